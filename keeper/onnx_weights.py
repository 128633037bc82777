"""Read a model's parameters in keeper's canonical orientation, and write warmed ones back.

Invariant: ``to_source(ref, canonical(ref, arrays))`` returns the array stored under ``ref.key`` unchanged, so a
round trip through canonical orientation is exact; for a piece of a role built from pieces (``ref.span``),
``to_source(ref, role_arrays(refs, arrays)[ref.role])`` does, and the rows no piece covers are zeros. Keys that
are aliases of a shared initializer (TorchScript deduplicates equal initializers behind Identity nodes) are untied
on write: each gets its own initializer.

A model's weights are its initializers' data, or, for initializers stored without data (a graph whose weights
travel apart), the tensors of a weights file (:mod:`keeper.weights`), checked against the graph's dtypes and dims
before any is used (:func:`model_weights`).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from keeper.errors import InvalidModelError, InvalidWeightsError
from keeper.graph import LayerGraph, TensorRef
from keeper.onnx_safety import has_data
from keeper.weights import WeightsInput, check_weights, open_weights

__all__ = ["read_initializers", "canonical", "role_arrays", "fixed_rows", "to_source", "layer_arrays",
           "write_weights", "apart_specs", "model_weights", "split_weights", "clear_data"]


def read_initializers(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every initializer of the main graph that holds data, as a numpy array (read-only views where protobuf
    allows)."""
    out = {}
    for t in proto.graph.initializer:
        if not has_data(t) and int(np.prod(t.dims)) > 0:
            continue
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


def role_arrays(refs: tuple[TensorRef, ...], arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Role -> canonical array of one layer's refs; the pieces of a role (``span``) assembled into the whole,
    the rows between them zeros (constants of the architecture, see :meth:`ModelReader.trace_pieces`); a ref's
    ``zeroed`` rows zeros too (:func:`keeper.graph.zeroed.trace_zeroed`)."""
    out: dict[str, np.ndarray] = {}
    for ref in refs:
        a = canonical(ref, arrays)
        if ref.zeroed:  # as the op reads it: zeros there, whatever the tensor holds
            a = np.array(a)
            for start, stop in zip(ref.zeroed[::2], ref.zeroed[1::2]):
                a[start:stop] = 0
        if ref.span:
            start, stop, whole = ref.span
            if ref.role not in out:
                out[ref.role] = np.zeros((whole,) + a.shape[1:], a.dtype)
            out[ref.role][start:stop] = a
        else:
            out[ref.role] = a
    return out


def to_source(ref: TensorRef, value: np.ndarray) -> np.ndarray:
    """Inverse of :func:`canonical`: the array to store under ``ref.key`` (for a piece, from the whole role's
    ``value``: its rows)."""
    if ref.span:
        value = value[ref.span[0]:ref.span[1]]
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
    return [role_arrays(refs, arrays) for refs in graph.tensors]


def fixed_rows(refs: tuple[TensorRef, ...], role: str) -> np.ndarray | None:
    """The rows of ``role`` no piece covers or a ref marks ``zeroed`` (its constant zeros) as a boolean mask, None
    when the role has none."""
    pieces = [r for r in refs if r.role == role and r.span]
    zeroed = [r for r in refs if r.role == role and r.zeroed]
    if not pieces and not zeroed:
        return None
    mask = np.ones(pieces[0].span[2], dtype=bool) if pieces else np.zeros(int(np.prod(zeroed[0].source_shape)), bool)
    for r in pieces:
        mask[r.span[0]:r.span[1]] = False
    for r in zeroed:
        for start, stop in zip(r.zeroed[::2], r.zeroed[1::2]):
            mask[start:stop] = True
    return mask


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


def apart_specs(proto: onnx.ModelProto) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Initializer name -> (dtype, dims) for every main-graph initializer stored without data."""
    out = {}
    for t in proto.graph.initializer:
        if not has_data(t) and int(np.prod(t.dims)) > 0:
            try:
                dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type))
            except (KeyError, ValueError, TypeError):
                raise InvalidModelError(f"model: initializer {t.name!r} has ONNX data type {t.data_type}, which "
                                        "keeper cannot take from a weights file") from None
            out[t.name] = (dtype, tuple(int(d) for d in t.dims))
    return out


def model_weights(proto: onnx.ModelProto, weights: WeightsInput | None = None,
                  what: str = "model") -> dict[str, np.ndarray]:
    """Every initializer of ``proto`` as an array: inline data from the model, the rest from ``weights``
    (safetensors bytes or path, or a mapping), checked first: every data-less initializer present there under its
    name, with the graph's dtype and dims. Arrays from a file are read-only memory-mapped views.

    Raises:
        InvalidWeightsError: naming the first tensor that is missing, mis-shaped or of another dtype, or the first
            data-less initializer when no weights are given.
    """
    out = read_initializers(proto)
    specs = apart_specs(proto)
    if not specs:
        return out
    if weights is None:
        name = next(iter(specs))
        raise InvalidWeightsError(f"{what}: initializer {name!r} (and {len(specs) - 1} more) has no data: the model "
                                  "is a graph whose weights travel apart; pass them as safetensors (weights=..., "
                                  "or --weights on the command line)")
    st = open_weights(weights, f"{what} weights")
    check_weights(st, specs, f"{what} weights")
    for name in specs:
        out[name] = st[name]
    return out


def split_weights(proto: onnx.ModelProto, min_elements: int = 16) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A copy of ``proto`` whose float initializers of at least ``min_elements`` hold no data, and those arrays
    (small integer constants stay inline: graph extraction reads shapes and axes from them)."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    taken = {}
    for t in out.graph.initializer:
        if t.data_type in _FLOAT_TYPES and int(np.prod(t.dims)) >= min_elements and has_data(t):
            taken[t.name] = numpy_helper.to_array(t)
            clear_data(t)
    return out, taken


def clear_data(tensor: onnx.TensorProto) -> None:
    """Drop ``tensor``'s data in place, keeping its name, data type and dims (a placeholder for weights apart)."""
    name, dtype, dims = tensor.name, tensor.data_type, list(tensor.dims)
    tensor.Clear()
    tensor.name, tensor.data_type = name, dtype
    tensor.dims.extend(dims)


_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                onnx.TensorProto.DOUBLE}
