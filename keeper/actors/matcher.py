"""Matcher: scores one child against batches of candidate parents with the compiled alignment.

A Matcher holds parents' match arrays as :class:`~keeper.actors.snapshot.Shard` objects that it fetched by
reference from the object store (zero-copy numpy on the same node) and caches by shard id. A request names the
shards it needs and the rows in each; the Matcher fetches the shards it lacks (bounded wait), packs the rows and
runs :func:`keeper.matching.score_many` once per shard. It keeps no other state, so a replacement Matcher is
useful at once and a batch can be redone anywhere.

Plain class: the launcher makes it a Ray actor; tests use it directly (shards passed by value).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any, Iterable, Sequence

import numpy as np

from keeper.actors.metrics import gc_seconds
from keeper.actors.snapshot import Shard
from keeper.errors import ServiceError
from keeper.matching import MatchArrays, score_many, upper_bounds

__all__ = ["Matcher", "Part"]

#: One piece of a batch: (shard id, the Shard or an ObjectRef to it, rows of that shard to score).
Part = tuple[str, Any, np.ndarray]


class Matcher:
    """Scores batches of parents against a child.

    Example:
        >>> m = Matcher()
        >>> m.score(child_arrays, [(shard.sid, shard, np.arange(shard.n))])  # doctest: +SKIP
        array([1. , 0.42, ...])
    """

    def __init__(self, fetch_timeout_s: float = 30.0):
        self.fetch_timeout_s = float(fetch_timeout_s)
        self._shards: dict[str, Shard] = {}
        self._lock = threading.Lock()
        self.batches = 0
        self.pairs = 0
        _warm_up()

    def ping(self) -> dict[str, Any]:
        """Liveness and placement: pid, node id (when under Ray), cached shards, work done."""
        return {"pid": os.getpid(), "node": _node_id(), "shards": len(self._shards), "batches": self.batches,
                "pairs": self.pairs}

    def pid(self) -> int:
        return os.getpid()

    def score(self, child: MatchArrays, parts: Sequence[Part], floor: float | None = None,
              live: Iterable[str] | None = None) -> np.ndarray:
        """Similarity of ``child`` to every requested parent, in request order (float64).

        Args:
            child: the child's match arrays.
            parts: (shard id, Shard or ObjectRef, rows) triples.
            floor: when given, parents whose cheap signature bound is below it are not aligned and score 0.0
                (they could not be chosen anyway).
            live: shard ids still in use; cached shards not in it are dropped.
        """
        return self.score_timed(child, parts, floor, live)[0]

    def score_timed(self, child: MatchArrays, parts: Sequence[Part], floor: float | None = None,
                    live: Iterable[str] | None = None) -> tuple[np.ndarray, dict[str, float]]:
        """:meth:`score`, and where this call's time went: ``fetch_s`` (shards it lacked), ``score_s`` (bounds,
        packing, alignments), ``gc_s`` (this process's GC pauses meanwhile), ``pairs_n`` (alignments run).
        Safe from several threads at once (the front door scores small stages itself this way)."""
        t0, gc0 = time.perf_counter(), gc_seconds()
        with self._lock:
            self._fetch([(sid, ref) for sid, ref, _ in parts])
            shards = {sid: self._shards[sid] for sid, _, _ in parts}
            if live is not None:
                keep = set(live) | set(shards)
                for sid in [s for s in self._shards if s not in keep]:
                    del self._shards[sid]
        t1 = time.perf_counter()
        scores, pairs = self._score(child, [(shards[sid], rows) for sid, _, rows in parts], floor)
        t2 = time.perf_counter()
        self.pairs += pairs
        self.batches += 1
        return scores, {"fetch_s": t1 - t0, "score_s": t2 - t1, "gc_s": gc_seconds() - gc0, "pairs_n": float(pairs)}

    @staticmethod
    def _score(child: MatchArrays, parts: Sequence[tuple[Shard, np.ndarray]],
               floor: float | None) -> tuple[np.ndarray, int]:
        out, pairs = [], 0
        for shard, rows in parts:
            rows = np.asarray(rows, dtype=np.int64)
            scores = np.zeros(rows.shape[0], dtype=np.float64)
            todo = np.arange(rows.shape[0])
            if floor is not None and floor > 0 and rows.shape[0]:
                todo = np.flatnonzero(upper_bounds(shard.sigs[rows], child) >= floor)
            if todo.shape[0]:
                scores[todo] = score_many(shard.pack(rows[todo]), child)
            out.append(scores)
            pairs += int(todo.shape[0])
        return (np.concatenate(out) if out else np.zeros(0, dtype=np.float64)), pairs

    def prefetch(self, refs: Sequence[tuple[str, Any]]) -> bool:
        """Fetch the shards ``refs`` (shard id, ObjectRef) not cached yet, ahead of the batches that need them;
        False when they could not be fetched within the bound (the batch that needs them fetches them again)."""
        with self._lock:
            try:
                self._fetch(refs)
            except ServiceError:
                return False
        return True

    def _fetch(self, refs: Sequence[tuple[str, Any]]) -> None:
        missing = {sid: ref for sid, ref in refs if sid not in self._shards}
        if not missing:
            return
        direct = {sid: ref for sid, ref in missing.items() if isinstance(ref, Shard)}
        self._shards.update(direct)
        remote = {sid: ref for sid, ref in missing.items() if sid not in direct}
        if not remote:
            return
        import ray
        from ray.exceptions import GetTimeoutError

        try:
            values = ray.get(list(remote.values()), timeout=self.fetch_timeout_s)
        except GetTimeoutError:
            raise ServiceError(f"matcher: fetching shards {sorted(remote)} took over {self.fetch_timeout_s:.0f} s; "
                               "the object store is overloaded or their owner died") from None
        self._shards.update(zip(remote, values))


def _warm_up() -> None:
    """Load the compiled alignment now (numba's disk cache), not on the first query's clock."""
    one = {f.name: np.zeros(1, np.int64) for f in dataclasses.fields(MatchArrays)}
    one.update(cls=np.ones(1, np.int32), shape=np.ones((1, 5), np.int64), total=1)
    tiny = MatchArrays(**one)
    score_many([tiny], tiny)


def _node_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # placement is informative only
        return None
