"""Torch glue: export a module to ONNX for keeper, and load a WarmResult back into the module.

The exporters rename (dynamo: ``val_22``), transpose (MatMul weights stored as ``W.T``), deduplicate (equal
initializers behind Identity nodes) and can fold parameters. Keeper does not guess names: it exports once with
every parameter and float buffer temporarily set to distinct seeded random values, and matches each ONNX tensor to
its state_dict entry by exact value (as is, or transposed).

:func:`export_graph` stops there: the architecture is the graph whose mapped initializers hold no data, and the
weights are the module's own tensors, read in place (:func:`module_weights`: views of CPU tensors, copied only
from other devices). :func:`warm_start` and :func:`register` take that path, so no weight is serialised into ONNX
and a module of any size works. (With the dynamo exporter the stamped values are not even serialised: keeper reads
them from the exported program and writes the graph with placeholders.) :func:`export` writes the module's real
values into the ONNX, for models under protobuf's 2 GiB that need ONNX with weights.

Invariant: the module is left exactly as it was (values, training mode) after :func:`export` and
:func:`export_graph`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import torch
from onnx import numpy_helper

from keeper.errors import KeeperError, PartialWarmWarning
from keeper.export_cache import cached_export
from keeper.graph import graph_from_proto
from keeper.onnx_safety import load_model
from keeper.onnx_safety import has_data
from keeper.onnx_weights import apart_specs, clear_data, read_initializers, write_weights
from keeper.warm import WarmResult

__all__ = ["Exported", "export", "export_graph", "module_weights", "register", "load_warm", "load_result",
           "warm_start", "warm_exported", "warm_choice", "DataProbe", "module_probe", "architecture_template",
           "fill_template", "template_apart", "tied_keys", "drop_eval_caches"]


@dataclass
class Exported:
    """ONNX bytes of a module and, per ONNX tensor key, (state_dict key, "same" | "T").

    ``apart``: for a graph without weights (:func:`export_graph`), each data-less initializer -> the ONNX key
    whose state_dict entry holds its value (empty when ``onnx`` holds the weights)."""

    onnx: bytes
    keys: dict[str, tuple[str, str]]
    apart: dict[str, str] = field(default_factory=dict)
    #: the LayerGraph of ``onnx`` when already extracted (by :func:`export_graph`), so a warm does not parse twice
    graph: Any = field(default=None, compare=False, repr=False)


def _float_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in module.state_dict(keep_vars=True).items() if torch.is_floating_point(v)}


def export(module: torch.nn.Module, example_input: Any, *, dynamo: bool | None = None, seed: int = 0) -> Exported:
    """Export ``module`` as ONNX with its weights (under protobuf's 2 GiB), BatchNorm kept (not folded), and map
    ONNX tensors to state_dict keys.

    Args:
        dynamo: True for torch's dynamo exporter (the default when None; ``KEEPER_EXPORTER=torchscript`` or
            False selects TorchScript).
    """
    graph = export_graph(module, example_input, dynamo=dynamo, seed=seed)
    proto = load_model(graph.onnx, what="exported module")
    saved = {k: v.detach() for k, v in _float_state(module).items()}
    return Exported(_with_state(proto, graph.keys, _key_shapes(proto, graph.keys), saved).SerializeToString(),
                    graph.keys)


def export_graph(module: torch.nn.Module, example_input: Any, *, dynamo: bool | None = None,
                 seed: int = 0) -> Exported:
    """Export ``module``'s architecture: ONNX whose initializers holding a parameter have no data (any size), the
    ONNX-to-state_dict map, and ``apart`` (which key feeds each data-less initializer). Weights:
    :func:`module_weights`.

    Example:
        >>> g = export_graph(model, torch.randn(1, 3, 32, 32))          # doctest: +SKIP
        >>> zoo.warm(g.onnx, weights=module_weights(model, g))          # doctest: +SKIP
    """
    if dynamo is None:
        dynamo = os.environ.get("KEEPER_EXPORTER", "dynamo") != "torchscript"
    args = example_input if isinstance(example_input, tuple) else (example_input,)
    drop_eval_caches(module)  # a tensor cached from the parameters would be traced as a constant, not read
    return cached_export(module, args, f"{'dynamo' if dynamo else 'torchscript'}/{seed}",
                         lambda: _export_graph(module, args, dynamo, seed),
                         lambda exported: _apart_state_keys(module, exported))


def _apart_state_keys(module: torch.nn.Module, exported: Exported) -> set[str]:
    """The state_dict keys whose values ``exported``'s graph leaves without data, tied keys included."""
    keys = {exported.keys[k][0] for k in exported.apart.values()}
    tied = tied_keys(dict(module.state_dict(keep_vars=True)))
    return keys | {t for k in keys for t in tied.get(k, ())}


