"""Architecture exports remembered within a process and on local disk, keyed by the module's fingerprint.

Tracing a module to ONNX costs seconds whatever its size (torch's dynamo exporter: 2-4 s for a GPT-2-sized model),
while loading its weights costs a fraction of that. A process that exports one architecture again (a Tune trial
exports at its warm start and again when it checkpoints; a NAS loop meets an architecture twice) reuses the first
export: the graph and its ONNX-to-state_dict map depend on the module's structure, never on its parameter values.

Invariants:
    * the fingerprint covers everything the trace reads besides the values of the tensors the graph leaves without
      data: per submodule its path, its class (qualified name and the bytecode of every method along its MRO up
      to ``torch.nn.Module``, and the content of the source file defining each such class) and its plain
      attributes (numbers, strings, flags, dtypes, functions by their bytecode, configs by their ``to_dict()``);
      every parameter's and buffer's name, shape, dtype and device type, and which of them share one tensor; the
      example input's structure, shapes, dtypes and devices; the exporter; the Python, torch and keeper versions,
      :attr:`LayerGraph.FORMAT` and a digest of the front end's own code (:func:`front_end_digest`). A module holding an attribute of any other type has no fingerprint and is
      exported every time;
    * an entry remembers the values of the tensors its graph holds as data (buffers, and parameters no layer
      reads): it is used only when they are unchanged, otherwise the module is exported again;
    * in a process at most :data:`MAX_ENTRIES` are kept, least recently used dropped first; every export is also
      kept on local disk (:mod:`keeper.torch_support.cache_files`), where an entry is used only after the module's
      parameter and buffer names, shapes and dtypes are checked against it, so a new process (a Tune trial) does
      not trace an architecture another process traced. A change to a model's source file changes the
      fingerprint; code the model calls from other files (a helper function in another module) is not read, so
      after editing such code set ``KEEPER_ARCH_CACHE=off`` once or remove the cache directory.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import os
import sys
import threading
import types
from collections import OrderedDict
from typing import Any, Callable

import numpy as np
import torch

import keeper
from keeper.graph import LayerGraph
from keeper.torch_support import cache_files
from keeper.torch_support.exported import Exported

__all__ = ["fingerprint", "cached_export", "clear", "MAX_ENTRIES", "stats"]

#: Exports kept per process (each is the graph without weights: kilobytes to a few megabytes).
MAX_ENTRIES = 16

_lock = threading.Lock()
_entries: "OrderedDict[str, tuple[Any, tuple[str, ...], str]]" = OrderedDict()
_counts = {"hits": 0, "disk_hits": 0, "misses": 0, "uncacheable": 0, "stale": 0}
_class_tokens: dict[type, bytes] = {}
_file_tokens: dict[str, bytes] = {}


class _Uncacheable(Exception):
    """An attribute whose effect on the trace cannot be told from its value."""


_SKIPPED_ATTRS = frozenset({"_parameters", "_buffers", "_modules", "training", "_state_dict_hooks",
                            "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks"})
_MAX_DEPTH = 8


def _code(code: types.CodeType) -> bytes:
    """A code object's bytecode, names and constants, nested code included."""
    parts = [code.co_code, repr(code.co_names).encode(), repr(code.co_varnames).encode()]
    for c in code.co_consts:
        parts.append(_code(c) if isinstance(c, types.CodeType) else _constant(c).encode())
    return b"\0".join(parts)


def _constant(c: object) -> str:
    """A code constant's text, the same in every process: a frozenset (``x in {"a", "b"}``) is sorted, since its
    repr follows string hashing, which differs per process."""
    if isinstance(c, frozenset):
        return "frozenset(" + ",".join(sorted(_constant(x) for x in c)) + ")"
    if isinstance(c, tuple):
        return "(" + ",".join(_constant(x) for x in c) + ")"
    return repr(c)


def _function(fn: Any) -> bytes:
    inner = getattr(fn, "__func__", fn)
    inner = getattr(inner, "__wrapped__", inner)
    name = f"{getattr(inner, '__module__', '')}.{getattr(inner, '__qualname__', type(inner).__name__)}".encode()
    code = getattr(inner, "__code__", None)
    return name + (b":" + _code(code) if code is not None else b"")


