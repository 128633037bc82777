"""The recorder: one eager forward pass under a ``TorchFunctionMode``, each torch call written as the ONNX nodes
the dynamo exporter writes for it (:mod:`~keeper.torch_support.trace.lowering`).

Every tensor the forward touches is one of:

* data: computed from the example input (a graph input, then node outputs);
* learned: a module tensor (parameter, buffer, tensor attribute: an initializer named by its state_dict key,
  tied tensors under their first key) or computed from such tensors alone; calls on them are written as nodes
  too, so the graph reader traces tables and lookups exactly as in an exported graph;
* plain: made during the forward from neither (``torch.arange``, masks, ``ones_like``): a ``Constant`` node
  where a node reads it.

A call with a data or learned argument and no rule, a tensor converted to a Python value (``.item()``,
``bool``: control flow that depends on the data), an in-place write into a module tensor, a read of a tensor an
in-place op changed through another view of its memory, or a tensor of unknown origin raises
:class:`~keeper.errors.TraceUnsupported` naming the op: the trace never guesses.

In-place ops are written as the functional op, which is what the exporter's functionalization writes, as long as
nothing reads the old value afterwards: the recorder keeps, per storage, every tensor it has seen on it, and an
in-place write makes the other tensors on that storage stale (their values changed behind the graph's back); a
later read of a stale tensor raises. So ``out += identity; out.relu_()`` (ResNet's block) is read, and a view read
after a write through its base is refused.
Python-level functions without a rule (``F.relu``, ``F.multi_head_attention_forward``) are followed inside, so
rules sit on the torch calls export records.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from keeper.errors import TraceUnsupported
from keeper.torch_support.trace.builder import OnnxBuilder
from keeper.torch_support.trace.inplace import write_back

__all__ = ["Recorder", "DATA", "LEARNED", "func_key", "func_name"]

DATA, LEARNED = "data", "learned"


@dataclass
class Value:
    """A tensor's ONNX value: its kind, and its name or the lowering that writes it on first read (the parts of
    a split become ``SequenceAt`` nodes only when read, as export writes ``getitem`` only for parts in use)."""

    kind: str
    name: str | None
    make: Callable[[], str] | None = None


def func_key(func: Any) -> Any:
    """A hashable key of a torch callable; property getters (``Tensor.T``) by their property's name."""
    if getattr(func, "__name__", "") == "__get__" and hasattr(func, "__self__"):
        return ("get", getattr(func.__self__, "__name__", ""))
    return func


def func_name(func: Any) -> str:
    key = func_key(func)
    if isinstance(key, tuple):
        return f"Tensor.{key[1]}"
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


# Calls that read no value (shapes, dtypes, devices, flags): answered without recording.
_QUERIES = {func_key(f) for f in (
    torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel, torch.Tensor.stride, torch.Tensor.is_contiguous,
    torch.Tensor.is_floating_point, torch.Tensor.is_complex, torch.Tensor.__len__, torch.Tensor.element_size,
    torch.Tensor.get_device, torch.Tensor.data_ptr, torch.Tensor.storage_offset, torch.Tensor.ndimension,
    torch.Tensor.nelement, torch.is_floating_point, torch.is_tensor, torch.numel,
    torch.is_complex, torch.Tensor.__hash__)} | {("get", n) for n in (
        "shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "is_leaf", "layout", "names", "is_sparse",
        "is_quantized", "is_meta", "is_nested", "grad_fn", "_base", "is_mps", "itemsize", "nbytes", "_version")}

# Conversions of a tensor to Python values: with the input or a learned tensor behind them, the forward's
# control flow or shapes may depend on values the graph cannot carry.
_CONVERSIONS = {func_key(f) for f in (
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
    torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.__array__, torch.Tensor.__complex__,
    torch.equal, torch.Tensor.equal, torch.allclose, torch.Tensor.allclose, torch.is_nonzero,
    torch._assert)}  # run as they are (``torch._assert`` of a Python bool: a shape check), never followed inside

# Calls whose result depends on a tensor's shape, dtype and device only: plain tensors.
_LIKE = {func_key(f) for f in (
    torch.zeros_like, torch.ones_like, torch.full_like, torch.empty_like, torch.rand_like, torch.randn_like,
    torch.Tensor.new_zeros, torch.Tensor.new_ones, torch.Tensor.new_full, torch.Tensor.new_empty,
    torch.Tensor.new_tensor)}


