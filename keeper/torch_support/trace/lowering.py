"""The rules of layers, attention and elementwise ops, registered into
:data:`~keeper.torch_support.trace.table.RULES` on import (reductions and pools:
:mod:`~keeper.torch_support.trace.reductions`; shape ops: :mod:`~keeper.torch_support.trace.shapes`)."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from keeper.errors import TraceUnsupported
from keeper.torch_support.trace.builder import onnx_dtype
from keeper.torch_support.trace.recorder import func_key


from keeper.torch_support.trace.table import RULES, T, _arg, _first_tensor, _np_dtype, _operand, _pair, _rule


# ----------------------------------------------------------------------------------------- layers

@_rule(F.linear)
def _linear(rec, args, kwargs, out):
    x, w, b = args[0], _arg(args, kwargs, 1, "weight"), _arg(args, kwargs, 2, "bias")
    if x.dim() == 2 and b is not None:
        rec.bind(out, rec.b.node("Gemm", [rec.name_of(x), rec.name_of(w), rec.name_of(b)], "linear",
                                 alpha=1.0, beta=1.0, transA=0, transB=1))
        return
    wt = rec.b.node("Transpose", [rec.name_of(w)], perm=[1, 0])
    if b is None:
        rec.bind(out, rec.b.node("MatMul", [rec.name_of(x), wt], "linear"))
        return
    mm = rec.b.node("MatMul", [rec.name_of(x), wt])
    rec.bind(out, rec.b.node("Add", [mm, rec.name_of(b)], "linear"))


def _conv_rule(dims: int) -> Callable:
    def conv(rec, args, kwargs, out):
        x, w = args[0], _arg(args, kwargs, 1, "weight")
        b = _arg(args, kwargs, 2, "bias")
        stride, padding = _arg(args, kwargs, 3, "stride", 1), _arg(args, kwargs, 4, "padding", 0)
        dilation, groups = _arg(args, kwargs, 5, "dilation", 1), _arg(args, kwargs, 6, "groups", 1)
        if padding == "valid":
            padding = 0
        elif padding == "same":  # symmetric only: otherwise export pads apart first
            total = [d * (k - 1) for d, k in zip(_pair(dilation, dims), w.shape[2:])]
            if any(t % 2 for t in total):
                raise TraceUnsupported(f"conv{dims}d with padding='same' and an even kernel")
            padding = [t // 2 for t in total]
        elif isinstance(padding, str):
            raise TraceUnsupported(f"conv{dims}d with padding={padding!r}")
        pads = _pair(padding, dims)
        ins = [rec.name_of(x), rec.name_of(w)] + ([rec.name_of(b)] if b is not None else [])
        rec.bind(out, rec.b.node("Conv", ins, f"conv{dims}d", group=int(groups), pads=pads + pads,
                                 auto_pad="NOTSET", strides=_pair(stride, dims), dilations=_pair(dilation, dims),
                                 kernel_shape=[int(k) for k in w.shape[2:]]))
    return conv


_rule(torch.conv1d)(_conv_rule(1))
_rule(torch.conv2d)(_conv_rule(2))
_rule(torch.conv3d)(_conv_rule(3))


@_rule(torch.batch_norm)
def _batch_norm(rec, args, kwargs, out):
    x, w, b, mean, var = args[:5]
    training, momentum, eps = args[5], args[6], args[7]
    if training:
        raise TraceUnsupported("batch_norm in training mode")
    ins = [rec.name_of(x)] + [rec.name_of(t) if t is not None else
                              rec.b.constant(np.full(x.shape[1], fill, dtype=_np_dtype(x)), dtype=None)
                              for t, fill in ((w, 1.0), (b, 0.0), (mean, 0.0), (var, 1.0))]
    rec.bind(out, rec.b.node("BatchNormalization", ins, "getitem", epsilon=float(eps),
                             momentum=float(1.0 - momentum if momentum is not None else 0.9)))


@_rule(torch.layer_norm)
def _layer_norm(rec, args, kwargs, out):
    x, shape = args[0], _arg(args, kwargs, 1, "normalized_shape")
    w, b = _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "bias")
    eps = _arg(args, kwargs, 4, "eps", 1e-5)
    ins = [rec.name_of(x), rec.name_of(w) if w is not None else
           rec.b.constant(np.ones(tuple(shape), dtype=_np_dtype(x)), dtype=None)]
    if b is not None:
        ins.append(rec.name_of(b))
    rec.bind(out, rec.b.node("LayerNormalization", ins, "layer_norm", axis=-len(shape), epsilon=float(eps),
                             stash_type=1))


@_rule(getattr(torch, "rms_norm", None))
def _rms_norm(rec, args, kwargs, out):
    x, shape = args[0], _arg(args, kwargs, 1, "normalized_shape")
    w, eps = _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "eps")
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    b = rec.b
    xn = rec.name_of(x)
    p = b.node("Pow", [xn, b.constant(np.array(2.0, dtype=_np_dtype(x)), dtype=None)], "pow")
    axes = list(range(-len(shape), 0))
    m = b.node("ReduceMean", [p, b.constant(axes)], "mean", keepdims=1, noop_with_empty_axes=0)
    a = b.node("Add", [m, b.constant(np.array(eps, dtype=_np_dtype(x)), dtype=None)], "add")
    r = b.node("Reciprocal", [b.node("Sqrt", [a])], "rsqrt")
    y = b.node("Mul", [xn, r], "mul")
    if w is not None:
        y = b.node("Mul", [y, rec.name_of(w)], "mul")
    rec.bind(out, b.node("CastLike", [y, xn], "type_as"))


@_rule(torch.embedding)
def _embedding(rec, args, kwargs, out):
    w, idx = args[0], args[1]
    rec.bind(out, rec.b.node("Gather", [rec.name_of(w), rec.name_of(idx)], "embedding", axis=0))


@_rule(torch.gather, T.gather)
def _gather(rec, args, kwargs, out):
    x, dim, idx = args[0], int(_arg(args, kwargs, 1, "dim")), _arg(args, kwargs, 2, "index")
    rec.bind(out, rec.b.node("GatherElements", [rec.name_of(x), rec.name_of(idx)], "gather", axis=dim))


@_rule(torch.matmul, T.matmul, T.__matmul__, torch.bmm, T.bmm, torch.mm, T.mm)
def _matmul(rec, args, kwargs, out):
    rec.bind(out, rec.b.node("MatMul", [rec.name_of(args[0]), rec.name_of(args[1])], "matmul"))


@_rule(torch.addmm, T.addmm)
def _addmm(rec, args, kwargs, out):
    bias, x, w = args[0], args[1], args[2]
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    rec.bind(out, rec.b.node("Gemm", [rec.name_of(x), rec.name_of(w), rec.name_of(bias)], "addmm",
                             alpha=float(alpha), beta=float(beta), transA=0, transB=0))


@_rule(F.scaled_dot_product_attention)
def _sdpa(rec, args, kwargs, out):
    q, k, v = args[:3]
    mask = _arg(args, kwargs, 3, "attn_mask")
    dropout_p, is_causal = _arg(args, kwargs, 4, "dropout_p", 0.0), _arg(args, kwargs, 5, "is_causal", False)
    scale, gqa = _arg(args, kwargs, 6, "scale"), kwargs.get("enable_gqa", False)
    if dropout_p or gqa or k.dim() < 3:
        raise TraceUnsupported("scaled_dot_product_attention with dropout, enable_gqa or rank < 3")
    if mask is not None and rec.kind_of(mask, "scaled_dot_product_attention") is not None:
        raise TraceUnsupported("scaled_dot_product_attention with a mask computed from the input")
    b = rec.b
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    root = b.constant(np.array(math.sqrt(s), dtype=_np_dtype(q)), dtype=None)
    kn = rec.name_of(k)
    # the exporter's swap of key's last two axes: shapes computed from Shape nodes (unknown to the reader)
    last, second = b.node("Shape", [kn], start=-1), b.node("Shape", [kn], start=-2, end=-1)
    first = b.node("Shape", [kn], end=-2)
    squeezed = b.node("Reshape", [kn, b.node("Concat", [b.constant([-1]), second, last], axis=0)])
    swapped = b.node("Transpose", [squeezed], perm=[0, 2, 1])
    kt = b.node("Reshape", [swapped, b.node("Concat", [first, last, second], axis=0)])
    k_scaled = b.node("Mul", [kt, root])
    q_scaled = b.node("Mul", [rec.name_of(q), root])
    w = b.node("MatMul", [q_scaled, k_scaled])
    if mask is not None or is_causal:
        w = b.node("Softmax", [b.node("Add", [w, b.tensor_constant(_additive_mask(mask, q, k, is_causal))])],
                   axis=-1)
        zero = b.constant(np.array(0.0, dtype=_np_dtype(q)), dtype=None)
        w = b.node("Where", [b.node("IsNaN", [w]), zero, w])
    else:
        w = b.node("Softmax", [w], axis=-1)
    rec.bind(out, b.node("MatMul", [w, rec.name_of(v)], "scaled_dot_product_attention"))


def _additive_mask(mask: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor, causal: bool) -> torch.Tensor:
    """The mask attention adds to its scores, as the exporter folds it: -inf where a boolean mask (or the causal
    triangle) is False. Made on the CPU, whatever the default device and the mask's own: it becomes a Constant."""
    if mask is None:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device="cpu").tril(diagonal=0)
    mask = mask.detach().cpu()
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device="cpu").masked_fill(~mask, float("-inf"))
    return mask


