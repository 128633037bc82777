"""The rules of reductions, norms and pools, registered into :data:`~keeper.torch_support.trace.table.RULES` on
import."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch._prims_common import suggest_memory_format  # the Python twin of ATen's, as export uses it

from keeper.errors import TraceUnsupported
from keeper.torch_support.trace.builder import onnx_dtype
from keeper.torch_support.trace.recorder import func_key
from keeper.torch_support.trace.table import RULES, T, _arg, _pair, _rule


@_rule(torch.any, T.any)
def _any(rec, args, kwargs, out):
    """``any`` over every element, as torchlib writes it (a ReduceMax of the values cast to bool, then int64)."""
    if len(args) > 1 or kwargs:
        raise TraceUnsupported("any over an axis")
    b = rec.b
    x = b.node("Cast", [rec.name_of(args[0])], to=onnx_dtype(torch.bool))
    if args[0].dim() == 0:
        rec.bind(out, b.node("Identity", [x], "any"))
        return
    r = b.node("ReduceMax", [b.node("Cast", [x], to=onnx_dtype(torch.int64))], keepdims=0)
    rec.bind(out, b.node("Cast", [r], "any", to=onnx_dtype(torch.bool)))


@_rule(torch.linalg.vector_norm)
def _vector_norm(rec, args, kwargs, out):
    """The norms torchlib writes with one reduction (ord 1, 2, inf); the axes a reshaped constant, as there."""
    x, order = args[0], _arg(args, kwargs, 1, "ord", 2)
    dim, keep = _arg(args, kwargs, 2, "dim"), bool(_arg(args, kwargs, 3, "keepdim", False))
    if kwargs.get("dtype") is not None or order not in (1, 2, math.inf):
        raise TraceUnsupported(f"linalg.vector_norm of ord {order!r} or with a dtype")
    b = rec.b
    ins = [rec.name_of(x)]
    if dim is None:
        ins[0], keep = b.node("Reshape", [ins[0], b.constant([-1])]), False
    else:
        dims = [int(d) for d in (dim if isinstance(dim, (list, tuple)) else [dim])]
        ins.append(b.node("Reshape", [b.constant(dims), b.constant([-1])]))
    if order == math.inf:
        ins[0] = b.node("Abs", [ins[0]])
    op = {1: "ReduceL1", 2: "ReduceL2", math.inf: "ReduceMax"}[order]
    rec.bind(out, b.node(op, ins, "linalg_vector_norm", keepdims=int(keep)))


# ----------------------------------------------------------------------------------------- reductions, pools

def _reduce(op: str, base: str) -> Callable:
    def rule(rec, args, kwargs, out):
        x = args[0]
        dim = _arg(args, kwargs, 1, "dim")
        keep = bool(_arg(args, kwargs, 2, "keepdim", False))
        if kwargs.get("dtype") is not None or (len(args) > 3 and args[3] is not None):
            raise TraceUnsupported(f"{base} with a dtype")
        b = rec.b
        if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
            r = b.node(op, [rec.name_of(x)], keepdims=1, noop_with_empty_axes=0)
            rec.bind(out, b.node("Squeeze", [r], base))
            return
        dims = [int(d) for d in (dim if isinstance(dim, (list, tuple)) else [dim])]
        rec.bind(out, b.node(op, [rec.name_of(x), b.constant(dims)], base, keepdims=int(keep),
                             noop_with_empty_axes=0))
    return rule


for _f in (torch.mean, T.mean):
    RULES[func_key(_f)] = _reduce("ReduceMean", "mean")
for _f in (torch.sum, T.sum):
    RULES[func_key(_f)] = _reduce("ReduceSum", "sum")


def _pool(op: str, dims: int, base: str) -> Callable:
    def rule(rec, args, kwargs, out):
        x, kernel = args[0], _arg(args, kwargs, 1, "kernel_size")
        stride = _arg(args, kwargs, 2, "stride") or kernel
        padding = _arg(args, kwargs, 3, "padding", 0)
        pads = _pair(padding, dims)
        attrs: dict[str, Any] = {"kernel_shape": _pair(kernel, dims), "strides": _pair(stride, dims),
                                 "pads": pads + pads, "auto_pad": "NOTSET"}
        if op == "MaxPool":
            if _arg(args, kwargs, 6, "return_indices"):
                raise TraceUnsupported("max_pool with return_indices")
            dilation = _arg(args, kwargs, 4, "dilation", 1)
            attrs.update(dilations=_pair(dilation, dims), ceil_mode=int(bool(_arg(args, kwargs, 5, "ceil_mode"))),
                         storage_order=0)
        else:
            attrs.update(ceil_mode=int(bool(_arg(args, kwargs, 4, "ceil_mode"))),
                         count_include_pad=int(bool(_arg(args, kwargs, 5, "count_include_pad", True))))
            if _arg(args, kwargs, 6, "divisor_override") is not None:
                raise TraceUnsupported("avg_pool with divisor_override")
        rec.bind(out, rec.b.node(op, [rec.name_of(x)], base, **attrs))
    return rule


for _f, _d in ((torch.max_pool1d, 1), (torch.max_pool2d, 2), (F.max_pool1d, 1), (F.max_pool2d, 2)):
    RULES[func_key(_f)] = _pool("MaxPool", _d, f"max_pool{_d}d")
RULES[func_key(torch.avg_pool1d)] = _pool("AveragePool", 1, "avg_pool1d")
RULES[func_key(torch._C._nn.avg_pool2d)] = _pool("AveragePool", 2, "avg_pool2d")


def _adaptive_avg(dims: int) -> Callable:
    def rule(rec, args, kwargs, out):
        x, size = args[0], _pair(_arg(args, kwargs, 1, "output_size"), dims)
        if any(s != 1 for s in size):
            raise TraceUnsupported(f"adaptive_avg_pool{dims}d to a size other than 1")
        axes = list(range(x.dim() - dims, x.dim()))
        b = rec.b
        mean = b.node("ReduceMean", [rec.name_of(x), b.constant(axes)], "mean", keepdims=1, noop_with_empty_axes=0)
        if dims == 2 and x.dim() == 4 and suggest_memory_format(x) == torch.channels_last:
            # ATen then restrides the mean to channels-last (``as_strided_``), which the exporter keeps and torchlib
            # writes as a Gather of the flattened mean at the strided positions
            n, c = x.shape[:2]
            index = np.arange(n, dtype=np.int64).reshape(n, 1, 1, 1) * c + np.arange(c).reshape(1, c, 1, 1)
            flat = b.node("Reshape", [mean, b.constant([-1])], allowzero=0)
            mean = b.node("Gather", [flat, b.constant(index)], "as_strided", axis=0)
        rec.bind(out, mean)
    return rule


RULES[func_key(torch.adaptive_avg_pool1d)] = _adaptive_avg(1)
RULES[func_key(torch._C._nn.adaptive_avg_pool2d)] = _adaptive_avg(2)
