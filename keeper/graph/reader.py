"""Reading a checked ModelProto: the ONNX conventions every other part of the graph package builds on.

:class:`ModelReader` sorts the file's nodes topologically (a file may list them in any order), infers activation
shapes on a weight-free copy, tells constants from data, and follows a weight from the op that reads it back to
its initializer through Identity/Transpose/Cast/Reshape/Squeeze/Unsqueeze/Flatten (:class:`TensorRef`), so a
dynamo export (renamed, pre-transposed, aliased weights) reads the same as a TorchScript one. A learned table
read by lookups (positions gathered at ``arange(seq_len)``, a relative-position bias gathered by an index grid, a
class token expanded over the batch) is followed back to the table (``trace_table``), and ``read_by`` names the
learned tensors any constant carries, so that a tensor no rule takes is reported, never dropped.

Invariant: nothing here depends on the order of nodes in the file beyond the topological order it must allow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from keeper.errors import InvalidModelError
from keeper.graph.types import TensorRef
from keeper.onnx_safety import has_data

__all__ = ["ModelReader", "value_inputs", "attr", "as_str", "architecture_constants", "marks_constant", "INPUT_KIND",
           "INPUT_PERSISTENT"]

# Ops a constant may pass through on its way from an initializer to the op that uses it.
_WEIGHT_CHAIN_OPS = {"Identity", "Cast", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten"}
# Ops that read a learned table without computing on its values: a lookup by constant indices (positions, a
# relative-position index), a broadcast (a class token expanded over the batch), a slice. Their first input is
# the table; the others are indices or shapes.
_LOOKUP_OPS = {"Gather", "GatherElements", "GatherND", "Expand", "Slice", "Tile"}
# Ops that combine a looked-up table with constants that are no table (a mask added to a position bias): the table
# is what is learned.
_COMBINE_OPS = {"Add", "Sub", "Mul", "Div", "Where", "Concat"}
# Ops that combine a tensor with others into new constants rather than read it: what they feed is derived, not the
# tensor (RoPE's angles are ``inv_freq @ positions``, then cos and sin). Any other op reading a learned tensor,
# unary math included (a gate read through a sigmoid), reads it (see ``read_by``), except arithmetic with
# positions (:data:`_ARITHMETIC` with shape information or a non-scalar constant holding no learned tensor: the
# dynamo exporter writes RoPE's outer product ``positions * inv_freq`` as a broadcast Mul).
_DERIVING_OPS = {"MatMul", "Gemm", "Einsum", "Conv", "ConvTranspose", "Range"}
_ARITHMETIC = {"Add", "Sub", "Mul", "Div", "Pow"}
# Float types a learned tensor has.
_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                onnx.TensorProto.DOUBLE}


class ModelReader:
    """A checked ModelProto made easy to query: nodes in a topological order of the file, producers, inferred
    activation shapes, constant values, and weights traced back to their initializers. Holds only Python state."""

    def __init__(self, proto: onnx.ModelProto):
        self.graph = proto.graph
        self.init_shapes = {t.name: tuple(int(d) for d in t.dims) for t in self.graph.initializer}
        self.init_by_name = {t.name: t for t in self.graph.initializer}
        self.nodes = self._toposort(list(self.graph.node))
        self.producer: dict[str, onnx.NodeProto] = {}
        for n in self.nodes:
            for o in n.output:
                if o:
                    self.producer[o] = n
        self.shapes = self._infer_shapes(proto)
        self.fixed = architecture_constants(self.graph)
        self._tables: dict[str, str | None] = {}  # tensor -> the learned table it reads (trace_table), memoised

    # -- ordering of the file's nodes (they may come in any order)
    def _toposort(self, nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
        produced_by = {}
        for i, n in enumerate(nodes):
            for o in n.output:
                if o:
                    produced_by[o] = i
        indeg = [0] * len(nodes)
        users: list[list[int]] = [[] for _ in nodes]
        for i, n in enumerate(nodes):
            for inp in set(x for x in n.input if x):
                j = produced_by.get(inp)
                if j is not None and j != i:
                    indeg[i] += 1
                    users[j].append(i)
        ready = [i for i, d in enumerate(indeg) if d == 0]
        order = []
        while ready:
            i = ready.pop()
            order.append(nodes[i])
            for u in users[i]:
                indeg[u] -= 1
                if indeg[u] == 0:
                    ready.append(u)
        if len(order) != len(nodes):
            raise InvalidModelError("model: its graph has a cycle; an ONNX graph must be acyclic")
        return order

    def _infer_shapes(self, proto: onnx.ModelProto) -> dict[str, tuple]:
        """Activation shapes by ONNX shape inference on a weight-free copy (dims may be symbolic: -1)."""
        light = onnx.ModelProto()
        light.ir_version = proto.ir_version
        light.opset_import.extend(proto.opset_import)
        light.functions.extend(proto.functions)
        g = light.graph
        g.node.extend(self.nodes)  # sorted: inference reads nodes in order, a shuffled file would lose shapes
        g.input.extend(proto.graph.input)
        g.output.extend(proto.graph.output)
        g.value_info.extend(proto.graph.value_info)
        known = {vi.name for vi in proto.graph.input}
        for t in proto.graph.initializer:
            if t.name not in known:
                # small integer constants (shapes, axes) keep their values so Reshape targets can be inferred
                if t.data_type == onnx.TensorProto.INT64 and int(np.prod(t.dims)) <= 16:
                    g.initializer.append(t)
                else:
                    g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        try:
            inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False)
        except Exception:  # inference is a help, never a requirement
            inferred = light
        shapes = {}
        for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
            tt = vi.type.tensor_type
            if tt.HasField("shape"):
                shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        return shapes

    # -- constants and weights
    def is_learned(self, name: str) -> bool:
        """Whether initializer ``name`` can be a learned tensor: floating point with more than one element (a
        scalar is a constant of the formula: an epsilon, a scale), and not marked by the exporter as a constant of
        the architecture (:func:`architecture_constants`)."""
        t = self.init_by_name.get(name)
        return (t is not None and t.data_type in _FLOAT_TYPES and int(np.prod(t.dims)) > 1
                and name not in self.fixed)

    def classify(self, inputs: frozenset[str] = frozenset()) -> tuple[set, set]:
        """Names of constant tensors and of shape-only ('meta') tensors; the constants named in ``inputs`` are
        read as inputs of the network instead (the coordinate table a position-bias MLP runs on:
        :func:`keeper.graph.rules.input_tables`), so what is computed from them is data.

        A value computed from a learned initializer is a constant, never shape information, even when an index or
        a shape it is read with is (a position table gathered at ``arange(seq_len)``, a class token expanded to
        the batch size): rules must be able to trace it back to its table (:meth:`trace_table`)."""
        const = set(self.init_shapes) - inputs
        learned = {k for k in self.init_shapes if self.is_learned(k)} - inputs
        meta: set[str] = set()
        for n in self.nodes:
            ins = value_inputs(n)
            outs = [o for o in n.output if o and o not in inputs]
            if n.op_type == "Constant" or (ins and all(x in const for x in ins)):
                const.update(outs)
            elif n.op_type in ("Shape", "Size"):
                meta.update(outs)
            elif ins and all(x in const or x in meta for x in ins):
                (const if any(x in learned for x in ins) else meta).update(outs)
            if n.op_type not in ("Shape", "Size") and any(x in learned for x in ins):
                learned.update(outs)
        return const, meta

    def const_value(self, name: str) -> np.ndarray | None:
        """Value of a small constant (shapes, axes); None when not directly readable (an initializer holding no
        data: a weight kept apart)."""
        if name in self.init_by_name:
            t = self.init_by_name[name]
            return numpy_helper.to_array(t) if has_data(t) or not int(np.prod(t.dims)) else None
        n = self.producer.get(name)
        if n is not None and n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
                if a.name == "value_ints":
                    return np.array(list(a.ints), dtype=np.int64)
                if a.name == "value_int":
                    return np.array(a.i, dtype=np.int64)
        return None

    def small_value(self, name: str, depth: int = 0) -> np.ndarray | None:
        """Value of a small integer constant (axes, starts) as :meth:`const_value` reads it, or folded through the
        ops exporters build them with (Unsqueeze, Squeeze, Identity, Cast, Concat, Reshape
        of constants); None when not readable that way."""
        v = self.const_value(name)
        n = self.producer.get(name)
        if v is not None or n is None or depth > 8:
            return v
        parts = [self.small_value(x, depth + 1) for x in n.input if x]
        if any(p is None for p in parts) or not parts or parts[0].size > 64:
            return None
        if n.op_type in ("Identity", "Cast"):
            return parts[0]
        if n.op_type == "Unsqueeze" and parts[0].ndim == 0:
            return parts[0].reshape(1)
        if n.op_type == "Squeeze" and parts[0].size == 1:
            return parts[0].reshape(())
        if n.op_type == "Concat" and all(p.ndim == 1 for p in parts):
            return np.concatenate(parts)
        if n.op_type == "Reshape" and len(parts) == 2 and parts[1].ndim == 1 and 0 not in parts[1].tolist():
            try:
                return parts[0].reshape(parts[1].tolist())
            except ValueError:
                return None
        return None

    def trace_weight(self, name: str, role: str) -> TensorRef | None:
        """Follow ``name`` back to its initializer through shape-only ops; None when it is computed."""
        steps: list[tuple[str, tuple[int, ...]]] = []
        key = name
        only_identity = True
        cur = name
        while cur not in self.init_shapes:
            n = self.producer.get(cur)
            if n is None or n.op_type not in _WEIGHT_CHAIN_OPS:
                return None
            if n.op_type == "Transpose":
                perm = next((tuple(a.ints) for a in n.attribute if a.name == "perm"), None)
                steps.append(("T", perm if perm is not None else ()))
            elif n.op_type in ("Reshape", "Squeeze", "Unsqueeze", "Flatten"):
                shp = self.shapes.get(n.output[0])
                if shp is None or any(d < 0 for d in shp):
                    return None
                steps.append(("R", tuple(shp)))
            if n.op_type not in ("Identity", "Cast"):
                only_identity = False
            cur = n.input[0]
        src_shape = self.init_shapes[cur]
        chain = []
        shape = src_shape
        for op, arg in reversed(steps):
            if op == "T":
                perm = arg or tuple(reversed(range(len(shape))))
                shape = tuple(shape[p] for p in perm)
                chain.append(("T", perm))
            else:
                if int(np.prod(arg)) != int(np.prod(shape)):
                    return None
                shape = arg
                chain.append(("R", arg))
        return TensorRef(role, key if only_identity else cur, cur, src_shape, tuple(chain))

    def trace_pieces(self, name: str, role: str) -> tuple[TensorRef, ...] | None:
        """A vector concatenated from learned tensors and constant zeros (BEiT's and EVA's qkv bias,
        concat(q_bias, zeros, v_bias)): one ref per learned piece, each with its ``span`` in the whole; None when
        ``name`` is no Concat of 1-D pieces of known length each either a learned tensor (:meth:`trace_weight`) or
        a constant that is not learned and reads as all zeros, or when no piece is learned. The zeros are no ref:
        a transform must leave them zero (see :func:`keeper.onnx_weights.to_source`)."""
        n = self.producer.get(name)
        if n is None or n.op_type != "Concat" or int(attr(n, "axis", 0)) not in (0, -1):
            return None
        found: list[tuple[TensorRef | None, int]] = []
        for x in (x for x in n.input if x):
            ref = self.trace_weight(x, role)
            if ref is not None and self.is_learned(ref.source):
                shape = self.ref_shape(ref)
            else:
                ref, shape = None, self.zeros_shape(x)
            if shape is None or len(shape) != 1 or shape[0] <= 0:
                return None
            found.append((ref, int(shape[0])))
        whole = sum(size for _, size in found)
        refs, start = [], 0
        for ref, size in found:
            if ref is not None:
                refs.append(TensorRef(ref.role, ref.key, ref.source, ref.source_shape, ref.chain, ref.canon,
                                      (start, start + size, whole)))
            start += size
        return tuple(refs) if refs else None

    def reads_zero(self, name: str, depth: int = 0) -> bool:
        """Whether ``name`` is all zeros: a constant reading as zeros (:meth:`zeros_shape`) broadcast, reshaped or
        cast (Expand, Reshape, Cast, CastLike, Identity, Unsqueeze, Squeeze of it)."""
        if self.zeros_shape(name) is not None:
            return True
        n = self.producer.get(name)
        if n is None or depth > 16 or n.op_type not in _WEIGHT_CHAIN_OPS | {"Expand", "CastLike"}:
            return False
        return self.reads_zero(n.input[0], depth + 1)

    def zeros_shape(self, name: str) -> tuple[int, ...] | None:
        """The shape of ``name`` when it is a constant that is no learned tensor and whose value reads as all zeros
        (a Constant node, or an initializer holding its data), else None."""
        t = self.init_by_name.get(name)
        if self.is_learned(name) or (t is not None and not has_data(t)):
            return None  # an initializer whose data travels apart is unreadable here
        try:
            v = self.const_value(name)
        except (ValueError, TypeError, OSError):
            return None
        return tuple(v.shape) if v is not None and v.size > 0 and not np.any(v) else None

    def trace_table(self, name: str, role: str) -> TensorRef | None:
        """The learned table ``name`` is read from, through shape-only ops, lookups by constant indices, broadcasts
        and slices (:data:`_LOOKUP_OPS`), and combinations with constants that trace to no table (a mask added to
        a position bias); None when no learned table, or more than one, is behind it, or when values are
        computed from it (RoPE's cos/sin tables come from ``inv_freq`` through MatMul and Cos: no table).

        The reference is to the whole table as stored (no chain): the op reads some of its rows, possibly many
        times, so the table itself is what a warm transfers."""
        src = self._table_source(name, 0)
        return None if src is None else TensorRef(role, src, src, self.init_shapes[src])

    def read_by(self, name: str, meta: set[str]) -> set[str]:
        """The learned initializers whose values constant ``name`` carries: those it reaches back to through any op
        but the deriving ones (:data:`_DERIVING_OPS`, and arithmetic with a tensor of ``meta``, the shape-only
        tensors of :meth:`classify`). Wider than :meth:`trace_table` on purpose: an op keeper has no lookup rule
        for still reads the tensor, which must then be reported, never dropped in silence."""
        out: set[str] = set()
        stack, seen = [name], set()
        while stack:
            cur = stack.pop()
            if cur in seen:
                continue
            seen.add(cur)
            if cur in self.init_shapes:
                if self.is_learned(cur):
                    out.add(cur)
                continue
            n = self.producer.get(cur)
            if n is None or n.op_type in _DERIVING_OPS:
                continue
            ins = [x for x in value_inputs(n) if x]
            if n.op_type in _ARITHMETIC and any(self._positions(x, meta) for x in ins):
                continue
            stack.extend(ins)
        return out

    def _positions(self, name: str, meta: set[str]) -> bool:
        """Whether ``name`` holds shape information or non-scalar constants with no learned tensor in them
        (positions, index grids): arithmetic with them makes a new table, not a read of a learned one."""
        if name in meta:
            return True
        shape = self.init_shapes.get(name, self.shapes.get(name))
        if shape is None or any(d < 0 for d in shape) or int(np.prod(shape)) <= 1:
            return False
        return not self.read_by(name, meta)

    def _table_source(self, name: str, depth: int) -> str | None:
        if name in self._tables:
            return self._tables[name]
        self._tables[name] = None  # a cycle, or a chain deeper than any lookup, reads as no table
        src: str | None = None
        n = self.producer.get(name)
        if name in self.init_shapes:
            src = name if self.is_learned(name) else None
        elif n is None or depth > 64:
            src = None
        elif n.op_type in _WEIGHT_CHAIN_OPS or n.op_type in _LOOKUP_OPS:
            src = self._table_source(n.input[0], depth + 1)
        elif n.op_type in _COMBINE_OPS:
            found = {self._table_source(x, depth + 1) for x in n.input if x} - {None}
            src = found.pop() if len(found) == 1 else None
        self._tables[name] = src
        return src

    @staticmethod
    def ref_shape(ref: TensorRef) -> tuple[int, ...]:
        shape = ref.source_shape
        for op, arg in ref.chain:
            shape = tuple(shape[p] for p in arg) if op == "T" else arg
        return shape


# How the dynamo exporter marks what each initializer was in the module (torch.export's graph signature):
# a buffer outside the state_dict (not persistent) or a constant tensor attribute is computed when the module is
# built and never saved, so never learned (RoPE's tables, BEiT's zero key bias); keeper's torch tracer writes the
# same marks.
INPUT_KIND = "pkg.torch.export.graph_signature.InputSpec.kind"
INPUT_PERSISTENT = "pkg.torch.export.graph_signature.InputSpec.persistent"


def marks_constant(props: Mapping[str, str]) -> bool:
    """Whether a value's metadata ``props`` mark it as a constant of the architecture: a buffer that is not
    persistent, or a constant tensor (see :data:`INPUT_KIND`)."""
    kind = props.get(INPUT_KIND)
    return kind == "CONSTANT_TENSOR" or (kind == "BUFFER" and props.get(INPUT_PERSISTENT) == "False")


def architecture_constants(graph: onnx.GraphProto) -> set[str]:
    """Names of the initializers whose value_info the exporter marks as constants of the architecture
    (:func:`marks_constant`)."""
    return {vi.name for vi in graph.value_info
            if marks_constant({p.key: p.value for p in getattr(vi, "metadata_props", ())})}


def value_inputs(node: onnx.NodeProto) -> list[str]:
    """The inputs whose values the output depends on (CastLike's second input lends only its dtype: the dynamo
    exporter builds the zero bias of a bias-free conv as CastLike(0, x), which is a constant, not data)."""
    ins = [x for x in node.input if x]
    return ins[:1] if node.op_type == "CastLike" else ins


def attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    """The value of the node's attribute ``name``, or ``default`` when it has none."""
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def as_str(v: Any) -> str:
    """A string attribute as str (ONNX gives bytes)."""
    return v.decode() if isinstance(v, bytes) else str(v or "")
