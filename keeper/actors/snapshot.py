"""What moves between the service's actors: immutable Shards of parents' match arrays, and the View of the zoo a
query plans with.

A :class:`Shard` packs many parents' :class:`~keeper.matching.MatchArrays` back to back in flat numpy arrays,
so Ray stores it once in the object store and every Matcher on a node maps the same memory (zero-copy reads).
Shards never change: a new registration lands in a new small shard, a removal only drops the name from the
View, and compaction replaces many shards by a few new ones. A :class:`View` names, for every live model, its
shard and row, its accuracy, whether it has weights, and the cluster index of the two-stage search.

Invariants:
    * ``Shard.pack(rows)`` gives exactly the parents ``rows`` in that order (``score_many`` on it equals scoring
      each parent alone);
    * a View's arrays are parallel (one entry per live model) and its ``key`` changes whenever any of them does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from keeper.actors.clustering import ClusterIndex
from keeper.matching import SIGNATURE_SIZE, MatchArrays, PackedParents, signature

__all__ = ["Shard", "View"]


@dataclass(frozen=True)
class Shard:
    """Parents' match arrays back to back: parent ``k`` owns rows ``offsets[k]:offsets[k+1]``."""

    sid: str
    cls: np.ndarray        # int32 (rows,)
    shape: np.ndarray      # int64 (rows, 5)
    vectors: np.ndarray    # int64 (rows,)
    offsets: np.ndarray    # int64 (n + 1,)
    totals: np.ndarray     # int64 (n,)
    sigs: np.ndarray       # int64 (n, SIGNATURE_SIZE)

    @property
    def n(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @classmethod
    def build(cls, sid: str, parents: Sequence[MatchArrays]) -> "Shard":
        p = PackedParents.pack(list(parents))
        sigs = (np.stack([signature(a) for a in parents]) if parents
                else np.zeros((0, SIGNATURE_SIZE), np.int64))
        return cls(sid, p.cls, p.shape, p.vectors, p.offsets,
                   np.array([a.total for a in parents], dtype=np.int64), sigs)

    def pack(self, rows: np.ndarray) -> PackedParents:
        """The parents ``rows`` (in that order) as one PackedParents; no copy when ``rows`` is the whole shard."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.shape[0] == self.n and np.array_equal(rows, np.arange(self.n)):
            return PackedParents(self.cls, self.shape, self.vectors, self.offsets)
        starts = self.offsets[rows]
        lens = self.offsets[rows + 1] - starts
        offsets = np.zeros(rows.shape[0] + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        # row index of every layer: its parent's start, plus its position within the parent
        take = np.repeat(starts - offsets[:-1], lens) + np.arange(int(offsets[-1]), dtype=np.int64)
        return PackedParents(self.cls[take], self.shape[take], self.vectors[take], offsets)


@dataclass(frozen=True)
class View:
    """The live zoo as a query sees it. Arrays are parallel, one entry per live model, sorted by name.

    ``key`` identifies the view (the manager's incarnation and a counter); ``shards`` lists the shard ids any
    entry refers to; ``index`` holds ``ClusterIndex.to_arrays()`` or is empty when the zoo is searched whole.
    """

    key: str
    names: np.ndarray          # str (n,)
    accuracy: np.ndarray       # float64 (n,)
    weighted: np.ndarray       # bool (n,): False for graph-only entries, which are scored but never chosen
    params: np.ndarray         # int64 (n,): trainable elements of each model (for the parent's coverage)
    shard: np.ndarray          # int32 (n,): index into ``shards``
    row: np.ndarray            # int64 (n,): row within that shard
    sigs: np.ndarray           # int64 (n, SIGNATURE_SIZE): each model's signature, for the search's score bounds
    shards: tuple[str, ...]
    index: dict[str, np.ndarray] = field(default_factory=dict)
    uri: str = ""
    clean: np.ndarray | None = None  # bool (n,): lineage clean (see keeper.zoo.Zoo.register); None: all clean

    def is_clean(self, position: int) -> bool:
        return True if self.clean is None else bool(self.clean[position])

    @property
    def n(self) -> int:
        return int(self.names.shape[0])

    @property
    def clusters(self) -> int:
        """Clusters of the two-stage index (0 while the zoo is searched whole)."""
        if not self.index:
            return 0
        return len(ClusterIndex.from_arrays(self.index).medoid_names)

    def positions(self, names: Sequence[str]) -> np.ndarray:
        """Positions of ``names`` in this view (names must be live)."""
        return np.searchsorted(self.names, np.asarray(names, dtype=self.names.dtype))

    @classmethod
    def empty(cls, key: str = "empty", uri: str = "") -> "View":
        return cls(key, np.array([], dtype=str), np.zeros(0), np.zeros(0, bool), np.zeros(0, np.int64),
                   np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros((0, SIGNATURE_SIZE), np.int64), (), {},
                   uri)
