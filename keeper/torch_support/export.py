"""A torch module's architecture for keeper: ONNX whose parameter initializers hold no data, and the map from
ONNX tensors to state_dict entries.

The exporters rename (dynamo: ``val_22``), transpose (MatMul weights stored as ``W.T``), deduplicate (equal
initializers behind Identity nodes) and can fold parameters. Keeper does not guess names: it exports once with
every parameter and float buffer temporarily set to distinct seeded random values, and matches each ONNX tensor to
its state_dict entry by exact value (as is, or transposed).

:func:`export_graph` stops there: the architecture is the graph whose mapped initializers hold no data, and the
weights are the module's own tensors, read in place (:func:`module_weights`: views of CPU tensors, copied only
from other devices); no weight is serialised into ONNX and a module of any size works. (With the dynamo exporter
the stamped values are not even serialised: keeper reads them from the exported program and writes the graph with
placeholders.) Exports are remembered per architecture (:mod:`keeper.torch_support.cache`). :func:`export`
writes the module's real values into the ONNX, for models under protobuf's 2 GiB that need ONNX with weights.

Invariant: the module is left exactly as it was (values, training mode) after :func:`export` and
:func:`export_graph`.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from keeper.errors import KeeperError, TraceFallbackWarning, TraceUnsupported
from keeper.graph import graph_from_proto
from keeper.graph.reader import marks_constant
from keeper.onnx_safety import has_data, load_model
from keeper.onnx_weights import apart_specs, clear_data, read_initializers, write_weights
from keeper.torch_support.cache import cached_export
from keeper.torch_support.exported import Exported
from keeper.torch_support.tensors import (FLOATS, as_numpy, drop_eval_caches, float_state, key_shapes,
                                          state_arrays, tensor_view, tied_keys)
from keeper.torch_support.trace import trace_graph

__all__ = ["Exported", "export", "export_graph", "module_weights"]


def export(module: torch.nn.Module, example_input: Any, *, dynamo: bool | None = None, seed: int = 0) -> Exported:
    """Export ``module`` as ONNX with its weights (under protobuf's 2 GiB), BatchNorm kept (not folded), and map
    ONNX tensors to state_dict keys.

    Args:
        dynamo: None for the torch front end (falling back to the dynamo exporter), True for the dynamo
            exporter, False for TorchScript (see :func:`export_graph`).
    """
    graph = export_graph(module, example_input, dynamo=dynamo, seed=seed)
    proto = load_model(graph.onnx, what="exported module")
    saved = {k: v.detach() for k, v in float_state(module).items()}
    shapes = key_shapes(proto, graph.keys, graph.graph)
    return Exported(_with_state(proto, graph.keys, shapes, saved).SerializeToString(), graph.keys)


def export_graph(module: torch.nn.Module, example_input: Any, *, dynamo: bool | None = None,
                 seed: int = 0) -> Exported:
    """Export ``module``'s architecture: ONNX whose initializers holding a parameter have no data (any size), the
    ONNX-to-state_dict map, and ``apart`` (which key feeds each data-less initializer). Weights:
    :func:`module_weights`.

    By default (``dynamo=None``, ``KEEPER_EXPORTER`` unset or ``trace``) the architecture comes from one forward
    pass (:mod:`keeper.torch_support.trace`, milliseconds); a module it cannot read goes through the dynamo
    exporter with a :class:`~keeper.errors.TraceFallbackWarning` naming why. ``dynamo=True`` (or
    ``KEEPER_EXPORTER=dynamo``) and ``dynamo=False`` (``KEEPER_EXPORTER=torchscript``) choose an exporter.

    Example:
        >>> g = export_graph(model, torch.randn(1, 3, 32, 32))          # doctest: +SKIP
        >>> zoo.warm(g.onnx, weights=module_weights(model, g))          # doctest: +SKIP
    """
    exporter = _exporter(dynamo)
    args = example_input if isinstance(example_input, tuple) else (example_input,)
    drop_eval_caches(module)  # a tensor cached from the parameters would be traced as a constant, not read

    def make() -> Exported:
        if exporter == "trace":
            return _traced_graph(module, args, seed)
        return _export_graph(module, args, exporter == "dynamo", seed)

    return cached_export(module, args, f"{exporter}/{seed}", make,
                         lambda exported: _apart_state_keys(module, exported))


_EXPORTERS = ("trace", "dynamo", "torchscript")


def _exporter(dynamo: bool | None) -> str:
    if dynamo is not None:
        return "dynamo" if dynamo else "torchscript"
    name = os.environ.get("KEEPER_EXPORTER", "trace")
    if name not in _EXPORTERS:
        raise KeeperError(f"KEEPER_EXPORTER={name!r}: expected one of {', '.join(_EXPORTERS)}; unset it for the "
                          "default (trace, falling back to dynamo)")
    return name


def _traced_graph(module: torch.nn.Module, args: tuple, seed: int) -> Exported:
    """The architecture from one forward pass; the dynamo exporter's, with a warning, when the trace cannot read
    the module (the fallback is always right, so an unexpected failure of the trace falls back too)."""
    try:
        traced = trace_graph(module, args)
    except Exception as exc:  # noqa: BLE001 (see the docstring)
        drop_eval_caches(module)  # what the eval-mode forward cached: the exporter must read the parameters
        reason = str(exc) if isinstance(exc, TraceUnsupported) else f"{type(exc).__name__}: {exc}"
        warnings.warn(f"{type(module).__qualname__}: the torch front end cannot read its forward ({reason}); "
                      "using the ONNX exporter instead (seconds instead of milliseconds)", TraceFallbackWarning,
                      stacklevel=5)
        return _export_graph(module, args, True, seed)
    drop_eval_caches(module)  # what the eval-mode forward cached
    return traced


def _apart_state_keys(module: torch.nn.Module, exported: Exported) -> set[str]:
    """The state_dict keys whose values ``exported``'s graph leaves without data, tied keys included."""
    keys = {exported.keys[k][0] for k in exported.apart.values()}
    tied = tied_keys(dict(module.state_dict(keep_vars=True)))
    return keys | {t for k in keys for t in tied.get(k, ())}


def _export_graph(module: torch.nn.Module, args: tuple, dynamo: bool, seed: int) -> Exported:
    state = float_state(module)
    saved = {k: v.detach().clone() for k, v in state.items()}
    # per submodule: module.train(flag) would also flip submodules the caller had set apart (a frozen BatchNorm)
    was_training = {m: m.training for m in module.modules()}
    gen = torch.Generator().manual_seed(seed)
    stamps: dict[str, np.ndarray] = {}
    try:
        with torch.no_grad():
            for k, v in state.items():
                # distinct values per tensor: a random draw plus a per-tensor offset, drawn on the CPU (the
                # generator's device) whatever torch's default device is
                stamp = torch.rand(v.shape, generator=gen, dtype=torch.float32, device="cpu") + len(stamps) * 2.0 + 1.0
                v.copy_(stamp.to(v.dtype))
                # matched while the module still holds the stamps: a float32 CPU tensor is read in place
                stamps[k] = (v.detach().numpy() if v.dtype == torch.float32 and v.device.type == "cpu"
                             else v.detach().cpu().float().numpy())
        module.eval()
        if dynamo:
            proto, inits = _dynamo_graph(module, args)
        else:
            proto = load_model(_export_bytes(module, args, dynamo), what="exported module")
            inits = read_initializers(proto)
        graph = graph_from_proto(proto)
        by_first = _stamps_by_first(stamps)
        keys = _match_keys(graph, inits, stamps, by_first)  # inside: dynamo's arrays are views of the stamped module
        # tensors of the module that no layer reads (an op keeper has no rule for) stay in the graph as data:
        # find which they are while they hold the stamps, to write their real values below
        read = {r.source for refs in graph.tensors for r in refs if r.key in keys}
        held = {name: hit for name, a in inits.items() if name not in read and a.dtype in FLOATS and a.size > 1
                for hit in [_find_stamp(a, by_first, stamps)] if hit is not None}
    finally:
        with torch.no_grad():
            for k, v in state.items():
                v.copy_(saved[k])
        drop_eval_caches(module)  # what the eval-mode trace cached was computed from the stamps
        for m, training in was_training.items():
            m.training = training
    apart = {}
    for refs in graph.tensors:
        for r in refs:
            if r.key in keys:
                apart.setdefault(r.source, r.key)
    for init in proto.graph.initializer:
        if init.name in apart and has_data(init):
            clear_data(init)
        elif init.name not in apart and init.name in held:  # the module's value, not the stamp the trace saw
            sd_key, how = held[init.name]
            arr = as_numpy(state[sd_key])
            arr = (arr.T if how == "T" else arr).reshape(tuple(init.dims))
            dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
            init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(arr.astype(dtype, copy=False)), init.name))
        elif init.name not in apart and not has_data(init) and init.name in inits:
            # a constant the exporter made (no state_dict entry): its data stays in the graph
            init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(inits[init.name]), init.name))
    data = proto.SerializeToString()
    return Exported(data, keys, apart, graph_from_proto(load_model(data, what="exported module", weights_apart=True)))


