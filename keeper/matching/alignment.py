"""Alignment of two LayerGraphs: the similarity score and the layer mapping transforms consume.

Both graphs' layers are taken in their canonical topological order and aligned by dynamic programming as a
weighted common subsequence: a child layer is either matched to one parent layer of the same class (kind and
spatial rank), inheriting ``prod(min(child_dim, parent_dim))`` elements of its main tensor plus ``min(units)``
per shared vector (bias, norm shift), or left to its own initialisation. Matching is one-to-one and
order-preserving, so branches and merges (residual adds, concatenations, attention) are counted once each:
every child element is inherited at most once, which bounds the score.

Invariants:
    * ``similarity(p, c) == inherited / c.score_total`` is in [0, 1] (the child's layer elements, a tensor
      shared by several layers once per layer, plus the learned elements no layer holds, which no parent can
      give: a child with such tensors scores below 1);
    * it is exactly 1.0 when ``p`` and ``c`` have the same architecture (integer arithmetic, no rounding);
    * a child that is a sub-network of its parent (fewer blocks, same widths) inherits every element it has.

The DP runs in compiled loops over flat arrays (:mod:`keeper.matching.core`: keeper's C extension, or the
same kernels under numba); a cheap per-class signature bound filters parents before the exact alignment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence, Union

import numpy as np

from keeper.graph import LayerGraph, as_graph
from keeper.graph.stream import Stream, residual_stream
from keeper.graph.walk import walk
from keeper.kinds import Merge, kind_mask, kinds_where, traits
from keeper.matching.core import dp_batch, dp_pairs, dp_value
from keeper.onnx_safety import ModelInput

__all__ = [
    "MatchRules",
    "DEFAULT_RULES",
    "MatchArrays",
    "PackedParents",
    "Alignment",
    "match_arrays",
    "similarity",
    "align",
    "score_many",
    "signature",
    "upper_bounds",
    "SIGNATURE_SIZE",
    "level_classes",
]

GraphLike = Union[LayerGraph, ModelInput]
SIGNATURE_SIZE = 64


def class_by_kind_and_rank(graph: LayerGraph) -> np.ndarray:
    """Layers match only when kind and parameter rank agree (a 1-D conv never feeds a 2-D one)."""
    return (graph.layer_kind.astype(np.int32) * 8 + graph.rank.astype(np.int32)).astype(np.int32)


_LEVELS = 64  # resolution levels told apart; deeper ones share the last code
_LEVELLED = kind_mask(lambda t: t.levelled).astype(np.int64)  # by kind code: 1 where the class carries levels


def class_by_kind_rank_and_level(graph: LayerGraph) -> np.ndarray:
    """Default node rule: kind and rank agree, and convolutions and BatchNorms also sit at the same resolution
    levels (input and output; see :mod:`keeper.graph`).

    Without the levels the alignment maximises inherited elements by pairing a child's widened stage-1 block
    with the parent's wider stage-2 block, whose channels belong to another residual stream and another
    resolution: many elements, no function. Linear layers, norms other than BatchNorm and embeddings are not
    levelled, so a head after global pooling matches a head whatever the number of stages.
    """
    return level_classes(graph.layer_kind, graph.rank, graph.in_level, graph.out_level)


def level_classes(kind: np.ndarray, rank: np.ndarray, in_level: np.ndarray, out_level: np.ndarray) -> np.ndarray:
    """:func:`class_by_kind_rank_and_level` from the four per-layer arrays it reads (int32)."""
    kind = np.asarray(kind).astype(np.int64)
    lo, hi = np.minimum(np.maximum(np.stack((in_level, out_level)), -1), _LEVELS - 2) + 1
    code = (kind * 8 + rank) * (_LEVELS * _LEVELS) + _LEVELLED[kind & 255] * (lo * _LEVELS + hi)
    return code.astype(np.int32)


@dataclass(frozen=True)
class MatchRules:
    """Pluggable node comparison: ``node_class`` maps a graph's layers to integer classes; only equal classes
    may be matched."""

    node_class: Callable[[LayerGraph], np.ndarray] = class_by_kind_rank_and_level


DEFAULT_RULES = MatchRules()


@dataclass(frozen=True)
class MatchArrays:
    """What the DP reads of one graph: flat arrays only (cheap to ship to Matcher actors)."""

    cls: np.ndarray      # int32 (n,)
    shape: np.ndarray    # int64 (n, 5)
    vectors: np.ndarray  # int64 (n,)
    total: int           # the score's denominator (LayerGraph.score_total)
    skip: np.ndarray     # int64 (n,): tie-break cost of leaving the layer unmatched (see dp_pairs)
    edge: np.ndarray     # int64 (n,): tie-break cost of a run of unmatched layers starting or ending here
    context: np.ndarray  # int64 (n,): code of what feeds the layer, for the tie-break (see _context_codes)
    feeds: np.ndarray    # int64 (n,): code of what the layer feeds, for the tie-break (see _feeds_codes)

    @property
    def n(self) -> int:
        return int(self.cls.shape[0])


def match_arrays(graph: LayerGraph, rules: MatchRules = DEFAULT_RULES) -> MatchArrays:
    cls = np.ascontiguousarray(rules.node_class(graph), dtype=np.int32)
    stream = residual_stream(graph)
    preds, succs = graph.predecessor_lists(), graph.successors()
    return MatchArrays(cls, np.ascontiguousarray(graph.shape, dtype=np.int64),
                       np.ascontiguousarray(graph.vectors, dtype=np.int64), int(graph.score_total),
                       _skip_costs(graph, stream, succs), _edge_costs(graph, stream, preds),
                       _context_codes(graph, cls, preds), _feeds_codes(graph, cls, succs))


# context codes of a layer fed by no weighted layer: straight from the graph input, or through a merge
_CONTEXT_INPUT = -1
_CONTEXT_MERGE = -2


def _context_codes(graph: LayerGraph, cls: np.ndarray, preds: list[list[int]]) -> np.ndarray:
    """What feeds each layer, as a code equal across two graphs when the feeding is alike: the class and fan-in
    (shape[1]) of the nearest weighted layer upstream (through activations, pools and reshapes), or a token for
    the graph input or a merge (residual add, concatenation, several inputs).

    The fan-in, not the output width or the kernel, so the code survives widening and kernel growth: a stem's
    norm is fed by a 1-channel conv in a wider child too, while a block's last norm is fed by a conv of the
    stream's width. Two BatchNorms of equal width inherit equally from each other wherever they sit; this tells
    the stem's from a residual block's when a child drops a block.
    """
    layer_of = _layer_of(graph)
    summed = _adds_a_table(graph)
    through = _between_layers(graph, layer_of).tolist()
    out = np.empty(graph.num_layers, dtype=np.int64)
    for li, node in enumerate(graph.layer_node.tolist()):
        end, stopped, _ = walk(node, preds, through)
        if stopped and layer_of[end] >= 0:
            src = int(layer_of[end])
            # >= 0: never one of the tokens; a table added to the data is a sum, as a merge
            out[li] = _CONTEXT_MERGE if summed[src] else int(cls[src]) * 1_000_003 + int(graph.shape[src][1])
        else:
            out[li] = _CONTEXT_INPUT if not preds[end] else _CONTEXT_MERGE
    return out


def _feeds_codes(graph: LayerGraph, cls: np.ndarray, succs: list[list[int]]) -> np.ndarray:
    """What each layer feeds, as a code equal across two graphs when the feeding is alike: the class of the nearest
    weighted layer downstream along a single path (through activations, pools and reshapes), or a token for a graph
    output or a merge (a residual add, a concatenation, a fork to several consumers).

    The counterpart of :func:`_context_codes` on the other side: in a plain chain (VGG, an MLP) the last conv of a
    run of equal convs is the one feeding the head, so a deeper child's last conv takes the parent's last conv and
    its new ones come before it. In residual blocks every block's layers feed alike, so blocks still pair up from
    the first.
    """
    layer_of = _layer_of(graph)
    # a node that other inputs join (attention's products, a gate) ends the single path too
    through = (_between_layers(graph, layer_of) & (np.diff(graph.pred_indptr) == 1)).tolist()
    out = np.empty(graph.num_layers, dtype=np.int64)
    for li, node in enumerate(graph.layer_node.tolist()):
        end, stopped, _ = walk(node, succs, through)
        if stopped and layer_of[end] >= 0:
            out[li] = int(cls[int(layer_of[end])])
        else:
            out[li] = _CONTEXT_INPUT if not succs[end] else _CONTEXT_MERGE
    return out


def _layer_of(graph: LayerGraph) -> np.ndarray:
    """Per node, its layer's index, or -1 for a weightless node."""
    layer_of = np.full(graph.num_nodes, -1, dtype=np.int64)
    layer_of[graph.layer_node] = np.arange(graph.num_layers)
    return layer_of


