"""Loading a warm result into a torch module.

Invariants: values are copied in place into the module's own tensors (device and dtype kept, every key of a tied
tensor written); a tensor the result does not supply keeps the module's value. What the loading found is a
:class:`~keeper.warm.LoadReport` of its own (missing, unexpected and mismatched keys, as transformers reports a
load), attached to a new result (``result.load``); the result itself is never changed. A warm with a parent that
leaves a learned tensor of the module behind says so with one :class:`~keeper.errors.PartialWarmWarning`.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import torch

from keeper.errors import PartialWarmWarning
from keeper.torch_support.tensors import as_tensor, drop_eval_caches, float_state, tied_keys
from keeper.warm import LoadReport, WarmResult

__all__ = ["load_result"]


def load_result(module: torch.nn.Module, result: WarmResult, keys: dict[str, tuple[str, str]]) -> WarmResult:
    """Copy ``result.weights`` into ``module`` in place, on each tensor's own device and dtype; tensors the
    child keeps (operator ``init``) are not copied: they are the module's own, so a cold result leaves the module
    as it is.

    Returns ``result`` with ``load``: the :class:`~keeper.warm.LoadReport` of the module's float state_dict
    entries not warmed (``missing``), the warmed layer tensors with no state_dict entry (``unexpected``) and those
    whose size differs from the module's tensor (``mismatched``, not loaded).
    """
    if all(op == "init" for _, op in result.mapping.values()):  # a cold result: the module keeps its weights
        return dataclasses.replace(result, load=LoadReport(reason="a cold result: the module keeps its own weights"))
    state = float_state(module)
    tied = tied_keys(state)
    done = set()
    unexpected, mismatched = [], []
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
            if arr.size != state[sd_key].numel():  # a result warmed for another architecture than the module's
                mismatched.append(sd_key)
                continue
            for key in tied.get(sd_key, (sd_key,)):  # every key sharing the tensor (GPT-2's wte and lm_head)
                dst = state[key]
                src = arr.reshape(dst.shape) if tuple(arr.shape) != tuple(dst.shape) else arr
                dst.copy_(as_tensor(src))  # copy_ converts dtype and device in one pass
                done.add(key)
    drop_eval_caches(module)  # caches of the old parameters' values
    report = _report(sorted(k for k in state if k not in done),
                     sorted(set(unexpected) | {k for k in result.mapping if k not in keys}), sorted(mismatched))
    if result.parent is not None and report.missing:
        shown = ", ".join(report.missing[:8]) + (f" and {len(report.missing) - 8} more" if len(report.missing) > 8
                                                 else "")
        warnings.warn(PartialWarmWarning(
            f"keeper: warmed from {result.parent!r}, but {len(report.missing)} tensor(s) of the module were not "
            f"inherited and keep their own initialisation: {shown} ({report.reason}); see WarmResult.load.missing"),
            stacklevel=3)
    return dataclasses.replace(result, load=report)


def _report(missing: list[str], unexpected: list[str], mismatched: list[str]) -> LoadReport:
    """The report, with why each non-empty list holds what it holds."""
    why = []
    if mismatched:
        why.append(f"{len(mismatched)} warmed tensor(s) differ in size from the module's (a result warmed for "
                   "another architecture): not loaded")
    if missing:
        why.append("keeper did not read them as layer tensors" if not mismatched
                   else "tensors not warmed keep the module's values")
    if unexpected:
        why.append(f"{len(unexpected)} warmed tensor(s) have no state_dict entry in the module (the graph holds "
                   "them, the module does not save them)")
    return LoadReport(missing, unexpected, mismatched, "; ".join(why))