# ----------------------------------------------------------------------------------------- elementwise

def _binary(op: str, base: str, swap: bool = False, in_place: bool = False) -> Callable:
    def rule(rec, args, kwargs, out):
        a, other = args[0], _arg(args, kwargs, 1, "other")
        alpha = kwargs.get("alpha", 1)
        like = _first_tensor(a, other)
        x, y = _operand(rec, a, like), _operand(rec, other, like)
        if alpha != 1:
            y = rec.b.node("Mul", [y, _operand(rec, alpha, like)])
        rec.bind(out, rec.b.node(op, [y, x] if swap else [x, y], base))
    rule.in_place = in_place  # type: ignore[attr-defined]
    return rule


def _register_binary(op: str, base: str, plain: tuple, rev: tuple, inplace: tuple) -> None:
    for f in plain:
        RULES[func_key(f)] = _binary(op, base)
    for f in rev:
        RULES[func_key(f)] = _binary(op, base, swap=True)
    for f in inplace:
        RULES[func_key(f)] = _binary(op, base, in_place=True)


_register_binary("Add", "add", (torch.add, T.add, T.__add__), (T.__radd__,), (T.add_, T.__iadd__))
_register_binary("Sub", "sub", (torch.sub, T.sub, T.__sub__, torch.subtract), (T.__rsub__, torch.rsub),
                 (T.sub_, T.__isub__))
