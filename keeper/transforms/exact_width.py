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

import numpy as np

from keeper.graph import LayerGraph
from keeper.kinds import Kind
from keeper.transforms.compose import group_correspondence, packed_groups

__all__ = ["inexact_width"]

# weightless kinds that act unit by unit, sum units linearly or only move them (see the module docstring)
_UNITWISE = frozenset(int(k) for k in (Kind.ACTIVATION, Kind.ADD, Kind.MUL, Kind.POOL, Kind.RESHAPE,
                                       Kind.TRANSPOSE, Kind.CONCAT))
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
    for cg, pg in sorted(corr.items()):
        cs, ps = int(child.group_size[cg]), int(parent.group_size[pg])
        if cs <= ps or ps <= 0 or cg in cpacked:
            continue
        uneven = cs % ps != 0
        what = (f"channel group of {_writer_name(child, cg)} ({ps} -> {cs} units"
                + (", a factor that does not divide)" if uneven else ")"))
        for li in np.flatnonzero((child.in_group == cg) | (child.out_group == cg)).tolist():
            why = _layer_why(child, li, cg, uneven)
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
    if uneven and kind == int(Kind.LAYERNORM):
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
        if hc == hp or (hp >= 1 and hc > hp and hc % hp == 0 and cs * hp == ps * hc):
            continue  # each head grown inside, or whole heads cloned
        return f"packed projection {name}: heads {hp} -> {hc} of part {j} are not cloned whole"
    return ""


def _flow_why(start: int, group: int, uneven: bool, sizes: dict[int, tuple[int, int]], g: LayerGraph,
              layer_of: np.ndarray, succ: list[list[int]], preds: list[list[int]]) -> str:
    """The first weightless node downstream of layer node ``start`` (up to the next layers) that reads the grown
    ``group``'s units together, described ("" when none does). Growth by an integer factor is only checked for
    slices of the units: its tiled map keeps norms' statistics and clones whole heads, so the walk stops at
    attention's products."""
    seen: set[int] = set()
    stack = list(succ[start])
    while stack:
        v = stack.pop()
        if v in seen or layer_of[v] >= 0:
            continue
        seen.add(v)
        k = int(g.kind[v])
        if k == int(Kind.SPLIT):
            if _slices_units(v, group, uneven, sizes, g, layer_of, succ):
                return "a slice of its units (a split along channels)"
        elif k == int(Kind.REDUCE):
            if uneven and _recombined(v, g, layer_of, succ, preds):
                return "a norm written out in ops (a mean over the units recombined with them)"
        elif k == int(Kind.MATMUL) and not uneven:
            continue
        elif uneven and k not in _UNITWISE:
            return _READS_TOGETHER.get(k, f"a {Kind(k).label} node")
        stack.extend(succ[v])
    return ""


def _slices_units(s: int, group: int, uneven: bool, sizes: dict[int, tuple[int, int]], g: LayerGraph,
                  layer_of: np.ndarray, succ: list[list[int]]) -> bool:
    """Whether slice node ``s`` cuts ``group``'s units: a layer it reaches (before attention's products) reads
    another group than ``group`` or a concatenation with ``group`` among its parts. A slice over positions (a
    roll, patch merging, a class token taken) keeps the units; when it opens a group of its own, that group has
    the same (parent, child) sizes (``sizes``), and an integer factor maps every group of those sizes alike (the
    tiled map), so only a factor that does not divide needs the group itself."""
    seen: set[int] = set()
    stack = list(succ[s])
    while stack:
        v = stack.pop()
        if v in seen or int(g.kind[v]) == int(Kind.MATMUL):
            continue
        seen.add(v)
        li = int(layer_of[v])
        if li >= 0:
            gi = int(g.in_group[li])
            if gi != group and group not in g.group_of_parts(gi).tolist() and \
                    (uneven or sizes.get(gi) != sizes[group]):
                return True
            continue
        stack.extend(succ[v])
    return False


def _recombined(r: int, g: LayerGraph, layer_of: np.ndarray, succ: list[list[int]], preds: list[list[int]]) -> bool:
    """Whether what reduce node ``r`` computes meets, before any layer, a tensor it was not computed from: a norm
    (x - mean(x), x / rms(x)), as opposed to a pool (a mean over positions read by the next layer)."""
    derived = {r}
    order = [r]
    stack = list(succ[r])
    while stack:
        v = stack.pop()
        if v in derived or layer_of[v] >= 0:
            continue
        derived.add(v)
        order.append(v)
        stack.extend(succ[v])
    # a node fed by the reduce's result and by a tensor that is not (inputs computed from it are in ``derived``)
    return any(len(preds[v]) > 1 and any(p not in derived for p in preds[v]) for v in order[1:])


def _writer_name(g: LayerGraph, group: int) -> str:
    """A layer writing the group, by name, for messages."""
    for li in np.flatnonzero(g.out_group == group).tolist():
        return repr(g.layer_names[li]) if li < len(g.layer_names) else f"#{li}"
    return f"#{group}"
