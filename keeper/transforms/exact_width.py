"""Which width growth the width operators make exact, read from the two graphs and an alignment (no weight read).

Net2Net copying (:func:`keeper.transforms.width.unit_map`; the next layer's inputs divided by the copy counts)
keeps a layer pair's function whatever the factor, as long as everything the grown units flow through between
the two layers acts unit by unit or sums units linearly: activations, per-channel layers (BatchNorm, depthwise
convs, biases and layer scales), residual adds and products of two tensors of the same units, pools and means
over positions, reshapes and concatenations. What reads a group's units *together* in another way keeps the
function only under conditions on the factor:

* a norm over the units (a LayerNorm; a mean over the units recombined with them, as RMSNorm and LayerNorm
  written out in ops): it sees the parent's statistics only when every unit is copied equally often, that is
  when the group grows by an integer factor (HyperCloning);
* a dot product or a softmax over the units (attention): a packed q/k/v projection with the same heads on both
  sides (each head grown inside, q scaled and k divided) or whole heads cloned an integer number of times; a
  plain group by an integer factor only (its tiled map clones whole heads);
* an op keeper has no rule for: never claimed for a factor that does not divide;
* whatever the factor: a slice of the units (a chunk along channels: its parts are groups of their own, mapped
  apart from the units they cut), a grouped conv (copies leave their conv group) and a depthwise conv with a
  channel multiplier are never claimed.

Invariant: :func:`inexact_width` returns "" only when every grown child group either grows by an integer factor
(and its packed heads clone whole) or flows only through readers for which the operators are exact at its
factor; otherwise it names the first group and reader that are not. ``tests/test_preservation.py`` walks growth
pairs and checks that what is claimed is exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from keeper.graph import LayerGraph
from keeper.kinds import Kind, traits
from keeper.transforms.correspondence import group_correspondence, packed_groups

__all__ = ["inexact_width", "StreamGrowth", "stream_growth"]

# weightless kinds that act unit by unit, sum units linearly or only move them (see the module docstring)
_UNITWISE = frozenset(int(k) for k in (Kind.ACTIVATION, Kind.RECTIFIER, Kind.ADD, Kind.MUL, Kind.POOL,
                                       Kind.RESHAPE, Kind.TRANSPOSE, Kind.CONCAT))
_READS_TOGETHER = {int(Kind.MATMUL): "a product of two activations over them (attention)",
                   int(Kind.SOFTMAX): "a softmax over them", int(Kind.OTHER): "an op keeper has no rule for"}


def inexact_width(parent: LayerGraph, child: LayerGraph, pairs: np.ndarray) -> str:
    """Why warming ``child`` from ``parent`` along ``pairs`` (the alignment's, -1 for new layers) cannot keep the
    parent's function because of how some channel group grows ("" when every growth is exact; see the module
    docstring)."""
    pairs = np.asarray(pairs)
    corr = group_correspondence(parent, child, pairs)
    cpacked, ppacked = packed_groups(child), packed_groups(parent)
    for cg, pg in sorted(corr.items()):
        why = _packed_why(child, parent, cg, pg, cpacked, ppacked)
        if why:
            return why
    layer_of = np.full(child.num_nodes, -1, dtype=np.int64)
    layer_of[child.layer_node] = np.arange(child.num_layers)
    succ, preds = child.successors(), child.predecessor_lists()
    sizes = {c: (int(parent.group_size[p]), int(child.group_size[c])) for c, p in corr.items()}
    streams = stream_growth(parent, child, pairs, corr)
    for cg, pg in sorted(corr.items()):
        cs, ps = int(child.group_size[cg]), int(parent.group_size[pg])
        if cs <= ps or ps <= 0 or cg in cpacked:
            continue
        uneven = cs % ps != 0
        what = (f"channel group of {_writer_name(child, cg)} ({ps} -> {cs} units"
                + (", a factor that does not divide)" if uneven else ")"))
        for li in np.flatnonzero((child.in_group == cg) | (child.out_group == cg)).tolist():
            why = _layer_why(child, li, cg, uneven and cg not in streams)
            if why:
                return f"{what} {why}"
        for li in np.flatnonzero(child.out_group == cg).tolist():
            why = _flow_why(int(child.layer_node[li]), cg, uneven, sizes, child, layer_of, succ, preds)
            if why:
                return f"{what} flows into {why}"
    return ""


def _layer_why(g: LayerGraph, li: int, group: int, uneven: bool) -> str:
    """Why layer ``li`` reading or writing the grown ``group`` breaks the copies ("" when it does not)."""
    kind, name = int(g.layer_kind[li]), repr(g.layer_names[li]) if li < len(g.layer_names) else f"#{li}"
    if uneven and traits(kind).normalizes:
        return f"is normalised by LayerNorm {name}"
    if kind in (int(Kind.CONV), int(Kind.CONVT)) and int(g.conv_groups[li]) > 1 and int(g.in_group[li]) == group:
        return f"feeds grouped conv {name} (copies leave their conv group)"
    if kind == int(Kind.DWCONV) and int(g.shape[li, 0]) != int(g.conv_groups[li]):
        return f"feeds depthwise conv {name} with a channel multiplier"
    return ""


def _packed_why(child: LayerGraph, parent: LayerGraph, cg: int, pg: int, cpacked: dict, ppacked: dict) -> str:
    """Why the heads of a packed projection do not grow exactly ("" when they do or the group is not packed)."""
    if cg not in cpacked:
        return ""
    cparts, pparts = child.group_of_parts(cg).tolist(), parent.group_of_parts(pg).tolist()
    if int(child.group_size[cg]) == int(parent.group_size[pg]) and len(cparts) == len(pparts):
        return ""
    name = _writer_name(child, cg)
    if pg not in ppacked or len(cparts) != len(pparts):
        return f"packed projection {name} takes a parent projection packed otherwise"
    for j, (cp, pp) in enumerate(zip(cparts, pparts)):
        hc, hp = int(cpacked[cg]["heads"][j]), int(ppacked[pg]["heads"][j])
        cs, ps = int(child.group_size[cp]), int(parent.group_size[pp])
        if hc == hp or (hp >= 1 and hc > hp and cs * hp == ps * hc):
            continue  # each head grown inside, or whole heads cloned (some once more than others)
        return f"packed projection {name}: heads {hp} -> {hc} of part {j} are not cloned whole"
    return ""


def _flow_why(start: int, group: int, uneven: bool, sizes: dict[int, tuple[int, int]], g: LayerGraph,
              layer_of: np.ndarray, succ: list[list[int]], preds: list[list[int]]) -> str:
    """The first weightless node downstream of layer node ``start`` (up to the next layers) that reads the grown
    ``group``'s units together, described ("" when none does). Growth by an integer factor is only checked for
    slices of the units: its tiled map keeps norms' statistics and clones whole heads, so the walk stops at
    attention's products."""
    def passes(v: int) -> bool:  # the walk goes on past weightless nodes, and past attention's products if uneven
        return layer_of[v] < 0 and (uneven or int(g.kind[v]) != int(Kind.MATMUL))

    for v in _downstream(start, succ, passes):
        if layer_of[v] >= 0:
            continue
        k = int(g.kind[v])
        if k == int(Kind.SPLIT):
            if _slices_units(v, group, uneven, sizes, g, layer_of, succ):
                return "a slice of its units (a split along channels)"
        elif k == int(Kind.REDUCE):
            if uneven and _recombined(v, g, layer_of, succ, preds):
                return "a norm written out in ops (a mean over the units recombined with them)"
        elif uneven and k not in _UNITWISE:  # attention's products among them (not unitwise)
            return _READS_TOGETHER.get(k, f"a {Kind(k).label} node")
    return ""


