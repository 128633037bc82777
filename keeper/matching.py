"""Alignment of two LayerGraphs: the similarity score and the layer mapping transforms consume.

Both graphs' layers are taken in their canonical topological order and aligned by dynamic programming as a
weighted common subsequence: a child layer is either matched to one parent layer of the same class (kind and
spatial rank), inheriting ``prod(min(child_dim, parent_dim))`` elements of its main tensor plus ``min(units)``
per shared vector (bias, norm shift), or left to its own initialisation. Matching is one-to-one and
order-preserving, so branches and merges (residual adds, concatenations, attention) are counted once each:
every child element is inherited at most once, which bounds the score.

Invariants:
    * ``similarity(p, c) == inherited / c.total_params`` is in [0, 1];
    * it is exactly 1.0 when ``p`` and ``c`` have the same architecture (integer arithmetic, no rounding);
    * a child that is a sub-network of its parent (fewer blocks, same widths) inherits every element it has.

The DP runs in numba-compiled loops over flat arrays (compiled once per process, cached on disk); a cheap
per-class signature bound filters parents before the exact alignment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence, Union

import numba
import numpy as np

from keeper.graph import LayerGraph, as_graph
from keeper.onnx_safety import ModelInput

__all__ = [
    "MatchRules",
    "DEFAULT_RULES",
    "MatchArrays",
    "Alignment",
    "match_arrays",
    "similarity",
    "align",
    "score_many",
    "signature",
    "upper_bounds",
    "SIGNATURE_SIZE",
]

GraphLike = Union[LayerGraph, ModelInput]
SIGNATURE_SIZE = 64


def class_by_kind_and_rank(graph: LayerGraph) -> np.ndarray:
    """Default node rule: layers match only when kind and parameter rank agree (a 1-D conv never feeds a 2-D one)."""
    return (graph.layer_kind.astype(np.int32) * 8 + graph.rank.astype(np.int32)).astype(np.int32)


@dataclass(frozen=True)
class MatchRules:
    """Pluggable node comparison: ``node_class`` maps a graph's layers to integer classes; only equal classes
    may be matched."""

    node_class: Callable[[LayerGraph], np.ndarray] = class_by_kind_and_rank


DEFAULT_RULES = MatchRules()


@dataclass(frozen=True)
class MatchArrays:
    """What the DP reads of one graph: flat arrays only (cheap to ship to Matcher actors)."""

    cls: np.ndarray      # int32 (n,)
    shape: np.ndarray    # int64 (n, 5)
    vectors: np.ndarray  # int64 (n,)
    total: int           # trainable elements of the whole graph

    @property
    def n(self) -> int:
        return int(self.cls.shape[0])


def match_arrays(graph: LayerGraph, rules: MatchRules = DEFAULT_RULES) -> MatchArrays:
    return MatchArrays(np.ascontiguousarray(rules.node_class(graph), dtype=np.int32),
                       np.ascontiguousarray(graph.shape, dtype=np.int64),
                       np.ascontiguousarray(graph.vectors, dtype=np.int64), int(graph.total_params))


@dataclass(frozen=True)
class Alignment:
    """The result of aligning a parent to a child.

    ``pairs[i]`` is the parent layer matched to child layer ``i`` (or -1); ``inherited`` counts child elements
    inherited; ``score = inherited / child_total``.
    """

    score: float
    inherited: int
    child_total: int
    pairs: np.ndarray

    def tensor_pairs(self, parent: LayerGraph, child: LayerGraph) -> dict[str, str | None]:
        """Child tensor key -> parent tensor key of the same role in the matched layer (None when unmatched)."""
        out: dict[str, str | None] = {}
        for ci, refs in enumerate(child.tensors):
            pi = int(self.pairs[ci])
            prole = {r.role: r.key for r in parent.tensors[pi]} if pi >= 0 else {}
            for r in refs:
                out[r.key] = prole.get(r.role)
        return out


# ---------------------------------------------------------------------------------------------- compiled core

@numba.njit(cache=True, inline="always")
def _gain(shp_c, vec_c, i, shp_p, vec_p, j):
    g = 1
    for d in range(5):
        a = shp_c[i, d]
        b = shp_p[j, d]
        g *= a if a < b else b
    v = vec_c[i] if vec_c[i] < vec_p[j] else vec_p[j]
    u = shp_c[i, 0] if shp_c[i, 0] < shp_p[j, 0] else shp_p[j, 0]
    return g + v * u


@numba.njit(cache=True)
def _dp_value(cls_c, shp_c, vec_c, cls_p, shp_p, vec_p, row):
    m = cls_c.shape[0]
    n = cls_p.shape[0]
    for j in range(n + 1):
        row[j] = 0
    for i in range(m):
        diag = 0
        left = 0
        ci = cls_c[i]
        for j in range(n):
            up = row[j + 1]
            best = up if up > left else left
            if cls_p[j] == ci:
                cand = diag + _gain(shp_c, vec_c, i, shp_p, vec_p, j)
                if cand > best:
                    best = cand
            diag = up
            row[j + 1] = best
            left = best
    return row[n]


# The alignment maximises inherited elements first and, among alignments inheriting equally many, the number
# of dimensions that agree exactly (a stem conv (16,3,3,3) inherits as much from any (16,16,3,3) conv as from
# its true counterpart; only the tie-break tells them apart). Lexicographic order in one int64: K > any bonus sum.
_TIE_K = 1 << 16


@numba.njit(cache=True, inline="always")
def _bonus(shp_c, i, shp_p, j):
    b = 1
    if shp_c[i, 0] == shp_p[j, 0]:
        b += 1
    if shp_c[i, 1] == shp_p[j, 1]:
        b += 1
    same = True
    for d in range(2, 5):
        if shp_c[i, d] != shp_p[j, d]:
            same = False
    if same:
        b += 1
    return b


@numba.njit(cache=True)
def _dp_pairs(cls_c, shp_c, vec_c, cls_p, shp_p, vec_p):
    m = cls_c.shape[0]
    n = cls_p.shape[0]
    f = np.zeros((m + 1, n + 1), dtype=np.int64)
    for i in range(m):
        ci = cls_c[i]
        for j in range(n):
            up = f[i, j + 1]
            left = f[i + 1, j]
            best = up if up > left else left
            if cls_p[j] == ci:
                cand = f[i, j] + _gain(shp_c, vec_c, i, shp_p, vec_p, j) * _TIE_K + _bonus(shp_c, i, shp_p, j)
                if cand > best:
                    best = cand
            f[i + 1, j + 1] = best
    pairs = np.full(m, -1, dtype=np.int64)
    inherited = 0
    i, j = m, n
    while i > 0 and j > 0:
        v = f[i, j]
        if v == f[i - 1, j]:
            i -= 1
        elif v == f[i, j - 1]:
            j -= 1
        else:  # only a diagonal step explains v
            g = _gain(shp_c, vec_c, i - 1, shp_p, vec_p, j - 1)
            pairs[i - 1] = j - 1
            inherited += g
            i -= 1
            j -= 1
    return inherited, pairs


@numba.njit(cache=True)
def _dp_batch(cls_c, shp_c, vec_c, cls_p, shp_p, vec_p, offsets, out):
    """Score the child against parents stored back to back (parent k = rows offsets[k]:offsets[k+1])."""
    maxn = 0
    for k in range(offsets.shape[0] - 1):
        if offsets[k + 1] - offsets[k] > maxn:
            maxn = offsets[k + 1] - offsets[k]
    row = np.zeros(maxn + 1, dtype=np.int64)
    for k in range(offsets.shape[0] - 1):
        a = offsets[k]
        b = offsets[k + 1]
        out[k] = _dp_value(cls_c, shp_c, vec_c, cls_p[a:b], shp_p[a:b], vec_p[a:b], row)


# ---------------------------------------------------------------------------------------------- public API

def _arrays(g: GraphLike | MatchArrays, rules: MatchRules) -> MatchArrays:
    return g if isinstance(g, MatchArrays) else match_arrays(as_graph(g), rules)


def similarity(parent: GraphLike, child: GraphLike, rules: MatchRules = DEFAULT_RULES) -> float:
    """Fraction of the child's trainable parameter elements inherited from the parent, in [0, 1].

    Example:
        >>> keeper.similarity(resnet18_onnx, resnet10_onnx)  # doctest: +SKIP
        1.0
    """
    p, c = _arrays(parent, rules), _arrays(child, rules)
    if c.total <= 0:
        return 0.0
    row = np.zeros(p.n + 1, dtype=np.int64)
    v = _dp_value(c.cls, c.shape, c.vectors, p.cls, p.shape, p.vectors, row)
    return min(1.0, int(v) / c.total)


def align(parent: GraphLike, child: GraphLike, rules: MatchRules = DEFAULT_RULES) -> Alignment:
    """The layer mapping of ``child`` onto ``parent`` and its score (see :class:`Alignment`).

    Example:
        >>> a = keeper.align(parent_graph, child_graph)  # doctest: +SKIP
        >>> a.score, a.pairs[:4]                          # doctest: +SKIP
    """
    p, c = _arrays(parent, rules), _arrays(child, rules)
    v, pairs = _dp_pairs(c.cls, c.shape, c.vectors, p.cls, p.shape, p.vectors)
    score = min(1.0, int(v) / c.total) if c.total > 0 else 0.0
    return Alignment(score, int(v), c.total, pairs)


@dataclass(frozen=True)
class PackedParents:
    """Many parents' MatchArrays back to back, for one compiled batch call."""

    cls: np.ndarray
    shape: np.ndarray
    vectors: np.ndarray
    offsets: np.ndarray

    @classmethod
    def pack(cls, parents: Sequence[MatchArrays]) -> "PackedParents":
        offsets = np.zeros(len(parents) + 1, dtype=np.int64)
        np.cumsum([p.n for p in parents], out=offsets[1:])
        if not parents:
            return cls(np.zeros(0, np.int32), np.zeros((0, 5), np.int64), np.zeros(0, np.int64), offsets)
        return cls(np.concatenate([p.cls for p in parents]), np.concatenate([p.shape for p in parents]),
                   np.concatenate([p.vectors for p in parents]), offsets)


