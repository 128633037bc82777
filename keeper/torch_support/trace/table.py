"""The rule table: each torch call the trace follows, written as the ONNX nodes the dynamo exporter writes for
it (torch.export's ATen op, translated by onnxscript's torchlib, ``optimize=False``).

Only what the graph reader reads must agree: the data nodes (op type, inputs in order, the attributes rules and
channel groups read: perms, axes, pads, strides, groups, epsilon), which values are constants, and which are
shape information. Constants are ``Constant`` nodes; learned tensors are initializers. Where the exporter
computes a shape from ``Shape`` nodes (the key transpose of attention), the same is done here, because the
reader then knows no static shape there either.

A rule is ``rule(rec, args, kwargs, out)``: it reads its arguments' values from the recorder, appends nodes,
and binds ``out``'s tensors to their values. ``RULES`` maps :func:`~keeper.torch_support.trace.recorder.func_key`
of a torch callable to its rule.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from keeper.torch_support.trace.builder import numpy_dtype
from keeper.torch_support.trace.recorder import Recorder, func_key


__all__ = ["RULES"]

T = torch.Tensor
RULES: dict[Any, Callable] = {}
_INT_MAX = 9223372036854775807


def _rule(*funcs: Any, in_place: bool = False) -> Callable:
    def register(fn: Callable) -> Callable:
        if in_place:
            def wrapped(rec, args, kwargs, out, _fn=fn):
                return _fn(rec, args, kwargs, out)
            wrapped.in_place = True  # type: ignore[attr-defined]
        for f in funcs:
            if f is not None:
                RULES[func_key(f)] = wrapped if in_place else fn
        return fn
    return register


def _arg(args: tuple, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _np_dtype(t: torch.Tensor) -> Any:
    return numpy_dtype(t.dtype)


def _operand(rec: Recorder, x: Any, like: torch.Tensor) -> str:
    """A tensor's value, or a Python number as a scalar Constant of ``like``'s dtype."""
    if isinstance(x, torch.Tensor):
        return rec.name_of(x)
    return rec.b.constant(np.array(x, dtype=_np_dtype(like) if not isinstance(x, bool) else np.bool_), dtype=None)


def _axis(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _pair(v: Any, n: int) -> list[int]:
    return [int(x) for x in v] if isinstance(v, (tuple, list)) else [int(v)] * n


def _first_tensor(*xs: Any) -> torch.Tensor:
    return next(x for x in xs if isinstance(x, torch.Tensor))
