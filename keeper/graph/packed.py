"""Packed projections: q, k and v computed by one linear layer and unpacked into parts downstream.

The layer's output group becomes a composite of k equal parts when its output reaches k Gathers with constant
indices 0..k-1 (torch's MultiheadAttention), one Split into k equal outputs along the unit axis
(``qkv.split(d, dim=-1)``, as in GPT-2), or SplitToSequence/SequenceAt (the dynamo exporter's ``split``), so each
part gets its own unit map. Heads (a part reshaped to ``(..., heads, d / heads)``) and dot products between parts
(``q @ k^T``) are recorded for the transforms as the layer's ``attrs["packed"]``.

A layer output reshaped to ``(..., k, heads, d / heads)`` whose k axis, moved by transposes, is taken apart (timm's
``qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)``: one Split, SplitToSequence/SequenceAt, or a
one-wide Slice or constant Gather per part along that axis) is packed the same way, each part with those heads.
Such a reshape found unpacked no other way is a layout keeper cannot follow: groups record it (``unit_axes``) and
no growth that changes its inner axes is claimed exact.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx

from keeper.graph.fold import fold_ints
from keeper.graph.reader import ModelReader, attr
from keeper.graph.rules import NodeInfo
from keeper.graph.unionfind import UnionFind

__all__ = ["PackedProjections", "reshape_last_dim"]

# ops a packed projection's output passes through before it is unpacked by Gather (torch's MultiheadAttention
# unflattens (..., 3 * d) to (..., 3, d) and moves the 3 to the front)
_UNPACK_CHAIN_OPS = {"Reshape", "Unsqueeze", "Squeeze", "Transpose", "Identity"}


class PackedProjections:
    """Finds the parts of packed projections while channel groups are built (one instance per extraction)."""

    def __init__(self, reader: ModelReader, nodes: Sequence[onnx.NodeProto], info: Sequence[NodeInfo],
                 uf: UnionFind, tensor_group: dict[str, int]):
        self.reader, self.info, self.uf, self.tensor_group = reader, info, uf, tensor_group
        self.linear_out: dict[str, int] = {}   # output tensor of a linear layer -> its data node index
        # (tensor, axis) -> constant scalar indices it is gathered at
        self.gathers: dict[tuple[str, int], set[int]] = {}
        for n in nodes:
            if n.op_type == "Gather" and len(n.input) == 2:
                v = reader.const_value(n.input[1])
                if v is not None and np.asarray(v).ndim == 0:
                    self.gathers.setdefault((n.input[0], int(attr(n, "axis", 0))), set()).add(int(v))
        self.part_of: dict[int, tuple[int, int]] = {}  # part group -> (data node of the projection, part index)
        self.part_heads: dict[int, int] = {}
        self.dots: set[tuple[int, int, int]] = set()
        self.cut: set[tuple[int, int]] = set()  # (data node of the projection, part) whose units a slice cuts

    def linear_of(self, src: str) -> str | None:
        """The linear layer output that ``src`` is, through unpacking reshapes (None when it is not one)."""
        cur = src
        while cur not in self.linear_out:
            p = self.reader.producer.get(cur)
            if p is None or p.op_type not in _UNPACK_CHAIN_OPS or not p.input:
                return None
            cur = p.input[0]
        return cur

    def packed_parts(self, cur: str | None, k: int | None, heads: int = 0) -> list[int] | None:
        """The k part groups of the linear layer output ``cur`` (found by ``linear_of``); ``heads`` (when > 0):
        the heads of every part, known from the layout (:meth:`layout`)."""
        if cur is None or k is None:
            return None
        li = self.linear_out[cur]
        units = int(self.info[li].shape[0])
        if k < 2 or units % k:
            return None
        uf = self.uf
        g = uf.find(self.tensor_group[cur])
        if g not in uf.parts:
            if uf.size[g] != units:
                return None
            uf.parts[g] = [uf.new(units // k) for _ in range(k)]
            for j, pg in enumerate(uf.parts[g]):
                self.part_of[pg] = (li, j)
                if heads > 1:
                    self.part_heads[pg] = heads
        return uf.parts[g] if len(uf.parts[g]) == k else None

    def gathered_part(self, n: onnx.NodeProto) -> int | None:
        """The part group a constant-index Gather takes from a packed output: along the parts axis of a layout
        (:meth:`layout`), or along axis 0 of an output reached through unpacking reshapes (MultiheadAttention)."""
        axis = int(attr(n, "axis", 0))
        ks = self.gathers.get((n.input[0], axis), set()) if len(n.input) == 2 else set()
        if not ks:
            return None
        idx = int(self.reader.const_value(n.input[1]))
        lay = self.layout(n.input[0], axis)
        if lay is not None:
            pgs = self.packed_parts(lay[0], lay[1], lay[2]) if max(ks) < lay[1] else None
            return None if pgs is None else pgs[idx % lay[1]]
        if axis != 0 or ks != set(range(len(ks))):
            return None
        pgs = self.packed_parts(self.linear_of(n.input[0]), len(ks))
        return None if pgs is None else pgs[idx]

    def _on_last_axis(self, n: onnx.NodeProto) -> bool:
        shp, axis = self.reader.shapes.get(n.input[0]), int(attr(n, "axis", 0))
        return axis == -1 or bool(shp and axis % len(shp) == len(shp) - 1)

    def split_parts(self, n: onnx.NodeProto) -> list[int] | None:
        """Part groups for the outputs of a Split of a linear output into equal pieces along its last axis, or
        into its k parts along the parts axis of a layout (:meth:`layout`)."""
        outs = list(n.output)
        if not n.input or len(outs) < 2 or not all(outs):
            return None
        sizes = self.reader.const_value(n.input[1]) if len(n.input) > 1 and n.input[1] else attr(n, "split", None)
        if sizes is not None and len(set(int(v) for v in np.asarray(sizes).reshape(-1))) != 1:
            return None
        lay = self.layout(n.input[0], int(attr(n, "axis", 0)))
        if lay is not None:
            return self.packed_parts(lay[0], lay[1], lay[2]) if len(outs) == lay[1] else None
        if not self._on_last_axis(n):
            return None
        return self.packed_parts(self.linear_of(n.input[0]), len(outs))

    def sequence_part(self, n: onnx.NodeProto) -> int | None:
        """The part group of SequenceAt(SplitToSequence(linear output, equal pieces, last axis), constant index),
        or of SequenceAt(SplitToSequence(a layout's parts axis, pieces of one), constant index) (torch's unbind)."""
        if len(n.input) != 2:
            return None
        p = self.reader.producer.get(n.input[0])
        if p is None or p.op_type != "SplitToSequence" or not p.input:
            return None
        if (lay := self.layout(p.input[0], int(attr(p, "axis", 0)))) is not None:
            return self._layout_piece(p, self.reader.const_value(n.input[1]), lay)
        if len(p.input) < 2 or not p.input[1] or not self._on_last_axis(p):
            return None
        r = self.reader
        sizes, idx, cur = r.const_value(p.input[1]), r.const_value(n.input[1]), self.linear_of(p.input[0])
        if sizes is None or idx is None or cur is None or np.asarray(idx).ndim:
            return None
        sizes = np.asarray(sizes).reshape(-1)
        units = int(self.info[self.linear_out[cur]].shape[0])
        if len(set(sizes.tolist())) != 1 or int(sizes[0]) <= 0:
            return None
        k = (units // int(sizes[0]) if units % int(sizes[0]) == 0 else None) if sizes.size == 1 else sizes.size
        pgs = self.packed_parts(cur, k)
        return None if pgs is None else pgs[int(idx) % len(pgs)]

    def _layout_piece(self, p: onnx.NodeProto, idx: Any, lay: tuple[str, int, int]) -> int | None:
        """The part at constant ``idx`` of SplitToSequence ``p`` over a layout's parts axis in pieces of one."""
        sizes = self.reader.const_value(p.input[1]) if len(p.input) > 1 and p.input[1] else None
        if idx is None or np.asarray(idx).ndim or (sizes is not None and set(np.asarray(sizes).reshape(-1)) != {1}):
            return None
        pgs = self.packed_parts(lay[0], lay[1], lay[2])
        return None if pgs is None else pgs[int(idx) % lay[1]]

    def sliced_part(self, n: onnx.NodeProto, axes: list[int] | None) -> int | None:
        """The part group a Slice one wide along a layout's parts axis takes (``qkv[j]`` as the dynamo exporter
        writes it: Slice then Squeeze)."""
        r = self.reader
        if axes is None or len(axes) != 1 or len(n.input) < 3:
            return None
        lay = self.layout(n.input[0], axes[0])
        if lay is None:
            return None
        starts, ends = r.small_value(n.input[1]), r.small_value(n.input[2])
        steps = r.small_value(n.input[4]) if len(n.input) > 4 and n.input[4] else None
        if starts is None or ends is None or (steps is not None and int(np.ravel(steps)[0]) != 1):
            return None
        k = lay[1]
        start, end = (int(np.ravel(v)[0]) for v in (starts, ends))
        start = start + k if start < 0 else start
        end = min(end + k if end < 0 else end, k)
        if not 0 <= start < k or end != start + 1:
            return None
        pgs = self.packed_parts(lay[0], k, lay[2])
        return None if pgs is None else pgs[start]

    def layout(self, name: str, axis: int) -> tuple[str, int, int] | None:
        """(linear layer output, parts k, heads) when axis ``axis`` of tensor ``name`` is the k axis of that output
        reshaped to ``(..., k, heads, units / (k * heads))``, through transposes (the axis followed through their
        permutations), identities and reshapes that keep a leading parts axis; None otherwise."""
        r, cur = self.reader, name
        firsts: set[int] = set()  # first dims of reshapes passed, each of which must be the k parts
        for _ in range(16):
            p = r.producer.get(cur)
            if p is None or not p.input:
                return None
            if p.op_type == "Transpose":
                perm = attr(p, "perm")
                if not perm:
                    return None
                axis = int(list(perm)[axis % len(perm)])
            elif p.op_type == "Reshape":
                split = self.split_heads(p)
                if split is not None:
                    src, k, h, rank = split
                    return (src, k, h) if axis % rank == rank - 3 and firsts <= {k} else None
                # only a reshape of the axes after a leading parts axis (ViTDet's (3, B * H, N, D)): it keeps the
                # first axis whole when that axis has the k parts on both sides
                first = _first_dim(r, p)
                if axis != 0 or first <= 0:
                    return None
                firsts.add(first)
            elif p.op_type != "Identity":
                return None
            cur = p.input[0]
        return None

    def split_heads(self, n: onnx.NodeProto) -> tuple[str, int, int, int] | None:
        """(linear layer output, k, heads, output rank) when Reshape ``n`` turns a linear output's units into
        ``(..., k, heads, units / (k * heads))`` (one axis into three), else None."""
        cur = n.input[0] if n.input else ""
        while cur not in self.linear_out:  # the units must still be the last axis: identities only
            p = self.reader.producer.get(cur)
            if p is None or p.op_type != "Identity" or not p.input:
                return None
            cur = p.input[0]
        units = int(self.info[self.linear_out[cur]].shape[0])
        got = reshape_tail(self.reader, n, 3, units)
        shp = self.reader.shapes.get(n.input[0])
        if got is None or not shp or got[1] != len(shp) + 2:
            return None
        (k, h, d), rank = got
        return (cur, k, h, rank) if k * h * d == units and k > 1 else None

    def part(self, g: int) -> tuple[int, int] | None:
        """(projection's data node, part index) of group ``g``, or None when it is no part."""
        return self.part_of.get(self.uf.find(g))

    def attrs(self) -> dict[int, dict[str, Any]]:
        """Data node index of each packed projection -> its ``attrs["packed"]``: parts, heads per part, the
        pairs of parts joined by a dot product, and (when any) the parts whose units a slice cuts apart ("cut")."""
        out: dict[int, dict[str, Any]] = {}
        for members in self.uf.parts.values():
            if members and members[0] in self.part_of:
                li = self.part_of[members[0]][0]
                out[li] = {"parts": len(members),
                           "heads": [self.part_heads.get(self.uf.find(m), 1) for m in members],
                           "dots": sorted([a, b] for (l2, a, b) in self.dots if l2 == li)}
                cut = sorted(j for (l2, j) in self.cut if l2 == li)
                if cut:
                    out[li]["cut"] = cut
        return out


def _first_dim(reader: ModelReader, n: onnx.NodeProto) -> int:
    """The first dimension a Reshape produces, from inferred shapes or its target; -1 if unknown."""
    shp = reader.shapes.get(n.output[0]) if n.output else None
    if shp and shp[0] > 0:
        return int(shp[0])
    target = n.input[1] if len(n.input) > 1 else ""
    v = reader.small_value(target)
    p = reader.producer.get(target)
    if v is None and p is not None and p.op_type == "Concat" and p.input:
        v = reader.small_value(p.input[0])
    v = None if v is None else np.asarray(v).reshape(-1)
    return int(v[0]) if v is not None and v.size else -1


def reshape_tail(reader: ModelReader, n: onnx.NodeProto, m: int, units: int) -> tuple[list[int], int] | None:
    """The last ``m`` dimensions a Reshape of a tensor of ``units`` on its last axis produces, and its output rank,
    from inferred shapes or from its target (constant, or a Concat of pieces whose trailing ones are constant; one
    -1 among them is solved from ``units``); None when unknown."""
    shp = reader.shapes.get(n.output[0]) if n.output else None
    if shp and len(shp) >= m and all(v > 0 for v in shp[-m:]):
        return [int(v) for v in shp[-m:]], len(shp)
    target = n.input[1] if len(n.input) > 1 else ""
    v = _ints(reader, target)
    if v is not None:
        dims, rank = [int(x) for x in np.asarray(v).reshape(-1)], int(np.asarray(v).size)
    else:
        p = reader.producer.get(target)
        if p is None or p.op_type != "Concat":
            return None
        dims = []
        for x in reversed(p.input):  # the trailing pieces, up to the first that is not constant (a batch size)
            piece = _ints(reader, x)
            if piece is None:
                break
            dims = [int(x) for x in np.asarray(piece).reshape(-1)] + dims
        rank = len(shp) if shp else -1
    tail = dims[-m:]
    if len(tail) < m or rank < m or any(x == 0 or x < -1 for x in tail) or tail.count(-1) > 1:
        return None
    if -1 in tail:
        rest = int(np.prod([x for x in tail if x > 0]))
        if rest <= 0 or units % rest:
            return None
        tail[tail.index(-1)] = units // rest
    return tail, rank



def _ints(reader: ModelReader, name: str) -> np.ndarray | None:
    """A small integer constant, read as one or folded from the ops that compute it (TorchScript computes a head
    size as the input's width divided by the heads)."""
    v = reader.small_value(name)
    return v if v is not None else fold_ints(reader, name, cap=64)

def reshape_last_dim(reader: ModelReader, n: onnx.NodeProto) -> int:
    """The last dimension a Reshape produces, from inferred shapes or from its constant target; -1 if unknown."""
    shp = reader.shapes.get(n.output[0]) if n.output else None
    if shp and shp[-1] > 0:
        return int(shp[-1])
    cur = n.input[1] if len(n.input) > 1 else ""
    for _ in range(8):  # Concat(..., Unsqueeze(Constant)) as TorchScript writes a target with a dynamic batch
        v = reader.const_value(cur)
        if v is not None:
            v = np.asarray(v).reshape(-1)
            return int(v[-1]) if v.size and v[-1] > 0 else -1
        p = reader.producer.get(cur)
        if p is None or p.op_type not in ("Concat", "Unsqueeze") or not p.input:
            return -1
        cur = p.input[-1] if p.op_type == "Concat" else p.input[0]
    return -1