def _between_layers(graph: LayerGraph, layer_of: np.ndarray) -> np.ndarray:
    """Per node, whether the walks to a layer's neighbours pass through it: neither a layer nor a merge."""
    return (layer_of < 0) & ~_MERGE_MASK[graph.kind]


def _skip_costs(graph: LayerGraph, stream: Stream | None = None,
                succs: list[list[int]] | None = None) -> np.ndarray:
    """A new layer costs nothing to leave unmatched when it can start as an identity (square conv/linear,
    depthwise conv, BatchNorm) or sits inside a residual branch (whose last layer is zeroed, so the branch adds
    nothing: a block of the residual stream that an add closes, :mod:`keeper.graph.stream`); any other new layer
    breaks the function, so it should rather be matched when inheritance is equal. So does one fed straight by the
    graph input with a nonlinearity before the next layer: its activation would act on the raw input (an MLP whose
    first hidden width equals its input size, deepened: the new layer goes after the first, not before it)."""
    k, s = graph.layer_kind, graph.shape
    square = s[:, 0] == s[:, 1]
    free = _IDENTITY_ANY_SHAPE[k] | (_IDENTITY_IF_SQUARE[k] & square)
    succs = succs if succs is not None else graph.successors()
    free &= ~_on_the_raw_input(graph, succs)
    stream = stream or residual_stream(graph)
    for li, node in enumerate(graph.layer_node.tolist()):
        if free[li]:
            continue
        if stream.segment[li] >= 0:
            # from the graph's structure: a layer in a residual block is free, one on the stream is not (a
            # post-LN norm); the walk below would read a mask added to attention scores as a second merge
            free[li] = stream.residual[li]
        else:
            free[li] = _inside_residual_branch(node, succs, graph.kind)
    return np.where(free, 0, _SKIP_NOT_IDENTITY).astype(np.int64)


