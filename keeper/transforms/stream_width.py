"""A residual stream grown by a factor that does not divide, kept exact under its norms (LEMON, Wang et al., ICLR
2024): which child groups qualify, and how (:class:`StreamGrowth`; :mod:`keeper.transforms.compose` builds the
tensors).

Net2Net copies with uneven counts change what a norm over the units sees. LEMON's answer: copy every parent unit
the same number of times ``copies``, fill the remaining units so the norm's statistics stay the parent's, and
scale the whole stream by ``scale = sqrt(child_units / (copies * parent_units))`` so that ``eps`` is unchanged:

* under a **LayerNorm** (mean removed) the remaining units hold ``mean(x)``: the mean is ``scale * mean(x)`` and
  the variance the parent's; the norm's weight is divided by ``scale``, its remaining units and shift are 0;
* under an **RMSNorm** (written out in ops: ``x * 1 / sqrt(mean(x ** 2) + eps)``, then a weight) the remaining
  units hold 0: the mean of squares is the parent's, so the normalised copies are ``scale`` times the parent's;
  the weight is divided by ``scale`` and is 0 on the remaining units.

Invariant: :func:`stream_growth` returns a group only when every layer on it has a role the construction keeps
exact (written into, read after a norm, read raw through linear shape ops, or the norm itself), its norms are all
of one kind and each norm's output is read by layers only (pre-norm: the norm is not the stream).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from keeper.graph import LayerGraph
from keeper.graph.walk import walk
from keeper.kinds import Kind, traits
from keeper.transforms.correspondence import group_correspondence

__all__ = ["StreamGrowth", "stream_growth", "downstream"]


@dataclass(frozen=True)
class StreamGrowth:
    """A stream grown LEMON's way (see the module docstring). The group holds ``scale * [x copied `copies` times,
    fill]`` with ``fill`` "mean" (LayerNorms) or "zero" (RMSNorms). Layers writing the group (embeddings,
    projections into it, added tables) are multiplied by ``scale`` and their remaining units take the mean of their
    rows ("mean") or 0 ("zero"); the norms (LayerNorms, or the RMSNorm weights ``norm_weights``) are divided by
    ``scale`` and are 0 on the remaining units; layers reading a norm's output divide their copied inputs by
    ``copies`` and read 0 from the remaining units; layers reading the group itself (``raw_readers``) divide by
    ``scale`` too. ``reduces`` are the RMSNorms' means of squares (nodes), which read the units together exactly."""

    parent_units: int
    child_units: int
    copies: int
    scale: float
    raw_readers: frozenset[int]
    fill: str = "mean"
    norm_weights: frozenset[int] = frozenset()
    reduces: frozenset[int] = frozenset()

    def copied(self) -> np.ndarray:
        """The parent unit of each copied child unit (the first ``copies * parent_units``)."""
        return np.tile(np.arange(self.parent_units), self.copies)