_register_binary("Mul", "mul", (torch.mul, T.mul, T.__mul__, torch.multiply), (T.__rmul__,), (T.mul_, T.__imul__))
_register_binary("Pow", "pow", (torch.pow, T.pow, T.__pow__), (T.__rpow__,), (T.pow_,))
_register_binary("Max", "maximum", (torch.maximum, T.maximum), (), ())
_register_binary("Min", "minimum", (torch.minimum, T.minimum), (), ())


def _div(swap: bool = False, in_place: bool = False) -> Callable:
    inner = _binary("Div", "div", swap, in_place)

    def rule(rec, args, kwargs, out):
        if kwargs.get("rounding_mode") is not None:
            raise TraceUnsupported(f"div with rounding_mode={kwargs['rounding_mode']!r}")
        inner(rec, args, kwargs, out)
    rule.in_place = in_place  # type: ignore[attr-defined]
    return rule


for _f in (torch.div, T.div, T.__truediv__, torch.true_divide, torch.divide):
    RULES[func_key(_f)] = _div()
RULES[func_key(T.__rtruediv__)] = _div(swap=True)
for _f in (T.div_, T.__itruediv__):
    RULES[func_key(_f)] = _div(in_place=True)


def _unary(op: str, base: str, in_place: bool = False, **attrs: Any) -> Callable:
    def rule(rec, args, kwargs, out):
        rec.bind(out, rec.b.node(op, [rec.name_of(args[0])], base, **attrs))
    rule.in_place = in_place  # type: ignore[attr-defined]
    return rule


