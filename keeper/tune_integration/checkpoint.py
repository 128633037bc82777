"""Turning a finished trial's checkpoint into ONNX with weights, ready for the zoo.

Accepted checkpoint layouts (the first file found wins):

- ``model.onnx``: the trained model as ONNX with its weights; used as is.
- ``model.safetensors``: the model's ``state_dict`` in safetensors format.
- ``model.pt``: the model's ``state_dict`` saved with ``torch.save`` (or a dict holding it under ``"model"``
  or ``"state_dict"``), read with ``weights_only=True``: a checkpoint is never unpickled into code.

A state_dict needs the trial's architecture: the template ``warm_start`` saved in the trial directory, or,
when the callback has a ``model_builder``, the model that builder makes from the trial's config.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable


from keeper.actors.remote import Demand, get
from keeper.errors import AdmissionError, KeeperError
from keeper.onnx_safety import load_model
from keeper.onnx_weights import write_weights
from keeper.torch_support.export import export_graph
from keeper.torch_support.restore import read_state_dict
from keeper.torch_support.templates import architecture_template, find_template, template_apart
from keeper.torch_support.trial import ARCHITECTURE_FILE, LINEAGE_FILE
from keeper.weights import weights_bytes

__all__ = ["CHECKPOINT_FILES", "checkpoint_onnx", "checkpoint_model", "register_trial"]

CHECKPOINT_FILES = ("model.onnx", "model.safetensors", "model.pt")


def checkpoint_onnx(directory: str, template: bytes | None, what: str,
                    builder: Callable[[], tuple[Any, Any]] | None = None,
                    find: Callable[[dict], bytes | None] | None = None) -> bytes:
    """ONNX bytes with the trained weights of the checkpoint in ``directory`` (models under ONNX's 2 GB; see
    :func:`checkpoint_model` for any size). Arguments and errors as :func:`checkpoint_model`."""
    model, weights, _ = _checkpoint_model(directory, template, what, builder, find)
    if weights is None:
        return model
    return write_weights(load_model(model, what=what, weights_apart=True), weights).SerializeToString()


def checkpoint_model(directory: str, template: bytes | None, what: str,
                     builder: Callable[[], tuple[Any, Any]] | None = None,
                     find: Callable[[dict], bytes | None] | None = None) -> tuple[bytes, dict | None]:
    """The trained model of the checkpoint in ``directory``: ``(model.onnx bytes, None)``, or for a state_dict the
    architecture's graph without weights and the weights apart (initializer name -> array), so a model of any
    size is registered without serialising its weights into ONNX.

    Args:
        template: the trial's architecture template, or None when warm_start did not write one.
        builder: makes ``(module, example_input)`` of the trial's architecture; used when there is no template.
        find: looks a template up from the checkpoint's state_dict (the zoo's store) when ``template`` is None.

    Raises:
        KeeperError: no accepted file in ``directory``, or nothing tells the architecture, or the state_dict
            does not fit it.
    """
    model, weights, _ = _checkpoint_model(directory, template, what, builder, find)
    return model, weights


def _checkpoint_model(directory: str, template: bytes | None, what: str,
                      builder: Callable[[], tuple[Any, Any]] | None,
                      find: Callable[[dict], bytes | None] | None) -> tuple[bytes, dict | None, bool]:
    """:func:`checkpoint_model`, and whether the model's architecture is ``template``'s (False when the template
    did not fit the checkpoint and the architecture came from ``find`` or ``builder``)."""
    onnx_path = os.path.join(directory, "model.onnx")
    if os.path.exists(onnx_path):
        with open(onnx_path, "rb") as f:
            return f.read(), None, False
    state = read_state_dict(directory, what)
    if state is None:
        raise KeeperError(f"{what}: the checkpoint holds none of {CHECKPOINT_FILES}; save the model's state_dict "
                          "as model.pt in the directory passed to tune.Checkpoint.from_directory")
    if template is not None:
        try:
            return (*template_apart(template, state, what), True)
        except KeeperError:
            if find is None and builder is None:
                raise
            # the trial changed architecture after this checkpoint (population-based training mutates width or
            # depth): the template in its directory is its latest architecture's; the checkpoint's is looked up
    return (*template_apart(_template_of(directory, what, builder, find, state), state, what), False)


def _template_of(directory: str, what: str, builder: Callable[[], tuple[Any, Any]] | None,
                 find: Callable[[dict], bytes | None] | None, state: dict | None = None) -> bytes:
    """The architecture template of the state_dict in ``directory``: found by its signature, or built."""
    state = state if state is not None else read_state_dict(directory, what)
    template = find(state) if find is not None else None
    if template is not None:
        return template
    if builder is None:
        raise KeeperError(f"{what}: the trial's architecture is unknown (warm_start was not called in the "
                          "trainable); call warm_start(model, example_input) or give KeeperCallback a "
                          "model_builder")
    module, example = builder()
    return architecture_template(export_graph(module, example))


def register_trial(handle: Any, checkpoint: Any, storage_fs: Any, trial_fs_path: str, accuracy: float, name: str,
                   builder: Callable[[dict], tuple[Any, Any]] | None, config: dict, timeout_s: float,
                   zoo_uri: str | None = None) -> dict:
    """Register a finished trial's checkpoint into the zoo (runs as a Ray task, off the Tune driver).

    Returns the zoo's record of the model as a dict.
    """
    what = f"trial {name}"
    try:
        with storage_fs.open_input_file(f"{trial_fs_path}/{ARCHITECTURE_FILE}") as f:
            template = f.read()
    except (FileNotFoundError, OSError):
        template = None  # warm_start ran elsewhere (a Ray Train worker): the zoo's store has it by signature
    lineage = _read_lineage(storage_fs, f"{trial_fs_path}/{LINEAGE_FILE}", what)
    with checkpoint.as_directory() as directory:
        model, weights, own = _checkpoint_model(directory, template, what,
                                                (lambda: builder(config)) if builder is not None else None,
                                                (lambda state: find_template(zoo_uri, state)) if zoo_uri else None)
    if template is not None and not own:
        lineage = None  # the lineage beside the template tells the trial's latest warm start, not this checkpoint's
    need = Demand(f"registering {what} (timeouts.register_s)", actor=handle)
    # weights apart as safetensors bytes: no ONNX 2 GB bound, and plain bytes on the wire
    blob = None if weights is None else weights_bytes(weights)
    return get(handle.register.remote(model, float(accuracy), name, blob, lineage), timeout_s, need)


def _read_lineage(storage_fs: Any, path: str, what: str) -> dict | None:
    """The lineage ``warm_start`` left in the trial directory (JSON, at most 64 KiB), or None when it never ran
    there. The zoo checks its fields when it registers the model."""
    try:
        with storage_fs.open_input_file(path) as f:
            data = f.read(_LINEAGE_CAP + 1)
    except (FileNotFoundError, OSError):
        return None
    try:
        lineage = json.loads(data) if len(data) <= _LINEAGE_CAP else None
    except ValueError:
        lineage = None
    if not isinstance(lineage, dict):
        raise AdmissionError(f"{what}: {path} is not the JSON object warm_start writes (WarmResult.lineage()); "
                              "remove the file to register the trial as trained from its own init")
    return lineage


_LINEAGE_CAP = 64 * 1024