def _export_graph(module: torch.nn.Module, args: tuple, dynamo: bool, seed: int) -> Exported:
    state = _float_state(module)
    saved = {k: v.detach().clone() for k, v in state.items()}
    # per submodule: module.train(flag) would also flip submodules the caller had set apart (a frozen BatchNorm)
    was_training = {m: m.training for m in module.modules()}
    gen = torch.Generator().manual_seed(seed)
    stamps: dict[str, np.ndarray] = {}
    try:
        with torch.no_grad():
            for k, v in state.items():
                # distinct values per tensor: a random draw plus a per-tensor offset
                stamp = torch.rand(v.shape, generator=gen, dtype=torch.float32) + len(stamps) * 2.0 + 1.0
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
        held = {name: hit for name, a in inits.items() if name not in read and a.dtype in _FLOATS and a.size > 1
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
            arr = _as_numpy(state[sd_key])
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
    import onnx_ir as ir

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
        values[name] = tensor.numpy()
        # an external reference serialises no data; load_model(weights_apart=True) drops it unread
        value.const_value = ir.ExternalTensor("keeper-weights-apart", 0, tensor.nbytes, tensor.dtype,
                                              shape=tensor.shape, name=name)
    proto = load_model(ir.to_proto(program.model), what="exported module", weights_apart=True)
    inits = read_initializers(proto)
    inits.update(values)
    return proto, inits


def _key_shapes(proto, keys: dict[str, tuple[str, str]]) -> dict[str, tuple[int, ...]]:
    graph = graph_from_proto(proto)
    shapes: dict[str, tuple[int, ...]] = {}
    for refs in graph.tensors:
        for r in refs:
            if r.key in keys:
                shapes.setdefault(r.key, tuple(int(d) for d in r.source_shape))
    return shapes


def _with_state(proto, keys: dict[str, tuple[str, str]], shapes: dict[str, tuple[int, ...]], state: dict[str, Any],
                what: str = "module") -> Any:
    """A copy of ``proto`` whose mapped tensors hold ``state``'s values (torch tensors or arrays)."""
    return write_weights(proto, _state_arrays(keys, shapes, state, what))


def _state_arrays(keys: dict[str, tuple[str, str]], shapes: dict[str, tuple[int, ...]], state: dict[str, Any],
                  what: str) -> dict[str, np.ndarray]:
    """ONNX key -> ``state``'s value in the ONNX tensor's orientation and shape."""
    real = {}
    for onnx_key, (sd_key, how) in keys.items():
        if sd_key not in state:
            raise KeeperError(f"{what}: state_dict has no entry {sd_key!r}, which the architecture needs; "
                              "save the whole model.state_dict() of the architecture that was exported")
        v = state[sd_key]
        arr = _as_numpy(v)
        if how == "T":
            arr = arr.T
        shape = shapes[onnx_key]
        if int(np.prod(shape)) != arr.size:
            raise KeeperError(f"{what}: state_dict entry {sd_key!r} has shape {tuple(arr.shape)}, the architecture "
                              f"expects {shape}; the checkpoint belongs to another architecture")
        real[onnx_key] = arr.reshape(shape)
    return real


def module_weights(module: torch.nn.Module, exported: Exported) -> dict[str, np.ndarray]:
    """The weights :func:`export_graph`'s graph leaves without data, from ``module`` as it is now: read-only
    views of CPU tensors (transposed and reshaped lazily as views where numpy can), copies from other devices.
    dtypes are kept (bfloat16 as ``ml_dtypes.bfloat16``)."""
    state = _float_state(module)
    specs = apart_specs(load_model(exported.onnx, what="exported module"))
    out = {}
    for init, key in exported.apart.items():
        sd_key, how = exported.keys[key]
        if sd_key not in state:
            raise KeeperError(f"module: state_dict has no entry {sd_key!r}, which the exported graph needs; export "
                              "the module again")
        arr = _tensor_view(state[sd_key])
        arr = arr.T if how == "T" else arr
        out[init] = arr.reshape(specs[init][1])
        out[init].flags.writeable = False
    return out


def _tensor_view(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: the same bits, viewed as ml_dtypes'
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def register(module: torch.nn.Module, example_input: Any, zoo: Any, accuracy: float, name: str | None = None, *,
             dynamo: bool | None = None) -> Any:
    """Register a trained ``module`` into a :class:`keeper.Zoo`: its graph and its weights apart (safetensors in
    the store), so no weight is serialised into ONNX and any size works. Returns the zoo's record."""
    exported = export_graph(module, example_input, dynamo=dynamo)
    return zoo.register(exported.onnx, accuracy, name, weights=module_weights(module, exported))


def _as_numpy(v: Any) -> np.ndarray:
    """``v`` as a float array of its own precision (float64 must not round through float32; bfloat16, which
    numpy lacks, widens to float32); write_weights then casts to the ONNX tensor's dtype."""
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu()
        return (v if v.dtype in (torch.float16, torch.float32, torch.float64) else v.float()).numpy()
    arr = np.asarray(v)
    return arr if arr.dtype.kind == "f" else arr.astype(np.float32)


_KEYS_PROP = "keeper.state_dict_keys"
_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16))