def _on_the_raw_input(graph: LayerGraph, succs: list[list[int]]) -> np.ndarray:
    """Per layer: fed by the graph input along a single path of weightless nodes, and followed by a nonlinearity
    before the next layer other than a norm, a merge, a fork or the output."""
    layer_of = _layer_of(graph)
    through = _between_layers(graph, layer_of)
    preds = graph.predecessor_lists()
    nonlinear = _NONLINEAR_MASK[graph.kind].tolist()
    down = through.copy()
    down[graph.layer_node] = _AFFINE[graph.layer_kind]  # norms, scales and shifts: on to the activation after them
    through, down = through.tolist(), down.tolist()
    out = np.zeros(graph.num_layers, dtype=bool)
    for li, node in enumerate(graph.layer_node.tolist()):
        end, stopped, _ = walk(node, preds, through)
        if stopped or preds[end]:
            continue  # fed by a layer, a merge or several inputs
        end, stopped, passed = walk(node, succs, down)
        out[li] = any(nonlinear[v] for v in passed) or (not stopped and end != node and nonlinear[end])
    return out


def _inside_residual_branch(node: int, succs: list[list[int]], kind: np.ndarray, limit: int = 256) -> bool:
    """Every forward path from ``node`` reaches one and the same Add before anything else ends it: the layer
    belongs to the branch that Add merges (attention forks into q, k, v and joins again before its Add)."""
    seen, stack, adds = {node}, [node], set()
    while stack:
        cur = stack.pop()
        if not succs[cur]:
            return False  # reached a graph output without merging
        for nxt in succs[cur]:
            if kind[nxt] in _RESIDUAL_KINDS:
                adds.add(nxt)
            elif nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
                if len(seen) > limit:
                    return False
    return len(adds) == 1


# by kind, from keeper.kinds: which layers can start as the identity (some only when square), which nodes merge
# branches (residual adds among them), which are nonlinearities
_IDENTITY_ANY_SHAPE = kind_mask(lambda t: t.identity is not None and not t.identity.needs_square)
_IDENTITY_IF_SQUARE = kind_mask(lambda t: t.identity is not None and t.identity.needs_square)
_MERGE_MASK = kind_mask(lambda t: t.merge is not None)
_RESIDUAL_KINDS = kinds_where(lambda t: t.merge is Merge.SUM)
_NONLINEAR_MASK = kind_mask(lambda t: t.nonlinear)
_AFFINE = kind_mask(lambda t: t.affine)

