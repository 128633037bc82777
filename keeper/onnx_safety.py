"""Safe reading of untrusted ONNX input.

Invariant: a ModelProto returned by :func:`load_model` has a graph, no tensor anywhere (initializers, sparse
initializers, Constant and other tensor attributes, subgraphs, functions, training graphs) that refers to external
data, no negative or absurd dimension, no tensor whose stored data is not exactly what its dims claim, and a node
count under the cap; it imports the default ONNX operator set. Nothing is ever read from a path the model names.

A main-graph initializer may hold no data at all: the model is then a graph whose weights travel apart
(:mod:`keeper.weights`), and :func:`keeper.onnx_weights.model_weights` refuses it unless they are given. With
``weights_apart=True`` a main-graph initializer that refers to external data (torch's exporter writes models over
2 GiB so) is turned into such a data-less one: its location is dropped unread.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Union

import onnx
from google.protobuf.message import DecodeError

from keeper.errors import InvalidModelError

__all__ = ["ModelInput", "load_model", "has_data", "MAX_MODEL_BYTES", "MAX_NODES", "MAX_TENSOR_ELEMENTS"]

ModelInput = Union[bytes, bytearray, memoryview, str, os.PathLike, onnx.ModelProto]

#: Larger inputs are refused before parsing (protobuf itself cannot go past 2 GiB).
MAX_MODEL_BYTES = int(os.environ.get("KEEPER_MAX_MODEL_BYTES", 2**31 - 1))
#: Nodes summed over the graph, its subgraphs and its functions.
MAX_NODES = int(os.environ.get("KEEPER_MAX_NODES", 1_000_000))
#: One tensor may not claim more elements than this (16 G elements is beyond any model keeper serves).
MAX_TENSOR_ELEMENTS = 2**34


def load_model(model: ModelInput, *, what: str = "model", weights_apart: bool = False) -> onnx.ModelProto:
    """Parse ``model`` (ONNX bytes, a path to an .onnx file, or a ModelProto) and check it is safe to use.

    ``weights_apart``: the caller supplies the weights separately, so main-graph initializers that refer to
    external data lose that reference (on a copy when ``model`` is a ModelProto) and must come from the weights.

    Raises:
        InvalidModelError: naming what is wrong (empty, too large, not ONNX, external data, absurd dims...).

    Example:
        >>> proto = load_model(open("net.onnx", "rb").read())  # doctest: +SKIP
    """
    if isinstance(model, onnx.ModelProto):
        size = model.ByteSize()
        if size > MAX_MODEL_BYTES:
            raise InvalidModelError(f"{what}: {size} bytes exceeds the cap of {MAX_MODEL_BYTES}; "
                                    "raise KEEPER_MAX_MODEL_BYTES if this is intended")
        proto = model
        if weights_apart and _external_initializers(proto):
            proto = onnx.ModelProto()
            proto.CopyFrom(model)
    elif isinstance(model, (bytes, bytearray, memoryview)):
        proto = _parse(bytes(model), what)
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise InvalidModelError(f"{what}: no file at {str(path)!r}; pass ONNX bytes, a path to an .onnx "
                                    "file, or an onnx.ModelProto")
        size = path.stat().st_size
        if size > MAX_MODEL_BYTES:
            raise InvalidModelError(f"{what}: file {str(path)!r} is {size} bytes, over the cap of "
                                    f"{MAX_MODEL_BYTES}; raise KEEPER_MAX_MODEL_BYTES if this is intended")
        proto = _parse(path.read_bytes(), f"{what} ({path.name})")
    else:
        raise InvalidModelError(f"{what}: got {type(model).__name__}; expected ONNX bytes, a path to an "
                                ".onnx file, or an onnx.ModelProto")
    if weights_apart:
        for t in _external_initializers(proto):
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
    check_model(proto, what)
    return proto


def _external_initializers(proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in proto.graph.initializer
            if t.data_location == onnx.TensorProto.EXTERNAL or len(t.external_data) > 0]


def has_data(tensor: onnx.TensorProto) -> bool:
    """Whether ``tensor`` holds any stored values (a data-less one is a placeholder for weights kept apart)."""
    if tensor.HasField("raw_data") and len(tensor.raw_data) > 0:
        return True
    if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data) > 0:
        return True
    return any(len(getattr(tensor, f)) for f in ("float_data", "int32_data", "string_data", "int64_data",
                                                  "double_data", "uint64_data"))


def _parse(data: bytes, what: str) -> onnx.ModelProto:
    if not data:
        raise InvalidModelError(f"{what}: empty input; expected the bytes of an ONNX model")
    if len(data) > MAX_MODEL_BYTES:
        raise InvalidModelError(f"{what}: {len(data)} bytes exceeds the cap of {MAX_MODEL_BYTES}; "
                                "raise KEEPER_MAX_MODEL_BYTES if this is intended")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidModelError(f"{what}: not a readable ONNX model ({exc}); the bytes are truncated, "
                                "corrupt or not ONNX: re-export the model") from None
    return proto


def check_model(proto: onnx.ModelProto, what: str = "model") -> None:
    """Raise InvalidModelError unless ``proto`` is structurally safe (see the module invariant)."""
    if not proto.HasField("graph") or len(proto.graph.node) == 0:
        raise InvalidModelError(f"{what}: has no graph nodes; expected an ONNX model with a computation "
                                "graph (garbage bytes can parse as an empty protobuf)")
    if not any(o.domain in ("", "ai.onnx") for o in proto.opset_import):
        raise InvalidModelError(f"{what}: imports no ONNX operator set (opset_import is empty or lacks the default "
                                "domain); the file is truncated or not a complete ONNX model: re-export it")
    nodes = 0
    # data-less main-graph initializers are weights kept apart; their dims are still checked
    apart = {t.name for t in proto.graph.initializer if not has_data(t)}
    for kind, tensor in _all_tensors(proto):
        if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data) > 0:
            raise InvalidModelError(f"{what}: {kind} {tensor.name!r} refers to external data; keeper never "
                                    "reads files a model names: save the model with all tensors inline, or pass "
                                    "the graph with its weights as safetensors (weights=..., --weights)")
        count = _check_dims(tensor, kind, what)
        if not (kind == "initializer" and tensor.name in apart and not has_data(tensor)):
            _check_data_size(tensor, kind, what, count)
    for graph in _all_graphs(proto):
        nodes += len(graph.node)
        if nodes > MAX_NODES:
            raise InvalidModelError(f"{what}: more than {MAX_NODES} nodes; this is not a model keeper can "
                                    "match (raise KEEPER_MAX_NODES if it really is)")
    for fn in proto.functions:
        nodes += len(fn.node)
    if nodes > MAX_NODES:
        raise InvalidModelError(f"{what}: more than {MAX_NODES} nodes including functions")


def _check_dims(tensor: onnx.TensorProto, kind: str, what: str) -> int:
    """The element count the dims claim, after checking it is sane."""
    count = 1
    for d in tensor.dims:
        if d < 0:
            raise InvalidModelError(f"{what}: {kind} {tensor.name!r} has negative dimension {d}")
        count *= d
        if count > MAX_TENSOR_ELEMENTS:
            raise InvalidModelError(f"{what}: {kind} {tensor.name!r} claims dims {list(tensor.dims)}, "
                                    f"over {MAX_TENSOR_ELEMENTS} elements; the model is corrupt")
    return count


# Bits per element of the types whose storage is unambiguous; others (strings, 2- and 6-bit types) go unchecked.
_BITS = {getattr(onnx.TensorProto, name): bits for name, bits in (
    ("FLOAT", 32), ("DOUBLE", 64), ("FLOAT16", 16), ("BFLOAT16", 16), ("INT8", 8), ("UINT8", 8), ("INT16", 16),
    ("UINT16", 16), ("INT32", 32), ("UINT32", 32), ("INT64", 64), ("UINT64", 64), ("BOOL", 8), ("COMPLEX64", 64),
    ("COMPLEX128", 128), ("FLOAT8E4M3FN", 8), ("FLOAT8E4M3FNUZ", 8), ("FLOAT8E5M2", 8), ("FLOAT8E5M2FNUZ", 8),
    ("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4)) if hasattr(onnx.TensorProto, name)}
_COMPLEX = {onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128}


def _check_data_size(tensor: onnx.TensorProto, kind: str, what: str, count: int) -> None:
    """The data a tensor holds must be exactly what its dims claim: a small file cannot claim a huge tensor, and
    truncated data is refused here rather than misread later. Only lengths are read, never the values."""
    bits = _BITS.get(tensor.data_type)
    if bits is None or tensor.HasField("segment"):
        return
    if tensor.HasField("raw_data"):
        have, need, unit = len(tensor.raw_data), (count * bits + 7) // 8, "bytes"
    else:
        try:
            field = onnx.helper.tensor_dtype_to_field(tensor.data_type)
        except (KeyError, ValueError):
            return
        have = len(getattr(tensor, field))
        need = (count + 1) // 2 if bits < 8 else count * (2 if tensor.data_type in _COMPLEX else 1)
        unit = f"{field} entries"
    if have != need:
        raise InvalidModelError(f"{what}: {kind} {tensor.name!r} holds {have} {unit} but its dims "
                                f"{list(tensor.dims)} need {need}; the model is truncated or corrupt: re-export it")


def _subgraphs(nodes) -> Iterator[onnx.GraphProto]:
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield attr.g
            yield from attr.graphs


def _all_graphs(proto: onnx.ModelProto) -> Iterator[onnx.GraphProto]:
    """The main graph and every subgraph, including those inside functions."""
    stack = [proto.graph]
    for info in proto.training_info:  # training graphs hold initializers too
        stack.extend((info.initialization, info.algorithm))
    for fn in proto.functions:
        stack.extend(_subgraphs(fn.node))
    while stack:
        graph = stack.pop()
        yield graph
        stack.extend(_subgraphs(graph.node))


def _node_tensors(nodes, where: str) -> Iterator[tuple[str, onnx.TensorProto]]:
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield f"attribute {attr.name} of {where} node {node.name or node.op_type}", attr.t
            for t in attr.tensors:
                yield f"attribute {attr.name} of {where} node {node.name or node.op_type}", t
            if attr.HasField("sparse_tensor"):
                yield "sparse attribute values", attr.sparse_tensor.values
                yield "sparse attribute indices", attr.sparse_tensor.indices
            for st in attr.sparse_tensors:
                yield "sparse attribute values", st.values
                yield "sparse attribute indices", st.indices


def _all_tensors(proto: onnx.ModelProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    for graph in _all_graphs(proto):
        for t in graph.initializer:
            yield "initializer", t
        for st in graph.sparse_initializer:
            yield "sparse initializer values", st.values
            yield "sparse initializer indices", st.indices
        yield from _node_tensors(graph.node, "graph")
    for fn in proto.functions:
        yield from _node_tensors(fn.node, f"function {fn.name}")
