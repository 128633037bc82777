"""Torch glue: export a module to ONNX for keeper, and load a WarmResult back into the module.

The exporters rename (dynamo: ``val_22``), transpose (MatMul weights stored as ``W.T``), deduplicate (equal
initializers behind Identity nodes) and can fold parameters. Keeper does not guess names: it exports once with
every parameter and float buffer temporarily set to distinct seeded random values, matches each ONNX tensor to
its state_dict entry by exact value (as is, or transposed), then writes the module's real values into the ONNX.
Invariant: the module is left exactly as it was (values, training mode) after :func:`export`.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from keeper.errors import KeeperError, ServiceError
from keeper.graph import graph_from_proto
from keeper.onnx_safety import load_model
from keeper.onnx_weights import read_initializers, write_weights
from keeper.warm import WarmResult

__all__ = ["Exported", "export", "load_warm", "warm_start"]


@dataclass
class Exported:
    """ONNX bytes of a module and, per ONNX tensor key, (state_dict key, "same" | "T")."""

    onnx: bytes
    keys: dict[str, tuple[str, str]]


def _float_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in module.state_dict(keep_vars=True).items() if torch.is_floating_point(v)}


def export(module: torch.nn.Module, example_input: Any, *, dynamo: bool | None = None, seed: int = 0) -> Exported:
    """Export ``module`` with BatchNorm kept (not folded) and map ONNX tensors to state_dict keys.

    Args:
        dynamo: True for torch's dynamo exporter (the default when None; ``KEEPER_EXPORTER=torchscript`` or
            False selects TorchScript).
    """
    if dynamo is None:
        dynamo = os.environ.get("KEEPER_EXPORTER", "dynamo") != "torchscript"
    args = example_input if isinstance(example_input, tuple) else (example_input,)
    state = _float_state(module)
    saved = {k: v.detach().clone() for k, v in state.items()}
    was_training = module.training
    gen = torch.Generator().manual_seed(seed)
    stamps: dict[str, np.ndarray] = {}
    try:
        with torch.no_grad():
            for k, v in state.items():
                # distinct values per tensor: a random draw plus a per-tensor offset
                stamp = torch.rand(v.shape, generator=gen, dtype=torch.float32) + len(stamps) * 2.0 + 1.0
                v.copy_(stamp.to(v.dtype))
                stamps[k] = v.detach().cpu().float().numpy().copy()
        module.eval()
        raw = _export_bytes(module, args, dynamo)
    finally:
        with torch.no_grad():
            for k, v in state.items():
                v.copy_(saved[k])
        module.train(was_training)
    proto = load_model(raw, what="exported module")
    graph = graph_from_proto(proto)
    inits = read_initializers(proto)
    keys = _match_keys(graph, inits, stamps)
    real = {}
    for onnx_key, (sd_key, how) in keys.items():
        arr = saved[sd_key].cpu().float().numpy()
        real[onnx_key] = arr.T if how == "T" else arr.reshape(_shape_of(onnx_key, inits, graph))
    proto = write_weights(proto, real)
    return Exported(proto.SerializeToString(), keys)


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


def _match_keys(graph, inits: dict[str, np.ndarray], stamps: dict[str, np.ndarray]) -> dict[str, tuple[str, str]]:
    by_first: dict[float, list[str]] = {}
    for k, a in stamps.items():
        if a.size:
            by_first.setdefault(float(a.reshape(-1)[0]), []).append(k)
    out: dict[str, tuple[str, str]] = {}
    for refs in graph.tensors:
        for r in refs:
            if r.key in out:
                continue
            a = inits[r.source].astype(np.float32)
            for how, cand in (("same", a), ("T", a.T if a.ndim == 2 else None)):
                if cand is None or not cand.size:
                    continue
                for k in by_first.get(float(cand.reshape(-1)[0]), []):
                    s = stamps[k]
                    if s.size == cand.size and np.array_equal(s.reshape(-1), np.ascontiguousarray(cand).reshape(-1)):
                        out[r.key] = (k, how)
                        break
                if r.key in out:
                    break
    return out


def load_warm(module: torch.nn.Module, result: WarmResult, keys: dict[str, tuple[str, str]]) -> WarmResult:
    """Copy ``result.weights`` into ``module`` in place, on each tensor's own device and dtype.

    Fills ``result.missing`` (float state_dict entries not warmed) and ``result.unexpected`` (warmed layer
    tensors with no state_dict entry) and returns ``result``.
    """
    state = _float_state(module)
    done = set()
    unexpected = []
    with torch.no_grad():
        for onnx_key, (sd_key, how) in keys.items():
            if onnx_key not in result.weights or sd_key not in state:
                unexpected.append(onnx_key)
                continue
            arr = np.asarray(result.weights[onnx_key])
            arr = arr.T if how == "T" else arr
            dst = state[sd_key]
            if tuple(arr.shape) != tuple(dst.shape):
                arr = arr.reshape(dst.shape)
            dst.copy_(torch.from_numpy(np.ascontiguousarray(arr)).to(device=dst.device, dtype=dst.dtype))
            done.add(sd_key)
    result.unexpected = sorted(set(unexpected) | {k for k in result.mapping if k not in keys})
    result.missing = sorted(k for k in state if k not in done)
    return result


def warm_start(module: torch.nn.Module, example_input: Any, zoo_or_handle: Any, *, noise: float | None = None,
               dynamo: bool | None = None, timeout_s: float = 300.0) -> WarmResult:
    """Export ``module``, ask the zoo (a :class:`keeper.Zoo` or a keeper Ray handle) for a warm start, and load
    it into the module on its own device.

    Example:
        >>> result = warm_start(model, torch.randn(1, 1, 40), zoo)  # doctest: +SKIP
        >>> result.parent, result.score                              # doctest: +SKIP
    """
    exported = export(module, example_input, dynamo=dynamo)
    kwargs = {} if noise is None else {"noise": noise}
    if hasattr(zoo_or_handle, "warm") and hasattr(zoo_or_handle.warm, "remote"):
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            result = ray.get(zoo_or_handle.warm.remote(exported.onnx, **kwargs), timeout=timeout_s)
        except GetTimeoutError:
            raise ServiceError(f"warm_start: the keeper service did not answer within {timeout_s:.0f} s; "
                               "check `keeper stats` or raise timeout_s") from None
        except RayActorError as exc:
            raise ServiceError(f"warm_start: the keeper service died while answering ({exc}); "
                               "restart it with keeper.actors.start()") from None
    else:
        result = zoo_or_handle.warm(exported.onnx, **kwargs)
    if result.parent is None:
        result.missing, result.unexpected = [], []
        return result
    return load_warm(module, result, exported.keys)