def _slices_units(s: int, group: int, uneven: bool, sizes: dict[int, tuple[int, int]], g: LayerGraph,
                  layer_of: np.ndarray, succ: list[list[int]]) -> bool:
    """Whether slice node ``s`` cuts ``group``'s units: a layer it reaches (before attention's products) reads
    another group than ``group`` or a concatenation with ``group`` among its parts. A slice over positions (a
    roll, patch merging, a class token taken) keeps the units; when it opens a group of its own, that group has
    the same (parent, child) sizes (``sizes``), and an integer factor maps every group of those sizes alike (the
    tiled map), so only a factor that does not divide needs the group itself."""
    def passes(v: int) -> bool:  # weightless nodes other than attention's products
        return layer_of[v] < 0 and int(g.kind[v]) != int(Kind.MATMUL)

    for v in _downstream(s, succ, passes):
        li = int(layer_of[v])
        if li >= 0 and int(g.kind[v]) != int(Kind.MATMUL):
            gi = int(g.in_group[li])
            if gi != group and group not in g.group_of_parts(gi).tolist() and \
                    (uneven or sizes.get(gi) != sizes[group]):
                return True
    return False


def _recombined(r: int, g: LayerGraph, layer_of: np.ndarray, succ: list[list[int]], preds: list[list[int]]) -> bool:
    """Whether what reduce node ``r`` computes meets, before any layer, a tensor it was not computed from: a norm
    (x - mean(x), x / rms(x)), as opposed to a pool (a mean over positions read by the next layer)."""
    def weightless(v: int) -> bool:
        return layer_of[v] < 0

    order = [v for v in _downstream(r, succ, weightless) if weightless(v)]
    derived = {r, *order}
    # a node fed by the reduce's result and by a tensor that is not (inputs computed from it are in ``derived``)
    return any(len(preds[v]) > 1 and any(p not in derived for p in preds[v]) for v in order)