# Tie-break costs the DP reads per layer (keeper.matching.kernels: second to inherited elements, and bounded there)
_EDGE_INSIDE = 8
_EDGE_NONLINEAR = 4
_SKIP_NOT_IDENTITY = 16  # skipping a layer that cannot be an identity outweighs gaps and dims


def _edge_costs(graph: LayerGraph, stream: Stream, preds: list[list[int]]) -> np.ndarray:
    """How badly a run of new layers would sit next to each layer (a run starting at it, or ending just before it).

    Where the graph has blocks (fork-join regions of the residual stream, :mod:`keeper.graph.stream`): 0 at a
    block boundary, at least ``_EDGE_NONLINEAR`` anywhere else inside a block, so new blocks go in whole, between
    two residual adds, whichever ops an exporter writes around a norm (dynamo spells RMSNorm as a two-input Mul
    before the norm's weight, which the local rule below reads as "inside"). Elsewhere (a chain of layers without
    a fork, as in VGG) the local rule: 0 where the layer's input comes through a merge or from the graph input;
    ``_EDGE_NONLINEAR`` through a nonlinearity or pool only; ``_EDGE_INSIDE`` when another layer feeds it directly
    (a norm after its conv)."""
    out = _local_edge_costs(graph, preds)
    boundary = stream.boundary_before()
    out[boundary] = 0
    inside = stream.in_block & ~boundary
    out[inside] = np.maximum(out[inside], _EDGE_NONLINEAR)
    return out


def _adds_a_table(graph: LayerGraph) -> np.ndarray:
    """Per layer: it adds (or joins) a learned table to the data rather than transforming it (a position table, a
    class token: an affine layer whose ``attrs["scales"]`` is False). Such a layer is a sum like a residual add, so
    the layer after it is fed by a merge, as when the positions come as an input and the embeddings are added by
    an Add: a model places new blocks alike whichever way it reads its positions."""
    return np.array([traits(int(k)).affine and not (graph.attrs[i] if i < len(graph.attrs) else {}).get("scales", True)
                     for i, k in enumerate(graph.layer_kind.tolist())], dtype=bool)


def _local_edge_costs(graph: LayerGraph, preds: list[list[int]]) -> np.ndarray:
    """The edge cost each layer gets from the ops right before it (see :func:`_edge_costs`)."""
    layer_of = _layer_of(graph)
    summed = np.zeros(graph.num_nodes, dtype=bool)
    summed[graph.layer_node] = _adds_a_table(graph)
    nonlinear = _NONLINEAR_MASK[graph.kind].tolist()
    through = _between_layers(graph, layer_of).tolist()
    out = np.zeros(graph.num_layers, dtype=np.int64)
    for li, node in enumerate(graph.layer_node.tolist()):
        end, stopped, passed = walk(node, preds, through)
        if end == node or (summed[end] and not passed):
            continue  # fed by a merge or the input, or by a layer that adds a table: a boundary
        # a layer, or a node of several inputs (attention's products, gating), is inside a block; a merge or the
        # graph input is not
        inside = layer_of[end] >= 0 if stopped else len(preds[end]) > 1
        if inside:
            out[li] = _EDGE_NONLINEAR if any(nonlinear[v] for v in passed) else _EDGE_INSIDE
    return out


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
            prole: dict[str, list[str]] = {}
            for r in parent.tensors[pi] if pi >= 0 else ():
                prole.setdefault(r.role, []).append(r.key)
            seen: dict[str, int] = {}
            for r in refs:  # the pieces of a role (TensorRef.span) pair in order
                keys, i = prole.get(r.role, []), seen.get(r.role, 0)
                seen[r.role] = i + 1
                out[r.key] = keys[min(i, len(keys) - 1)] if keys else None
        return out


# ---------------------------------------------------------------------------------------------- public API

def _arrays(g: GraphLike | MatchArrays, rules: MatchRules) -> MatchArrays:
    return g if isinstance(g, MatchArrays) else match_arrays(as_graph(g), rules)


class _Scored(NamedTuple):
    """What scoring reads of a graph: a MatchArrays without the alignment's tie-break costs, whose pass over the
    graph's nodes in Python costs more than the compiled score itself."""

    cls: np.ndarray
    shape: np.ndarray
    vectors: np.ndarray
    total: int

    @property
    def n(self) -> int:
        return int(self.cls.shape[0])