def _storage(t: torch.Tensor) -> int:
    """The address of ``t``'s memory: the same for a tensor and every view of it."""
    return t.untyped_storage().data_ptr()


def _stale(t: torch.Tensor, op: str) -> TraceUnsupported:
    return TraceUnsupported(f"{op} reads a tensor of shape {tuple(t.shape)} after an in-place op changed its "
                            "memory through another tensor (a view or its base): the graph cannot show the change")


def _no_torch_function(*args: Any, **kwargs: Any) -> bool:
    return False


_unchecked_globals: dict[int, dict] = {}
_unchecked_funcs: dict[Any, types.FunctionType] = {}


def _unchecked(func: types.FunctionType) -> types.FunctionType:
    """``func`` with its ``has_torch_function`` preamble answered False: run under the mode, its body's torch
    calls reach the mode while the function itself does not dispatch to it again (which would recurse)."""
    out = _unchecked_funcs.get(func)
    if out is None:
        g = _unchecked_globals.get(id(func.__globals__))
        if g is None:
            g = dict(func.__globals__)
            for name in ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic"):
                g[name] = _no_torch_function
            _unchecked_globals[id(func.__globals__)] = g
        out = types.FunctionType(func.__code__, g, func.__name__, func.__defaults__, func.__closure__)
        out.__kwdefaults__ = func.__kwdefaults__
        _unchecked_funcs[func] = out
    return out


