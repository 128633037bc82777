"""Per-op rules: what one ONNX node is to keeper (its kind, and for a layer its canonical shape and tensors).

:data:`OP_RULES` maps an op type to the rule that recognises a weighted layer in it; a rule returns a
:class:`NodeInfo` or None when the node does not read its weights from constants (a Conv whose weight is computed
is no layer). Every other node, and a node its rule declines, takes its kind from :data:`WEIGHTLESS` (``OTHER``
when the op is not listed). :func:`resolution_step` is the one per-op fact about resolution levels.

Canonical orientation (the invariant every rule keeps): axis 0 of ``shape`` is output units, axis 1 input units
(when the kind has an input axis, see :mod:`keeper.kinds`), then kernel axes; ``refs[0]`` is the main tensor,
whose ``canon`` transposes the op's input into that orientation. ``vectors`` counts the trainable per-output-unit
vectors besides it (a bias, a norm's shift); a vector assembled from pieces is one role with one ref per piece.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import numpy as np
import onnx

from keeper.graph.reader import ModelReader, as_str, attr
from keeper.graph.types import INPUT_ROLE, MAX_RANK, TensorRef
from keeper.graph.zeroed import trace_zeroed
from keeper.kinds import Kind, traits

__all__ = ["NodeInfo", "RuleContext", "OP_RULES", "WEIGHTLESS", "node_info", "input_tables", "resolution_step"]


@dataclass(frozen=True)
class NodeInfo:
    """What extraction records of one data node. Weightless nodes have only ``kind``.

    ``bias_add`` is the Add node a MatMul rule absorbed as the layer's bias (extraction then drops that Add and
    lets the layer answer for its output).
    """

    kind: Kind
    shape: tuple[int, ...] = ()
    refs: tuple[TensorRef, ...] = ()
    vectors: int = 0
    groups: int = 1
    attrs: Mapping[str, Any] = field(default_factory=dict)
    bias_add: onnx.NodeProto | None = None


@dataclass(frozen=True)
class RuleContext:
    """What a rule may read: the model, its constant tensor names, and the data nodes reading each tensor."""

    reader: ModelReader
    const: set[str]
    users: Mapping[str, list[onnx.NodeProto]]
    inputs: frozenset[str] = frozenset()  # constant tables read as inputs of the network (input_tables)

    def ref(self, name: str, role: str) -> TensorRef | None:
        """The weight ``name`` traced to its initializer; None when it is no constant or is computed."""
        return self.reader.trace_weight(name, role) if name and name in self.const else None

    def table(self, name: str, role: str) -> TensorRef | None:
        """The learned table constant ``name`` reads (looked up, broadcast, sliced: see
        :meth:`~keeper.graph.reader.ModelReader.trace_table`); None when it is no constant or reads none."""
        return self.reader.trace_table(name, role) if name and name in self.const else None

    def vector(self, name: str, role: str, units: int) -> tuple[TensorRef, ...]:
        """The per-unit vector ``name`` of ``units`` elements (a linear layer's bias) as refs: the one tensor it
        is (some of its rows possibly zeroed in the forward pass:
        :func:`~keeper.graph.zeroed.trace_zeroed`), or the learned pieces it is concatenated from with
        constant zeros (:meth:`~keeper.graph.reader.ModelReader.trace_pieces`); empty when neither."""
        if not name or name not in self.const:
            return ()
        ref = self.reader.trace_weight(name, role) or trace_zeroed(self.reader, name, role)
        if ref is not None:
            return (ref,) if int(np.prod(self.shape(ref))) == units else ()
        pieces = self.reader.trace_pieces(name, role)
        return pieces if pieces and pieces[0].span[2] == units else ()

    def through(self, name: str, role: str) -> tuple[TensorRef | None, tuple[str, ...]]:
        """The learned tensor constant ``name`` computes elementwise through one-input functions
        (:data:`_ELEMENTWISE`, a Clip's bounds constants that are no learned tensor: Swin V2's logit scale,
        ``exp(clamp(s, max=log 100))``) and those ops, first applied first; (None, ()) when it is none."""
        ops: list[str] = []
        cur = name
        while (n := self.reader.producer.get(cur)) is not None and n.op_type in _ELEMENTWISE and len(ops) < 8:
            rest = [x for x in n.input[1:] if x]
            if any(x not in self.const or self.reader.read_by(x, set()) for x in rest):
                return None, ()
            ops.append(n.op_type)
            cur = n.input[0]
        ref = self.ref(cur, role) if ops else None
        if ref is None or not self.reader.is_learned(ref.source):
            return None, ()
        return ref, tuple(reversed(ops))

    def input_table(self, name: str) -> tuple[TensorRef, ...]:
        """The initializer behind ``name`` when it is a constant table read as the network's input
        (:func:`input_tables`), as a ref of role :data:`~keeper.graph.types.INPUT_ROLE`; empty otherwise (a table
        computed from constant nodes has nothing to transfer)."""
        ref = self.reader.trace_weight(name, INPUT_ROLE) if name in self.inputs else None
        return (ref,) if ref is not None else ()

    def learned(self, name: str, role: str) -> TensorRef | None:
        """The weight ``name`` as the op reads it, else the whole learned table it reads; None when neither."""
        return self.ref(name, role) or self.table(name, role)

    def shape(self, ref: TensorRef) -> tuple[int, ...]:
        return self.reader.ref_shape(ref)


Rule = Callable[[RuleContext, onnx.NodeProto], Optional[NodeInfo]]


def _inputs(n: onnx.NodeProto) -> list[str]:
    return list(n.input) + [""] * 5  # absent optional inputs read as ""


def _conv(ctx: RuleContext, n: onnx.NodeProto) -> NodeInfo | None:
    ins = _inputs(n)
    w = ctx.ref(ins[1], "weight")
    if not w:
        return None
    s = ctx.shape(w)
    g = int(attr(n, "group", 1))
    refs = [w]
    b = ctx.ref(ins[2], "bias")
    if b:
        refs.append(b)
    attrs = {"pads": list(attr(n, "pads", []) or []), "strides": list(attr(n, "strides", []) or []),
             "dilations": list(attr(n, "dilations", []) or []), "auto_pad": as_str(attr(n, "auto_pad", ""))}
    if n.op_type == "ConvTranspose":
        if g != 1:
            return NodeInfo(Kind.OTHER)
        perm = (1, 0) + tuple(range(2, len(s)))  # ONNX stores (in, out, k...)
        refs[0] = _with_canon(w, perm)
        return NodeInfo(Kind.CONVT, tuple(s[p] for p in perm), tuple(refs), len(refs) - 1, attrs=attrs)
    kind = Kind.DWCONV if (g > 1 and s[1] == 1) else Kind.CONV
    return NodeInfo(kind, s, tuple(refs), len(refs) - 1, groups=g, attrs=attrs)


def _gemm(ctx: RuleContext, n: onnx.NodeProto) -> NodeInfo | None:
    ins = _inputs(n)
    w = ctx.ref(ins[1], "weight")
    if not w or ctx.ref(ins[0], "weight"):
        return None
    s = ctx.shape(w)
    if len(s) != 2 or int(attr(n, "transA", 0)):
        return NodeInfo(Kind.OTHER)
    if not int(attr(n, "transB", 0)):
        w, s = _with_canon(w, (1, 0)), (s[1], s[0])
    b = ctx.vector(ins[2], "bias", s[0])
    return NodeInfo(Kind.LINEAR, s, (w,) + b + ctx.input_table(ins[0]), int(bool(b)))


def _matmul(ctx: RuleContext, n: onnx.NodeProto) -> NodeInfo | None:
    """A MatMul by a constant matrix is a linear layer; a following Add of a constant vector (one tensor, or
    pieces concatenated: :meth:`RuleContext.vector`) is its bias; a constant table it reads as its input
    (:func:`input_tables`) is one more ref, after them."""
    ins = _inputs(n)
    w = ctx.ref(ins[1], "weight")
    if not w or len(ctx.shape(w)) != 2:
        return None
    k_in, k_out = ctx.shape(w)
    w, table = _with_canon(w, (1, 0)), ctx.input_table(ins[0])
    outs = ctx.users.get(n.output[0], [])
    if len(outs) == 1 and outs[0].op_type == "Add":
        add = outs[0]
        other = [x for x in add.input if x != n.output[0]]
        b = ctx.vector(other[0], "bias", k_out) if len(other) == 1 else ()
        if b:
            return NodeInfo(Kind.LINEAR, (k_out, k_in), (w,) + b + table, 1, bias_add=add)
    return NodeInfo(Kind.LINEAR, (k_out, k_in), (w,) + table, 0)


def _batchnorm(ctx: RuleContext, n: onnx.NodeProto) -> NodeInfo | None:
    ins = _inputs(n)
    rs = [ctx.ref(ins[j], role) for j, role in ((1, "scale"), (2, "bias"), (3, "mean"), (4, "var"))]
    if not all(rs):
        return NodeInfo(Kind.OTHER)  # statistics computed in the graph: not a layer keeper can transfer
    c = int(np.prod(ctx.shape(rs[0])))
    return NodeInfo(Kind.BATCHNORM, (c,), tuple(rs), 1, attrs={"epsilon": float(attr(n, "epsilon", 1e-5))})


def _layernorm(ctx: RuleContext, n: onnx.NodeProto) -> NodeInfo | None:
    ins = _inputs(n)
    sc = ctx.ref(ins[1], "scale")
    if not sc:
        return None
    b = ctx.ref(ins[2], "bias")
    rs = (sc, b) if b else (sc,)
    c = int(np.prod(ctx.shape(sc)))
    return NodeInfo(Kind.LAYERNORM, (c,), rs, len(rs) - 1, attrs={"epsilon": float(attr(n, "epsilon", 1e-5))})


def _embedding(ctx: RuleContext, n: onnx.NodeProto) -> NodeInfo | None:
    ins = _inputs(n)
    w = ctx.ref(ins[0], "weight")
    if not w or ins[1] in ctx.const:
        return None
    s = ctx.shape(w)
    if len(s) != 2:
        return None
    return NodeInfo(Kind.EMBEDDING, (s[1], s[0]), (_with_canon(w, (1, 0)),), 0)


def _param(ctx: RuleContext, n: onnx.NodeProto) -> NodeInfo | None:
    """An Add or Mul of one learned tensor with more than one element: a positional embedding, a layer scale, or
    a table read by constant indices and added to the data (a relative-position bias added to attention scores,
    a position table gathered at ``arange(seq_len)``). A Mul's layer records ``attrs["scales"]``: its output is
    proportional to its tensor (an RMSNorm's weight), which the transforms may divide; a Mul by a function of the
    tensor (a per-head logit scale ``exp(clamp(s))``: :meth:`RuleContext.through`) records the functions' ops in
    ``attrs["through"]``: its output is proportional to their value, not to the tensor, which no transform may then
    divide or scale (only copy)."""
    consts = [x for x in n.input if x in ctx.const]
    if len(consts) != 1:
        return None
    p, through = ctx.learned(consts[0], "weight"), ()
    if p is None and n.op_type == "Mul":
        p, through = ctx.through(consts[0], "weight")
    if p is None or int(np.prod(ctx.shape(p))) <= 1:
        return None
    info = _channel_first(ctx, p)
    attrs: dict[str, Any] = {"scales": n.op_type == "Mul"}
    if through:
        attrs["through"] = list(through)
    return NodeInfo(info.kind, info.shape, info.refs, info.vectors, attrs=attrs)


def _tokens(ctx: RuleContext, n: onnx.NodeProto) -> NodeInfo | None:
    """A Concat of the data with learned tokens (ViT's class token, DeiT's class and distillation tokens, each
    expanded over the batch) along an axis other than the channels: one layer holding the tokens, the first as
    its main tensor and each other as one more per-channel vector."""
    refs = [ctx.learned(x, "weight") for x in n.input if x in ctx.const]
    if not refs or any(r is None for r in refs) or len(refs) == len([x for x in n.input if x]):
        return None
    out_rank = len(ctx.reader.shapes.get(n.output[0], ()))
    axis = int(attr(n, "axis", 0))
    if out_rank and axis % out_rank == out_rank - 1:
        return None  # a concatenation of channels: the tokens would be channels of their own
    first = _channel_first(ctx, refs[0])
    units = first.shape[0]
    if any(int(np.prod(ctx.shape(r))) != units for r in refs[1:]):
        return None
    extra = tuple(TensorRef(f"token{k}", c.key, c.source, c.source_shape, c.chain, c.canon)
                  for k, c in enumerate((_channel_first(ctx, r).refs[0] for r in refs[1:]), 1))
    return NodeInfo(Kind.PARAM, first.shape, first.refs + extra, len(extra), attrs={"scales": False})


def _channel_first(ctx: RuleContext, p: TensorRef) -> NodeInfo:
    """A learned tensor as a PARAM layer: the channel axis first, the others in order. The channel axis is the
    only non-singleton one when there is one (a per-channel scale (1, C, 1, 1) of a conv net), else the last one
    (a positional embedding (1, T, D) of a transformer, a bias table (positions, heads))."""
    s = ctx.shape(p)
    wide = [a for a, d in enumerate(s) if d != 1]
    ax = wide[0] if len(wide) == 1 else len(s) - 1
    perm = (ax,) + tuple(a for a in range(len(s)) if a != ax)
    return NodeInfo(Kind.PARAM, tuple(s[q] for q in perm), (_with_canon(p, perm),), 0)


def _with_canon(ref: TensorRef, perm: tuple[int, ...]) -> TensorRef:
    return TensorRef(ref.role, ref.key, ref.source, ref.source_shape, ref.chain, tuple(perm))


# One-input elementwise functions a learned tensor may be read through (:meth:`RuleContext.through`); a Clip's
# bounds are its other inputs.
_ELEMENTWISE = {"Clip", "Exp", "Log", "Sigmoid", "Softplus", "Tanh", "Abs", "Neg", "Relu", "Sqrt", "Reciprocal"}

# Weighted layers: op type -> the rule recognising one. A new weighted op adds its rule here and its Kind's traits
# in keeper.kinds.
OP_RULES: Mapping[str, Rule] = {
    "Conv": _conv, "ConvTranspose": _conv, "Gemm": _gemm, "MatMul": _matmul,
    "BatchNormalization": _batchnorm, "LayerNormalization": _layernorm, "Gather": _embedding,
    "Add": _param, "Mul": _param, "Concat": _tokens,
}

# Every other op: op type -> its kind (OTHER when not listed). A new weightless op adds one line here.
WEIGHTLESS: Mapping[str, Kind] = {
    "Add": Kind.ADD, "Sub": Kind.ADD, "Mul": Kind.MUL, "Div": Kind.MUL, "Concat": Kind.CONCAT,
    "Split": Kind.SPLIT, "Slice": Kind.SPLIT, "SplitToSequence": Kind.SPLIT, "SequenceAt": Kind.SPLIT,
    "MaxPool": Kind.POOL, "AveragePool": Kind.POOL,
    "GlobalAveragePool": Kind.POOL, "GlobalMaxPool": Kind.POOL, "LpPool": Kind.POOL,
    "Relu": Kind.RECTIFIER, "LeakyRelu": Kind.ACTIVATION, "Sigmoid": Kind.ACTIVATION, "Tanh": Kind.ACTIVATION,
    "Gelu": Kind.ACTIVATION, "Erf": Kind.ACTIVATION, "Clip": Kind.ACTIVATION, "Elu": Kind.ACTIVATION,
    "Selu": Kind.ACTIVATION, "HardSigmoid": Kind.ACTIVATION, "HardSwish": Kind.ACTIVATION,
    "Softplus": Kind.ACTIVATION, "Mish": Kind.ACTIVATION, "PRelu": Kind.ACTIVATION, "Dropout": Kind.ACTIVATION,
    "Identity": Kind.ACTIVATION, "Cast": Kind.ACTIVATION, "Sqrt": Kind.ACTIVATION, "Pow": Kind.ACTIVATION,
    "Neg": Kind.ACTIVATION, "Exp": Kind.ACTIVATION, "Log": Kind.ACTIVATION, "Abs": Kind.ACTIVATION,
    "Reciprocal": Kind.ACTIVATION, "Rsqrt": Kind.ACTIVATION,
    "Max": Kind.ADD, "Min": Kind.ADD, "Where": Kind.OTHER,
    "MatMul": Kind.MATMUL, "Softmax": Kind.SOFTMAX, "LogSoftmax": Kind.SOFTMAX,
    "Reshape": Kind.RESHAPE, "Flatten": Kind.RESHAPE, "Squeeze": Kind.RESHAPE, "Unsqueeze": Kind.RESHAPE,
    "Transpose": Kind.TRANSPOSE, "ReduceMean": Kind.REDUCE, "ReduceMax": Kind.REDUCE, "ReduceSum": Kind.REDUCE,
    "Gather": Kind.SPLIT, "Pad": Kind.ACTIVATION, "Resize": Kind.ACTIVATION, "Expand": Kind.RESHAPE,
}


def input_tables(reader: ModelReader, const: set[str], meta: set[str]) -> frozenset[str]:
    """Constant tables that a linear layer reads as its input: the first operand of a MatMul (or a Gemm) of
    constants whose second operand is a learned matrix (Swin V2's position-bias MLP runs on a coordinate table,
    its output added to the attention scores). The table must be an initializer (through shape ops) or carry no
    learned tensor (:meth:`~keeper.graph.reader.ModelReader.read_by`), so that nothing learned hides behind it; a
    matrix with one row or column makes an outer product (RoPE's angles, positions x frequencies), no layer.

    Read as inputs of the network (:meth:`~keeper.graph.reader.ModelReader.classify`), they make the small network
    part of the graph: its linear layers are layers, their weights transferred like any other."""
    out: set[str] = set()
    for n in reader.nodes:
        ins = _inputs(n)
        if n.op_type not in ("MatMul", "Gemm") or not ins[0] or any(x not in const for x in n.input if x):
            continue
        if n.op_type == "Gemm" and (int(attr(n, "transA", 0)) or len(reader.init_shapes.get(ins[0], (0, 0))) > 2):
            continue
        w = reader.trace_weight(ins[1], "weight")
        if w is None or not reader.is_learned(w.source) or len(reader.ref_shape(w)) != 2 or 1 in reader.ref_shape(w):
            continue  # a product over one unit is an outer product (RoPE's positions x frequencies), no layer
        if reader.trace_weight(ins[0], INPUT_ROLE) is not None or not reader.read_by(ins[0], meta):
            out.add(ins[0])
    return frozenset(out)


def node_info(ctx: RuleContext, n: onnx.NodeProto) -> NodeInfo:
    """The NodeInfo of one data node: its op's rule when it recognises a layer, else its weightless kind."""
    rule = OP_RULES.get(n.op_type)
    info = rule(ctx, n) if rule is not None else None
    if info is None:
        return NodeInfo(WEIGHTLESS.get(n.op_type, Kind.OTHER))
    if traits(info.kind).weighted and len(info.shape) > MAX_RANK:  # e.g. a rank-6 learned tensor
        return NodeInfo(Kind.OTHER)
    return info


def resolution_step(n: onnx.NodeProto) -> int:
    """+1 for a strided conv or pool (it lowers the resolution), -1 for a strided transposed conv, else 0.
    Global pools and reductions are left out: a head after them should match a head whatever the stage count."""
    if n.op_type in ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"):
        if any(int(s) > 1 for s in (attr(n, "strides", []) or [])):
            return -1 if n.op_type == "ConvTranspose" else 1
    return 0