def _writer_name(g: LayerGraph, group: int) -> str:
    """A layer writing the group, by name, for messages."""
    for li in np.flatnonzero(g.out_group == group).tolist():
        return repr(g.layer_names[li]) if li < len(g.layer_names) else f"#{li}"
    return f"#{group}"


@dataclass(frozen=True)
class StreamGrowth:
    """A channel group grown by a factor that does not divide under LayerNorms, made exact LEMON's way (Wang et al.,
    ICLR 2024), scaled so that the norms see the parent's statistics, ``eps`` included.

    The grown group holds ``scale * [x copied `copies` times, mean(x) in each remaining unit]``: its mean is
    ``scale * mean(x)`` and, with ``scale = sqrt(child_units / (copies * parent_units))``, its variance is the
    parent's exactly, so a LayerNorm over it gives ``scale`` times the parent's normalised units (its weight is
    divided by ``scale``; the mean units normalise to 0, their weight and shift are 0). Layers writing the group
    (embeddings, projections into it, added tables) are multiplied by ``scale`` and their mean units take the mean
    of their rows; layers reading a norm's output divide their copied inputs by ``copies`` and read 0 from the mean
    units; layers reading the group itself (``raw_readers``) divide by ``scale`` too.
    """

    parent_units: int
    child_units: int
    copies: int
    scale: float
    raw_readers: frozenset[int]

    def copied(self) -> np.ndarray:
        """The parent unit of each copied child unit (the first ``copies * parent_units``)."""
        return np.tile(np.arange(self.parent_units), self.copies)