def _scored(g: GraphLike | MatchArrays, rules: MatchRules) -> MatchArrays | _Scored:
    if isinstance(g, MatchArrays):
        return g
    graph = as_graph(g)
    return _Scored(np.ascontiguousarray(rules.node_class(graph), dtype=np.int32),
                   np.ascontiguousarray(graph.shape, dtype=np.int64),
                   np.ascontiguousarray(graph.vectors, dtype=np.int64), int(graph.score_total))


def similarity(parent: GraphLike, child: GraphLike, rules: MatchRules = DEFAULT_RULES) -> float:
    """Fraction of the child's trainable parameter elements inherited from the parent, in [0, 1].

    Example:
        >>> keeper.similarity(resnet18_onnx, resnet10_onnx)  # doctest: +SKIP
        1.0
    """
    p, c = _scored(parent, rules), _scored(child, rules)
    if c.total <= 0:
        return 0.0
    row = np.zeros(p.n + 1, dtype=np.int64)
    v = dp_value(c.cls, c.shape, c.vectors, p.cls, p.shape, p.vectors, row)
    return min(1.0, int(v) / c.total)


def align(parent: GraphLike, child: GraphLike, rules: MatchRules = DEFAULT_RULES) -> Alignment:
    """The layer mapping of ``child`` onto ``parent`` and its score (see :class:`Alignment`).

    Example:
        >>> a = keeper.align(parent_graph, child_graph)  # doctest: +SKIP
        >>> a.score, a.pairs[:4]                          # doctest: +SKIP
    """
    p, c = _arrays(parent, rules), _arrays(child, rules)
    v, pairs = dp_pairs(c.cls, c.shape, c.vectors, c.skip, c.edge, c.context, c.feeds, p.cls, p.shape, p.vectors,
                         p.skip, p.edge, p.context, p.feeds)
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
    c = _scored(child, rules)
    packed = parents if isinstance(parents, PackedParents) else PackedParents.pack([_scored(p, rules) for p in parents])
    out = np.zeros(packed.offsets.shape[0] - 1, dtype=np.int64)
    if c.total <= 0 or out.shape[0] == 0:
        return out.astype(np.float64)
    dp_batch(c.cls, c.shape, c.vectors, packed.cls, packed.shape, packed.vectors, packed.offsets, out)
    return np.minimum(out / c.total, 1.0)


def signature(g: GraphLike | MatchArrays, rules: MatchRules = DEFAULT_RULES) -> np.ndarray:
    """Trainable elements per layer class, folded into ``SIGNATURE_SIZE`` bins (int64) by a multiplicative hash
    (classes are sparse codes; folding them by a modulus would put whole families of them in one bin)."""
    a = _scored(g, rules)
    per_layer = np.prod(a.shape, axis=1) + a.vectors * a.shape[:, 0]
    mixed = a.cls.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the top bits are mixed
    bins = (mixed >> np.uint64(65 - SIGNATURE_SIZE.bit_length())).astype(np.int64)
    return np.bincount(bins, weights=per_layer, minlength=SIGNATURE_SIZE).astype(np.int64)


def upper_bounds(parent_signatures: np.ndarray, child: GraphLike | MatchArrays,
                 rules: MatchRules = DEFAULT_RULES, rows: np.ndarray | None = None) -> np.ndarray:
    """Cheap filter: an upper bound of ``similarity(parent_k, child)`` for every row of ``parent_signatures`` (or
    for ``rows`` of it, in that order).

    A bound below a threshold means the parent definitely scores below it; a bound above promises nothing.
    Only the child's non-empty bins are read (the others add ``min(parent, 0) = 0``), so a column-major
    (Fortran-ordered) ``parent_signatures`` of a large zoo costs a few columns, not all of them.
    """
    a = _scored(child, rules)
    sc = signature(a)
    n = parent_signatures.shape[0] if rows is None else len(rows)
    if a.total <= 0:
        return np.zeros(n)
    # column by column into one accumulator: a fancy-indexed (n, bins) copy and its temporaries cost 4-7x more
    # and, at 100,000 rows and more, page faults that made the slowest queries' bounds 10x the median
    acc = np.zeros(n, dtype=np.int64)
    part = np.empty_like(acc)
    for j in np.flatnonzero(sc).tolist():
        column = parent_signatures[:, j]
        np.minimum(column if rows is None else column[rows], sc[j], out=part)
        acc += part
    return np.minimum(acc / a.total, 1.0)
