"""Integer constants folded through the ops exporters compute them with: indices and shapes written as small
subgraphs (the rows a ScatterND writes, built by the dynamo exporter as ``Slice(Range(0, Shape(x)[0], 1))``).

Invariant: :func:`fold_ints` returns the value the ONNX ops compute, or None; never a guess. It reads only
constants (:meth:`~keeper.graph.reader.ModelReader.const_value`) and statically known shapes, and refuses any result
of more than ``cap`` elements, so an untrusted graph cannot make it allocate much.
"""

from __future__ import annotations

import numpy as np
import onnx

from keeper.graph.reader import ModelReader, attr

__all__ = ["fold_ints"]

_CAP = 1 << 20
_ARITHMETIC = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}


def fold_ints(reader: ModelReader, name: str, cap: int = _CAP, depth: int = 0) -> np.ndarray | None:
    """The value of integer tensor ``name`` when its ops fold from constants and static shapes (Identity, Cast,
    CastLike, Unsqueeze, Squeeze, Concat, Reshape, Shape, a Gather of a shape's known dimensions, Gather, Range,
    Slice, Add, Sub, Mul, Div), else None."""
    if depth > 32:
        return None
    try:
        v = reader.const_value(name)
    except (ValueError, TypeError, OSError):
        return None
    if v is not None:
        return v if v.dtype.kind in "iu" and v.size <= cap else None
    n = reader.producer.get(name)
    if n is None:
        return None
    if n.op_type == "Shape":
        shape = _shape(reader, n)
        return None if shape is None or np.any(shape < 0) else shape
    if n.op_type == "Gather" and (p := reader.producer.get(n.input[0])) is not None and p.op_type == "Shape":
        shape, idx = _shape(reader, p), fold_ints(reader, n.input[1], cap, depth + 1)  # known dims of a shape
        if shape is None or idx is None or np.any(idx >= len(shape)) or np.any(idx < -len(shape)):
            return None
        out = np.take(shape, idx)
        return None if np.any(out < 0) else out
    names = list(n.input[:1]) if n.op_type == "CastLike" else list(n.input)
    while names and not names[-1]:  # absent optional inputs at the end
        names.pop()
    parts = [fold_ints(reader, x, cap, depth + 1) if x else None for x in names]
    if not parts or parts[0] is None:
        return None
    try:
        out = _apply(n, parts)
    except (ValueError, IndexError, TypeError):
        return None
    return out if out is not None and out.size <= cap else None


def _shape(reader: ModelReader, n: onnx.NodeProto) -> np.ndarray | None:
    """What Shape node ``n`` gives, -1 for a dimension not known statically; None when the rank is unknown."""
    shape = reader.init_shapes.get(n.input[0], reader.shapes.get(n.input[0]))
    if shape is None:
        return None
    start, end = int(attr(n, "start", 0)), attr(n, "end", None)
    return np.array(shape[start:None if end is None else int(end)], dtype=np.int64)


def _apply(n: onnx.NodeProto, parts: list[np.ndarray | None]) -> np.ndarray | None:
    """The op ``n`` on its folded inputs (``parts[0]`` is known); None for an op or input it does not fold."""
    op, x = n.op_type, parts[0]
    if op in ("Identity", "Cast", "CastLike"):
        return x
    if op in ("Unsqueeze", "Squeeze"):
        axes = parts[1] if len(parts) > 1 else attr(n, "axes")
        if axes is None:
            return np.squeeze(x) if op == "Squeeze" else None
        axes = [int(a) for a in np.asarray(axes).reshape(-1).tolist()]
        if op == "Squeeze":
            return np.squeeze(x, axis=tuple(a % x.ndim for a in axes))
        rank = x.ndim + len(axes)
        for a in sorted(a % rank for a in axes):
            x = np.expand_dims(x, a)
        return x
    if (op in _ARITHMETIC or op == "Div") and len(parts) == 2 and parts[1] is not None:
        a, b = parts
        if op == "Div":  # ONNX divides integers toward zero
            return None if np.any(b == 0) else np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))
        return _ARITHMETIC[op](a, b)
    if op == "Concat" and all(p is not None for p in parts):
        return np.concatenate(parts, axis=int(attr(n, "axis", 0)))
    if op == "Reshape" and len(parts) == 2 and parts[1] is not None:
        target = [int(d) for d in parts[1].reshape(-1).tolist()]
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
        return x.reshape(target)
    if op == "Gather" and len(parts) == 2 and parts[1] is not None:
        return np.take(x, parts[1], axis=int(attr(n, "axis", 0)))
    if op == "Range" and len(parts) == 3 and all(p is not None and p.size == 1 for p in parts):
        start, limit, delta = (int(p.reshape(())) for p in parts)
        if delta == 0 or (limit - start) // delta > _CAP:
            return None
        return np.arange(start, limit, delta, dtype=np.int64)
    if op == "Slice" and len(parts) >= 3 and all(p is not None for p in parts):
        starts, ends = parts[1].reshape(-1), parts[2].reshape(-1)
        axes = parts[3].reshape(-1) if len(parts) > 3 else np.arange(len(starts))
        steps = parts[4].reshape(-1) if len(parts) > 4 else np.ones(len(starts), dtype=np.int64)
        index = [slice(None)] * x.ndim
        for s, e, a, st in zip(starts.tolist(), ends.tolist(), axes.tolist(), steps.tolist()):
            index[int(a) % x.ndim] = slice(int(s), int(e), int(st))
        return x[tuple(index)]
    return None
