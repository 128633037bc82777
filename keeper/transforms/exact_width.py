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
  sides (each head grown inside, q scaled and k divided) or whole heads cloned; a q, k or v projection of its
  own whose output is reshaped into heads of the same size on both sides, by any factor (the map clones whole
  heads, the first ones once more; with grouped key-value heads when every such group grows its heads by the
  same factor, so each query head reads the clone of its parent's key-value head); one whose heads change size
  never; any other group by an integer factor only (its tiled map clones whole heads);
* an op keeper has no rule for: never claimed for a factor that does not divide;
* whatever the factor: a slice of the units (a chunk along channels: its parts are groups of their own, mapped
  apart from the units they cut), a grouped conv (copies leave their conv group) and a depthwise conv with a
  channel multiplier are never claimed;
* a group whose units a reshape spreads over three or more axes without being found packed (``attrs["unit_axes"]``:
  q, k, v as ``(3, heads, head size)`` unpacked in a way :mod:`keeper.graph` does not follow): only when every
  axis but the first keeps its size (the in-order copies then clone whole blocks of the first axis), else never.

Invariant: :func:`inexact_width` returns "" only when every grown child group either grows by an integer factor
(and its heads, packed or reshaped, clone whole) or flows only through readers for which the operators are exact
at its factor; otherwise it names the first group and reader that are not. ``tests/test_preservation.py`` walks growth
pairs and checks that what is claimed is exact.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from keeper.graph import LayerGraph
from keeper.graph.walk import walk
from keeper.kinds import Kind, traits
from keeper.transforms.correspondence import group_correspondence, group_heads, group_unit_axes, packed_groups
from keeper.transforms.stream_width import downstream, stream_growth

__all__ = ["inexact_width"]

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
    refused: dict[int, str] = {}
    streams = stream_growth(parent, child, pairs, corr, refused)
    cheads, pheads = group_heads(child), group_heads(parent)
    caxes, paxes = group_unit_axes(child), group_unit_axes(parent)
    factors = {Fraction(cheads[c], pheads[p]) for c, p in corr.items() if c in cheads and p in pheads}
    for cg, pg in sorted(corr.items()):
        cs, ps = int(child.group_size[cg]), int(parent.group_size[pg])
        why = _axes_why(child, cg, caxes.get(cg), paxes.get(pg), cs != ps)
        if why:
            return why
        hc, hp = cheads.get(cg, 0), pheads.get(pg, 0)
        if hc and hp and cs * hp != ps * hc and ps > 0:  # whatever the size: another head size is another function
            return f"channel group of {_writer_name(child, cg)} is split into heads of {ps // hp} -> {cs // hc} " \
                   "units (each head's attention changes)"
        if cs <= ps or ps <= 0 or cg in cpacked:
            continue
        uneven = cs % ps != 0
        what = (f"channel group of {_writer_name(child, cg)} ({ps} -> {cs} units"
                + (", a factor that does not divide)" if uneven else ")"))
        # whole heads of one size cloned: attention's products compute the parent heads' (see the docstring); a
        # table with one unit per head (a relative-position bias) is cloned with them
        # (a stream grown LEMON's way is filled, not cloned)
        cloned = len(factors) == 1 and cg not in streams and \
            (bool(hc and hp) or _per_head_table(child, cg, ps, cs, cheads, pheads, corr))
        if uneven and hc and hp and not cloned:
            return f"{what} is split into heads whose number grows by {len(factors)} factors (grouped key-value " \
                   "heads would read other heads' clones)"
        for li in np.flatnonzero((child.in_group == cg) | (child.out_group == cg)).tolist():
            why = _layer_why(child, li, cg, uneven and cg not in streams)
            if why:
                return f"{what} {why}" + (f"; it cannot grow LEMON's way: {refused[cg]}" if cg in refused else "")
        for li in np.flatnonzero(child.out_group == cg).tolist():
            norms = streams[cg].reduces if cg in streams else frozenset()
            why = _flow_why(int(child.layer_node[li]), cg, (uneven, cloned, norms), sizes, child, layer_of, succ,
                            preds)
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


def _axes_why(child: LayerGraph, cg: int, cu: tuple | None, pu: tuple | None, grown: bool) -> str:
    """Why a group whose units a reshape spreads over three or more axes, in a layout not found packed (q, k, v
    as ``(3, heads, head size)`` unpacked otherwise), does not keep its function ("" when it does): the unit map
    copies units in order (child unit j is parent unit j mod the parent's units), so the copies line up with the
    child's axes only when every axis but the first keeps its size (whole blocks of the first axis cloned)."""
    if not (cu or pu) or (cu == pu and not grown):
        return ""
    if cu and pu and len(cu) == len(pu) and cu[1:] == pu[1:] and min(cu + pu) > 0:
        return ""
    return f"channel group of {_writer_name(child, cg)} is reshaped into axes {pu or '?'} -> {cu or '?'}: a layout " \
           "keeper does not follow (copies of units would land in other parts or heads)"


def _packed_why(child: LayerGraph, parent: LayerGraph, cg: int, pg: int, cpacked: dict, ppacked: dict) -> str:
    """Why the heads of a packed projection do not grow exactly ("" when they do or the group is not packed)."""
    if cg not in cpacked:
        return ""
    cparts, pparts = child.group_of_parts(cg).tolist(), parent.group_of_parts(pg).tolist()
    name = _writer_name(child, cg)
    if int(child.group_size[cg]) == int(parent.group_size[pg]) and len(cparts) == len(pparts):
        if pg not in ppacked or cpacked[cg]["heads"] == ppacked[pg]["heads"]:
            return ""
        return f"packed projection {name}: heads {ppacked[pg]['heads']} -> {cpacked[cg]['heads']} of another size"
    if pg not in ppacked or len(cparts) != len(pparts):
        return f"packed projection {name} takes a parent projection packed otherwise"
    dots = [d for d in cpacked[cg].get("dots", []) if d in ppacked[pg].get("dots", [])]
    for j, (cp, pp) in enumerate(zip(cparts, pparts)):
        hc, hp = int(cpacked[cg]["heads"][j]), int(ppacked[pg]["heads"][j])
        cs, ps = int(child.group_size[cp]), int(parent.group_size[pp])
        if (hp >= 1 and hc > hp and cs * hp == ps * hc) or (cs == ps and hc == hp):
            continue  # whole heads cloned (some once more than others), or the part as it is
        cut = j in cpacked[cg].get("cut", []) or j in ppacked[pg].get("cut", [])
        if hc == hp and (dots or hc == 1) and not cut:
            # each head grown inside: q scaled and k divided along the q . k found (v read divided); a part in
            # no heads (a GLU's chunk) grows as any group does
            continue
        if hc == hp:  # q . k not found, or the head's units cut apart (RoPE's halves): the attention changes
            return f"packed projection {name}: heads of part {j} grow inside ({ps // hp} -> {cs // hc} units) " \
                   + ("and their units are sliced (rotary halves)" if cut else
                      "with no q . k product found between its parts (the attention's scale would change)")
        return f"packed projection {name}: heads {hp} -> {hc} of part {j} are not cloned whole"
    return ""


def _flow_why(start: int, group: int, growth: tuple[bool, bool, frozenset[int]], sizes: dict[int, tuple[int, int]],
              g: LayerGraph, layer_of: np.ndarray, succ: list[list[int]], preds: list[list[int]]) -> str:
    """The first weightless node downstream of layer node ``start`` (up to the next layers) that reads the grown
    ``group``'s units together, described ("" when none does). ``growth`` is (uneven: a factor that does not
    divide, cloned: the group is split into whole heads, norms: the means of squares of RMSNorms its stream growth
    keeps exact). Growth by an integer factor is only checked for slices of the units: its tiled map keeps norms'
    statistics and clones whole heads, so the walk stops at attention's products; so does growth of a group
    cloned into whole heads, by any factor."""
    uneven, cloned, norms = growth
    whole_heads = not uneven or cloned

    def passes(v: int) -> bool:  # the walk goes on past weightless nodes, and past attention's products if uneven
        return layer_of[v] < 0 and not (whole_heads and int(g.kind[v]) == int(Kind.MATMUL))

    for v in downstream(start, succ, passes):
        k = int(g.kind[v])
        if layer_of[v] >= 0 or (cloned and k == int(Kind.MATMUL)):
            continue
        if k == int(Kind.SPLIT):
            if _slices_units(v, group, uneven, sizes, g, layer_of, succ):
                return "a slice of its units (a split along channels)"
        elif k == int(Kind.REDUCE):
            if uneven and v not in norms and _recombined(v, g, layer_of, succ, preds):
                return "a norm written out in ops (a mean over the units recombined with them)"
        elif k == int(Kind.SOFTMAX) and cloned and _scores_plus(v, g, layer_of, preds):
            continue  # a per-head bias added to attention's scores: the softmax is over positions
        elif uneven and k not in _UNITWISE:  # attention's products among them (not unitwise)
            return _READS_TOGETHER.get(k, f"a {Kind(k).label} node")
    return ""


def _per_head_table(g: LayerGraph, group: int, ps: int, cs: int, cheads: dict[int, int], pheads: dict[int, int],
                    corr: dict[int, int]) -> bool:
    """Whether ``group`` holds one unit per attention head: written only by tables (embeddings, added tables) and
    sized as the heads of a projection split into heads, on both sides."""
    writers = np.flatnonzero(g.out_group == group)
    return len(writers) > 0 and all(int(g.layer_kind[li]) in (int(Kind.EMBEDDING), int(Kind.PARAM))
                                    for li in writers.tolist()) \
        and any(cheads[c] == cs and pheads[p] == ps for c, p in corr.items() if c in cheads and p in pheads)


def _scores_plus(softmax: int, g: LayerGraph, layer_of: np.ndarray, preds: list[list[int]]) -> bool:
    """Whether the softmax reads attention's scores (a product of two activations) with something added: through
    one-input weightless nodes (a scale, a mask), an added table (a PARAM that does not scale) or an Add of the
    scores and another tensor."""
    tables = [int(g.layer_node[li]) for li in range(g.num_layers) if _added_table(g, li)]
    through = layer_of < 0
    through[tables] = True

    def scores(v: int) -> bool:
        return layer_of[v] < 0 and int(g.kind[v]) == int(Kind.MATMUL)

    up = walk(softmax, preds, through)
    top = up.node
    if layer_of[top] < 0 and int(g.kind[top]) == int(Kind.ADD) and len(preds[top]) == 2:
        return any(scores(walk(top, preds, through, first=[p]).node) for p in preds[top])
    return scores(top) and bool(set(up.passed) & set(tables))


def _added_table(g: LayerGraph, li: int) -> bool:
    attrs = g.attrs[li] if li < len(g.attrs) else {}
    return int(g.layer_kind[li]) == int(Kind.PARAM) and not attrs.get("scales", True)


def _slices_units(s: int, group: int, uneven: bool, sizes: dict[int, tuple[int, int]], g: LayerGraph,
                  layer_of: np.ndarray, succ: list[list[int]]) -> bool:
    """Whether slice node ``s`` cuts ``group``'s units: a layer it reaches (before attention's products) reads
    another group than ``group`` or a concatenation with ``group`` among its parts. A slice over positions (a
    roll, patch merging, a class token taken) keeps the units; when it opens a group of its own, that group has
    the same (parent, child) sizes (``sizes``), and an integer factor maps every group of those sizes alike (the
    tiled map), so only a factor that does not divide needs the group itself."""
    def passes(v: int) -> bool:  # weightless nodes other than attention's products
        return layer_of[v] < 0 and int(g.kind[v]) != int(Kind.MATMUL)

    for v in downstream(s, succ, passes):
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

    order = [v for v in downstream(r, succ, weightless) if weightless(v)]
    derived = {r, *order}
    # a node fed by the reduce's result and by a tensor that is not (inputs computed from it are in ``derived``)
    return any(len(preds[v]) > 1 and any(p not in derived for p in preds[v]) for v in order)


def _writer_name(g: LayerGraph, group: int) -> str:
    """A layer writing the group, by name, for messages."""
    for li in np.flatnonzero(g.out_group == group).tolist():
        return repr(g.layer_names[li]) if li < len(g.layer_names) else f"#{li}"
    return f"#{group}"
