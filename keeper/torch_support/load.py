"""Loading a warm result into a torch module.

Invariants: values are copied in place into the module's own tensors (device and dtype kept, every key of a tied
tensor written); a tensor the result does not supply keeps the module's value and is listed in
``result.missing``, with one :class:`~keeper.errors.PartialWarmWarning` when the result has a parent: a warm that
leaves a learned tensor behind says so.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from keeper.errors import PartialWarmWarning
from keeper.torch_support.tensors import as_tensor, drop_eval_caches, float_state, tied_keys
from keeper.warm import WarmResult

__all__ = ["load_result"]


def load_result(module: torch.nn.Module, result: WarmResult, keys: dict[str, tuple[str, str]]) -> WarmResult:
    """Copy ``result.weights`` into ``module`` in place, on each tensor's own device and dtype; tensors the
    child keeps (operator ``init``) are not copied: they are the module's own, so a cold result leaves the module
    as it is.

    Fills ``result.missing`` (float state_dict entries not warmed) and ``result.unexpected`` (warmed layer
    tensors with no state_dict entry) and returns ``result``.
    """
    if all(op == "init" for _, op in result.mapping.values()):  # a cold result: the module keeps its weights
        result.missing, result.unexpected = [], []
        return result
    state = float_state(module)
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
                dst.copy_(as_tensor(src))  # copy_ converts dtype and device in one pass
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
