"""Read a model's parameters in keeper's canonical orientation, and write warmed ones back.

Invariant: ``to_source(ref, canonical(ref, arrays))`` returns the array stored under ``ref.key`` unchanged, so a
round trip through canonical orientation is exact. Keys that are aliases of a shared initializer (TorchScript
deduplicates equal initializers behind Identity nodes) are untied on write: each gets its own initializer.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from keeper.errors import InvalidModelError
from keeper.graph import LayerGraph, TensorRef

__all__ = ["read_initializers", "canonical", "to_source", "layer_arrays", "write_weights"]


def read_initializers(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every initializer of the main graph as a numpy array (read-only views where protobuf allows)."""
    out = {}
    for t in proto.graph.initializer:
        try:
            out[t.name] = numpy_helper.to_array(t)
        except (ValueError, TypeError) as exc:
            raise InvalidModelError(f"model: initializer {t.name!r} holds data that does not fit its dims "
                                    f"{list(t.dims)} ({exc}); the file is corrupt: re-export it") from None
    return out


def canonical(ref: TensorRef, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """The tensor ``ref`` names, in keeper's canonical orientation (a view where possible)."""
    a = arrays[ref.source]
    for op, arg in ref.chain:
        a = a.transpose(arg) if op == "T" else a.reshape(arg)
    return a.transpose(ref.canon) if ref.canon else a


def to_source(ref: TensorRef, value: np.ndarray) -> np.ndarray:
    """Inverse of :func:`canonical`: the array to store under ``ref.key``."""
    a = value.transpose(np.argsort(ref.canon)) if ref.canon else value
    if ref.key != ref.source:  # an untied alias: stored as the op sees it
        return np.ascontiguousarray(a)
    shapes = [ref.source_shape]
    for op, arg in ref.chain:
        shapes.append(tuple(shapes[-1][p] for p in arg) if op == "T" else arg)
    for (op, arg), before in zip(reversed(ref.chain), reversed(shapes[:-1])):
        a = a.transpose(np.argsort(arg)) if op == "T" else a.reshape(before)
    return np.ascontiguousarray(a)


def layer_arrays(graph: LayerGraph, arrays: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Per layer, role -> canonical array."""
    return [{ref.role: canonical(ref, arrays) for ref in refs} for refs in graph.tensors]


def write_weights(proto: onnx.ModelProto, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``proto`` whose initializers (and untied aliases) hold ``weights``.

    Keys not among the initializers must be outputs of Identity nodes reading an initializer; such a node is
    replaced by an initializer of its own. Dtypes follow the original tensors.
    """
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    g = out.graph
    by_name = {t.name: i for i, t in enumerate(g.initializer)}
    aliases = {}
    for idx, node in enumerate(g.node):
        if node.op_type == "Identity" and node.output and node.output[0] in weights and node.input[0] in by_name:
            aliases[node.output[0]] = idx
    for key, value in weights.items():
        if key in by_name:
            old = g.initializer[by_name[key]]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(old.data_type)
            if tuple(old.dims) != tuple(value.shape):
                raise InvalidModelError(f"warm weights: {key!r} has shape {tuple(value.shape)}, the model expects "
                                        f"{tuple(old.dims)}; the weights belong to another architecture")
            old.CopyFrom(numpy_helper.from_array(np.asarray(value, dtype=dtype), key))
        elif key not in aliases:
            raise InvalidModelError(f"warm weights: {key!r} is neither an initializer nor an alias of one in the "
                                    "model; pass the weights of this model's WarmResult")
    if aliases:
        drop = set()
        for key, idx in aliases.items():
            src = g.initializer[by_name[g.node[idx].input[0]]]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(src.data_type)
            g.initializer.append(numpy_helper.from_array(np.asarray(weights[key], dtype=dtype), key))
            drop.add(idx)
        keep = [n for i, n in enumerate(g.node) if i not in drop]
        del g.node[:]
        g.node.extend(keep)
    return out
