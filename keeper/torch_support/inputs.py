"""The example input ``warm_start`` traces a module with, when the caller gives none: the one the module can make.

- A Hugging Face model (``transformers.PreTrainedModel``): its ``dummy_inputs`` when they hold its
  ``main_input_name``, else one built from its config (``input_ids`` of a few tokens; ``pixel_values`` of
  ``num_channels`` x ``image_size``; ``input_values`` of a second of audio), passed by position in its
  ``forward``'s order.
- A LightningModule: its ``example_input_array`` when set.

Also here: whether a call runs while the Hugging Face Trainer builds its model outside a search
(:func:`trainer_building`): ``Trainer(model_init=...)`` calls ``model_init(None)`` once when it is built, before
``hyperparameter_search`` starts Ray Tune and keeper's service.

Invariants: an explicit input always wins; the input is made on the module's device, in the module's float dtype
for float inputs; the module is not changed; a module that can make no input raises
:class:`~keeper.errors.KeeperError` naming it and the fix.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch

from keeper.errors import KeeperError

__all__ = ["example_for", "trainer_building"]

_TOKENS = 8  # tokens of a made input_ids


def example_for(module: torch.nn.Module, given: Any = None) -> Any:
    """``given`` when it is not None, else the example input ``module`` can make (see the module docstring).

    Raises:
        KeeperError: ``given`` is None and the module can make none.
    """
    if given is not None:
        return given
    lightning = getattr(module, "example_input_array", None) if _is_lightning(module) else None
    if lightning is not None:
        return lightning
    if _is_hf(module):
        return _hf_example(module)
    raise KeeperError(f"warm_start: {type(module).__qualname__} cannot make an example input (it is no Hugging Face "
                      "model and no LightningModule with example_input_array set); pass one the module's forward "
                      "accepts: warm_start(model, example_input), e.g. one batch of its data")


def _is_hf(module: Any) -> bool:
    modeling = sys.modules.get("transformers.modeling_utils")  # imported by every model of transformers'
    return modeling is not None and isinstance(module, modeling.PreTrainedModel)


def _is_lightning(module: Any) -> bool:
    return any(c.__module__.split(".")[0] in ("lightning", "pytorch_lightning") and c.__name__ == "LightningModule"
               for c in type(module).__mro__)


def _device_dtype(module: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    for p in module.parameters():
        return p.device, (p.dtype if p.is_floating_point() else torch.float32)
    return torch.device("cpu"), torch.float32


def _hf_example(module: Any) -> tuple:
    """A Hugging Face model's example input, as positional arguments of its forward."""
    main = getattr(module, "main_input_name", "input_ids")
    device, dtype = _device_dtype(module)
    try:
        dummy = dict(module.dummy_inputs)
    except Exception:  # noqa: BLE001 - a model's property may fail for its config; the config serves then
        dummy = {}
    if main not in dummy:
        dummy = {main: _from_config(module, main, device, dtype)}
    dummy = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in dummy.items()}
    params = list(inspect.signature(module.forward).parameters.values())
    names = [p.name for p in params]
    if main not in names:
        raise KeeperError(f"warm_start: {type(module).__name__}.forward takes no {main!r} (its main_input_name); pass "
                          "an example input: warm_start(model, example_input)")
    last = max(names.index(k) for k in dummy if k in names)
    return tuple(dummy.get(p.name, p.default if p.default is not inspect.Parameter.empty else None)
                 for p in params[:last + 1])


def _from_config(module: Any, main: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    config = module.config
    if main == "input_ids":
        vocab = int(getattr(config, "vocab_size", 0) or 2)
        return torch.arange(_TOKENS, device=device).reshape(1, _TOKENS) % vocab
    if main == "pixel_values" and getattr(config, "image_size", None):
        side = config.image_size
        h, w = (side, side) if isinstance(side, int) else tuple(side)[:2]
        return torch.zeros(1, int(getattr(config, "num_channels", 3)), int(h), int(w), device=device, dtype=dtype)
    if main == "input_values":
        return torch.zeros(1, 16000, device=device, dtype=dtype)
    raise KeeperError(f"warm_start: {type(module).__name__} cannot make an example input from its config (its main "
                      f"input is {main!r}); pass one: warm_start(model, example_input)")


def trainer_building() -> bool:
    """Whether this call runs inside the Hugging Face Trainer's ``call_model_init(None)``: the model it builds
    when it is constructed or trains outside a hyperparameter search (no trial)."""
    trainer = sys.modules.get("transformers.trainer")  # imported by a running Trainer; importing it costs seconds
    if trainer is None:
        return False
    frame = inspect.currentframe()
    try:
        while frame is not None:
            if frame.f_code.co_name == "call_model_init" and isinstance(frame.f_locals.get("self"), trainer.Trainer):
                return frame.f_locals.get("trial") is None
            frame = frame.f_back
    finally:
        del frame
    return False