for _op, _base, _fs, _fs_ in (
        ("Relu", "relu", (torch.relu, T.relu), (torch.relu_, T.relu_)),
        ("Tanh", "tanh", (torch.tanh, T.tanh), (T.tanh_,)),
        ("Sigmoid", "sigmoid", (torch.sigmoid, T.sigmoid), (T.sigmoid_,)),
        ("Exp", "exp", (torch.exp, T.exp), ()), ("Neg", "neg", (torch.neg, T.neg, T.__neg__), ()),
        ("Sqrt", "sqrt", (torch.sqrt, T.sqrt), ()), ("Abs", "abs", (torch.abs, T.abs), ()),
        ("Erf", "erf", (torch.erf, T.erf), ()), ("Log", "log", (torch.log, T.log), ()),
        ("Cos", "cos", (torch.cos, T.cos), ()), ("Sin", "sin", (torch.sin, T.sin), ()),
        ("Reciprocal", "reciprocal", (torch.reciprocal, T.reciprocal), ()),
        ("HardSwish", "hardswish", (torch._C._nn.hardswish,), (torch._C._nn.hardswish_,)),
        ("HardSigmoid", "hardsigmoid", (torch._C._nn.hardsigmoid,), (torch._C._nn.hardsigmoid_,))):
    for _f in _fs:
        RULES[func_key(_f)] = _unary(_op, _base)
    for _f in _fs_:
        RULES[func_key(_f)] = _unary(_op, _base, in_place=True)


@_rule(torch.rsqrt, T.rsqrt)
def _rsqrt(rec, args, kwargs, out):
    rec.bind(out, rec.b.node("Reciprocal", [rec.b.node("Sqrt", [rec.name_of(args[0])])], "rsqrt"))


@_rule(F.gelu)
def _gelu(rec, args, kwargs, out):
    approximate = _arg(args, kwargs, 1, "approximate", "none")
    rec.bind(out, rec.b.node("Gelu", [rec.name_of(args[0])], "gelu", approximate=approximate))


def _silu(rec, args, kwargs, out):
    x = rec.name_of(args[0])
    rec.bind(out, rec.b.node("Mul", [x, rec.b.node("Sigmoid", [x])], "silu"))


_rule(torch._C._nn.silu)(_silu)
_rule(torch._C._nn.silu_, in_place=True)(_silu)


def _clip(base: str, lo: float | None = None, hi: float | None = None) -> Callable:
    def rule(rec, args, kwargs, out):
        x = args[0]
        lo_, hi_ = (lo, hi) if lo is not None else (_arg(args, kwargs, 1, "min_val", -1.0),
                                                     _arg(args, kwargs, 2, "max_val", 1.0))
        rec.bind(out, rec.b.node("Clip", [rec.name_of(x), _operand(rec, lo_, x), _operand(rec, hi_, x)], base))
    return rule


RULES[func_key(torch._C._nn.hardtanh)] = _clip("hardtanh")
RULES[func_key(torch._C._nn.relu6)] = _clip("relu6", 0.0, 6.0)
for _f, _r in ((torch._C._nn.hardtanh_, _clip("hardtanh")), (torch._C._nn.relu6_, _clip("relu6", 0.0, 6.0))):
    _r.in_place = True  # type: ignore[attr-defined]
    RULES[func_key(_f)] = _r


def _clamp(bounds: str) -> Callable:
    """``clamp`` (``bounds`` "both"), ``clamp_min`` ("min"), ``clamp_max`` ("max") by Python numbers, as torchlib
    writes them: ``Clip`` with each bound a constant ``CastLike`` the tensor."""
    def rule(rec, args, kwargs, out):
        x = args[0]
        lo = _arg(args, kwargs, 1, "min") if bounds != "max" else None
        hi = (_arg(args, kwargs, 2, "max") if bounds == "both" else _arg(args, kwargs, 1, "max")
              if bounds == "max" else None)
        b, base = rec.b, "clamp" if bounds == "both" else f"clamp_{bounds}"
        xn = rec.name_of(x)
        if isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor):  # clamp.Tensor: Max, then Min
            steps = [(op, b.node("CastLike", [_operand(rec, v, x), xn])) for v, op in ((lo, "Max"), (hi, "Min"))
                     if v is not None]
            y = xn
            for i, (op, bound) in enumerate(steps):
                y = b.node(op, [y, bound], base if i == len(steps) - 1 else None)
            rec.bind(out, y)
            return
        if lo is None and hi is None:
            rec.bind(out, b.node("Identity", [xn], base))
            return
        ins = [xn] + [b.node("CastLike", [_operand(rec, v, x), xn]) if v is not None else "" for v in (lo, hi)]
        while not ins[-1]:
            ins.pop()
        rec.bind(out, b.node("Clip", ins, base))
    return rule


