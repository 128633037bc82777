"""Torch tensors as keeper reads and writes them: numpy views and copies, dtypes kept, tied tensors found.

Invariants: :func:`tensor_view` and :func:`as_tensor` copy nothing they need not (CPU float tensors and contiguous
arrays are shared, bfloat16 is reinterpreted, never rounded); :func:`as_numpy` keeps a tensor's own precision
(float64 never rounds through float32); no function here changes a module's values or flags, except
:func:`drop_eval_caches`, which only drops what modules cached for eval mode.
"""

from __future__ import annotations

import warnings
from typing import Any

import ml_dtypes
import numpy as np
import torch

from keeper.errors import KeeperError
from keeper.graph import graph_from_proto

__all__ = ["FLOATS", "float_state", "as_numpy", "tensor_view", "as_tensor", "tied_keys", "drop_eval_caches",
           "state_arrays", "key_shapes"]

#: The float dtypes of the tensors keeper transfers.
FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16))


def float_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's floating-point state_dict entries, as the tensors themselves (``keep_vars``)."""
    return {k: v for k, v in module.state_dict(keep_vars=True).items() if torch.is_floating_point(v)}


def as_numpy(v: Any) -> np.ndarray:
    """``v`` as a float array of its own precision (float64 must not round through float32; bfloat16, which
    numpy lacks, widens to float32); write_weights then casts to the ONNX tensor's dtype."""
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu()
        return (v if v.dtype in (torch.float16, torch.float32, torch.float64) else v.float()).numpy()
    arr = np.asarray(v)
    return arr if arr.dtype.kind == "f" else arr.astype(np.float32)


def tensor_view(t: torch.Tensor) -> np.ndarray:
    """``t`` as a numpy array: a view of a CPU tensor (bfloat16 as ``ml_dtypes.bfloat16``), a copy from other
    devices."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: the same bits, viewed as ml_dtypes'
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def as_tensor(arr: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing ``arr``'s memory (read only here: the caller copies out of it)."""
    arr = np.ascontiguousarray(arr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about read-only arrays; nothing writes through this tensor
        if arr.dtype == np.dtype(ml_dtypes.bfloat16):
            return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(arr)


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


def key_shapes(proto, keys: dict[str, tuple[str, str]], graph=None) -> dict[str, tuple[int, ...]]:
    """ONNX key -> the shape of the initializer holding it, for the keys ``keys`` maps; ``graph``: the LayerGraph
    of ``proto`` when the caller has it (an export's), which spares extracting it again."""
    graph = graph_from_proto(proto) if graph is None else graph
    shapes: dict[str, tuple[int, ...]] = {}
    for refs in graph.tensors:
        for r in refs:
            if r.key in keys:
                shapes.setdefault(r.key, tuple(int(d) for d in r.source_shape))
    return shapes


def state_arrays(keys: dict[str, tuple[str, str]], shapes: dict[str, tuple[int, ...]], state: dict[str, Any],
                  what: str) -> dict[str, np.ndarray]:
    """ONNX key -> ``state``'s value in the ONNX tensor's orientation and shape."""
    real = {}
    for onnx_key, (sd_key, how) in keys.items():
        if sd_key not in state:
            raise KeeperError(f"{what}: state_dict has no entry {sd_key!r}, which the architecture needs; "
                              "save the whole model.state_dict() of the architecture that was exported")
        v = state[sd_key]
        arr = as_numpy(v)
        if how == "T":
            arr = arr.T
        shape = shapes[onnx_key]
        if int(np.prod(shape)) != arr.size:
            raise KeeperError(f"{what}: state_dict entry {sd_key!r} has shape {tuple(arr.shape)}, the architecture "
                              f"expects {shape}; the checkpoint belongs to another architecture: report a checkpoint "
                              "of the model passed to warm_start")
        real[onnx_key] = arr.reshape(shape)
    return real