def architecture_template(exported: Exported) -> bytes:
    """``exported`` without its parameter values: the architecture plus the ONNX-to-state_dict map.

    Small (kilobytes) whatever the model's size; :func:`fill_template` turns it and a state_dict back into
    ONNX with weights. Initializers that hold a mapped parameter keep their dims and lose their data.
    """
    proto = load_model(exported.onnx, what="exported module")
    shapes = _key_shapes(proto, exported.keys)
    for init in proto.graph.initializer:
        if init.name in exported.keys:
            clear_data(init)
    prop = proto.metadata_props.add()
    table = {k: [sd, how, list(shapes[k])] for k, (sd, how) in exported.keys.items()}
    prop.key, prop.value = _KEYS_PROP, json.dumps(table, sort_keys=True)
    return proto.SerializeToString()


def fill_template(template: bytes, state: dict[str, Any], what: str = "checkpoint") -> bytes:
    """ONNX bytes with weights: ``template`` (from :func:`architecture_template`) filled with ``state``.

    The result is untrusted like any caller's ONNX: the zoo validates it in full when it is registered.

    Raises:
        KeeperError: ``template`` is not a keeper template, or ``state`` misses or mis-shapes a tensor.
    """
    proto, keys, shapes = _parse_template(template, what)
    return write_weights(proto, _state_arrays(keys, shapes, state, what)).SerializeToString()


def template_apart(template: bytes, state: dict[str, Any], what: str = "checkpoint") -> tuple[bytes, dict]:
    """``template`` and ``state`` as a graph without weights plus its weights apart (initializer name -> array in
    the graph's dtype), for models of any size: nothing is serialised into ONNX.

    Raises:
        KeeperError: ``template`` is not a keeper template, or ``state`` misses or mis-shapes a tensor.
    """
    proto, keys, shapes = _parse_template(template, what)
    specs = apart_specs(proto)
    arrays = _state_arrays(keys, shapes, state, what)
    return proto.SerializeToString(), {k: np.asarray(v).astype(specs[k][0], copy=False) if k in specs else v
                                       for k, v in arrays.items()}