for _f in (torch.clamp, T.clamp, torch.clip, T.clip):
    RULES[func_key(_f)] = _clamp("both")
for _f in (torch.clamp_min, T.clamp_min):
    RULES[func_key(_f)] = _clamp("min")
for _f in (torch.clamp_max, T.clamp_max):
    RULES[func_key(_f)] = _clamp("max")


@_rule(torch.isinf, T.isinf)
def _isinf(rec, args, kwargs, out):
    x = rec.b.node("Cast", [rec.name_of(args[0])], to=onnx_dtype(torch.float32))
    rec.bind(out, rec.b.node("IsInf", [x], "isinf"))


@_rule(torch._C._nn.leaky_relu)
def _leaky_relu(rec, args, kwargs, out):
    slope = _arg(args, kwargs, 1, "negative_slope", 0.01)
    rec.bind(out, rec.b.node("LeakyRelu", [rec.name_of(args[0])], "leaky_relu", alpha=float(slope)))


def _softmax(op: str, base: str) -> Callable:
    def rule(rec, args, kwargs, out):
        x, dim = args[0], _arg(args, kwargs, 1, "dim")
        dtype = _arg(args, kwargs, 2, "dtype")
        if dtype is None:
            rec.bind(out, rec.b.node(op, [rec.name_of(x)], base, axis=int(dim)))
            return
        y = rec.b.node(op, [rec.name_of(x)], axis=int(dim))  # torchlib casts after, whatever the input's dtype
        rec.bind(out, rec.b.node("Cast", [y], base, to=onnx_dtype(dtype)))
    return rule


for _f in (torch.softmax, T.softmax):
    RULES[func_key(_f)] = _softmax("Softmax", "softmax")
for _f in (torch.log_softmax, T.log_softmax):
    RULES[func_key(_f)] = _softmax("LogSoftmax", "log_softmax")


@_rule(torch.dropout, T.dropout if hasattr(T, "dropout") else None)
def _dropout(rec, args, kwargs, out):
    if _arg(args, kwargs, 2, "train", False):
        raise TraceUnsupported("dropout in training mode")
    rec.bind(out, rec.b.node("Identity", [rec.name_of(args[0])], "clone"))


@_rule(torch.dropout_)
def _dropout_in_place(rec, args, kwargs, out):
    """In eval mode in-place dropout leaves its tensor as it is: the exporter writes nothing for it (not even an
    in-place write, so no view of it goes stale)."""
    if _arg(args, kwargs, 2, "train", False):
        raise TraceUnsupported("dropout_ in training mode")
    if out is not args[0]:
        rec.bind(out, rec.name_of(args[0]))


@_rule(T.zero_, in_place=True)
def _zero(rec, args, kwargs, out):
    """``zero_`` as the exporter functionalizes it: ``zeros_like``, written by torchlib as an Expand of a zero
    cast like the tensor to its shape."""
    b = rec.b
    x = rec.name_of(args[0])
    zero = b.node("CastLike", [b.constant(np.array(0, dtype=np.int64), dtype=None), x])
    rec.bind(out, b.node("Expand", [zero, b.node("Shape", [x], start=0)], "zeros_like"))


@_rule(torch.where)
def _where(rec, args, kwargs, out):
    if len(args) != 3:
        raise TraceUnsupported("torch.where with one argument")
    cond, a, b = args
    # Python numbers take the result's dtype (with two numbers that is the default float type, not the bool
    # condition's)
    rec.bind(out, rec.b.node("Where", [rec.name_of(cond), _operand(rec, a, out), _operand(rec, b, out)], "where"))


def _masked_fill(rec, args, kwargs, out):
    x, mask, value = args[0], args[1], _arg(args, kwargs, 2, "value")
    rec.bind(out, rec.b.node("Where", [rec.name_of(mask), _operand(rec, value, x), rec.name_of(x)], "masked_fill"))


_rule(torch.masked_fill, T.masked_fill)(_masked_fill)
_rule(T.masked_fill_, in_place=True)(_masked_fill)
