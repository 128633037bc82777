"""Turning a finished trial's checkpoint into a zoo model: its graph and its trained weights.

The checkpoint's weights are read in any layout of :mod:`keeper.torch_support.layouts` (keeper's own, Ray Train's,
the Hugging Face Trainer's ``checkpoint-<step>/``, ``save_pretrained`` folders, Lightning's ``.ckpt``); only
weight files are read, pickles with ``weights_only=True``. ``model.onnx`` is used as is. A state_dict needs the
trial's architecture: the template ``warm_start`` saved in the trial directory, else the one the zoo's store keeps
for the state_dict's signature (``warm_start`` ran in a Ray Train worker), else the model the callback's
``model_builder`` makes from the trial's config. The state_dict is mapped onto it all or nothing
(:mod:`keeper.torch_support.state_keys`).

Invariant: a checkpoint that cannot be read whole is refused with one line naming the file and what to change in
the Tune code; nothing reaches the zoo then.
"""

from __future__ import annotations

import json
from typing import Any, Callable


from keeper.actors.remote import Demand, get
from keeper.errors import AdmissionError, KeeperError
from keeper.onnx_safety import load_model
from keeper.onnx_weights import write_weights
from keeper.torch_support.export import export_graph
from keeper.torch_support.inputs import example_for
from keeper.torch_support.layouts import WEIGHT_FILES, find_weights, nothing_found
from keeper.torch_support.templates import architecture_template, find_template, template_apart
from keeper.torch_support.trial import LINEAGE_FILE, read_template
from keeper.weights import weights_bytes

__all__ = ["CHECKPOINT_FILES", "checkpoint_onnx", "checkpoint_model", "register_trial", "trial_lineage"]

#: The weight files the callback reads (see :mod:`keeper.torch_support.layouts` for where).
CHECKPOINT_FILES = WEIGHT_FILES


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
    found = find_weights(directory, what)
    if found is None:
        raise nothing_found(directory, what)
    if found.onnx is not None:
        return found.onnx, None, False
    state, what = found.state, f"{what}: {found.source}"
    misfit = None
    if template is not None:
        try:
            return (*template_apart(template, state, what), True)
        except KeeperError as exc:
            if find is None and builder is None:
                raise
            # the trial changed architecture after this checkpoint (population-based training mutates width or
            # depth): the template in its directory is its latest architecture's; the checkpoint's is looked up
            misfit = exc
    try:
        other = _template_of(state, what, builder, find)
    except KeeperError:
        if misfit is not None:  # no other architecture known: why the trial's own did not fit is the answer
            raise misfit from None
        raise
    return (*template_apart(other, state, what), False)


def _template_of(state: dict, what: str, builder: Callable[[], tuple[Any, Any]] | None,
                 find: Callable[[dict], bytes | None] | None) -> bytes:
    """The architecture template of ``state``: found by its signature, or built."""
    template = find(state) if find is not None else None
    if template is not None:
        return template
    if builder is None:
        raise KeeperError(f"{what}: the trial's architecture is unknown (warm_start never ran for it); call "
                          "warm_start(model) where the trial builds its model (the trainable, the Hugging Face "
                          "Trainer's model_init, Ray Train's train_loop_per_worker), or give KeeperCallback a "
                          "model_builder")
    module, example = builder()
    return architecture_template(export_graph(module, example_for(module, example)), module.state_dict())


def register_trial(handle: Any, checkpoint: Any, storage_fs: Any, trial_fs_path: str, accuracy: float, name: str,
                   builder: Callable[[dict], tuple[Any, Any]] | None, config: dict, timeout_s: float,
                   zoo_uri: str | None = None, training: dict | None = None,
                   client: dict | None = None) -> dict:
    """Register a finished trial's checkpoint into the zoo (in the Tune driver's registration thread, off Tune's
    loop); ``training``: its learning curve's summary (:func:`keeper.choice.inheritance.training_of`), kept in the
    model's lineage; ``client``: who registers (:meth:`keeper.teams.Client.to_wire`, the callback's team).

    Weights already in the zoo are that stored model trained again (a search repeated with the same seeds): the
    trial is recorded on it (``record_again``), never refused for it.

    Returns the zoo's record of the model as a dict (the stored model's when the weights were there already).
    """
    what = f"trial {name}"
    template = read_template(storage_fs, trial_fs_path)  # None: the zoo's store has it by signature
    lineage = _read_lineage(storage_fs, f"{trial_fs_path}/{LINEAGE_FILE}", what)
    with checkpoint.as_directory() as directory:
        model, weights, own = _checkpoint_model(directory, template, what,
                                                (lambda: builder(config)) if builder is not None else None,
                                                (lambda state: find_template(zoo_uri, state)) if zoo_uri else None)
    if template is not None and not own:
        lineage = None  # the lineage beside the template tells the trial's latest warm start, not this checkpoint's
    if training is not None:
        lineage = {**(lineage or {"parent": None}), "training": training}
    need = Demand(f"registering {what} (timeouts.register_s)", actor=handle)
    # weights apart as safetensors bytes: no ONNX 2 GB bound, and plain bytes on the wire
    blob = None if weights is None else weights_bytes(weights)
    return get(handle.register.remote(model, float(accuracy), name, blob, lineage, record_again=True,
                                      client=client), timeout_s, need)


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
                             "remove the file to register the trial as trained from its own init, and let only "
                             "warm_start write files named keeper-* into trial directories")
    return lineage


def trial_lineage(trial: Any) -> dict | None:
    """The lineage ``warm_start`` left in a running Tune trial's directory, or None where there is none or it
    cannot be read (the callback then counts the trial as started from its own initialisation; registration reads it strictly, :func:`_read_lineage`)."""
    storage = getattr(trial, "storage", None)
    if storage is None:
        return None
    try:
        with storage.storage_filesystem.open_input_file(f"{storage.trial_fs_path}/{LINEAGE_FILE}") as f:
            data = f.read(_LINEAGE_CAP + 1)
        out = json.loads(data) if len(data) <= _LINEAGE_CAP else None
    except (FileNotFoundError, OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


_LINEAGE_CAP = 64 * 1024