def _parse_template(template: bytes, what: str) -> tuple[Any, dict[str, tuple[str, str]], dict[str, tuple]]:
    """(graph proto without the key map, ONNX key -> (state_dict key, how), ONNX key -> shape)."""
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(bytes(template))  # protobuf parsing executes and unpickles nothing
    except Exception as exc:
        raise KeeperError(f"{what}: the architecture template is not ONNX ({exc}); re-run warm_start") from None
    props = {p.key: p.value for p in proto.metadata_props}
    if _KEYS_PROP not in props:
        raise KeeperError(f"{what}: the architecture template has no {_KEYS_PROP!r} entry; it was not written by "
                          "keeper.torch_support.architecture_template")
    try:
        table = json.loads(props[_KEYS_PROP])
        keys = {k: (str(v[0]), str(v[1])) for k, v in table.items()}
        shapes = {k: tuple(int(d) for d in v[2]) for k, v in table.items()}
    except (ValueError, TypeError, IndexError, AttributeError) as exc:
        raise KeeperError(f"{what}: the template's {_KEYS_PROP!r} entry is malformed ({exc}); re-run warm_start") \
            from None
    kept = [p for p in proto.metadata_props if p.key != _KEYS_PROP]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    return proto, keys, shapes


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


def _shape_of(key: str, inits: dict[str, np.ndarray], graph) -> tuple[int, ...]:
    if key in inits:
        return inits[key].shape
    for refs in graph.tensors:
        for r in refs:
            if r.key == key:
                return inits[r.source].shape
    raise KeeperError(f"export: tensor {key!r} not found in the exported model")


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


def load_warm(module: torch.nn.Module, result: WarmResult, keys: dict[str, tuple[str, str]]) -> WarmResult:
    """Copy ``result.weights`` into ``module`` in place, on each tensor's own device and dtype; tensors the
    child keeps (operator ``init``) are not copied: they are the module's own.

    Fills ``result.missing`` (float state_dict entries not warmed) and ``result.unexpected`` (warmed layer
    tensors with no state_dict entry) and returns ``result``.
    """
    state = _float_state(module)
    tied = tied_keys(state)
    done = set()
    unexpected = []
    with torch.no_grad():
        for onnx_key, (sd_key, how) in keys.items():
            if sd_key in state and result.mapping.get(onnx_key, ("", ""))[1] == "init":
                done.update(tied.get(sd_key, (sd_key,)))  # the module's own tensor: it stays where it is
                continue
            if onnx_key not in result.weights or sd_key not in state:
                unexpected.append(onnx_key)
                continue
            arr = np.asarray(result.weights[onnx_key])
            arr = arr.T if how == "T" else arr
            for key in tied.get(sd_key, (sd_key,)):  # every key sharing the tensor (GPT-2's wte and lm_head)
                dst = state[key]
                src = arr.reshape(dst.shape) if tuple(arr.shape) != tuple(dst.shape) else arr
                dst.copy_(_as_tensor(src))  # copy_ converts dtype and device in one pass
                done.add(key)
    drop_eval_caches(module)  # caches of the old parameters' values
    result.unexpected = sorted(set(unexpected) | {k for k in result.mapping if k not in keys})
    result.missing = sorted(k for k in state if k not in done)
    if result.parent is not None and result.missing:
        shown = ", ".join(result.missing[:8]) + (f" and {len(result.missing) - 8} more" if len(result.missing) > 8
                                                 else "")
        warnings.warn(PartialWarmWarning(
            f"keeper: warmed from {result.parent!r}, but {len(result.missing)} tensor(s) of the module were not "
            f"inherited and keep their own initialisation: {shown} (keeper did not read them as layer tensors); "
            "see WarmResult.missing"), stacklevel=3)
    return result


def drop_eval_caches(module: torch.nn.Module) -> None:
    """Have every submodule drop what it derived from its parameters for eval mode, leaving every training flag as
    it was.

    Modules that cache tensors computed from their parameters between eval calls (LeViT's gathered attention
    biases, in transformers and timm) drop the cache in ``train(True)``, the torch convention for "the parameters
    may change now". Keeper calls it before and after an export (a cached tensor would be traced as a constant
    instead of read from its parameter, and a trace fills the cache with traced values) and after loading warmed
    weights (the cache would hold the old parameters' values)."""
    flags = {m: m.training for m in module.modules()}
    module.train(True)
    for m, training in flags.items():
        m.training = training


def tied_keys(state: dict[str, torch.Tensor]) -> dict[str, tuple[str, ...]]:
    """State_dict key -> every key sharing its tensor (same storage, offset, shape and strides), for the keys
    that share one: tied weights such as GPT-2's ``transformer.wte.weight`` and ``lm_head.weight``. The export
    sees one tensor, keeper transfers it once, and loading writes it back under each key."""
    by_tensor: dict[tuple, list[str]] = {}
    for k, v in state.items():
        if v.numel():
            ident = (v.device, v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), v.stride())
            by_tensor.setdefault(ident, []).append(k)
    return {k: tuple(ks) for ks in by_tensor.values() if len(ks) > 1 for k in ks}