def stream_growth(parent: LayerGraph, child: LayerGraph, pairs: np.ndarray, corr: dict[int, int] | None = None,
                  refused: dict[int, str] | None = None) -> dict[int, StreamGrowth]:
    """Child groups grown by a factor that does not divide that :class:`StreamGrowth` makes exact: read by at least
    one norm, LayerNorms or RMSNorms but not both, each norm's output read by layers only, and every layer on the
    group inherited and either writing it (a linear, conv or embedding into it, an added table), reading it with
    an input axis (after a norm, or the group itself through shape ops and means over positions), or a norm.
    Per-channel layers (BatchNorm, depthwise convs, layer scales) leave a group out (its filled units would not
    stay the fill). A group with norms that is left out gets the reason in ``refused`` (when given)."""
    pairs = np.asarray(pairs)
    corr = group_correspondence(parent, child, pairs) if corr is None else corr
    out: dict[int, StreamGrowth] = {}
    layer_of = np.full(child.num_nodes, -1, dtype=np.int64)
    layer_of[child.layer_node] = np.arange(child.num_layers)
    succ, preds = child.successors(), child.predecessor_lists()
    casts = (layer_of < 0) & (child.kind == int(Kind.ACTIVATION))
    scalar_ops = (layer_of < 0) & np.isin(child.kind, [int(Kind.ACTIVATION), int(Kind.MUL), int(Kind.ADD)])
    for cg, pg in corr.items():
        cs, ps = int(child.group_size[cg]), int(parent.group_size[pg])
        if ps <= 0 or cs <= ps or cs % ps == 0 or len(child.group_of_parts(cg)):
            continue
        on = np.flatnonzero((child.in_group == cg) | (child.out_group == cg)).tolist()
        layernorms = any(int(child.layer_kind[li]) == int(Kind.LAYERNORM) for li in on)
        rms = {li: r for li in on if (r := _rms_reduce(child, li, layer_of, preds, casts, scalar_ops)) is not None}
        if layernorms == bool(rms):  # no norm, or norms of both kinds
            if rms and refused is not None:
                refused[cg] = "LayerNorms and RMSNorms both read it"
            continue
        raw: set[int] = set()
        why = next((w for li in on if (w := _stream_role(child, li, cg, pairs, layer_of, succ, preds, raw, rms))),
                   "") or _fed_by_stream(child, cg, on, layer_of, preds)
        if why:
            if refused is not None:
                refused[cg] = why
            continue
        q = cs // ps
        out[cg] = StreamGrowth(ps, cs, q, float(np.sqrt(cs / (q * ps))), frozenset(raw),
                               "zero" if rms else "mean", frozenset(rms), frozenset(rms.values()))
    return out


def _rms_reduce(g: LayerGraph, li: int, layer_of: np.ndarray, preds: list[list[int]],
                casts: np.ndarray, scalar_ops: np.ndarray) -> int | None:
    """The mean-of-squares node when layer ``li`` is an RMSNorm's weight written out in ops, else None: a scaling
    PARAM fed (through casts) by ``x * f`` where ``f`` comes from a mean over the units of ``x`` (through a square
    and casts) by an ``eps`` added, a root and a reciprocal (nodes of one input each). ``casts`` and
    ``scalar_ops`` say per node whether a walk up goes through it (weightless activations; and products and
    sums)."""
    attrs = g.attrs[li] if li < len(g.attrs) else {}
    if int(g.layer_kind[li]) != int(Kind.PARAM) or not attrs.get("scales", True) or attrs.get("through"):
        return None

    def back(v: int, through: np.ndarray) -> int:  # the first node up from v (v included) that one does not pass
        return walk(v, preds, through, first=[v]).node

    node = int(g.layer_node[li])
    if len(preds[node]) != 1:
        return None
    m = back(preds[node][0], casts)
    if layer_of[m] >= 0 or int(g.kind[m]) != int(Kind.MUL) or len(preds[m]) != 2:
        return None
    for a, b in (preds[m], preds[m][::-1]):
        r = back(b, scalar_ops)
        if layer_of[r] < 0 and int(g.kind[r]) == int(Kind.REDUCE) and len(preds[r]) == 1 \
                and back(preds[r][0], casts) == back(a, casts):
            return r
    return None


# a SPLIT between a norm and a layer reading the norm's group takes positions (a class token), not units
_LINEAR_INPUT = frozenset(int(k) for k in (Kind.RESHAPE, Kind.TRANSPOSE, Kind.REDUCE, Kind.POOL, Kind.SPLIT))
_ON_THE_WAY = _LINEAR_INPUT | {int(Kind.ACTIVATION), int(Kind.RECTIFIER)}