def _class(cls: type) -> bytes:
    """A class's qualified name and the bytecode of the methods it and its bases (below nn.Module) define."""
    token = _class_tokens.get(cls)
    if token is None:
        parts = []
        for klass in cls.__mro__:
            if klass is torch.nn.Module or klass is object:
                break
            parts.append(f"{klass.__module__}.{klass.__qualname__}".encode() + _source_file(klass))
            for name, value in sorted(vars(klass).items()):
                if isinstance(value, (types.FunctionType, staticmethod, classmethod)):
                    parts.append(name.encode() + b"=" + _function(value))
                elif isinstance(value, property):
                    parts.append(name.encode() + b"=" + b"".join(_function(f) for f in
                                                                 (value.fget, value.fset) if f is not None))
        token = _class_tokens[cls] = b"\1".join(parts)
    return token


def _source_file(cls: type) -> bytes:
    """sha256 of the file defining ``cls`` (empty when it has none): an edit anywhere in a model's file changes
    the fingerprint, the module-level helpers its methods call included."""
    try:
        path = inspect.getsourcefile(cls)
    except (TypeError, OSError):  # a built-in, or a class defined where no file holds it (python -c, a REPL)
        return b""
    if not path:
        return b""
    token = _file_tokens.get(path)
    if token is None:
        try:
            with open(path, "rb") as f:
                token = hashlib.sha256(f.read()).digest()
        except OSError:
            token = b""
        _file_tokens[path] = token
    return b"@" + token


def _digest(t: torch.Tensor) -> str:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    data = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes() if t.numel() else b""
    return hashlib.sha256(data).hexdigest()


def _token(v: Any, depth: int = 0) -> str:
    """A stable text for an attribute value, or :class:`_Uncacheable`."""
    if depth > _MAX_DEPTH:
        raise _Uncacheable("nested too deep")
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
        return repr(v)
    if isinstance(v, enum.Enum):
        return f"{type(v).__qualname__}.{v.name}"
    if isinstance(v, (torch.dtype, torch.device, torch.Size, torch.memory_format, torch.layout)):
        return str(v)
    if isinstance(v, (tuple, list)):
        return type(v).__name__ + "(" + ",".join(_token(x, depth + 1) for x in v) + ")"
    if isinstance(v, (set, frozenset)):
        return "set(" + ",".join(sorted(_token(x, depth + 1) for x in v)) + ")"
    if isinstance(v, dict):
        return "{" + ",".join(sorted(f"{_token(k, depth + 1)}:{_token(x, depth + 1)}" for k, x in v.items())) + "}"
    if isinstance(v, torch.Tensor):
        return f"tensor({tuple(v.shape)},{v.dtype},{_digest(v)})"
    if isinstance(v, np.ndarray):
        return f"array({v.shape},{v.dtype},{hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()})"
    if isinstance(v, functools.partial):
        return f"partial({_function(v.func).hex()},{_token(v.args, depth + 1)},{_token(v.keywords, depth + 1)})"
    if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return "fn(" + _function(v).hex() + ")"
    if isinstance(v, type):
        return "cls(" + _class(v).hex() + ")"
    if isinstance(v, torch.nn.Module):  # referenced outside the module tree: its structure is someone else's
        return f"module({type(v).__module__}.{type(v).__qualname__})"
    to_dict = getattr(v, "to_dict", None)  # configuration objects (Hugging Face's PretrainedConfig)
    if callable(to_dict):
        return f"{type(v).__qualname__}(" + _token(to_dict(), depth + 1) + ")"
    raise _Uncacheable(f"attribute of type {type(v).__qualname__}")


def _inputs(args: Any, depth: int = 0) -> str:
    if isinstance(args, torch.Tensor):
        return f"T({tuple(args.shape)},{args.dtype},{args.device.type})"
    if isinstance(args, (tuple, list)):
        return "(" + ",".join(_inputs(a, depth + 1) for a in args) + ")"
    if isinstance(args, dict):
        return "{" + ",".join(f"{k!r}:{_inputs(a, depth + 1)}" for k, a in sorted(args.items())) + "}"
    return _token(args, depth)