def stream_growth(parent: LayerGraph, child: LayerGraph, pairs: np.ndarray,
                  corr: dict[int, int] | None = None) -> dict[int, StreamGrowth]:
    """Child groups grown by a factor that does not divide that :class:`StreamGrowth` makes exact: read by at least
    one LayerNorm, each norm's output read by layers only (pre-LN: the norm is not the stream), and every layer on
    the group inherited and either writing it (a linear, conv or embedding into it, an added table), reading it
    with an input axis (after a norm, or the group itself through shape ops and means over positions), or a
    LayerNorm. A norm written out in ops (RMSNorm) and per-channel layers (BatchNorm, depthwise convs, layer
    scales) leave a group out (their mean units would not stay the mean)."""
    pairs = np.asarray(pairs)
    corr = group_correspondence(parent, child, pairs) if corr is None else corr
    out: dict[int, StreamGrowth] = {}
    layer_of = np.full(child.num_nodes, -1, dtype=np.int64)
    layer_of[child.layer_node] = np.arange(child.num_layers)
    succ, preds = child.successors(), child.predecessor_lists()
    for cg, pg in corr.items():
        cs, ps = int(child.group_size[cg]), int(parent.group_size[pg])
        if ps <= 0 or cs <= ps or cs % ps == 0 or len(child.group_of_parts(cg)):
            continue
        on = np.flatnonzero((child.in_group == cg) | (child.out_group == cg)).tolist()
        if not any(int(child.layer_kind[li]) == int(Kind.LAYERNORM) for li in on):
            continue
        raw: set[int] = set()
        if all(_stream_role(child, li, cg, pairs, layer_of, succ, preds, raw) for li in on):
            q = cs // ps
            out[cg] = StreamGrowth(ps, cs, q, float(np.sqrt(cs / (q * ps))), frozenset(raw))
    return out


_LINEAR_INPUT = frozenset(int(k) for k in (Kind.RESHAPE, Kind.TRANSPOSE, Kind.REDUCE, Kind.POOL))
_ON_THE_WAY = _LINEAR_INPUT | {int(Kind.ACTIVATION), int(Kind.RECTIFIER)}


def _stream_role(g: LayerGraph, li: int, group: int, pairs: np.ndarray, layer_of: np.ndarray,
                 succ: list[list[int]], preds: list[list[int]], raw: set[int]) -> bool:
    """Whether layer ``li`` on ``group`` has a role :class:`StreamGrowth` keeps exact (a reader of the group itself
    is added to ``raw``)."""
    if pairs[li] < 0:
        return False
    kind, t = int(g.layer_kind[li]), traits(int(g.layer_kind[li]))
    gi, go = int(g.in_group[li]), int(g.out_group[li])
    attrs = g.attrs[li] if li < len(g.attrs) else {}
    if kind == int(Kind.LAYERNORM):
        return not _reaches_merge(int(g.layer_node[li]), g, layer_of, succ)
    if kind == int(Kind.PARAM):
        return go == group and not attrs.get("scales", True)  # a table added to the group
    if t.in_axis is not None and gi == group and go != group:
        # a norm's output: copies hold the parent's values and the mean units 0, so any elementwise op between
        # keeps them (the reader reads 0 from the mean units); the stream itself only through linear ops
        cur, linear = int(g.layer_node[li]), True
        while len(preds[cur]) == 1 and layer_of[preds[cur][0]] < 0 and int(g.kind[preds[cur][0]]) in _ON_THE_WAY:
            cur = preds[cur][0]
            linear = linear and int(g.kind[cur]) in _LINEAR_INPUT
        if len(preds[cur]) != 1:
            return False
        src = preds[cur][0]
        if layer_of[src] >= 0 and int(g.layer_kind[layer_of[src]]) == int(Kind.LAYERNORM):
            return True
        if linear and (layer_of[src] >= 0 and int(g.out_group[layer_of[src]]) == group
                       or int(g.kind[src]) == int(Kind.ADD)):
            raw.add(li)
            return True
        return False
    return go == group and gi != group and (t.in_axis is not None or kind == int(Kind.EMBEDDING))


def _reaches_merge(node: int, g: LayerGraph, layer_of: np.ndarray, succ: list[list[int]]) -> bool:
    """Whether a norm's output meets a merge (a residual add: post-LN) before any layer."""
    def weightless(v: int) -> bool:
        return layer_of[v] < 0

    return any(weightless(v) and traits(int(g.kind[v])).merge is not None
               for v in _downstream(node, succ, weightless))


def _downstream(start: int, succ: list[list[int]], passes: Callable[[int], bool]) -> Iterator[int]:
    """The nodes reachable from ``start``'s successors, each once, depth first; the walk goes on past a node only
    where ``passes`` says so (the nodes it stops at are yielded too)."""
    seen: set[int] = set()
    stack = list(succ[start])
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        yield v
        if passes(v):
            stack.extend(succ[v])
