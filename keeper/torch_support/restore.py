"""Restoring a module from a trial's checkpoint of any architecture: the step that lets population-based training
exploit across architectures.

When a Tune trial (or a Ray Train worker) starts from a checkpoint, ``warm_start`` restores the module from it
instead of choosing a zoo parent: a state_dict of the module's own architecture is loaded exactly (a plain copy,
as Tune's PBT does); one of another architecture (PBT cloned a trial whose width or depth differs) is transformed
onto the module by keeper's operators, reading the checkpoint's architecture from the template ``warm_start``
left beside it.

Invariants: a same-architecture restore is exact (every state_dict entry loaded as saved); a checkpoint keeper
cannot read or transform raises :class:`~keeper.errors.KeeperError` naming it, and ``warm_start`` then keeps the
trial alive on the zoo's warm start, saying why in the result's reason; nothing is ever unpickled (checkpoints are
read by :mod:`keeper.torch_support.layouts`, pickles with ``weights_only=True``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from keeper.errors import KeeperError
from keeper.torch_support.export import Exported, module_weights
from keeper.torch_support.load import load_result
from keeper.torch_support.templates import state_signature, template_apart
from keeper.warm import LoadReport, WarmResult, restore as restore_warm, restored

__all__ = ["restore", "same_architecture"]


def same_architecture(module: torch.nn.Module, state: dict[str, Any]) -> bool:
    """Whether ``state`` is a state_dict of ``module``'s own architecture (same keys, same shapes)."""
    own = module.state_dict()
    return set(state) == set(own) and all(tuple(state[k].shape) == tuple(own[k].shape) for k in own)


def restore(module: torch.nn.Module, exported: Exported, state: dict[str, Any], template: bytes | None,
            what: str, noise: float, seed: int = 0, note: str = "") -> WarmResult:
    """Load checkpoint ``state`` into ``module``: exactly when it is the module's architecture, else transformed
    onto it from the checkpoint's architecture ``template`` (:func:`keeper.warm.restore`, which builds the reason,
    ``note`` first). ``result.parent`` is ``what``; ``result.load`` says what loading found."""
    if same_architecture(module, state):
        module.load_state_dict(state)
        return dataclasses.replace(restored(what, note), load=LoadReport(reason="loaded whole: the same keys and "
                                                                                "shapes"))
    if template is None:
        raise KeeperError(f"{what}: the checkpoint's state_dict is another architecture (signature "
                          f"{state_signature(state)[:12]}) and no architecture template was found beside it; call "
                          "warm_start(model, example_input) in the trainable before its first checkpoint")
    graph, weights = template_apart(template, state, what)
    result = restore_warm(graph, what, exported.onnx, exported.graph, checkpoint_weights=weights,
                          weights=module_weights(module, exported) if exported.apart else None, noise=noise,
                          seed=seed, note=note)
    return load_result(module, result, exported.keys)