def _as_tensor(arr: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing ``arr``'s memory (read only here: the caller copies out of it)."""
    arr = np.ascontiguousarray(arr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about read-only arrays; nothing writes through this tensor
        if arr.dtype == np.dtype(ml_dtypes.bfloat16):
            return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(arr)


def warm_start(module: torch.nn.Module, example_input: Any, zoo_or_handle: Any, *, noise: float | None = None,
               dynamo: bool | None = None, timeout_s: float = 300.0, probe: Any = None) -> WarmResult:
    """Export ``module``, ask the zoo (a :class:`keeper.Zoo` or a keeper Ray handle) for a warm start, and load
    it into the module on its own device.

    Args:
        probe: optional data probe (see :func:`module_probe`): a callable scoring a candidate module (lower is
            better), or ``(batches, loss_fn)`` / a :class:`DataProbe`. The best ranked candidates (the policy's
            ``probe_top``, default 3) and the module's own init are scored on it, each on a copy of the module, and
            the best is kept; when none beats the cold init the module keeps its weights and ``result.reason``
            says why. ``result.probe`` reports the losses and the probe's cost (transform and scoring seconds).

    Example:
        >>> result = warm_start(model, torch.randn(1, 1, 40), zoo)                          # doctest: +SKIP
        >>> result.parent, result.score, result.preserved                                   # doctest: +SKIP
        >>> result = warm_start(model, x, zoo, probe=((xb, yb), torch.nn.CrossEntropyLoss()))  # doctest: +SKIP
    """
    return warm_exported(module, export_graph(module, example_input, dynamo=dynamo), zoo_or_handle, noise=noise,
                         timeout_s=timeout_s, probe=probe)


def warm_exported(module: torch.nn.Module, exported: Exported, zoo_or_handle: Any, *, noise: float | None = None,
                  timeout_s: float = 300.0, probe: Any = None) -> WarmResult:
    """:func:`warm_start` for a module already exported (by :func:`export_graph`, or :func:`export`).

    With a service handle, the service only chooses the parent (it receives the graph's arrays, kilobytes); the
    transform runs here, reading the parent from the zoo's store, so no weights pass through an actor. A probe
    then runs here too, over the candidates the service's choice lists."""
    child_weights = module_weights(module, exported) if exported.apart else None
    score = module_probe(module, exported, probe) if probe is not None else None
    if hasattr(zoo_or_handle, "choose") and hasattr(zoo_or_handle.choose, "remote"):
        from keeper.actors.transfer import ask_service, warm_from_store
        from keeper.graph import load_graph

        # once: the service gets its arrays, the transfer below reuses it
        graph = exported.graph if exported.graph is not None else load_graph(exported.onnx)
        choice = ask_service(zoo_or_handle, graph, timeout_s)
        result = warm_choice(choice, exported.onnx, graph, child_weights, noise, score, warm_from_store)
    else:
        kwargs = {} if noise is None else {"noise": noise}
        result = zoo_or_handle.warm(exported.onnx, weights=child_weights, probe=score, graph=exported.graph, **kwargs)
    return load_result(module, result, exported.keys)


def warm_choice(choice: Any, child: bytes, graph: Any, child_weights: Any, noise: float | None, score: Any,
                warm_from_store: Any) -> WarmResult:
    """The warm a service's :class:`~keeper.selection.ParentChoice` asks for, made here; with a probe
    (``score`` over WarmResults), the choice's listed candidates, best ranked first, and the cold init are scored
    and the best is kept."""
    from keeper.probe import probe_choice
    from keeper.selection import SelectionPolicy, rank_parents

    level = choice.noise if noise is None else float(noise)
    if score is None or choice.parent is None:
        return warm_from_store(choice.uri, choice.parent, child, level, choice.seed, graph, child_weights=child_weights)
    ranked = [c for c in choice.candidates if c.name == choice.parent]
    ranked += [c for c in rank_parents(choice.candidates, SelectionPolicy(floor=0.0)) if c.name != choice.parent]
    result, report = probe_choice(
        ranked, lambda name: warm_from_store(choice.uri, name, child, level, choice.seed, graph,
                                             child_weights=child_weights),
        lambda: warm_from_store(choice.uri, None, child, level, choice.seed, graph, child_weights=child_weights),
        score, int(choice.probe_top))
    result.probe, result.reason = report.as_dict(), report.reason
    result.candidates = [c.as_dict() for c in ranked[:5]]
    return result


@dataclass
class DataProbe:
    """A probe from data: ``batches`` (one ``(inputs, targets)`` pair or a list of them) and ``loss_fn(output,
    targets)``. A candidate's score is the mean training loss over ``steps`` SGD steps (momentum ``momentum``,
    learning rate ``lr``) on a copy of the module, each step on the next batch, plus the loss after the last step:
    the start of the learning curve, not one loss at the start (see ``docs/architecture.md``). The module
    trains in train mode (batch statistics), as the real training does.
    """

    batches: Any
    loss_fn: Any
    steps: int = 2
    lr: float = 0.01
    momentum: float = 0.9

    def __post_init__(self) -> None:
        if isinstance(self.batches, tuple) and len(self.batches) == 2 and isinstance(self.batches[0], torch.Tensor):
            self.batches = [self.batches]
        if not isinstance(self.batches, (list, tuple)) or not self.batches or not all(
                isinstance(b, (list, tuple)) and len(b) == 2 for b in self.batches):
            raise KeeperError("probe batches: expected an (inputs, targets) pair or a non-empty list of them; "
                              "pass e.g. (x[:128], y[:128])")
        if not callable(self.loss_fn):
            raise KeeperError(f"probe loss_fn {self.loss_fn!r}: expected a callable loss_fn(output, targets), e.g. "
                              "torch.nn.CrossEntropyLoss()")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 0:
            raise KeeperError(f"probe steps {self.steps!r}: expected an integer >= 0 (0: the loss at the start)")
        if not (self.lr >= 0.0 and np.isfinite(self.lr)):
            raise KeeperError(f"probe lr {self.lr!r}: expected a finite learning rate >= 0")

    def __call__(self, module: torch.nn.Module) -> float:
        device = next((p.device for p in module.parameters()), torch.device("cpu"))
        module.train()
        params = [p for p in module.parameters() if p.requires_grad]
        opt = torch.optim.SGD(params, lr=self.lr, momentum=self.momentum) if params else None
        losses = []
        for step in range(self.steps + 1):
            x, y = self.batches[step % len(self.batches)]
            loss = self.loss_fn(module(x.to(device)), y.to(device))
            losses.append(float(loss.detach()))
            if not np.isfinite(losses[-1]):
                return float("inf")
            if step < self.steps and opt is not None:
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        return float(np.mean(losses))


def module_probe(module: torch.nn.Module, exported: Exported, probe: Any):
    """A probe over WarmResults from a probe over modules: each result is loaded into a fresh copy of ``module``
    (the module itself is never touched), which ``probe`` scores.

    ``probe``: a callable ``probe(module) -> loss`` (lower is better; it may train the copy), a
    :class:`DataProbe`, or ``(batches, loss_fn)``, which becomes ``DataProbe(batches, loss_fn)``.
    """
    import copy

    if isinstance(probe, (tuple, list)) and len(probe) == 2 and callable(probe[1]) and not callable(probe):
        probe = DataProbe(probe[0], probe[1])
    if not callable(probe):
        raise KeeperError(f"probe {probe!r}: expected a callable probe(module) -> loss, a DataProbe, or a "
                          "(batches, loss_fn) pair")

    def score(result: WarmResult) -> float:
        twin = copy.deepcopy(module)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PartialWarmWarning)  # reported once, for the winner
            load_result(twin, result, exported.keys)
        result.missing, result.unexpected = [], []
        return probe(twin)

    return score


def load_result(module: torch.nn.Module, result: WarmResult, keys: dict[str, tuple[str, str]]) -> WarmResult:
    """Load ``result`` into ``module`` (nothing to load when it has no parent: the module keeps its weights)."""
    if result.parent is None:
        result.missing, result.unexpected = [], []
        return result
    return load_warm(module, result, keys)


