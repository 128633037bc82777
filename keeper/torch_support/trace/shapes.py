"""The rules of shape ops (views, reshapes, permutes, concatenations, splits, pads, indexing), registered into
:data:`~keeper.torch_support.trace.table.RULES` on import."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from keeper.errors import TraceUnsupported
from keeper.torch_support.trace.builder import onnx_dtype
from keeper.torch_support.trace.inplace import remember_slice
from keeper.torch_support.trace.recorder import Recorder


from keeper.torch_support.trace.table import (T, _INT_MAX, _arg, _axis, _operand,
                                                 _rule)


# ----------------------------------------------------------------------------------------- shapes

def _reshape_to(rec: Recorder, x: torch.Tensor, out: torch.Tensor, base: str) -> None:
    name = rec.name_of(x)
    if not (out._is_view() and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()):
        name = rec.b.node("Identity", [name], "clone")  # a reshape that copies: export's clone + _unsafe_view
        base = "_unsafe_view"
    rec.bind(out, rec.b.node("Reshape", [name, rec.b.constant(list(out.shape))], base, allowzero=1))


@_rule(T.view, T.view_as)
def _view(rec, args, kwargs, out):
    if len(args) == 2 and isinstance(args[1], torch.dtype):
        raise TraceUnsupported("Tensor.view to another dtype")
    _reshape_to(rec, args[0], out, "view")


@_rule(T.reshape, torch.reshape, T.reshape_as, T.flatten, torch.flatten, T.unflatten, torch.unflatten)
def _reshape(rec, args, kwargs, out):
    if out is args[0]:
        return
    _reshape_to(rec, args[0], out, "view")


@_rule(T.permute, torch.permute)
def _permute(rec, args, kwargs, out):
    x = args[0]
    dims = args[1] if len(args) == 2 and isinstance(args[1], (list, tuple)) else args[1:] or kwargs["dims"]
    perm = [_axis(int(d), x.dim()) for d in dims]
    rec.bind(out, rec.b.node("Transpose", [rec.name_of(x)], "permute", perm=perm))


@_rule(T.transpose, torch.transpose, T.swapaxes, torch.swapaxes)
def _transpose(rec, args, kwargs, out):
    x = args[0]
    a, c = _axis(int(_arg(args, kwargs, 1, "dim0")), x.dim()), _axis(int(_arg(args, kwargs, 2, "dim1")), x.dim())
    perm = list(range(x.dim()))
    perm[a], perm[c] = perm[c], perm[a]
    rec.bind(out, rec.b.node("Transpose", [rec.name_of(x)], "transpose", perm=perm))


@_rule(T.t, torch.t, ("get", "T"), ("get", "mT"))
def _t(rec, args, kwargs, out):
    x = args[0]
    if x.dim() < 2:
        rec.bind(out, rec.name_of(x))
        return
    perm = list(range(x.dim()))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    rec.bind(out, rec.b.node("Transpose", [rec.name_of(x)], "permute", perm=perm))


@_rule(T.unsqueeze, torch.unsqueeze)
def _unsqueeze(rec, args, kwargs, out):
    x, d = args[0], int(_arg(args, kwargs, 1, "dim"))
    rec.bind(out, rec.b.node("Unsqueeze", [rec.name_of(x), rec.b.constant([_axis(d, x.dim() + 1)])], "unsqueeze"))


@_rule(T.squeeze, torch.squeeze)
def _squeeze(rec, args, kwargs, out):
    x, dim = args[0], _arg(args, kwargs, 1, "dim")
    dims = [d for d in range(x.dim()) if x.shape[d] == 1] if dim is None else [
        _axis(int(d), x.dim()) for d in (dim if isinstance(dim, (list, tuple)) else [dim])]
    dims = [d for d in dims if x.shape[d] == 1]
    if not dims:
        rec.bind(out, rec.name_of(x))
        return
    rec.bind(out, rec.b.node("Squeeze", [rec.name_of(x), rec.b.constant(dims)], "squeeze"))


@_rule(T.expand, T.expand_as)
def _expand(rec, args, kwargs, out):
    rec.bind(out, rec.b.node("Expand", [rec.name_of(args[0]), rec.b.constant(list(out.shape))], "expand"))


@_rule(T.contiguous)
def _contiguous(rec, args, kwargs, out):
    if out is not args[0]:
        rec.bind(out, rec.b.node("Identity", [rec.name_of(args[0])], "clone"))


@_rule(T.clone, torch.clone)
def _clone(rec, args, kwargs, out):
    rec.bind(out, rec.b.node("Identity", [rec.name_of(args[0])], "clone"))


@_rule(T.detach, torch.detach, ("get", "data"), T.requires_grad_, T.cpu, T.cuda)
def _alias(rec, args, kwargs, out):
    if out is not args[0]:
        rec.bind(out, rec.name_of(args[0]))


@_rule(T.to, T.float, T.half, T.double, T.bfloat16, T.type)
def _to(rec, args, kwargs, out):
    x = args[0]
    if out is x:
        return
    if not isinstance(out, torch.Tensor):
        raise TraceUnsupported("Tensor.type() without a dtype")
    if out.dtype == x.dtype or (out.dtype.is_floating_point and x.dtype.is_floating_point):
        # a change of float precision is no part of the architecture: a module's graph is the same in fp32, bf16
        # and fp16 (its norms' upcasts to float32 are no-ops in fp32), whatever the exporter writes for them
        rec.bind(out, rec.name_of(x))
        return
    rec.bind(out, rec.b.node("Cast", [rec.name_of(x)], "_to_copy", to=onnx_dtype(out.dtype)))


@_rule(T.type_as)
def _type_as(rec, args, kwargs, out):
    rec.bind(out, rec.b.node("CastLike", [rec.name_of(args[0]), rec.name_of(args[1])], "type_as"))


@_rule(torch.cat, torch.concat, getattr(torch, "concatenate", None))
def _cat(rec, args, kwargs, out):
    xs, dim = list(args[0]), int(_arg(args, kwargs, 1, "dim", 0))
    # empty parts add nothing (a key/value cache before its first entry): the exporter drops them, and writes a
    # concatenation left with one part as an Identity
    kept = [x for x in xs if x.numel()] or xs[:1]
    if len(kept) == 1:
        rec.bind(out, rec.b.node("Identity", [rec.name_of(kept[0])], "cat"))
        return
    rec.bind(out, rec.b.node("Concat", [rec.name_of(x) for x in kept], "cat", axis=dim))


@_rule(torch.stack)
def _stack(rec, args, kwargs, out):
    xs, dim = list(args[0]), int(_arg(args, kwargs, 1, "dim", 0))
    d = _axis(dim, xs[0].dim() + 1)
    parts = [rec.b.node("Unsqueeze", [rec.name_of(x), rec.b.constant([d])]) for x in xs]
    rec.bind(out, rec.b.node("Concat", parts, "stack", axis=d))


def _split_parts(rec: Recorder, x: torch.Tensor, out: Any, sizes: Any, dim: int, base: str,
                 keepdims: int = 1) -> None:
    b = rec.b
    seq: list[str] = []

    def sequence() -> str:
        if not seq:
            ins = [rec.name_of(x)] + ([b.constant(sizes)] if sizes is not None else [])
            seq.append(b.node("SplitToSequence", ins, base, axis=dim, keepdims=keepdims))
        return seq[0]

    for i, part in enumerate(out):
        rec.bind_lazy(part, lambda i=i: b.node("SequenceAt", [sequence(), b.constant(i)], "getitem"))


@_rule(T.split, torch.split, T.split_with_sizes, torch.split_with_sizes)
def _split(rec, args, kwargs, out):
    x, size = args[0], _arg(args, kwargs, 1, "split_size_or_sections", kwargs.get("split_size"))
    if size is None:
        size = kwargs.get("split_sizes")
    dim = int(_arg(args, kwargs, 2, "dim", 0))
    sizes = size if isinstance(size, int) else [int(s) for s in size]
    _split_parts(rec, x, out, sizes, dim, "split" if isinstance(size, int) else "split_with_sizes")


@_rule(T.chunk, torch.chunk)
def _chunk(rec, args, kwargs, out):
    x, chunks, dim = args[0], int(_arg(args, kwargs, 1, "chunks")), int(_arg(args, kwargs, 2, "dim", 0))
    _split_parts(rec, x, out, -(-x.shape[dim] // chunks), dim, "split")


@_rule(T.unbind, torch.unbind)
def _unbind(rec, args, kwargs, out):
    """Each part as torchlib writes ``unbind`` along an axis of static length (onnxscript 0.5.7 on): a one-wide
    ``Slice`` then a ``Squeeze`` of that axis, written when the part is read (the exporter drops unread ones)."""
    x, dim = args[0], int(_arg(args, kwargs, 1, "dim", 0))
    b = rec.b

    def part(i: int) -> str:
        piece = b.node("Slice", [rec.name_of(x), b.constant([i]), b.constant([i + 1]), b.constant([dim])])
        return b.node("Squeeze", [piece, b.constant([dim])], "getitem")

    for i, t in enumerate(out):
        rec.bind_lazy(t, lambda i=i: part(i))


@_rule(torch._C._nn.pad, F.pad)
def _pad(rec, args, kwargs, out):
    x, pad = args[0], list(_arg(args, kwargs, 1, "pad"))
    mode, value = _arg(args, kwargs, 2, "mode", "constant"), _arg(args, kwargs, 3, "value")
    if mode != "constant":
        raise TraceUnsupported(f"pad in mode {mode!r}")
    begins, ends = [0] * x.dim(), [0] * x.dim()
    for i in range(len(pad) // 2):
        begins[x.dim() - 1 - i], ends[x.dim() - 1 - i] = int(pad[2 * i]), int(pad[2 * i + 1])
    ins = [rec.name_of(x), rec.b.constant(begins + ends)]
    if value:
        ins.append(_operand(rec, value, x))
    rec.bind(out, rec.b.node("Pad", ins, "pad", mode="constant"))


@_rule(T.__getitem__)
def _getitem(rec, args, kwargs, out):
    x, index = args[0], args[1]
    index = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, torch.Tensor) for i in index):
        _index_tensor(rec, x, index, out)
        return
    if sum(i is Ellipsis for i in index) > 1:
        raise TraceUnsupported("__getitem__ with more than one Ellipsis")
    if Ellipsis in index:  # the axes it stands for, as whole slices
        k = index.index(Ellipsis)
        taken = sum(1 for i in index if i is not None and i is not Ellipsis)
        index = index[:k] + (slice(None),) * (x.dim() - taken) + index[k + 1:]
    b = rec.b
    name, shape, d = rec.name_of(x), list(x.shape), 0
    whole = name
    ops = []  # (axis, start, end, step) of each Slice written; anything else written: None
    for i in index:
        if i is None:
            name = b.node("Unsqueeze", [name, b.constant([d])], "unsqueeze")
            ops.append(None)
            shape.insert(d, 1)
            d += 1
        elif isinstance(i, bool):
            raise TraceUnsupported("__getitem__ with a bool index")
        elif isinstance(i, int):
            name = b.node("Gather", [name, b.constant(i)], "select", axis=d)
            ops.append(None)
            shape.pop(d)
        elif isinstance(i, slice):
            if i == slice(None):
                d += 1
                continue
            start, stop, step = i.indices(shape[d])
            if step <= 0:
                raise TraceUnsupported("__getitem__ with a negative step")
            n = len(range(start, stop, step))
            if start == 0 and n == shape[d] and step == 1:  # torch skips a slice that keeps the whole axis
                d += 1
                continue
            else:
                ends = i.stop if i.stop is not None else _INT_MAX
                name = b.node("Slice", [name, b.constant([i.start or 0]), b.constant([ends]), b.constant([d]),
                                        b.constant([step])], "slice")
                ops.append((d, i.start or 0, ends, step))
                shape[d] = n
            d += 1
        else:
            raise TraceUnsupported(f"__getitem__ with an index of type {type(i).__name__}")
    if name == whole:  # nothing taken: torch returns an alias of the tensor (``x[...]``, ``x[:, :n]`` of n)
        name = b.node("Identity", [name], "alias")
    rec.bind(out, name)
    if len(ops) == 1 and ops[0] is not None:  # one Slice: an in-place write through it can go back to x
        remember_slice(rec, out, x, *ops[0])


def _index_tensor(rec: Recorder, x: torch.Tensor, index: tuple, out: torch.Tensor) -> None:
    """``x[..., idx, ...]`` with one integer tensor index and whole slices elsewhere, as torchlib writes
    ``aten.index``: the indexed axis moved to the front, a GatherND by the broadcast index, the axis moved back
    (both Transposes written even where their permutation is the identity, as there)."""
    tensors = [k for k, i in enumerate(index) if isinstance(i, torch.Tensor)]
    d = tensors[0]
    idx = index[d]
    if len(tensors) != 1 or idx.dtype == torch.bool or any(
            not (i == slice(None)) for k, i in enumerate(index) if k != d) or d >= x.dim():
        raise TraceUnsupported("__getitem__ with tensor indices other than one integer tensor")
    b = rec.b
    name = b.node("Transpose", [rec.name_of(x)], perm=[d] + [a for a in range(x.dim()) if a != d])
    i = rec.name_of(idx)
    broadcast = b.node("Expand", [i, b.node("Shape", [b.node("Max", [i])], start=0)])
    stacked = b.node("Concat", [b.node("Unsqueeze", [broadcast, b.constant([-1])])], axis=-1)
    g = b.node("GatherND", [name, stacked], batch_dims=0)
    k = idx.dim()
    perm = list(range(k, k + d)) + list(range(k)) + list(range(k + d, out.dim()))
    rec.bind(out, b.node("Transpose", [g], "index", perm=perm))
