"""ONNX -> LayerGraph: the compact, Ray-friendly view of a model that matching and transforms use.

This is the only module that knows ONNX node conventions. A LayerGraph holds:

* every data-dependent ONNX node ("node"), in a canonical topological order that does not depend on the order of
  nodes in the file, with its kind and its predecessors in CSR form;
* the weighted nodes ("layers": conv, linear, norm, embedding, learned additive parameters), each with its main
  parameter's shape in one canonical orientation (axis 0 = output units, axis 1 = input units, then kernel), its
  trainable element count, and the initializers it reads (:class:`TensorRef`), followed through
  Identity/Transpose/Cast/Reshape/Squeeze/Unsqueeze so a dynamo export (renamed, pre-transposed, aliased weights)
  reads the same as a TorchScript one;
* channel groups: layers whose unit axes must share one channel indexing (a conv's output, the BatchNorm after
  it, the residual stream it is added to, the next conv's input) get one group id; concatenations are composite
  groups made of their parts;
* resolution levels: how many strided convs and pools (less strided transposed convs) stand between the graph
  input and a layer's input and output, so a CNN's stages can be told apart whatever their widths.

Every array is a flat numpy array (no Python objects in them), so a LayerGraph moves zero-copy through Ray.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np
import onnx
from onnx import numpy_helper

from keeper.errors import InvalidModelError
from keeper.onnx_safety import ModelInput, load_model

__all__ = [
    "Kind",
    "TensorRef",
    "LayerGraph",
    "load_graph",
    "as_graph",
    "graph_from_proto",
]


class Kind:
    """Node kinds. Values below ``WEIGHTED_END`` carry parameters."""

    CONV = 1          # Conv, groups == 1 or grouped (not depthwise)
    DWCONV = 2        # depthwise Conv: groups == input channels, one filter (or a multiple) per channel
    CONVT = 3         # ConvTranspose
    LINEAR = 4        # Gemm / MatMul with a weight
    BATCHNORM = 5
    LAYERNORM = 6
    EMBEDDING = 7     # Gather from a weight matrix
    PARAM = 8         # a learned tensor added or multiplied elementwise (positional embedding, layer scale)
    WEIGHTED_END = 9
    ADD = 10
    MUL = 11
    CONCAT = 12
    SPLIT = 13
    POOL = 14
    ACTIVATION = 15
    MATMUL = 16       # activation x activation (attention)
    SOFTMAX = 17
    RESHAPE = 18
    TRANSPOSE = 19
    REDUCE = 20
    OTHER = 21

    NAMES = {1: "conv", 2: "dwconv", 3: "convT", 4: "linear", 5: "batchnorm", 6: "layernorm", 7: "embedding",
             8: "param", 10: "add", 11: "mul", 12: "concat", 13: "split", 14: "pool", 15: "activation",
             16: "matmul", 17: "softmax", 18: "reshape", 19: "transpose", 20: "reduce", 21: "other"}


_STRUCT_KINDS = {
    "Add": Kind.ADD, "Sub": Kind.ADD, "Mul": Kind.MUL, "Div": Kind.MUL, "Concat": Kind.CONCAT,
    "Split": Kind.SPLIT, "Slice": Kind.SPLIT, "SplitToSequence": Kind.SPLIT, "SequenceAt": Kind.SPLIT,
    "MaxPool": Kind.POOL, "AveragePool": Kind.POOL,
    "GlobalAveragePool": Kind.POOL, "GlobalMaxPool": Kind.POOL, "LpPool": Kind.POOL,
    "Relu": Kind.ACTIVATION, "LeakyRelu": Kind.ACTIVATION, "Sigmoid": Kind.ACTIVATION, "Tanh": Kind.ACTIVATION,
    "Gelu": Kind.ACTIVATION, "Erf": Kind.ACTIVATION, "Clip": Kind.ACTIVATION, "Elu": Kind.ACTIVATION,
    "Selu": Kind.ACTIVATION, "HardSigmoid": Kind.ACTIVATION, "HardSwish": Kind.ACTIVATION,
    "Softplus": Kind.ACTIVATION, "Mish": Kind.ACTIVATION, "PRelu": Kind.ACTIVATION, "Dropout": Kind.ACTIVATION,
    "Identity": Kind.ACTIVATION, "Cast": Kind.ACTIVATION, "Sqrt": Kind.ACTIVATION, "Pow": Kind.ACTIVATION,
    "Neg": Kind.ACTIVATION, "Exp": Kind.ACTIVATION, "Log": Kind.ACTIVATION, "Abs": Kind.ACTIVATION,
    "Max": Kind.ADD, "Min": Kind.ADD, "Where": Kind.OTHER,
    "MatMul": Kind.MATMUL, "Softmax": Kind.SOFTMAX, "LogSoftmax": Kind.SOFTMAX,
    "Reshape": Kind.RESHAPE, "Flatten": Kind.RESHAPE, "Squeeze": Kind.RESHAPE, "Unsqueeze": Kind.RESHAPE,
    "Transpose": Kind.TRANSPOSE, "ReduceMean": Kind.REDUCE, "ReduceMax": Kind.REDUCE, "ReduceSum": Kind.REDUCE,
    "Gather": Kind.SPLIT, "Pad": Kind.ACTIVATION, "Resize": Kind.ACTIVATION, "Expand": Kind.RESHAPE,
}
# Ops whose output keeps the channel group of their (first) data input.
_PASS_GROUP = {Kind.ACTIVATION, Kind.POOL, Kind.SOFTMAX, Kind.TRANSPOSE, Kind.REDUCE}
# Ops a constant may pass through on its way from an initializer to the op that uses it.
_WEIGHT_CHAIN_OPS = {"Identity", "Cast", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten"}
_TRAINABLE_ROLES = ("weight", "bias", "scale")
_MAX_RANK = 5


@dataclass(frozen=True)
class TensorRef:
    """One parameter tensor a layer reads.

    ``key`` names it in a WarmResult's ``weights`` (the name the op sees when only Identity nodes stand between
    it and the initializer, so deduplicated initializers are untied; the initializer's name otherwise).
    ``source`` is the initializer holding the data; ``chain`` turns the source array into the op's input
    (("T", perm) / ("R", shape) steps); ``canon`` is the extra transpose from the op's input to keeper's
    canonical orientation (empty when none).
    """

    role: str
    key: str
    source: str
    source_shape: tuple[int, ...]
    chain: tuple[tuple[str, tuple[int, ...]], ...] = ()
    canon: tuple[int, ...] = ()

    def to_json(self) -> list:
        return [self.role, self.key, self.source, list(self.source_shape),
                [[op, list(arg)] for op, arg in self.chain], list(self.canon)]

    @classmethod
    def from_json(cls, v: list) -> "TensorRef":
        return cls(v[0], v[1], v[2], tuple(v[3]), tuple((op, tuple(arg)) for op, arg in v[4]), tuple(v[5]))


@dataclass
class LayerGraph:
    """A model as flat arrays. See the module docstring for the meaning of each part.

    Node arrays (length ``num_nodes``, canonical order): ``kind``, ``pred_indptr``/``pred_indices``.
    Layer arrays (length ``num_layers``, layers in canonical order): ``layer_node`` (node index),
    ``layer_kind``, ``shape`` (``num_layers x 5`` canonical parameter shape, padded with 1), ``rank``,
    ``vectors`` (trainable per-output-unit vectors besides the main tensor, e.g. 1 for a bias),
    ``params`` (trainable elements), ``conv_groups``, ``in_group``/``out_group`` (channel group or -1),
    ``in_level``/``out_level`` (resolution level of the layer's input and output; they differ only across a
    strided layer).
    Group arrays: ``group_size`` (units, or -1 when unknown/inconsistent), ``group_parts_indptr`` /
    ``group_parts`` (the parts of a concatenation group, in order; empty for plain groups).
    """

    kind: np.ndarray
    pred_indptr: np.ndarray
    pred_indices: np.ndarray
    layer_node: np.ndarray
    layer_kind: np.ndarray
    shape: np.ndarray
    rank: np.ndarray
    vectors: np.ndarray
    params: np.ndarray
    conv_groups: np.ndarray
    in_group: np.ndarray
    out_group: np.ndarray
    in_level: np.ndarray
    out_level: np.ndarray
    group_size: np.ndarray
    group_parts_indptr: np.ndarray
    group_parts: np.ndarray
    layer_names: list[str] = field(default_factory=list)
    tensors: list[tuple[TensorRef, ...]] = field(default_factory=list)
    attrs: list[dict[str, Any]] = field(default_factory=list)

    # Version of what extraction records; 2 added packed projections (attrs["packed"]), 3 resolution levels. A
    # stored graph of an older version is re-extracted from its model (see keeper.zoo.graph_from_blob).
    FORMAT = 3

    _ARRAYS = ("kind", "pred_indptr", "pred_indices", "layer_node", "layer_kind", "shape", "rank", "vectors",
               "params", "conv_groups", "in_group", "out_group", "in_level", "out_level", "group_size",
               "group_parts_indptr", "group_parts")

    @property
    def num_nodes(self) -> int:
        return int(self.kind.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.layer_kind.shape[0])

    @property
    def total_params(self) -> int:
        """Trainable parameter elements over all layers."""
        return int(self.params.sum())

    def predecessors(self, node: int) -> np.ndarray:
        return self.pred_indices[self.pred_indptr[node]:self.pred_indptr[node + 1]]

    def group_of_parts(self, group: int) -> np.ndarray:
        return self.group_parts[self.group_parts_indptr[group]:self.group_parts_indptr[group + 1]]

    def summary(self) -> dict[str, Any]:
        """A small JSON-able description for catalogs and logs."""
        kinds: dict[str, int] = {}
        for k in self.layer_kind.tolist():
            kinds[Kind.NAMES[k]] = kinds.get(Kind.NAMES[k], 0) + 1
        return {"nodes": self.num_nodes, "layers": self.num_layers, "params": self.total_params,
                "layer_kinds": kinds}

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Plain numpy arrays (for ``np.savez``; reload with ``allow_pickle=False``)."""
        out = {name: getattr(self, name) for name in self._ARRAYS}
        meta = {"layer_names": self.layer_names, "tensors": [[t.to_json() for t in ts] for ts in self.tensors],
                "attrs": self.attrs}
        out["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        out["format"] = np.array(self.FORMAT, dtype=np.int64)
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "LayerGraph":
        try:
            meta = json.loads(bytes(np.asarray(arrays["meta"], dtype=np.uint8)).decode())
            kw = {name: np.asarray(arrays[name]) for name in cls._ARRAYS}
            return cls(**kw, layer_names=list(meta["layer_names"]),
                       tensors=[tuple(TensorRef.from_json(t) for t in ts) for ts in meta["tensors"]],
                       attrs=list(meta["attrs"]))
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            raise InvalidModelError(f"stored graph arrays are incomplete or corrupt ({exc}); "
                                    "re-register the model to rebuild them") from None


def load_graph(model: ModelInput) -> LayerGraph:
    """Parse an untrusted model once and extract its LayerGraph.

    Args:
        model: ONNX bytes, a path to an .onnx file, or an ``onnx.ModelProto``.

    Raises:
        InvalidModelError: the input is not a safe, usable ONNX model.

    Example:
        >>> g = keeper.load_graph(onnx_bytes)  # doctest: +SKIP
        >>> g.num_layers, g.total_params        # doctest: +SKIP
    """
    return graph_from_proto(load_model(model))


def as_graph(model: Union[ModelInput, LayerGraph]) -> LayerGraph:
    """``model`` itself when it already is a LayerGraph, else :func:`load_graph` of it."""
    return model if isinstance(model, LayerGraph) else load_graph(model)


# --------------------------------------------------------------------------------------------------------------
# extraction


class _Extractor:
    """One pass over a checked ModelProto. Holds only Python state; the result is flat arrays."""

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
    def classify(self) -> tuple[set, set]:
        """Names of constant tensors and of shape-only ('meta') tensors."""
        const = set(self.init_shapes)
        meta: set[str] = set()
        for n in self.nodes:
            ins = _value_inputs(n)
            if n.op_type == "Constant" or (ins and all(x in const for x in ins)):
                const.update(o for o in n.output if o)
            elif n.op_type in ("Shape", "Size") or (ins and all(x in const or x in meta for x in ins)):
                meta.update(o for o in n.output if o)
        return const, meta

    def const_value(self, name: str) -> np.ndarray | None:
        """Value of a small constant (shapes, axes); None when not directly readable."""
        if name in self.init_by_name:
            return numpy_helper.to_array(self.init_by_name[name])
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

    @staticmethod
    def ref_shape(ref: TensorRef) -> tuple[int, ...]:
        shape = ref.source_shape
        for op, arg in ref.chain:
            shape = tuple(shape[p] for p in arg) if op == "T" else arg
        return shape


def graph_from_proto(proto: onnx.ModelProto) -> LayerGraph:
    """Extract the LayerGraph of a ModelProto already checked by :func:`keeper.onnx_safety.load_model`."""
    try:
        return _extract(proto)
    except InvalidModelError:
        raise
    except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        raise InvalidModelError(f"model: its graph could not be read ({type(exc).__name__}: {exc}); "
                                "check it with onnx.checker.check_model and re-export") from None


def _value_inputs(node: onnx.NodeProto) -> list[str]:
    """The inputs whose values the output depends on (CastLike's second input lends only its dtype: the dynamo
    exporter builds the zero bias of a bias-free conv as CastLike(0, x), which is a constant, not data)."""
    ins = [x for x in node.input if x]
    return ins[:1] if node.op_type == "CastLike" else ins


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _extract(proto: onnx.ModelProto) -> LayerGraph:
    ex = _Extractor(proto)
    const, meta = ex.classify()
    # nodes that read activations and produce more than shape information
    data_nodes = [n for n in ex.nodes if n.op_type != "Constant"
                  and any(x not in const and x not in meta for x in _value_inputs(n))
                  and not all(o in meta for o in n.output if o)]
    # A MatMul with a weight followed by an Add of a constant vector is one linear layer with a bias.
    users: dict[str, list[onnx.NodeProto]] = {}
    for n in data_nodes:
        for x in n.input:
            users.setdefault(x, []).append(n)

    absorbed: dict[int, int] = {}  # id(Add node) -> index into data_nodes of the MatMul that owns it
    info: list[dict[str, Any]] = []
    for i, n in enumerate(data_nodes):
        d = _layer_info(ex, n, const, users, absorbed, i)
        if d["kind"] < Kind.WEIGHTED_END and len(d["shape"]) > _MAX_RANK:  # e.g. a rank-6 learned tensor
            d = {"kind": Kind.OTHER, "refs": []}
        info.append(d)
    keep = [i for i, n in enumerate(data_nodes) if id(n) not in absorbed]
    # tensor -> data node index (absorbed bias adds answer for their MatMul)
    out_of: dict[str, int] = {}
    for i, n in enumerate(data_nodes):
        owner = absorbed.get(id(n), i)
        for o in n.output:
            if o:
                out_of[o] = owner
    preds_raw = {i: [] for i in keep}
    for i in keep:
        n = data_nodes[i]
        for x in n.input:
            j = out_of.get(x)
            if j is not None and j != i and j not in preds_raw[i]:
                preds_raw[i].append(j)
    order = _canonical_order(keep, preds_raw, info, data_nodes)
    pos = {i: p for p, i in enumerate(order)}

    kind = np.array([info[i]["kind"] for i in order], dtype=np.int8)
    indptr = [0]
    indices: list[int] = []
    for i in order:
        indices.extend(sorted(pos[j] for j in preds_raw[i]))
        indptr.append(len(indices))

    layers = [i for i in order if info[i]["kind"] < Kind.WEIGHTED_END]
    groups = _channel_groups(ex, data_nodes, order, info, out_of, const, meta)
    level_in: dict[int, int] = {}  # data node -> resolution level of its input, and of its output
    level: dict[int, int] = {}
    for i in order:
        level_in[i] = max((level[j] for j in preds_raw[i]), default=0)
        level[i] = level_in[i] + _resolution_step(data_nodes[i])
    nl = len(layers)
    shape = np.ones((nl, _MAX_RANK), dtype=np.int64)
    rank = np.zeros(nl, dtype=np.int8)
    vectors = np.zeros(nl, dtype=np.int64)
    params = np.zeros(nl, dtype=np.int64)
    conv_groups = np.ones(nl, dtype=np.int64)
    in_group = np.full(nl, -1, dtype=np.int32)
    out_group = np.full(nl, -1, dtype=np.int32)
    in_level = np.zeros(nl, dtype=np.int16)
    out_level = np.zeros(nl, dtype=np.int16)
    names, tensors, attrs = [], [], []
    for li, i in enumerate(layers):
        d = info[i]
        s = d["shape"]
        shape[li, :len(s)] = s
        rank[li] = len(s)
        vectors[li] = d["vectors"]
        params[li] = int(np.prod(s)) + d["vectors"] * s[0]
        conv_groups[li] = d.get("groups", 1)
        in_group[li], out_group[li] = groups.layer_groups.get(i, (-1, -1))
        in_level[li], out_level[li] = level_in[i], level[i]
        names.append(data_nodes[i].name or data_nodes[i].output[0])
        tensors.append(tuple(d["refs"]))
        attrs.append({**d.get("attrs", {}), **({"packed": groups.packed[i]} if i in groups.packed else {})})
    return LayerGraph(
        kind=kind, pred_indptr=np.array(indptr, dtype=np.int64), pred_indices=np.array(indices, dtype=np.int32),
        layer_node=np.array([pos[i] for i in layers], dtype=np.int32),
        layer_kind=np.array([info[i]["kind"] for i in layers], dtype=np.int8), shape=shape, rank=rank,
        vectors=vectors, params=params, conv_groups=conv_groups, in_group=in_group, out_group=out_group,
        in_level=in_level, out_level=out_level, group_size=np.array(groups.sizes, dtype=np.int64),
        group_parts_indptr=np.array(groups.parts_indptr, dtype=np.int64),
        group_parts=np.array(groups.parts, dtype=np.int32),
        layer_names=names, tensors=tensors, attrs=attrs)


def _resolution_step(n: onnx.NodeProto) -> int:
    """+1 for a strided conv or pool (it lowers the resolution), -1 for a strided transposed conv, else 0.
    Global pools and reductions are left out: a head after them should match a head whatever the stage count."""
    if n.op_type in ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"):
        if any(int(s) > 1 for s in (_attr(n, "strides", []) or [])):
            return -1 if n.op_type == "ConvTranspose" else 1
    return 0


def _layer_info(ex: _Extractor, n: onnx.NodeProto, const: set, users: dict, absorbed: dict, i: int) -> dict:
    """Kind, canonical shape and tensor refs of one data node."""
    op = n.op_type
    ins = list(n.input) + [""] * 5

    def ref(name: str, role: str) -> TensorRef | None:
        return ex.trace_weight(name, role) if name and name in const else None

    if op in ("Conv", "ConvTranspose") and ref(ins[1], "weight"):
        w = ref(ins[1], "weight")
        s = ex.ref_shape(w)
        g = int(_attr(n, "group", 1))
        refs = [w]
        b = ref(ins[2], "bias")
        if b:
            refs.append(b)
        attrs = {"pads": list(_attr(n, "pads", []) or []), "strides": list(_attr(n, "strides", []) or []),
                 "dilations": list(_attr(n, "dilations", []) or []), "auto_pad": _as_str(_attr(n, "auto_pad", ""))}
        if op == "ConvTranspose":
            if g != 1:
                return {"kind": Kind.OTHER, "refs": []}
            perm = (1, 0) + tuple(range(2, len(s)))
            refs[0] = _with_canon(w, perm)
            s = tuple(s[p] for p in perm)
            return {"kind": Kind.CONVT, "shape": s, "vectors": len(refs) - 1, "refs": refs, "attrs": attrs}
        k = Kind.DWCONV if (g > 1 and s[1] == 1) else Kind.CONV
        return {"kind": k, "shape": s, "vectors": len(refs) - 1, "refs": refs, "groups": g, "attrs": attrs}
    if op == "Gemm" and ref(ins[1], "weight") and not ref(ins[0], "weight"):
        w = ref(ins[1], "weight")
        s = ex.ref_shape(w)
        if len(s) != 2 or int(_attr(n, "transA", 0)):
            return {"kind": Kind.OTHER, "refs": []}
        if not int(_attr(n, "transB", 0)):
            w, s = _with_canon(w, (1, 0)), (s[1], s[0])
        refs = [w]
        b = ref(ins[2], "bias")
        if b and int(np.prod(ex.ref_shape(b))) == s[0]:
            refs.append(b)
        return {"kind": Kind.LINEAR, "shape": s, "vectors": len(refs) - 1, "refs": refs}
    if op == "MatMul" and ref(ins[1], "weight") and len(ex.ref_shape(ref(ins[1], "weight"))) == 2:
        w = ref(ins[1], "weight")
        k_in, k_out = ex.ref_shape(w)
        refs = [_with_canon(w, (1, 0))]
        d = {"kind": Kind.LINEAR, "shape": (k_out, k_in), "vectors": 0, "refs": refs}
        outs = users.get(n.output[0], [])
        if len(outs) == 1 and outs[0].op_type == "Add":
            add = outs[0]
            other = [x for x in add.input if x != n.output[0]]
            if len(other) == 1 and ref(other[0], "bias") and int(np.prod(ex.ref_shape(ref(other[0], "bias")))) == k_out:
                refs.append(ref(other[0], "bias"))
                d["vectors"] = 1
                absorbed[id(add)] = i
                d["bias_add_node"] = add
        return d
    if op == "BatchNormalization":
        rs = [ref(ins[j], role) for j, role in ((1, "scale"), (2, "bias"), (3, "mean"), (4, "var"))]
        if all(rs):
            c = int(np.prod(ex.ref_shape(rs[0])))
            return {"kind": Kind.BATCHNORM, "shape": (c,), "vectors": 1, "refs": rs,
                    "attrs": {"epsilon": float(_attr(n, "epsilon", 1e-5))}}
    if op == "LayerNormalization":
        sc = ref(ins[1], "scale")
        if sc:
            rs = [sc] + ([ref(ins[2], "bias")] if ref(ins[2], "bias") else [])
            c = int(np.prod(ex.ref_shape(sc)))
            return {"kind": Kind.LAYERNORM, "shape": (c,), "vectors": len(rs) - 1, "refs": rs,
                    "attrs": {"epsilon": float(_attr(n, "epsilon", 1e-5))}}
    if op == "Gather" and ref(ins[0], "weight") and ins[1] not in const:
        w = ref(ins[0], "weight")
        s = ex.ref_shape(w)
        if len(s) == 2:
            return {"kind": Kind.EMBEDDING, "shape": (s[1], s[0]), "vectors": 0, "refs": [_with_canon(w, (1, 0))]}
    if op in ("Add", "Mul") and sum(1 for x in n.input if x in const) == 1:
        cname = next(x for x in n.input if x in const)
        p = ref(cname, "weight")
        if p is not None and int(np.prod(ex.ref_shape(p))) > 1:
            s = ex.ref_shape(p)
            # canonical: the channel axis first, the others in order. The channel axis is the only non-singleton
            # one when there is one (a per-channel scale (1, C, 1, 1) of a conv net), else the last one (a
            # positional embedding (1, T, D) of a transformer).
            wide = [a for a, d in enumerate(s) if d != 1]
            ax = wide[0] if len(wide) == 1 else len(s) - 1
            perm = (ax,) + tuple(a for a in range(len(s)) if a != ax)
            return {"kind": Kind.PARAM, "shape": tuple(s[q] for q in perm), "vectors": 0,
                    "refs": [_with_canon(p, perm)]}
    return {"kind": _STRUCT_KINDS.get(op, Kind.OTHER), "refs": []}


def _with_canon(ref: TensorRef, perm: tuple[int, ...]) -> TensorRef:
    return TensorRef(ref.role, ref.key, ref.source, ref.source_shape, ref.chain, tuple(perm))


def _as_str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v or "")


