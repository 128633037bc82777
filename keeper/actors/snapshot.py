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

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from keeper.actors.clustering import ClusterIndex
from keeper.matching import SIGNATURE_SIZE, MatchArrays, PackedParents, signature

__all__ = ["Shard", "View", "ViewTable"]


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
    entry refers to; ``labels`` gives each model's cluster of the two-stage index (-1: in none; found through
    its signature bound only) and ``medoids`` the position of each cluster's medoid, or ``labels`` is None when
    the zoo is searched whole. ``sigs`` is column-major, so a query's score bounds read only its own bins.
    ``private`` names the private models and their teams: only those teams (and operators) may have them as
    parents (:meth:`keeper.teams.Access.readable`).
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
    labels: np.ndarray | None = None                                   # int32 (n,), or None: no index
    medoids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # int64 (clusters,): positions
    uri: str = ""
    clean: np.ndarray | None = None  # bool (n,): lineage clean (see keeper.zoo.Zoo.register); None: all clean
    private: Mapping[str, str] = field(default_factory=dict)  # private model -> its team (usually few)
    # int64 (n,): each model's registration number within the manager's incarnation (the first part of ``key``):
    # the same while the model lives, whatever compaction moves; a model registered again under its name gets a
    # new one. None: not known (caches then key on shard and row)
    ident: np.ndarray | None = None

    def is_clean(self, position: int) -> bool:
        return True if self.clean is None else bool(self.clean[position])

    @property
    def n(self) -> int:
        return int(self.names.shape[0])

    @property
    def incarnation(self) -> str:
        """The manager incarnation that published this view (``ident`` numbers are unique within it)."""
        return self.key.rsplit("-", 1)[0]

    @property
    def clusters(self) -> int:
        """Clusters of the two-stage index (0 while the zoo is searched whole)."""
        return 0 if self.labels is None else int(self.medoids.shape[0])

    def positions(self, names: Sequence[str]) -> np.ndarray:
        """Positions of ``names`` in this view (names must be live)."""
        return np.searchsorted(self.names, np.asarray(names, dtype=self.names.dtype))

    @classmethod
    def empty(cls, key: str = "empty", uri: str = "") -> "View":
        return cls(key, np.array([], dtype=str), np.zeros(0), np.zeros(0, bool), np.zeros(0, np.int64),
                   np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros((0, SIGNATURE_SIZE), np.int64), (),
                   uri=uri)


#: One model's entry in a :class:`ViewTable`: (accuracy, weighted, clean, params, shard serial, row, signature,
#: registration number).
Entry = tuple[float, bool, bool, int, int, int, np.ndarray, int]


@dataclass(frozen=True)
class ViewTable:
    """The columns of the next View, sorted by name, changed by differences instead of rebuilt: a publish after
    a few arrivals costs a few numpy inserts (memory moves over N), not a Python loop over every model.

    Invariants: the columns are parallel and sorted by ``names``; a table is never changed in place (every
    change returns a new one), so a View made from it stays as it was. ``serial`` numbers the shards (the
    manager maps serials to shard ids); ``labels`` are the clusters as last set by :meth:`relabel` or given
    with the additions (-1: in no cluster).
    """

    names: np.ndarray
    accuracy: np.ndarray
    weighted: np.ndarray
    clean: np.ndarray
    params: np.ndarray
    serial: np.ndarray
    row: np.ndarray
    sigs: np.ndarray     # (n, SIGNATURE_SIZE), Fortran order
    labels: np.ndarray   # int32
    ident: np.ndarray    # int64: registration numbers (see View.ident)

    @classmethod
    def build(cls, entries: dict[str, Entry], labels: dict[str, int] | None = None) -> "ViewTable":
        """A table of ``entries`` (name -> Entry); ``labels`` name -> cluster (absent: -1)."""
        names = sorted(entries)
        cols = list(zip(*(entries[n] for n in names))) if names else [()] * 8
        sigs = np.asfortranarray(np.stack(cols[6]) if names else np.zeros((0, SIGNATURE_SIZE), np.int64))
        return cls(np.array(names, dtype=str), np.array(cols[0], np.float64), np.array(cols[1], bool),
                   np.array(cols[2], bool), np.array(cols[3], np.int64), np.array(cols[4], np.int64),
                   np.array(cols[5], np.int64), sigs,
                   np.array([(labels or {}).get(n, -1) for n in names], np.int32), np.array(cols[7], np.int64))

    def changed(self, added: dict[str, Entry], removed: Sequence[str],
                labels: dict[str, int] | None = None) -> "ViewTable":
        """The table without ``removed`` (names it holds) and with ``added`` (names it lacks)."""
        t = self
        if len(removed):
            drop = np.searchsorted(t.names, np.asarray(sorted(removed), dtype=t.names.dtype))
            t = ViewTable(*(np.delete(c, drop, axis=0) for c in t._columns()))
        if added:
            new = ViewTable.build(added, labels)
            at = np.searchsorted(t.names, new.names)
            # promoted first: np.insert casts to the column's dtype, which would cut longer names
            t = ViewTable(*(np.insert(c.astype(np.promote_types(c.dtype, v.dtype), copy=False), at, v, axis=0)
                            for c, v in zip(t._columns(), new._columns())))
        return dataclasses.replace(t, sigs=np.asfortranarray(t.sigs))

    def moved(self, names: Sequence[str], serial: np.ndarray, row: np.ndarray) -> "ViewTable":
        """The table with ``names`` now at (``serial``, ``row``) (a compaction re-packed them)."""
        at = np.searchsorted(self.names, np.asarray(names, dtype=self.names.dtype))
        s, r = self.serial.copy(), self.row.copy()
        s[at], r[at] = serial, row
        return dataclasses.replace(self, serial=s, row=r)

    def relabel(self, index: ClusterIndex | None) -> "ViewTable":
        """Every label read from ``index`` again (after a fit, or a removal renumbered clusters)."""
        labels = np.full(self.names.shape[0], -1, np.int32)
        if index is not None and len(index) and self.names.shape[0]:
            arrays = index.to_arrays()
            at = np.minimum(np.searchsorted(self.names, arrays["names"]), self.names.shape[0] - 1)
            ok = self.names[at] == arrays["names"]
            labels[at[ok]] = arrays["labels"][ok]
        return dataclasses.replace(self, labels=labels)

    def medoid_positions(self, index: ClusterIndex | None) -> np.ndarray:
        if index is None or not len(index):
            return np.zeros(0, np.int64)
        return np.searchsorted(self.names, np.array(index.medoid_names, dtype=self.names.dtype)).astype(np.int64)

    def _columns(self) -> tuple[np.ndarray, ...]:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))