class Recorder(TorchFunctionMode):
    """Records one forward of ``module`` into an :class:`OnnxBuilder` (see the module docstring)."""

    def __init__(self, module: torch.nn.Module, rules: dict[Any, Callable]):
        super().__init__()
        self.b = OnnxBuilder()
        self.rules = rules
        self.values: dict[int, Value] = {}
        self.plain: set[int] = set()
        self.alive: list[Any] = []  # every tensor seen, so that no id is reused during the trace
        self.aliases: dict[int, set[int]] = {}  # storage address -> the tensors seen on it (in-place safety)
        self.stale: set[int] = set()  # tensors whose memory an in-place op wrote through another tensor
        self.slices: dict[int, tuple] = {}  # view -> (base, dim, start, end, step): writes go back (inplace.py)
        self.state: dict[int, tuple[str, torch.Tensor]] = {}
        for name, t in list(module.named_parameters(remove_duplicate=False)) + list(
                module.named_buffers(remove_duplicate=False)):
            self.state.setdefault(id(t), (name, t))
        # module tensors the state_dict does not hold (a buffer that is not persistent, a tensor attribute) are
        # built with the module and never saved: initializers with their data, marked as the exporter marks them
        saved = {id(v) for v in module.state_dict(keep_vars=True).values()}
        self.constant: dict[int, str] = {id(t): "BUFFER" for t in module.buffers() if id(t) not in saved}
        for path, m in module.named_modules():
            for attr, v in vars(m).items():
                if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter) and id(v) not in self.state:
                    self.state[id(v)] = (f"{path}.{attr}" if path else attr, v)
                    self.constant[id(v)] = "CONSTANT_TENSOR"
        self.module_storages = {_storage(t) for _, t in self.state.values() if t.numel()}
        self.kind = DATA  # the kind of the current call's results
        self.following: set[Any] = set()

    # -- values
    def bind(self, t: Any, name: str, kind: str | None = None) -> None:
        """``t``'s value is ``name`` (of the current call's kind unless given)."""
        self._bind(t, Value(kind or self.kind, name))
        self.b.annotate(name, t)

    def bind_lazy(self, t: torch.Tensor, make: Callable[[], str]) -> None:
        self._bind(t, Value(self.kind, None, make))

    def _bind(self, t: torch.Tensor, v: Value) -> None:
        self.alive.append(t)
        self.values[id(t)] = v
        self.plain.discard(id(t))
        self.stale.discard(id(t))
        self._alias(t)

    def _alias(self, t: torch.Tensor) -> None:
        if t.numel():  # an empty tensor holds no values an in-place op could change
            self.aliases.setdefault(_storage(t), set()).add(id(t))

    def kind_of(self, t: torch.Tensor, op: str) -> str | None:
        """DATA, LEARNED, or None for a plain tensor; raises for a tensor of unknown origin."""
        if id(t) in self.stale:
            raise _stale(t, op)
        return self.kind_of_unchecked(t, op)

    @staticmethod
    def joined(kinds: Any) -> str:
        """The kind of what is computed from tensors of ``kinds`` (None for plain ones): data once any one is."""
        return DATA if DATA in kinds else LEARNED

    def kind_of_unchecked(self, t: torch.Tensor, op: str = "a write back") -> str | None:
        """:meth:`kind_of`, stale or not."""
        v = self.values.get(id(t))
        if v is not None:
            return v.kind
        if id(t) in self.state:
            return LEARNED
        if id(t) in self.plain:
            return None
        raise TraceUnsupported(f"{op} reads a tensor of shape {tuple(t.shape)} made outside the traced torch calls "
                               "(a C extension, or a cache filled before the forward)")

    def name_of(self, t: torch.Tensor) -> str:
        """The ONNX value of ``t``, written where it is first read (initializer, Constant, split part)."""
        if id(t) in self.stale:
            raise _stale(t, "a node")
        v = self.values.get(id(t))
        if v is not None:
            if v.name is None:
                v.name = v.make()
                v.make = None
                self.b.annotate(v.name, t)
            return v.name
        if id(t) in self.state:
            name, tensor = self.state[id(t)]
            return self.b.initializer(name, tensor, self.constant.get(id(t)))
        if id(t) in self.plain:  # a Constant node: the graph reader takes it for no learned tensor
            return self.b.tensor_constant(t)
        raise TraceUnsupported(f"a tensor of shape {tuple(t.shape)} of unknown origin")

    def mark_plain(self, out: Any) -> None:
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and id(t) not in self.values and id(t) not in self.state:
                self.alive.append(t)
                self.plain.add(id(t))
                self.stale.discard(id(t))
                self._alias(t)

    def check_in_place(self, t: torch.Tensor, op: str) -> None:
        """Before ``op`` writes ``t`` in place: a module tensor (or a view of one) must keep its values; every other
        tensor on ``t``'s memory becomes stale (its values change behind the graph's back: reading it raises)."""
        key = _storage(t)
        if id(t) in self.state or (t.numel() and key in self.module_storages):
            raise TraceUnsupported(f"{op} writes in place into a module tensor")
        self.stale.update(self.aliases.get(key, set()) - {id(t)})

    # -- the mode
    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        key = func_key(func)
        if key in _QUERIES:
            return func(*args, **kwargs)
        rule = self.rules.get(key)
        op = func_name(func)
        if rule is None and key not in _CONVERSIONS and isinstance(func, types.FunctionType):
            if func in self.following:  # its body dispatches to itself again (a dispatch wrapper)
                raise TraceUnsupported(f"{op} cannot be followed inside and has no rule in the trace's table")
            self.following.add(func)
            try:
                with self:  # a Python-level function: record the torch calls it makes
                    return _unchecked(func)(*args, **kwargs)
            finally:
                self.following.discard(func)
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if key in _LIKE:  # the first tensor lends its shape, dtype and device only (a stale one's are still right)
            if any(self.kind_of(t, op) for t in tensors[1:]):
                raise TraceUnsupported(f"{op} makes a tensor from the values of a tensor computed from the input or "
                                       "the weights")
            out = func(*args, **kwargs)
            self.mark_plain(out)
            return out
        kinds = [self.kind_of(t, op) for t in tensors]
        if key in _CONVERSIONS and any(kinds):
            raise TraceUnsupported(f"{op} turns a tensor computed from the input or the weights into a Python "
                                   "value (control flow or shapes that depend on values)")
        if rule is not None and getattr(rule, "in_place", False) and tensors:
            self.check_in_place(tensors[0], op)
        if isinstance(kwargs.get("out"), torch.Tensor):  # an ``out=`` argument is an in-place write too
            self.check_in_place(kwargs["out"], op)
        out = func(*args, **kwargs)
        if not any(kinds):
            self.mark_plain(out)
            return out
        if rule is None:
            if not any(isinstance(t, torch.Tensor) for t in tree_flatten(out)[0]):
                raise TraceUnsupported(f"{op} reads a tensor computed from the input or the weights")
            raise TraceUnsupported(f"{op} has no rule in the trace's table")
        self.kind = self.joined(kinds)
        rule(self, args, kwargs, out)
        if getattr(rule, "in_place", False):
            write_back(self, tensors[0])
        return out