def _dynamo_graph(module: torch.nn.Module, args: tuple) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The dynamo export as a ModelProto whose float initializers hold placeholders instead of data, and those
    initializers' values as arrays (views of the module's tensors where torch allows): the weights are never
    serialised."""
    import onnx_ir as ir  # the exporter's IR (onnxscript's): needed here only, not on the torch front end's path

    quiet = contextlib.redirect_stdout(io.StringIO())
    with warnings.catch_warnings(), quiet:
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, args, dynamo=True, optimize=False)
    values = {}
    for name, value in program.model.graph.initializers.items():
        tensor = value.const_value
        if tensor is None or tensor.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16,
                                                  ir.DataType.DOUBLE) or tensor.size < 2:
            continue
        if marks_constant(value.metadata_props):  # a buffer outside the state_dict: no weight, its data stays
            continue
        values[name] = tensor.numpy()
        # an external reference serialises no data; load_model(weights_apart=True) drops it unread
        value.const_value = ir.ExternalTensor("keeper-weights-apart", 0, tensor.nbytes, tensor.dtype,
                                              shape=tensor.shape, name=name)
    proto = load_model(ir.to_proto(program.model), what="exported module", weights_apart=True)
    inits = read_initializers(proto)
    inits.update(values)
    return proto, inits


def _export_bytes(module: torch.nn.Module, args: tuple, dynamo: bool) -> bytes:
    f = io.BytesIO()
    quiet = contextlib.redirect_stdout(io.StringIO())
    with warnings.catch_warnings(), quiet:
        warnings.simplefilter("ignore")
        if dynamo:
            torch.onnx.export(module, args, f, dynamo=True, optimize=False)
        else:
            torch.onnx.export(module, args, f, dynamo=False, do_constant_folding=False)
    return f.getvalue()


def _stamps_by_first(stamps: dict[str, np.ndarray]) -> dict[float, list[str]]:
    by_first: dict[float, list[str]] = {}
    for k, a in stamps.items():
        if a.size:
            by_first.setdefault(float(a.reshape(-1)[0]), []).append(k)
    return by_first


def _find_stamp(a: np.ndarray, by_first: dict[float, list[str]],
                stamps: dict[str, np.ndarray]) -> tuple[str, str] | None:
    """(state_dict key, "same" | "T") of the stamp ``a`` holds, as is or transposed, or None."""
    a = np.asarray(a, dtype=np.float32)  # no copy for float32
    for how, cand in (("same", a), ("T", a.T if a.ndim == 2 else None)):
        if cand is None or not cand.size:
            continue
        for k in by_first.get(float(cand.reshape(-1)[0]), []):
            s = stamps[k]
            if s.size == cand.size and np.array_equal(s.reshape(-1), np.ascontiguousarray(cand).reshape(-1)):
                return k, how
    return None


def _match_keys(graph, inits: dict[str, np.ndarray], stamps: dict[str, np.ndarray],
                by_first: dict[float, list[str]]) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for refs in graph.tensors:
        for r in refs:
            if r.key not in out:
                hit = _find_stamp(inits[r.source], by_first, stamps)
                if hit is not None:
                    out[r.key] = hit
    return out


def _with_state(proto, keys: dict[str, tuple[str, str]], shapes: dict[str, tuple[int, ...]], state: dict[str, Any],
                what: str = "module") -> Any:
    """A copy of ``proto`` whose mapped tensors hold ``state``'s values (torch tensors or arrays)."""
    return write_weights(proto, state_arrays(keys, shapes, state, what))


def module_weights(module: torch.nn.Module, exported: Exported) -> dict[str, np.ndarray]:
    """The weights :func:`export_graph`'s graph leaves without data, from ``module`` as it is now: read-only
    views of CPU tensors (transposed and reshaped lazily as views where numpy can), copies from other devices.
    dtypes are kept (bfloat16 as ``ml_dtypes.bfloat16``)."""
    state = float_state(module)
    specs = apart_specs(load_model(exported.onnx, what="exported module"))
    out = {}
    for init, key in exported.apart.items():
        sd_key, how = exported.keys[key]
        if sd_key not in state:
            raise KeeperError(f"module: state_dict has no entry {sd_key!r}, which the exported graph needs; export "
                              "the module again")
        arr = tensor_view(state[sd_key])
        arr = arr.T if how == "T" else arr
        out[init] = arr.reshape(specs[init][1])
        out[init].flags.writeable = False
    return out
