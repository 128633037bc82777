"""Architecture templates found from a checkpoint alone.

``warm_start`` leaves the trial's architecture template (ONNX without parameter values, plus the ONNX-to-state_dict
map) in the zoo's store, under a signature of the module's state_dict: its floating-point keys and their shapes.
The callback's registration task computes the same signature from the checkpoint's state_dict and reads the
template back. No shared directory is needed, so this works wherever ``warm_start`` ran: a Tune trial, a Ray Train
worker (whose run directory the Tune trial never sees: Tune copies the reported checkpoint into the trial's own
directory), or any process.

Invariant: a template is stored under the signature of the state_dict of the module it was exported from; a
checkpoint of that module (``model.state_dict()``) has the same signature. A collision between architectures
with equal keys and shapes is harmless: their templates can be filled with each other's state_dicts.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["state_signature", "save_template", "find_template"]


def state_signature(state: dict[str, Any]) -> str:
    """Signature of a state_dict: its floating-point tensors' keys and shapes."""
    import torch

    items = sorted((str(k), [int(d) for d in v.shape]) for k, v in state.items()
                   if isinstance(v, torch.Tensor) and torch.is_floating_point(v))
    return hashlib.blake2b(json.dumps(items).encode(), digest_size=20).hexdigest()


def save_template(uri: str, template: bytes, state: dict[str, Any]) -> None:
    """Store ``template`` in the zoo at ``uri`` under ``state``'s signature (once per architecture)."""
    from keeper.actors.transfer import store_for

    store_for(uri).put_template(state_signature(state), template)


def find_template(uri: str, state: dict[str, Any]) -> bytes | None:
    """The template stored in the zoo at ``uri`` for ``state``'s architecture, or None."""
    from keeper.actors.transfer import store_for

    return store_for(uri).get_template(state_signature(state))