@functools.lru_cache(maxsize=1)
def front_end_digest() -> str:
    """A digest of the code that turns a module into its graph (the front end's rules, the export path, graph
    extraction): an entry written by other code of the same version is never served (an upgrade that reads a
    model the old code fell back on, or writes another graph). Read once per process (~40 small files)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the keeper package
    h = hashlib.sha256()
    for sub in ("torch_support/trace", "torch_support", "graph"):
        folder = os.path.join(root, sub)
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py"):
                with open(os.path.join(folder, name), "rb") as f:
                    h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()[:16]


def fingerprint(module: torch.nn.Module, args: Any, exporter: str) -> str | None:
    """The module's architecture fingerprint for ``args`` and ``exporter`` (sha256 hex), or None when an
    attribute's effect on the trace cannot be told from its value."""
    h = hashlib.sha256(repr((sys.version_info[:3], torch.__version__, keeper.__version__, LayerGraph.FORMAT,
                             exporter, front_end_digest())).encode())
    try:
        h.update(_inputs(args).encode())
        for path, m in module.named_modules(remove_duplicate=False):
            h.update(b"\2" + path.encode() + b"\3" + _class(type(m)))
            for name, value in sorted(vars(m).items()):
                if name not in _SKIPPED_ATTRS:
                    h.update(f"\4{name}={_token(value)}".encode())
    except _Uncacheable:
        return None
    shared: dict[tuple, str] = {}
    for name, t in module.state_dict(keep_vars=True).items():
        ident = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.stride())) if t.numel() else None
        h.update(f"\5{name}:{tuple(t.shape)}:{t.dtype}:{t.device.type}:{shared.setdefault(ident, name)}".encode())
    for name, _ in module.named_buffers():
        h.update(f"\6{name}".encode())  # a buffer outside the state_dict (not persistent) is still traced
    return h.hexdigest()


def _baked_digest(module: torch.nn.Module, keys: tuple[str, ...]) -> str:
    tensors = dict(module.named_parameters(remove_duplicate=False))
    tensors.update(module.named_buffers(remove_duplicate=False))
    h = hashlib.sha256()
    for k in keys:
        h.update(f"{k}={_digest(tensors[k])};".encode())
    return h.hexdigest()


def cached_export(module: torch.nn.Module, args: Any, exporter: str, export: Callable[[], Any],
                  apart_keys: Callable[[Any], set[str]]) -> Any:
    """``export()``'s result for ``module``, remembered: a later call with the same fingerprint and the same values
    of the tensors the graph holds as data returns a copy of the first result without tracing.

    ``apart_keys(result)``: the state_dict keys whose values the graph leaves without data (the rest of the
    module's tensors are remembered by value)."""
    key = fingerprint(module, args, exporter)
    if key is None:
        with _lock:
            _counts["uncacheable"] += 1
        return export()
    with _lock:
        entry = _entries.get(key)
    if entry is not None:
        result, baked, digest = entry
        if _baked_digest(module, baked) == digest:
            with _lock:
                _entries.move_to_end(key)
                _counts["hits"] += 1
            return _copy(result)
        with _lock:
            _counts["stale"] += 1
    else:
        found = _from_disk(key, module)
        if found is not None:
            return found
        # another trial process of this node may be tracing this architecture now: wait for its entry
        with cache_files.exporting(key):
            found = _from_disk(key, module)
            if found is not None:
                return found
            with _lock:
                _counts["misses"] += 1
            return _export_and_keep(key, module, export, apart_keys)
    return _export_and_keep(key, module, export, apart_keys)


def _from_disk(key: str, module: torch.nn.Module) -> Any:
    """A copy of the disk cache's entry ``key`` when it is the module's (remembered in the process too), else
    None."""
    found = cache_files.load(key, module)
    if found is None or _baked_digest(module, found[4]) != found[5]:
        return None
    onnx, keys, apart, graph, baked, digest = found
    result = Exported(onnx, keys, apart, graph)
    with _lock:
        _counts["disk_hits"] += 1
        _remember(key, (result, baked, digest))
    return _copy(result)


def _export_and_keep(key: str, module: torch.nn.Module, export: Callable[[], Any],
                     apart_keys: Callable[[Any], set[str]]) -> Any:
    """``export()``, remembered in the process and kept on disk."""
    result = export()
    apart = apart_keys(result)
    every = [k for k, _ in module.named_parameters(remove_duplicate=False)]
    every += [k for k, _ in module.named_buffers(remove_duplicate=False)]
    baked = tuple(k for k in every if k not in apart)
    digest = _baked_digest(module, baked)
    with _lock:
        _remember(key, (_copy(result), baked, digest))
    cache_files.save(key, module, result, baked, digest)
    return result


def _remember(key: str, entry: tuple) -> None:
    """Keep ``entry`` in this process (caller holds the lock)."""
    _entries[key] = entry
    _entries.move_to_end(key)
    while len(_entries) > MAX_ENTRIES:
        _entries.popitem(last=False)




def _copy(result: Any) -> Any:
    return type(result)(result.onnx, dict(result.keys), dict(result.apart), result.graph)


def clear() -> None:
    """Forget every remembered export."""
    with _lock:
        _entries.clear()


def stats() -> dict[str, int]:
    """Counts since the process started: hits (in memory), disk hits, misses, uncacheable modules, stale entries
    (values changed)."""
    with _lock:
        return dict(_counts, entries=len(_entries))
