"""MatcherPool: a resizable set of Matcher actors that runs one scoring batch per member and never loses one.

The front door splits a query's candidates into one batch per member and calls :meth:`MatcherPool.map`. Every
wait is bounded: ``ray.wait`` with a timeout for the batches, the query's deadline for the whole map.

Invariants:
    * ``map`` returns one result per request, in request order, or raises :class:`~keeper.errors.ServiceError`
      when the deadline passes; a member that dies (``RayActorError``) or does not answer within the batch
      timeout is dropped, replaced while the pool is below its target size, and its batch is redone on another
      member that has answered before, or in the calling process when none is left;
    * batches go only to members that have answered (a startup ping at spawn), so a matcher Ray cannot place
      (its CPUs held by trials, or asked for more than any node has) never holds a query: until one answers,
      batches are scored in the calling process;
    * ``resize`` never fails a batch in flight: members leaving the pool take no new batches and are killed once
      their batches are back (or once a batch timeout has passed).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from keeper.errors import ServiceError

__all__ = ["MatcherPool"]


@dataclass(eq=False)
class _Member:
    handle: Any
    inflight: int = 0
    ready: bool = False       # answered at least once: its worker is up and its numba code is loaded
    probe: Any = None         # the startup ping's ObjectRef until it is back
    retiring_since: float | None = None
    born: float = field(default_factory=time.monotonic)


class MatcherPool:
    """Matcher actors with bounded, retried batch scoring.

    Args:
        spawn: starts one Matcher actor and returns its handle (the launcher's ``launch_matcher``).
        size: members to keep.
        batch_timeout_s: a batch not back after this long is redone elsewhere and its member replaced.
        local: called as ``local(*request)`` to score a batch in this process when no member can take it.
        kill: ends a member (``ray.kill``); injectable for tests.

    Example:
        >>> pool = MatcherPool(lambda: launch_matcher(cfg), 2, 30.0, local.score)  # doctest: +SKIP
        >>> pool.map([(child, parts_a), (child, parts_b)], deadline=time.monotonic() + 60)  # doctest: +SKIP
    """

    def __init__(self, spawn: Callable[[], Any], size: int, batch_timeout_s: float,
                 local: Callable[..., Any], kill: Callable[[Any], None] | None = None):
        self._spawn = spawn
        self._local = local
        self._kill = kill or _ray_kill
        self.batch_timeout_s = float(batch_timeout_s)
        self._lock = threading.Lock()
        self._members: list[_Member] = []
        self._retiring: list[_Member] = []
        self.target = 0
        self._shards: list[tuple[str, Any]] = []  # every shard of the zoo's view, for members that start later
        self.deaths = 0
        self.redone = 0
        self.local_batches = 0
        self.resize(size)

    # -- membership
    @property
    def size(self) -> int:
        """Members taking batches now."""
        with self._lock:
            return len(self._members)

    def handles(self) -> list[Any]:
        with self._lock:
            return [m.handle for m in self._members]

    def resize(self, n: int) -> int:
        """Grow or shrink to ``n`` members; returns ``n``. Leaving members finish their batches first."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"matchers must be an integer >= 0, got {n!r}")
        with self._lock:
            self.target = n
            while len(self._members) < n:
                self._members.append(self._new_member())
            now = time.monotonic()
            while len(self._members) > n:
                # the youngest leave first: the older ones have their shards cached
                m = self._members.pop()
                m.retiring_since = now
                self._retiring.append(m)
        self._reap()
        return n

    def _drop(self, member: _Member, why: str) -> None:
        """Forget a dead or stuck member and start its replacement while below target."""
        with self._lock:
            if member in self._members:
                self._members.remove(member)
                self.deaths += 1
                if len(self._members) < self.target:
                    self._members.append(self._new_member())
            elif member in self._retiring:
                self._retiring.remove(member)
        self._kill(member.handle)

    def _reap(self) -> None:
        now = time.monotonic()
        with self._lock:
            done = [m for m in self._retiring
                    if m.inflight == 0 or now - (m.retiring_since or now) > self.batch_timeout_s]
            for m in done:
                self._retiring.remove(m)
        for m in done:
            self._kill(m.handle)

    def _new_member(self) -> _Member:
        handle = self._spawn()
        member = _Member(handle, probe=handle.ping.remote())
        if self._shards:
            handle.prefetch.remote(self._shards)
        return member

    def prefetch(self, new: Sequence[tuple[str, Any]], every: Sequence[tuple[str, Any]]) -> None:
        """Ahead of the batches that need them (a member's first fetch of a large zoo costs a query hundreds of
        milliseconds): the ``new`` shards to every member, and ``every`` shard to each member started from now on.
        Fire and forget: a member that has not fetched a shard yet fetches it with the batch that needs it."""
        with self._lock:
            self._shards = list(every)
            members = list(self._members)
        if not new:
            return
        for m in members:
            try:
                m.handle.prefetch.remote(list(new))
            except Exception:  # noqa: BLE001 - a dead member is found and replaced by the next batch
                pass

    def pending(self) -> list[Any]:
        """Handles of the members that have not answered yet (not placed by Ray, or still starting)."""
        self._check_probes()
        with self._lock:
            return [m.handle for m in self._members if not m.ready]

    def _check_probes(self) -> None:
        """Mark members whose startup ping is back as ready; drop those whose ping failed. Never waits."""
        import ray
        from ray.exceptions import RayActorError

        with self._lock:
            waiting = {m.probe: m for m in self._members if not m.ready and m.probe is not None}
        if not waiting:
            return
        done, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=0)
        for ref in done:
            m = waiting[ref]
            try:
                ray.get(ref, timeout=0)
            except RayActorError:
                self._drop(m, "dead at start")
                continue
            m.ready, m.probe = True, None

    def _pick(self, exclude: set[int]) -> _Member | None:
        """The least busy member that has answered and is not excluded; None sends the batch to ``local``."""
        self._check_probes()
        with self._lock:
            pool = [m for m in self._members if id(m) not in exclude and m.ready]
            if not pool:
                return None
            m = min(pool, key=lambda m: (m.inflight, m.born))
            m.inflight += 1
            return m

    # -- work
    def map(self, requests: Sequence[tuple], deadline: float, method: str = "score") -> list[Any]:
        """Run ``member.<method>.remote(*request)`` for every request, one per member where possible.

        Raises:
            ServiceError: the deadline passed before every batch was back.
            Exception: an error raised by the scoring code itself (a bad request is not retried).
        """
        import ray
        from ray.exceptions import GetTimeoutError, ObjectLostError, OwnerDiedError, RayActorError

        results: list[Any] = [None] * len(requests)
        pending: dict[Any, tuple[int, _Member, float, set[int]]] = {}

        def submit(i: int, tried: set[int]) -> None:
            m = self._pick(tried)
            if m is None:
                self.local_batches += 1
                results[i] = self._local(*requests[i])
                return
            ref = getattr(m.handle, method).remote(*requests[i])
            pending[ref] = (i, m, time.monotonic(), tried | {id(m)})

        def redo(i: int, tried: set[int]) -> None:
            self.redone += 1
            submit(i, tried)

        try:
            for i in range(len(requests)):
                submit(i, set())
            while pending:
                now = time.monotonic()
                if now >= deadline:
                    raise ServiceError(f"matcher pool: {len(pending)} of {len(requests)} batches not back by the "
                                       "query deadline; raise timeouts.query_s or add matchers (keeper scale N)")
                oldest = min(t for _, _, t, _ in pending.values())
                wait_s = max(0.001, min(deadline, oldest + self.batch_timeout_s) - now)
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
                for ref in ready:
                    i, m, _, tried = pending.pop(ref)
                    with self._lock:
                        m.inflight -= 1
                    try:
                        results[i] = ray.get(ref, timeout=self.batch_timeout_s)
                    except (RayActorError, ObjectLostError, OwnerDiedError, GetTimeoutError) as exc:
                        self._drop(m, f"{type(exc).__name__}")
                        redo(i, tried)
                now = time.monotonic()
                for ref, (i, m, t, tried) in list(pending.items()):
                    if now - t > self.batch_timeout_s:
                        pending.pop(ref)
                        with self._lock:
                            m.inflight -= 1
                        self._drop(m, "batch timeout")
                        redo(i, tried)
        finally:
            for ref, (i, m, _, _) in pending.items():
                with self._lock:
                    m.inflight -= 1
            self._reap()
        return results

    def ping_all(self, timeout_s: float) -> list[dict[str, Any]]:
        """``ping()`` of every member that answers within ``timeout_s`` (dead ones are dropped)."""
        import ray
        from ray.exceptions import RayActorError

        with self._lock:
            members = list(self._members)
        refs = {m.handle.ping.remote(): m for m in members}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        out = []
        for ref in ready:
            try:
                out.append(ray.get(ref, timeout=timeout_s))
                refs[ref].ready = True
            except RayActorError:
                self._drop(refs[ref], "dead at ping")
        return out


def _ray_kill(handle: Any) -> None:
    import ray

    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # already gone: nothing to end
        pass