def _canonical_order(keep: list[int], preds: dict[int, list[int]], info: list[dict],
                     nodes: list[onnx.NodeProto]) -> list[int]:
    """Topological order independent of file order.

    Ready nodes are taken by (longest-path level, the input slot their branch takes at the merge it ends in,
    structural hash, kind, output name); the hash is a two-round Weisfeiler-Lehman label over kinds and input
    slots without shapes, so widening a model does not reorder it, and only structurally identical nodes fall
    back to their output names (unique in a valid model, so the order never depends on where a node sits in the
    file).
    """
    succs: dict[int, list[tuple[int, int]]] = {i: [] for i in keep}
    for i in keep:
        n = nodes[i]
        for slot, j in enumerate(preds[i]):
            succs[j].append((i, slot))
    level: dict[int, int] = {}
    indeg = {i: len(preds[i]) for i in keep}
    stack = [i for i in keep if indeg[i] == 0]
    topo = []
    while stack:
        i = stack.pop()
        topo.append(i)
        for j, _ in succs[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                stack.append(j)
    for i in topo:
        level[i] = 1 + max((level[j] for j in preds[i]), default=-1)
    label = {i: info[i]["kind"] for i in keep}
    for _ in range(2):
        label = {i: hash((label[i], tuple(label[j] for j in preds[i]),
                          tuple(sorted((label[s], slot) for s, slot in succs[i])))) & 0xFFFFFFFF
                 for i in keep}
    # Where a node's branch ends: following single-successor links down to the first merge, the input slot the
    # branch takes there (-1 when it forks or ends first). Parallel branches of one concatenation or residual
    # add are ordered by that slot, which editing the model above or below the merge does not change (the
    # hashed labels of siblings all change together there, and their order with them).
    exit_slot: dict[int, int] = {}
    for i in reversed(topo):
        if len(succs[i]) != 1:
            exit_slot[i] = -1
        else:
            j, slot = succs[i][0]
            exit_slot[i] = exit_slot[j] if len(preds[j]) == 1 else slot
    indeg = {i: len(preds[i]) for i in keep}
    # last tie-break: the node's first output name (unique in a valid model), never the position in the file
    name = {i: nodes[i].output[0] if nodes[i].output else "" for i in keep}
    heap = [(level[i], exit_slot[i], label[i], info[i]["kind"], name[i], i) for i in keep if indeg[i] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        *_, i = heapq.heappop(heap)
        order.append(i)
        for j, _ in succs[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(heap, (level[j], exit_slot[j], label[j], info[j]["kind"], name[j], j))
    return order


@dataclass
class _Groups:
    sizes: list[int]
    parts_indptr: list[int]
    parts: list[int]
    layer_groups: dict[int, tuple[int, int]]
    # data node index of a projection whose output is unpacked into parts -> its "packed" attrs
    packed: dict[int, dict[str, Any]] = field(default_factory=dict)


# ops a packed projection's output passes through before it is unpacked by Gather (torch's MultiheadAttention
# unflattens (..., 3 * d) to (..., 3, d) and moves the 3 to the front)
_UNPACK_CHAIN_OPS = {"Reshape", "Unsqueeze", "Squeeze", "Transpose", "Identity"}


def _reshape_last_dim(ex: _Extractor, n: onnx.NodeProto) -> int:
    """The last dimension a Reshape produces, from inferred shapes or from its constant target; -1 if unknown."""
    shp = ex.shapes.get(n.output[0]) if n.output else None
    if shp and shp[-1] > 0:
        return int(shp[-1])
    cur = n.input[1] if len(n.input) > 1 else ""
    for _ in range(8):  # Concat(..., Unsqueeze(Constant)) as TorchScript writes a target with a dynamic batch
        v = ex.const_value(cur)
        if v is not None:
            v = np.asarray(v).reshape(-1)
            return int(v[-1]) if v.size and v[-1] > 0 else -1
        p = ex.producer.get(cur)
        if p is None or p.op_type not in ("Concat", "Unsqueeze") or not p.input:
            return -1
        cur = p.input[-1] if p.op_type == "Concat" else p.input[0]
    return -1


def _channel_groups(ex: _Extractor, nodes: list, order: list[int], info: list[dict], out_of: dict,
                    const: set, meta: set) -> _Groups:
    """Union-find over channel dimensions; see the module docstring."""
    parent: list[int] = []
    size: list[int] = []
    parts: dict[int, list[int]] = {}

    def new(sz: int = -1, comp: list[int] | None = None) -> int:
        parent.append(len(parent))
        size.append(sz)
        if comp:
            parts[len(parent) - 1] = comp
        return len(parent) - 1

    def find(g: int) -> int:
        while parent[g] != g:
            parent[g] = parent[parent[g]]
            g = parent[g]
        return g

    def union(a: int, b: int) -> int:
        a, b = find(a), find(b)
        if a == b:
            return a
        if a in parts or b in parts:  # a composite never merges; keep the one readers asked for
            return a
        sa, sb = size[a], size[b]
        parent[b] = a
        size[a] = sa if sb < 0 else (sb if sa < 0 else (sa if sa == sb else -2))  # -2: inconsistent
        return a

    def sized(g: int, sz: int) -> int:
        g = find(g)
        if g in parts:
            total = sum(max(size[find(p)], 0) for p in parts[g])
            return g if total == sz else new(sz)
        if size[g] == -1:
            size[g] = sz
        return g if size[g] == sz else new(sz)

    tensor_group: dict[str, int] = {}
    layer_groups: dict[int, tuple[int, int]] = {}

    def group_in(name: str) -> int:
        g = tensor_group.get(name)
        return new() if g is None else g

    # Packed projections (q, k and v computed by one linear layer): the layer's output group becomes a composite
    # of k equal parts when its output reaches k Gathers with constant indices 0..k-1 (torch's
    # MultiheadAttention) or one Split into k equal outputs along the unit axis (``qkv.split(d, dim=-1)``, as in
    # GPT-2), so each part gets its own unit map; heads and dot products between parts are recorded for the
    # transforms.
    linear_out: dict[str, int] = {}   # output tensor of a linear layer -> its data node index
    gathers: dict[str, set[int]] = {}  # tensor -> constant scalar indices it is gathered at
    for n in nodes:
        if n.op_type == "Gather" and len(n.input) == 2 and int(_attr(n, "axis", 0)) == 0:
            v = ex.const_value(n.input[1])
            if v is not None and np.asarray(v).ndim == 0:
                gathers.setdefault(n.input[0], set()).add(int(v))
    part_of: dict[int, tuple[int, int]] = {}  # part group -> (data node of the projection, part index)
    part_heads: dict[int, int] = {}
    dots: set[tuple[int, int, int]] = set()

    def linear_of(src: str) -> str | None:
        """The linear layer output that ``src`` is, through unpacking reshapes (None when it is not one)."""
        cur = src
        while cur not in linear_out:
            p = ex.producer.get(cur)
            if p is None or p.op_type not in _UNPACK_CHAIN_OPS or not p.input:
                return None
            cur = p.input[0]
        return cur

    def packed_parts(cur: str | None, k: int | None) -> list[int] | None:
        """The k part groups of the linear layer output ``cur`` (found by ``linear_of``)."""
        if cur is None or k is None:
            return None
        li = linear_out[cur]
        units = int(info[li]["shape"][0])
        if k < 2 or units % k:
            return None
        g = find(tensor_group[cur])
        if g not in parts:
            if size[g] != units:
                return None
            parts[g] = [new(units // k) for _ in range(k)]
            for j, pg in enumerate(parts[g]):
                part_of[pg] = (li, j)
        return parts[g] if len(parts[g]) == k else None

    def unpacked_part(n: onnx.NodeProto) -> int | None:
        ks = gathers.get(n.input[0], set())
        pgs = packed_parts(linear_of(n.input[0]), len(ks)) if ks == set(range(len(ks))) else None
        return None if pgs is None else pgs[int(ex.const_value(n.input[1]))]

    def on_last_axis(n: onnx.NodeProto) -> bool:
        shp, axis = ex.shapes.get(n.input[0]), int(_attr(n, "axis", 0))
        return axis == -1 or bool(shp and axis % len(shp) == len(shp) - 1)

    def split_parts(n: onnx.NodeProto) -> list[int] | None:
        """Part groups for the outputs of a Split of a linear output into equal pieces along its last axis."""
        outs = list(n.output)
        if len(outs) < 2 or not all(outs) or not on_last_axis(n):
            return None
        sizes = ex.const_value(n.input[1]) if len(n.input) > 1 and n.input[1] else _attr(n, "split", None)
        if sizes is not None and len(set(int(v) for v in np.asarray(sizes).reshape(-1))) != 1:
            return None
        return packed_parts(linear_of(n.input[0]), len(outs))

    def sequence_part(n: onnx.NodeProto) -> int | None:
        """The part group of SequenceAt(SplitToSequence(linear output, equal pieces, last axis), constant index)
        (the dynamo exporter's form of ``split``)."""
        p = ex.producer.get(n.input[0])
        if p is None or p.op_type != "SplitToSequence" or len(p.input) < 2 or not p.input[1] or not on_last_axis(p):
            return None
        sizes, idx, cur = ex.const_value(p.input[1]), ex.const_value(n.input[1]), linear_of(p.input[0])
        if sizes is None or idx is None or cur is None or np.asarray(idx).ndim:
            return None
        sizes = np.asarray(sizes).reshape(-1)
        units = int(info[linear_out[cur]]["shape"][0])
        if len(set(sizes.tolist())) != 1 or int(sizes[0]) <= 0:
            return None
        k = (units // int(sizes[0]) if units % int(sizes[0]) == 0 else None) if sizes.size == 1 else sizes.size
        pgs = packed_parts(cur, k)
        return None if pgs is None else pgs[int(idx) % len(pgs)]

    def part(g: int) -> tuple[int, int] | None:
        return part_of.get(find(g))

    data_inputs = lambda n: [x for x in n.input if x and x not in const and x not in meta]  # noqa: E731
    for i in order:
        n, d = nodes[i], info[i]
        k = d["kind"]
        ins = data_inputs(n)
        out = n.output[0] if n.output else None
        if d.get("bias_add_node") is not None:
            out = d["bias_add_node"].output[0]
        g_out: int
        if k < Kind.WEIGHTED_END:
            s = d["shape"]
            if k in (Kind.CONV, Kind.CONVT, Kind.LINEAR):
                cin = s[1] * d.get("groups", 1)
                gi = sized(group_in(ins[0]), cin) if ins else -1
                g_out = new(s[0])
                if k == Kind.LINEAR and out:
                    linear_out[out] = i
            elif k == Kind.EMBEDDING:
                gi, g_out = -1, new(s[0])
            else:  # depthwise conv, norms, learned params act per channel: in and out share the group
                gi = sized(group_in(ins[0]), s[0]) if ins else new(s[0])
                g_out = gi
            layer_groups[i] = (gi, g_out)
        elif k in (Kind.ADD, Kind.MUL) and len(ins) >= 2:
            g_out = group_in(ins[0])
            for x in ins[1:]:
                g_out = union(g_out, group_in(x))
        elif k in _PASS_GROUP or (k in (Kind.ADD, Kind.MUL) and ins):
            g_out = group_in(ins[0]) if ins else new()
        elif k == Kind.SPLIT and n.op_type == "Gather" and len(n.input) == 2 and n.input[0] in gathers \
                and (pg := unpacked_part(n)) is not None:
            g_out = pg
        elif k == Kind.SPLIT and n.op_type == "SequenceAt" and len(n.input) == 2 \
                and (pg := sequence_part(n)) is not None:
            g_out = pg
        elif k == Kind.SPLIT and n.op_type == "Split" and n.input and (pgs := split_parts(n)) is not None:
            for o, pg in zip(n.output, pgs):
                tensor_group[o] = pg
            continue
        elif k == Kind.MATMUL and len(ins) == 2:
            pa, pb = part(group_in(ins[0])), part(group_in(ins[1]))
            if pa and pb and pa[0] == pb[0] and pa[1] != pb[1]:
                # q @ k^T of one packed projection: its output is indexed by positions, not by units
                dots.add((pa[0], min(pa[1], pb[1]), max(pa[1], pb[1])))
                g_out = new()
            else:
                g_out = group_in(ins[1])
        elif k == Kind.RESHAPE and ins and n.op_type == "Reshape" and part(group_in(ins[0])):
            # a part split into heads (..., heads, d / heads) or merged back keeps its unit indexing
            # (an unknown target passes the group on, as elsewhere)
            g, last = find(group_in(ins[0])), _reshape_last_dim(ex, n)
            if last <= 0 or (size[g] > 0 and size[g] % last == 0):
                g_out = g
                if 0 < last < size[g]:
                    part_heads[g] = size[g] // last
            else:
                g_out = new()
        elif k == Kind.RESHAPE and ins:
            a, b = ex.shapes.get(ins[0]), ex.shapes.get(out or "")
            g_out = group_in(ins[0]) if _keeps_channels(a, b) else new()
        elif k == Kind.CONCAT and ins:
            axis = int(_attr(n, "axis", 0))
            shp = ex.shapes.get(out or "")
            r = len(shp) if shp else None
            ax = axis % r if r else axis
            gs = [find(group_in(x)) for x in ins]
            if r is not None and (ax == 1 or ax == r - 1) and all(size[g] > 0 for g in gs):
                g_out = new(sum(size[g] for g in gs), gs)
            else:
                g_out = gs[0]
                for g in gs[1:]:
                    g_out = union(g_out, g)
        else:
            g_out = new()
        for o in (n.output if d.get("bias_add_node") is None else [out]):
            if o:
                tensor_group[o] = g_out
    # compact ids
    roots: dict[int, int] = {}
    sizes: list[int] = []
    for g in range(len(parent)):
        r = find(g)
        if r not in roots:
            roots[r] = len(sizes)
            sizes.append(size[r] if size[r] >= 0 else -1)
    indptr, flat = [0], []
    for r, cid in sorted(roots.items(), key=lambda kv: kv[1]):
        flat.extend(roots[find(p)] for p in parts.get(r, []))
        indptr.append(len(flat))
    remap = {i: (roots[find(a)] if a >= 0 else -1, roots[find(b)] if b >= 0 else -1)
             for i, (a, b) in layer_groups.items()}
    packed: dict[int, dict[str, Any]] = {}
    for g, members in parts.items():
        if members and members[0] in part_of:
            li = part_of[members[0]][0]
            packed[li] = {"parts": len(members), "heads": [part_heads.get(find(m), 1) for m in members],
                          "dots": sorted([a, b] for (l2, a, b) in dots if l2 == li)}
    return _Groups(sizes, indptr, flat, remap, packed)


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
