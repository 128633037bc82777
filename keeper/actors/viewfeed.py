"""The front door's feed of zoo views: the :class:`~keeper.actors.viewsearch.SearchState` every query reads, kept
up with the ZooManager's newest View by a daemon thread that long-polls it: the manager answers when the zoo
changes (or after ``LONG_POLL_S``), so a change reaches queries one publish and one state build after it happens,
and a quiet zoo costs no calls (a short poll took a steady share of a core in both actors, beside Tune trials that
want every core).

Invariants:
    * no query waits for a view: :meth:`ViewFeed.current` returns the last state built unless the caller forces a
      refresh (after a write it routed, a shard that could not be read), and a forced refresh waits at most
      ``_VIEW_WAIT_S`` (or the control timeout) before the last state keeps serving;
    * a state is swapped whole (one assignment under a lock), so a query sees all of a view or none of it;
    * a manager that does not answer (restarting, busy) is asked again after ``_VIEW_BACKOFF_S``, not every poll;
    * the shards of new arrivals are handed to ``prefetch`` when their view comes in, so matchers fetch them
      before the first query that needs them.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from keeper.actors.viewsearch import SearchState

__all__ = ["ViewFeed", "LONG_POLL_S"]

#: The longest a view request waits at the manager for a change before it is asked again.
LONG_POLL_S = 10.0
#: A view refresh that cannot reach the manager within this many seconds serves the last view instead.
_VIEW_WAIT_S = 5.0
#: After a failed refresh, queries use the last view without asking for this many seconds.
_VIEW_BACKOFF_S = 2.0


class ViewFeed:
    """The current search state of the zoo, refreshed from ``manager`` in the background.

    Args:
        manager: the ZooManager's handle (``view.remote(key)`` answers None when ``key`` is still the newest).
        control_s: the bound on one view request (capped at ``_VIEW_WAIT_S``).
        prefetch: called with ``(new shard refs, all shard refs)`` as (shard id, ref) pairs after each new view.
        on_size: called with the number of models of each new view (a metric).
    """

    def __init__(self, manager: Any, control_s: float, prefetch: Callable[[list, list], None],
                 on_size: Callable[[int], None]):
        self.manager = manager
        self._wait_s = min(_VIEW_WAIT_S, control_s)
        self._prefetch = prefetch
        self._on_size = on_size
        self._state = SearchState.empty()
        self._lock = threading.Lock()
        self._backoff_until = 0.0
        self._pulled = False
        self._closed = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._follow, daemon=True, name="keeper-view-refresher").start()

    def close(self) -> None:
        self._closed.set()

    def current(self, force: bool = False) -> SearchState:
        """The state queries read. Without ``force`` it never waits: the refresher thread takes each new view in as
        the manager publishes it. With ``force`` it asks the manager now, within a short bound, else keeps the
        last one."""
        if force or not self._pulled:  # a new front door takes its first view in before its first answer
            self.pull(force=force)
        return self._state

    def after_write(self, force: bool = False) -> None:
        """Take in the view a write routed through the front door made, so its caller's next query sees it (one
        small call when another pull took it in); a backoff from an earlier failure does not delay it."""
        self._backoff_until = 0.0
        self.pull(force=force)

    def pull(self, force: bool = False, wait_s: float = 0.0) -> bool:
        """Take the manager's newest view, if it is new, and build its SearchState; False when the manager could
        not answer within the bound (the last state keeps serving). ``wait_s``: let the manager answer when the
        zoo changes, within that long (the refresher's long poll; it holds no lock while it waits)."""
        if wait_s > 0:
            known = self._state.view.key
            try:
                v = ray.get(self.manager.view.remote(known, wait_s), timeout=wait_s + self._wait_s)
            except (GetTimeoutError, RayActorError):
                return False
            if v is None or v.key == self._state.view.key:
                return True
            return self._install(v, force=False)
        with self._lock:
            old = self._state
            try:
                v = ray.get(self.manager.view.remote(None if force else old.view.key), timeout=self._wait_s)
            except (GetTimeoutError, RayActorError):
                return False
            self._pulled = True
            if v is None:
                return True
        return self._install(v, force)

    def _install(self, v: Any, force: bool) -> bool:
        """Build ``v``'s SearchState and swap it in whole; hand the new arrivals' shards to ``prefetch``."""
        with self._lock:
            old = self._state
            if not force and (v.key == old.view.key or _older(v.key, old.view.key)):
                return True  # another pull took it, or a newer one, in while this view travelled
            # shard objects are fetched once, by reference: the front door owns them and hands them to matchers
            refs = {sid: (old.refs[sid] if sid in old.refs and not force else self.manager.shard.remote(sid))
                    for sid in v.shards}
            self._state = SearchState.build(v, refs)
            self._on_size(v.n)
        # the shards of new arrivals, fetched by the matchers rather than by the first query that needs them
        self._prefetch([(sid, ref) for sid, ref in refs.items() if sid not in old.refs], list(refs.items()))
        return True

    def _follow(self) -> None:
        """The refresher (a daemon thread): long-polls the manager, so queries read a state one publish and one
        build behind its view, and never wait for the manager or for a new state to be built."""
        while not self._closed.wait(_VIEW_BACKOFF_S if time.monotonic() < self._backoff_until else 0.0):
            try:
                ok = self.pull(wait_s=LONG_POLL_S)
            except RayError:  # a manager restarting answers later: keep serving the last state
                ok = False
            if not ok:
                self._backoff_until = time.monotonic() + _VIEW_BACKOFF_S


def _older(key: str, than: str) -> bool:
    """Whether view ``key`` precedes view ``than`` of the same manager (keys are ``<manager token>-<sequence>``);
    views of another manager (a restart) are never older."""
    token, _, seq = key.rpartition("-")
    token_than, _, seq_than = than.rpartition("-")
    return token == token_than and seq.isdigit() and seq_than.isdigit() and int(seq) < int(seq_than)