def score_many(parents: Sequence[GraphLike | MatchArrays] | PackedParents, child: GraphLike | MatchArrays,
               rules: MatchRules = DEFAULT_RULES) -> np.ndarray:
    """Similarity of ``child`` to each parent, in one compiled call (float64 array)."""
    c = _arrays(child, rules)
    packed = parents if isinstance(parents, PackedParents) else PackedParents.pack([_arrays(p, rules) for p in parents])
    out = np.zeros(packed.offsets.shape[0] - 1, dtype=np.int64)
    if c.total <= 0 or out.shape[0] == 0:
        return out.astype(np.float64)
    _dp_batch(c.cls, c.shape, c.vectors, packed.cls, packed.shape, packed.vectors, packed.offsets, out)
    return np.minimum(out / c.total, 1.0)


def signature(g: GraphLike | MatchArrays, rules: MatchRules = DEFAULT_RULES) -> np.ndarray:
    """Trainable elements per layer class, folded into ``SIGNATURE_SIZE`` bins (int64)."""
    a = _arrays(g, rules)
    per_layer = np.prod(a.shape, axis=1) + a.vectors * a.shape[:, 0]
    return np.bincount(a.cls % SIGNATURE_SIZE, weights=per_layer, minlength=SIGNATURE_SIZE).astype(np.int64)


def upper_bounds(parent_signatures: np.ndarray, child: GraphLike | MatchArrays,
                 rules: MatchRules = DEFAULT_RULES) -> np.ndarray:
    """Cheap filter: an upper bound of ``similarity(parent_k, child)`` for every row of ``parent_signatures``.

    A bound below a threshold means the parent definitely scores below it; a bound above promises nothing.
    """
    a = _arrays(child, rules)
    sc = signature(a)
    if a.total <= 0:
        return np.zeros(parent_signatures.shape[0])
    return np.minimum(np.minimum(parent_signatures, sc[None, :]).sum(axis=1) / a.total, 1.0)
