"""Packed projections: q, k and v computed by one linear layer and unpacked into parts downstream.

The layer's output group becomes a composite of k equal parts when its output reaches k Gathers with constant
indices 0..k-1 (torch's MultiheadAttention), one Split into k equal outputs along the unit axis
(``qkv.split(d, dim=-1)``, as in GPT-2), or SplitToSequence/SequenceAt (the dynamo exporter's ``split``), so each
part gets its own unit map. Heads (a part reshaped to ``(..., heads, d / heads)``, or the whole output reshaped to
``(..., parts, heads, d)`` before the parts are gathered, as torchvision's Swin does) and dot products between parts
(``q @ k^T``) are recorded for the transforms as the layer's ``attrs["packed"]``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx

from keeper.graph.fold import fold_ints
from keeper.graph.reader import ModelReader, attr
from keeper.graph.rules import NodeInfo
from keeper.graph.unionfind import UnionFind

__all__ = ["PackedProjections", "reshape_last_dim", "reshape_tail"]

# ops a packed projection's output passes through before it is unpacked by Gather (torch's MultiheadAttention
# unflattens (..., 3 * d) to (..., 3, d) and moves the 3 to the front)
_UNPACK_CHAIN_OPS = {"Reshape", "Unsqueeze", "Squeeze", "Transpose", "Identity"}


class PackedProjections:
    """Finds the parts of packed projections while channel groups are built (one instance per extraction)."""

    def __init__(self, reader: ModelReader, nodes: Sequence[onnx.NodeProto], info: Sequence[NodeInfo],
                 uf: UnionFind, tensor_group: dict[str, int]):
        self.reader, self.info, self.uf, self.tensor_group = reader, info, uf, tensor_group
        self.linear_out: dict[str, int] = {}   # output tensor of a linear layer -> its data node index
        self.gathers: dict[str, set[int]] = {}  # tensor -> constant scalar indices it is gathered at
        for n in nodes:
            if n.op_type == "Gather" and len(n.input) == 2 and int(attr(n, "axis", 0)) == 0:
                v = reader.const_value(n.input[1])
                if v is not None and np.asarray(v).ndim == 0:
                    self.gathers.setdefault(n.input[0], set()).add(int(v))
        self.part_of: dict[int, tuple[int, int]] = {}  # part group -> (data node of the projection, part index)
        self.part_heads: dict[int, int] = {}
        # linear output -> (parts, heads) of a reshape to (..., parts, heads, d) before it is unpacked (Swin's qkv)
        self.unpacked_heads: dict[str, tuple[int, int]] = {}
        self.dots: set[tuple[int, int, int]] = set()

    def linear_of(self, src: str) -> str | None:
        """The linear layer output that ``src`` is, through unpacking reshapes (None when it is not one)."""
        cur = src
        while cur not in self.linear_out:
            p = self.reader.producer.get(cur)
            if p is None or p.op_type not in _UNPACK_CHAIN_OPS or not p.input:
                return None
            cur = p.input[0]
        return cur

    def packed_parts(self, cur: str | None, k: int | None) -> list[int] | None:
        """The k part groups of the linear layer output ``cur`` (found by ``linear_of``)."""
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
            parts, heads = self.unpacked_heads.get(cur, (0, 0))
            for j, pg in enumerate(uf.parts[g]):
                self.part_of[pg] = (li, j)
                if parts == k:
                    self.part_heads[pg] = heads
        return uf.parts[g] if len(uf.parts[g]) == k else None

    def note_heads(self, n: onnx.NodeProto) -> None:
        """Record the heads of a linear output reshaped by ``n`` to (..., parts, heads, d) before it is unpacked
        (torchvision's Swin: ``qkv.reshape(b, t, 3, heads, d)``, then q, k, v gathered at 0, 1, 2): its parts, once
        found, take ``heads`` each."""
        cur = self.linear_of(n.input[0]) if len(n.input) > 1 else None
        tail = reshape_tail(self.reader, n, 3) if cur is not None else None
        if tail is None:
            return
        parts, heads, d = tail
        if parts > 1 and heads > 1 and parts * heads * d == int(self.info[self.linear_out[cur]].shape[0]):
            self.unpacked_heads[cur] = (parts, heads)

    def gathered_part(self, n: onnx.NodeProto) -> int | None:
        """The part group a constant-index Gather takes from a packed output."""
        if len(n.input) != 2 or n.input[0] not in self.gathers:
            return None
        ks = self.gathers.get(n.input[0], set())
        pgs = self.packed_parts(self.linear_of(n.input[0]), len(ks)) if ks == set(range(len(ks))) else None
        return None if pgs is None else pgs[int(self.reader.const_value(n.input[1]))]

    def _on_last_axis(self, n: onnx.NodeProto) -> bool:
        shp, axis = self.reader.shapes.get(n.input[0]), int(attr(n, "axis", 0))
        return axis == -1 or bool(shp and axis % len(shp) == len(shp) - 1)

    def split_parts(self, n: onnx.NodeProto) -> list[int] | None:
        """Part groups for the outputs of a Split of a linear output into equal pieces along its last axis."""
        outs = list(n.output)
        if not n.input or len(outs) < 2 or not all(outs) or not self._on_last_axis(n):
            return None
        sizes = self.reader.const_value(n.input[1]) if len(n.input) > 1 and n.input[1] else attr(n, "split", None)
        if sizes is not None and len(set(int(v) for v in np.asarray(sizes).reshape(-1))) != 1:
            return None
        return self.packed_parts(self.linear_of(n.input[0]), len(outs))

    def sequence_part(self, n: onnx.NodeProto) -> int | None:
        """The part group of SequenceAt(SplitToSequence(linear output, equal pieces, last axis), constant index)."""
        if len(n.input) != 2:
            return None
        p = self.reader.producer.get(n.input[0])
        if p is None or p.op_type != "SplitToSequence" or len(p.input) < 2 or not p.input[1] \
                or not self._on_last_axis(p):
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

    def part(self, g: int) -> tuple[int, int] | None:
        """(projection's data node, part index) of group ``g``, or None when it is no part."""
        return self.part_of.get(self.uf.find(g))

    def attrs(self) -> dict[int, dict[str, Any]]:
        """Data node index of each packed projection -> its ``attrs["packed"]``: parts, heads per part, and the
        pairs of parts joined by a dot product."""
        out: dict[int, dict[str, Any]] = {}
        for members in self.uf.parts.values():
            if members and members[0] in self.part_of:
                li = self.part_of[members[0]][0]
                out[li] = {"parts": len(members),
                           "heads": [self.part_heads.get(self.uf.find(m), 1) for m in members],
                           "dots": sorted([a, b] for (l2, a, b) in self.dots if l2 == li)}
        return out


def reshape_tail(reader: ModelReader, n: onnx.NodeProto, k: int) -> tuple[int, ...] | None:
    """The last ``k`` dimensions a Reshape produces when each is known and positive: from inferred shapes, or
    folded from the end of its target (a Concat whose leading entries come from the batch's shape); else None."""
    shp = reader.shapes.get(n.output[0]) if n.output else None
    if shp and len(shp) >= k and all(d > 0 for d in shp[-k:]):
        return tuple(int(d) for d in shp[-k:])
    tail: list[int] = []
    p = reader.producer.get(n.input[1])
    for x in reversed(list(p.input) if p is not None and p.op_type == "Concat" else [n.input[1]]):
        v = fold_ints(reader, x, cap=64)
        if v is None:
            break
        tail = [int(d) for d in v.reshape(-1).tolist()] + tail
        if len(tail) >= k:
            break
    return tuple(tail[-k:]) if len(tail) >= k and all(d > 0 for d in tail[-k:]) else None


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
