"""Channel groups: which layers' unit axes must share one channel indexing.

A conv's output, the BatchNorm after it, the residual stream it is added to and the next conv's input get one
group id; a concatenation along channels is a composite group made of its parts; a packed q/k/v projection's
output is a composite of its parts (:mod:`keeper.graph.packed`). Data nodes are visited in canonical order and
each kind has one handler (:data:`HANDLERS`) saying which group its output takes; weighted kinds share one
handler driven by their traits (:mod:`keeper.kinds`: an input axis opens a group for the input, a per-channel
layer keeps its input's group).

Invariant: group ids depend only on the canonical order and the graph (stored graphs keep them), so a handler
must open groups (``UnionFind.new``, or ``_Walk.group_in`` of a tensor no node produced) exactly as it always
has; changing that is a change to what extraction records, and ``LayerGraph.FORMAT`` must be bumped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import onnx

from keeper.errors import KeeperError
from keeper.graph.packed import PackedProjections, reshape_last_dim, reshape_tail
from keeper.graph.reader import ModelReader, attr
from keeper.graph.rules import NodeInfo
from keeper.graph.unionfind import UnionFind
from keeper.kinds import Kind, Traits, traits

__all__ = ["ChannelGroups", "channel_groups", "HANDLERS", "handler"]


@dataclass(frozen=True)
class ChannelGroups:
    """Compacted groups: sizes (-1 unknown or inconsistent), composite parts in CSR form, each layer's (input,
    output) group (-1 for none), the ``attrs["packed"]`` of packed projections by data node, the number of
    heads of groups reshaped into heads ``(..., heads, units / heads)`` (one q, k or v projection's output), and
    the axes of groups whose units a reshape spreads over three or more axes and that are not found packed
    (``(3, heads, units / (3 * heads))`` unpacked in a way keeper does not follow; -1 for a size not known)."""

    sizes: list[int]
    parts_indptr: list[int]
    parts: list[int]
    layer_groups: dict[int, tuple[int, int]]
    packed: dict[int, dict[str, Any]]
    heads: dict[int, int]
    unit_axes: dict[int, tuple[int, ...]]


class _Walk:
    """State of one pass: the union-find, the group of each tensor seen, and each layer's groups."""

    def __init__(self, reader: ModelReader, nodes: Sequence[onnx.NodeProto], info: Sequence[NodeInfo]):
        self.reader = reader
        self.uf = UnionFind()
        self.tensor_group: dict[str, int] = {}
        # tensor -> the axis holding its channels where known: -1 the last (transformers, linear layers), 1 the
        # second (convolutions); read by slices and concatenations to tell channels from positions
        self.channel_axis: dict[str, int] = {}
        self.layer_groups: dict[int, tuple[int, int]] = {}
        self.packed = PackedProjections(reader, nodes, info, self.uf, self.tensor_group)
        self.heads: list[tuple[int, int]] = []  # (group, heads) for each reshape of a group into heads
        self.unit_axes: list[tuple[int, tuple[int, ...]]] = []  # (group, axes) for each reshape into 3+ axes

    def group_in(self, name: str) -> int:
        """The group of tensor ``name``; a fresh group when no node produced it (a graph input)."""
        g = self.tensor_group.get(name)
        return self.uf.new() if g is None else g


# A handler gives the group of a node's output, or None when it assigned its outputs itself (a Split into parts).
Handler = Callable[[_Walk, int, onnx.NodeProto, NodeInfo, list[str], Optional[str]], Optional[int]]


def _layer(w: _Walk, i: int, n: onnx.NodeProto, d: NodeInfo, ins: list[str], out: str | None) -> int:
    """Any weighted kind, by its traits: an input axis opens (or joins) a group of ``in_units * groups`` channels
    and a new output group; a per-channel layer keeps its input's group; otherwise (embedding) no input group."""
    t: Traits = traits(d.kind)
    s, uf = d.shape, w.uf
    if t.in_axis is not None:
        gi = uf.sized(w.group_in(ins[0]), s[t.in_axis] * d.groups) if ins else -1
        g_out = uf.new(s[0])
    elif t.per_channel:
        gi = uf.sized(w.group_in(ins[0]), s[0]) if ins else uf.new(s[0])
        g_out = gi
    else:
        gi, g_out = -1, uf.new(s[0])
    w.layer_groups[i] = (gi, g_out)
    return g_out


def _linear(w: _Walk, i: int, n: onnx.NodeProto, d: NodeInfo, ins: list[str], out: str | None) -> int:
    """A linear layer, whose output may be a packed projection unpacked further down."""
    g_out = _layer(w, i, n, d, ins, out)
    if out:
        w.packed.linear_out[out] = i
    return g_out


def _elementwise(w: _Walk, i: int, n: onnx.NodeProto, d: NodeInfo, ins: list[str], out: str | None) -> int:
    """Add, Mul and the like: every data input shares the output's channels (a residual stream)."""
    if len(ins) < 2:
        return _pass(w, i, n, d, ins, out)
    g = w.group_in(ins[0])
    for x in ins[1:]:
        g = w.uf.union(g, w.group_in(x))
    return g


def _pass(w: _Walk, i: int, n: onnx.NodeProto, d: NodeInfo, ins: list[str], out: str | None) -> int:
    """The output keeps the channel group of the first data input."""
    return w.group_in(ins[0]) if ins else w.uf.new()


def _fresh(w: _Walk, i: int, n: onnx.NodeProto, d: NodeInfo, ins: list[str], out: str | None) -> int:
    """An output indexed by something else than its input's channels."""
    return w.uf.new()


def _split(w: _Walk, i: int, n: onnx.NodeProto, d: NodeInfo, ins: list[str], out: str | None) -> int | None:
    """A part of a packed projection takes its part group, a slice over positions its input's group; any other
    slice opens a group."""
    pk = w.packed
    if n.op_type == "Gather" and (pg := pk.gathered_part(n)) is not None:
        return pg
    if n.op_type == "SequenceAt" and (pg := pk.sequence_part(n)) is not None:
        return pg
    if n.op_type == "Split" and (pgs := pk.split_parts(n)) is not None:
        for o, pg in zip(n.output, pgs):
            w.tensor_group[o] = pg
        return None
    if n.op_type == "Gather" and ins and _off_channels(w, ins[0], [int(attr(n, "axis", 0))]):
        return w.group_in(ins[0])  # a position taken (a class token): the same units
    if n.op_type == "Slice" and ins and (pg := pk.sliced_part(n, _slice_axes(w.reader, n))) is not None:
        return pg
    if n.op_type == "Slice" and ins and _off_channels(w, ins[0], _slice_axes(w.reader, n)):
        return w.group_in(ins[0])  # a crop or one half of a roll over positions: the same units
    if ins and (part := pk.part(w.group_in(ins[0]))) is not None:
        pk.cut.add(part)  # a part's units cut apart (RoPE's halves): its heads may only be cloned whole
    return w.uf.new()


def _slice_axes(reader: ModelReader, n: onnx.NodeProto) -> list[int] | None:
    """The axes a Slice cuts: its constant ``axes`` input (opset 10 on) or attribute, by default the first
    ``len(starts)`` axes; None when not constant."""
    axes = reader.small_value(n.input[3]) if len(n.input) > 3 and n.input[3] else attr(n, "axes")
    if axes is None:
        starts = reader.small_value(n.input[1]) if len(n.input) > 1 and n.input[1] else attr(n, "starts")
        return None if starts is None else list(range(len(list(starts))))
    return [int(a) for a in np.asarray(axes).reshape(-1).tolist()]


def _off_channels(w: _Walk, name: str, axes: list[int] | None, rank: int | None = None) -> bool:
    """Whether ``axes`` of tensor ``name`` (of ``rank`` axes when its inferred shape does not say) are all known
    to be other than its channel axis."""
    ax = w.channel_axis.get(name)
    if ax is None or axes is None:
        return False
    shp = w.reader.shapes.get(name)
    rank = len(shp) if shp else rank
    if rank:
        return all(a % rank != ax % rank for a in axes)
    # rank unknown: only axes counted from the same end compare
    return all((a < 0) == (ax < 0) and a != ax for a in axes)


def _matmul(w: _Walk, i: int, n: onnx.NodeProto, d: NodeInfo, ins: list[str], out: str | None) -> int:
    """Activation x activation: the output is indexed like the second operand (attention weights x values),
    except q @ k^T of one packed projection, whose output is indexed by positions, not by units."""
    if len(ins) != 2:
        return w.uf.new()
    pa, pb = w.packed.part(w.group_in(ins[0])), w.packed.part(w.group_in(ins[1]))
    if pa and pb and pa[0] == pb[0] and pa[1] != pb[1]:
        w.packed.dots.add((pa[0], min(pa[1], pb[1]), max(pa[1], pb[1])))
        return w.uf.new()
    return w.group_in(ins[1])


def _reshape(w: _Walk, i: int, n: onnx.NodeProto, d: NodeInfo, ins: list[str], out: str | None) -> int:
    """A reshape keeps its input's group when it keeps the channel axis; a part of a packed projection split into
    heads ``(..., heads, d / heads)`` or merged back keeps its unit indexing and records its heads."""
    if not ins:
        return w.uf.new()
    uf = w.uf
    if n.op_type == "Reshape" and w.packed.part(w.group_in(ins[0])):
        # an unknown target passes the group on, as elsewhere
        g, last = uf.find(w.group_in(ins[0])), reshape_last_dim(w.reader, n)
        if last <= 0 or (uf.size[g] > 0 and uf.size[g] % last == 0):
            if 0 < last < uf.size[g]:
                w.packed.part_heads[g] = uf.size[g] // last
            return g
        return uf.new()
    a, b = w.reader.shapes.get(ins[0]), w.reader.shapes.get(out or "")
    if n.op_type == "Reshape":
        _record_heads(w, n, ins[0], a, b)
        _record_unit_axes(w, n, ins[0], a, b)
    keeps = _keeps_channels(a, b) or _keeps_leading(a, b, w.channel_axis.get(ins[0]))
    return w.group_in(ins[0]) if keeps else uf.new()


def _keeps_leading(a: tuple | None, b: tuple | None, ax: int | None) -> bool:
    """A reshape keeps the channel group when the channels are on a leading axis (after the batch) that it keeps
    with every axis before it, reshaping only the axes after: ``(B, C, H, W) -> (B, C, H * W)``."""
    if not a or not b or ax is None or ax < 1 or len(a) <= ax + 1 or len(b) <= ax:
        return False
    return all(x == y and x > 0 for x, y in zip(a[1:ax + 1], b[1:ax + 1]))


def _record_heads(w: _Walk, n: onnx.NodeProto, name: str, a: tuple | None, b: tuple | None) -> None:
    """Record the heads of a reshape of a tensor holding its units on the last axis into ``(..., heads, units /
    heads)``: one more axis, the last a divisor of the units (q, k or v split into heads)."""
    if w.channel_axis.get(name) != -1 or (a and b and len(b) != len(a) + 1):
        return
    g, last = w.uf.find(w.group_in(name)), reshape_last_dim(w.reader, n)
    size = int(w.uf.size[g])
    if 0 < last < size and size % last == 0 and (not b or b[-2] in (size // last, -1, 0)):
        w.heads.append((g, size // last))


def _record_unit_axes(w: _Walk, n: onnx.NodeProto, name: str, a: tuple | None, b: tuple | None) -> None:
    """Record the axes a reshape spreads a tensor's units (on its last axis) over when they are three or more:
    ``(..., 3, heads, head size)`` of a packed q/k/v projection. Found packed (:mod:`keeper.graph.packed`), the
    record is dropped; otherwise it tells the transforms that copies of units would land in other parts."""
    if w.channel_axis.get(name) != -1 or not a or not b or len(b) < len(a) + 2 or (a[-1] > 0 and a[-1] == b[-1]):
        return
    g = w.uf.find(w.group_in(name))
    size = int(w.uf.size[g])
    got = reshape_tail(w.reader, n, len(b) - len(a) + 1, size) if size > 0 else None
    axes = tuple(got[0]) if got and int(np.prod(got[0])) == size else (-1,) * (len(b) - len(a) + 1)
    w.unit_axes.append((g, axes))


def _concat(w: _Walk, i: int, n: onnx.NodeProto, d: NodeInfo, ins: list[str], out: str | None) -> int:
    """Along channels (axis 1 or the last), with every part's size known: a composite of the parts; otherwise
    the inputs share one group."""
    if not ins:
        return w.uf.new()
    uf = w.uf
    axis = int(attr(n, "axis", 0))
    shp = w.reader.shapes.get(out or "")
    r = len(shp) if shp else None
    ax = axis % r if r else axis
    gs = [uf.find(w.group_in(x)) for x in ins]
    along_channels = ax == 1 or (r is not None and ax == r - 1)
    if r is not None and _same_axis(w, ins) is not None:
        along_channels = not _off_channels(w, ins[0], [axis], r)  # positions joined (a roll): the units stay
    if r is not None and along_channels and all(uf.size[g] > 0 for g in gs):
        return uf.new(sum(uf.size[g] for g in gs), gs)
    g_out = gs[0]
    for g in gs[1:]:
        g_out = uf.union(g_out, g)
    return g_out


def _same_axis(w: _Walk, ins: list[str]) -> int | None:
    """The channel axis all of ``ins`` share, None when one is unknown or they differ."""
    axes = {w.channel_axis.get(x) for x in ins}
    return axes.pop() if len(axes) == 1 else None


# Kinds whose output holds its channels where the (first) data input held them.
_AXIS_KEPT = (Kind.ACTIVATION, Kind.RECTIFIER, Kind.POOL, Kind.ADD, Kind.MUL, Kind.SOFTMAX, Kind.PARAM, Kind.CONCAT)


def _channel_axis(w: _Walk, n: onnx.NodeProto, d: NodeInfo, ins: list[str], g_out: int) -> int | None:
    """Where the output of node ``n`` holds its channels (see ``_Walk.channel_axis``); None when unknown."""
    t = traits(d.kind)
    first = w.channel_axis.get(ins[0]) if ins else None
    if t.kernel_axes or d.kind == Kind.BATCHNORM:
        return 1
    if d.kind in (Kind.LINEAR, Kind.EMBEDDING):
        return -1
    if d.kind == Kind.LAYERNORM:
        return -1 if int(attr(n, "axis", -1)) == -1 else None
    if d.kind in _AXIS_KEPT:
        return _same_axis(w, ins) if d.kind == Kind.CONCAT else first
    kept = bool(ins) and w.uf.find(g_out) == w.uf.find(w.group_in(ins[0]))
    if d.kind == Kind.TRANSPOSE and first is not None:
        perm = attr(n, "perm")
        if not perm:
            return None
        perm = list(perm)
        moved = perm.index(first % len(perm))
        return -1 if moved == len(perm) - 1 else moved
    if d.kind == Kind.RESHAPE and kept and first == -1:
        return -1  # a reshape keeps the group only when it keeps the last axis (or cannot tell)
    shapes = w.reader.shapes
    if d.kind == Kind.RESHAPE and kept and _keeps_leading(shapes.get(ins[0]), shapes.get(n.output[0]), first):
        return first
    if d.kind == Kind.SPLIT and n.op_type == "Slice" and kept:
        return first
    return None


def _keeps_channels(a: tuple | None, b: tuple | None) -> bool:
    """A reshape keeps the channel group when it only drops/adds singleton or batch-like axes around it."""
    if not a or not b or a[-1] <= 0 or b[-1] <= 0:
        return True  # unknown shapes: pass the group on; a real conflict shows up as an inconsistent size
    if a[-1] == b[-1] and a[-1] > 0:
        return True
    # flatten after global pooling: (B, C, 1, 1) -> (B, C)
    if len(a) >= 3 and len(b) == 2 and all(d == 1 for d in a[2:]) and a[1] == b[1] and a[1] > 0:
        return True
    return False


# One handler per kind. Weighted kinds default to ``_layer`` (their traits say how they share channels), so a new
# weighted kind needs no line here; a new weightless kind does.
HANDLERS: Mapping[Kind, Handler] = {
    **{k: _layer for k in Kind if traits(k).weighted},
    Kind.LINEAR: _linear,
    Kind.ADD: _elementwise, Kind.MUL: _elementwise,
    Kind.ACTIVATION: _pass, Kind.RECTIFIER: _pass, Kind.POOL: _pass, Kind.SOFTMAX: _pass, Kind.TRANSPOSE: _pass,
    Kind.REDUCE: _pass,
    Kind.SPLIT: _split, Kind.MATMUL: _matmul, Kind.RESHAPE: _reshape, Kind.CONCAT: _concat, Kind.OTHER: _fresh,
}


def handler(kind: int) -> Handler:
    """The channel-group handler of ``kind``.

    Raises:
        KeeperError: the kind has none (a new weightless kind must add one to ``HANDLERS``).
    """
    h = HANDLERS.get(kind)  # type: ignore[call-overload]
    if h is None:
        raise KeeperError(f"layer kind {kind!r}: no channel-group handler in keeper.graph.groups.HANDLERS; a "
                          "weightless kind needs one (most pass their input's group on: _pass)")
    return h


def channel_groups(reader: ModelReader, nodes: Sequence[onnx.NodeProto], order: Sequence[int],
                   info: Sequence[NodeInfo], const: set[str], meta: set[str]) -> ChannelGroups:
    """Channel groups of the data nodes ``nodes`` visited in canonical ``order`` (see the module docstring)."""
    w = _Walk(reader, nodes, info)
    for i in order:
        n, d = nodes[i], info[i]
        ins = [x for x in n.input if x and x not in const and x not in meta]
        out = n.output[0] if n.output else None
        if d.bias_add is not None:  # a linear layer with its absorbed bias Add answers for the Add's output
            out = d.bias_add.output[0]
        g_out = handler(d.kind)(w, i, n, d, ins, out)
        if g_out is None:
            continue
        ax = _channel_axis(w, n, d, ins, g_out)
        for o in (n.output if d.bias_add is None else [out]):
            if o:
                w.tensor_group[o] = g_out
                if ax is not None:
                    w.channel_axis[o] = ax
    c = w.uf.compact()
    remap = {i: (c.ids[a] if a >= 0 else -1, c.ids[b] if b >= 0 else -1) for i, (a, b) in w.layer_groups.items()}
    heads: dict[int, int] = {}
    for g, h in w.heads:  # a group split into heads two ways has no head count
        if w.uf.parts.get(w.uf.find(g)):
            continue  # a packed projection's (..., parts, units) view, found packed later: its parts hold the heads
        g = c.ids[w.uf.find(g)]
        heads[g] = h if heads.get(g, h) == h else 0
    axes: dict[int, tuple[int, ...]] = {}
    for g, ax in w.unit_axes:  # a group spread over axes two ways has no known axes
        if not w.uf.parts.get(w.uf.find(g)):
            g = c.ids[w.uf.find(g)]
            axes[g] = ax if axes.get(g, ax) == ax else (-1,) * len(ax)
    return ChannelGroups(c.sizes, c.parts_indptr, c.parts, remap, w.packed.attrs(),
                         {g: h for g, h in heads.items() if h > 0}, axes)