def _stream_role(g: LayerGraph, li: int, group: int, pairs: np.ndarray, layer_of: np.ndarray,
                 succ: list[list[int]], preds: list[list[int]], raw: set[int], rms: dict[int, int]) -> str:
    """Why layer ``li`` on ``group`` has no role :class:`StreamGrowth` keeps exact ("" when it has one; a reader
    of the group itself is added to ``raw``; ``rms`` are the group's RMSNorm weights)."""
    name = repr(g.layer_names[li]) if li < len(g.layer_names) else f"#{li}"
    if pairs[li] < 0:
        return f"layer {name} on it is new"
    kind, t = int(g.layer_kind[li]), traits(int(g.layer_kind[li]))
    gi, go = int(g.in_group[li]), int(g.out_group[li])
    attrs = g.attrs[li] if li < len(g.attrs) else {}
    if kind == int(Kind.LAYERNORM) or li in rms:
        if _reaches_merge(int(g.layer_node[li]), g, layer_of, succ):
            return f"the output of norm {name} is the stream (post-norm: after the norm a filled unit cannot stay " \
                   "the fill)"
        return ""
    if kind == int(Kind.PARAM):
        if go == group and not attrs.get("scales", True):  # a table added to the group
            return ""
        return f"per-channel layer {name} scales it (a filled unit would not stay the fill)"
    if t.in_axis is not None and gi == group and go != group:
        return "" if _reads_stream(g, li, group, layer_of, preds, raw, rms) else \
            f"layer {name} reads it through an op other than shape ops and means over positions"
    if go == group and gi != group and (t.in_axis is not None or kind == int(Kind.EMBEDDING)):
        return ""
    return f"{Kind(kind).label} layer {name} acts on it channel by channel (a filled unit would not stay the fill)"


def _reads_stream(g: LayerGraph, li: int, group: int, layer_of: np.ndarray, preds: list[list[int]], raw: set[int],
                  rms: dict[int, int]) -> bool:
    """Whether layer ``li`` reads the stream after a norm (copies hold the parent's values and the filled units 0,
    so any elementwise op between keeps them) or the stream itself through linear ops only (added to ``raw``)."""
    cur, linear = int(g.layer_node[li]), True
    while len(preds[cur]) == 1 and layer_of[preds[cur][0]] < 0 and int(g.kind[preds[cur][0]]) in _ON_THE_WAY:
        cur = preds[cur][0]
        linear = linear and int(g.kind[cur]) in _LINEAR_INPUT
    if len(preds[cur]) != 1:
        return False
    src = preds[cur][0]
    if layer_of[src] >= 0 and (int(g.layer_kind[layer_of[src]]) == int(Kind.LAYERNORM) or int(layer_of[src]) in rms):
        return True
    writes = layer_of[src] >= 0 and int(g.out_group[layer_of[src]]) == group
    if linear and (writes or int(g.kind[src]) == int(Kind.ADD)):
        raw.add(li)
        return True
    return False


def _fed_by_stream(g: LayerGraph, group: int, on: list[int], layer_of: np.ndarray, preds: list[list[int]]) -> str:
    """Why not every layer reading ``group`` gets its input, through weightless nodes, from layers writing the group
    only ("" when all do): a layer whose output the extraction grouped apart, or a graph input, would bring units
    that are not filled."""
    for li in on:
        if int(g.in_group[li]) != group:
            continue
        seen: set[int] = set()
        stack = list(preds[int(g.layer_node[li])])
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            if layer_of[v] >= 0:
                if int(g.out_group[layer_of[v]]) != group:
                    w = int(layer_of[v])
                    return f"layer {g.layer_names[w]!r}, grouped apart from the stream, feeds it"
            elif not preds[v]:
                return "a graph input feeds it"
            else:
                stack.extend(preds[v])
    return ""


def _reaches_merge(node: int, g: LayerGraph, layer_of: np.ndarray, succ: list[list[int]]) -> bool:
    """Whether a norm's output meets a merge (a residual add: post-norm) before any layer."""
    def weightless(v: int) -> bool:
        return layer_of[v] < 0

    return any(weightless(v) and traits(int(g.kind[v])).merge is not None
               for v in downstream(node, succ, weightless))


def downstream(start: int, succ: list[list[int]], passes: Callable[[int], bool]) -> Iterator[int]:
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
