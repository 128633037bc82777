"""What ``warm_start`` leaves behind when it runs inside a Ray Tune trial or a Ray Train worker.

In a Tune trial it writes two small files into the trial's directory on Tune's storage: the architecture template
(:data:`ARCHITECTURE_FILE`, from which :class:`keeper.tune_integration.KeeperCallback` turns the trial's ``model.pt``
checkpoint into a zoo model without further user code) and the lineage of the warm start (:data:`LINEAGE_FILE`,
``WarmResult.lineage()`` as JSON, so a model trained from a warm across block structures does not become everyone's
parent). In a Tune trial or a Ray Train worker it also stores the template in the zoo's store under the
state_dict's signature (:mod:`keeper.torch_support.templates`), since a Ray Train worker's run directory is never
seen by the Tune trial.

Invariant: outside Tune and Ray Train nothing is written; a zoo that cannot be written (read-only) loses only
the template's copy there, with a warning, never the warm start.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import posixpath
import sys
import warnings
from typing import Any, NamedTuple

from keeper.errors import KeeperError, StoreError
from keeper.torch_support.distributed import train_context
from keeper.torch_support.layouts import read_state_dict
from keeper.torch_support.templates import save_template
from keeper.warm import WarmResult

__all__ = ["ARCHITECTURE_FILE", "LINEAGE_FILE", "TrialCheckpoint", "checkpoint_state", "in_trial",
           "own_checkpoint_state", "read_template", "save_architecture", "save_lineage", "search_name"]

#: The architecture template's file name in the trial directory.
ARCHITECTURE_FILE = "keeper-architecture.onnx"
#: How the trial's model was obtained (``WarmResult.lineage()`` as JSON) in the trial directory.
LINEAGE_FILE = "keeper-lineage.json"

log = logging.getLogger(__name__)


class TrialCheckpoint(NamedTuple):
    """A checkpoint a trial starts from: its state_dict, the architecture template beside it (None when
    ``warm_start`` left none in its trial directory) and a label naming it in messages and reasons."""

    state: dict[str, Any]
    template: bytes | None
    label: str


def _storage(trainable: Any) -> Any:
    """The trial's StorageContext: from ``trainable``, the function-trainable session, or the call stack."""
    if trainable is not None:
        return getattr(trainable, "_storage", None)
    if "ray.tune" not in sys.modules:  # a Tune trial's process has imported Tune; importing it here costs seconds
        return None
    from ray import tune
    from ray.tune import Trainable

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # outside a trial Tune warns that there is no storage
            storage = tune.get_context().get_storage()
        if storage is not None:
            return storage
    except Exception:  # outside a function trainable the session raises or returns nothing
        pass

    frame = inspect.currentframe()
    try:
        while frame is not None:
            me = frame.f_locals.get("self")
            if isinstance(me, Trainable):
                return getattr(me, "_storage", None)
            frame = frame.f_back
    finally:
        del frame
    return None


def search_name(trainable: Any = None) -> str:
    """The search this call runs in: the Tune experiment's directory name ("" outside Tune; a Ray Train worker
    inside a Tune trial names its own run's)."""
    storage = _storage(trainable)
    if storage is None and train_context() is not None:
        try:
            storage = train_context().get_storage()
        except Exception:  # Train's context API differs across versions: the worker then searches alone
            storage = None
    return str(getattr(storage, "experiment_dir_name", "") or "")


def in_trial(trainable: Any = None) -> bool:
    """Whether this call runs inside a Tune trial or a Ray Train worker."""
    return _storage(trainable) is not None or train_context() is not None


def save_architecture(template: bytes, state: dict[str, Any], uri: str, trainable: Any = None) -> None:
    """The trial's architecture template into its trial directory, and into the zoo at ``uri`` by signature."""
    if not in_trial(trainable):
        return
    _save_trial_file(ARCHITECTURE_FILE, template, trainable)
    try:
        save_template(uri, template, state)
    except StoreError as exc:  # a read-only zoo: the trial directory's copy still serves the callback
        log.warning("keeper: the architecture template could not be stored in the zoo at %s (%s); checkpoints "
                    "of Ray Train workers of this architecture will need a model_builder", uri, exc)


def checkpoint_state(trainable: Any = None, given: Any = None) -> TrialCheckpoint | None:
    """The checkpoint this function trainable or Ray Train worker starts from (its own after a restore, or the
    trial Tune's PBT cloned); None outside a trial, with no checkpoint, or for a checkpoint holding no state_dict
    (``model.onnx``: the trainable restores it itself). A ``tune.Trainable`` class restores in its own
    ``load_checkpoint``.

    ``given`` (a ``ray.train.Checkpoint`` or a directory): the checkpoint to start from, for a Ray Train worker
    that Tune's checkpoint reaches only through ``train_loop_config`` (Ray Train V2 hands a worker only its own
    run's checkpoints). In a Ray Train worker the run's own checkpoint (a restart after a worker failure) comes
    first; in a function trainable ``given`` replaces Tune's."""
    if trainable is not None:
        return None
    checkpoint = _as_checkpoint(given)
    in_train = train_context() is not None
    if in_train:
        import ray.train

        checkpoint = ray.train.get_checkpoint() or checkpoint
    elif checkpoint is None and "ray.tune" in sys.modules:
        try:
            from ray import tune

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # outside a trial Tune warns that there is no checkpoint to get
                checkpoint = tune.get_checkpoint()
        except Exception:  # noqa: BLE001 - outside a function trainable Tune raises various errors
            checkpoint = None
    return _read_checkpoint(checkpoint) if checkpoint is not None else None


def own_checkpoint_state(exclude: str) -> TrialCheckpoint | None:
    """The latest checkpoint in this function trainable's own trial directory (Tune's ``checkpoint_NNNNNN``
    layout), as :func:`checkpoint_state` gives it, unless it is the one labelled ``exclude`` (one that could not be
    restored); None outside a Tune trial or without one. What a trial continues from when the checkpoint Tune's PBT
    cloned into it from another trial cannot be restored."""
    storage = _storage(None)
    if storage is None or train_context() is not None:
        return None
    import pyarrow.fs as pafs
    from ray.train import Checkpoint

    fs, directory = storage.storage_filesystem, storage.trial_fs_path
    try:
        infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    except OSError:
        return None
    found = sorted(i.path for i in infos
                   if i.type == pafs.FileType.Directory and posixpath.basename(i.path).startswith("checkpoint_"))
    for path in reversed(found):  # the latest first; one holding no state_dict is passed over
        got = _read_checkpoint(Checkpoint(path, filesystem=fs))
        if got is not None:
            return None if got.label == exclude else got
    return None


def _read_checkpoint(checkpoint: Any) -> TrialCheckpoint | None:
    """``checkpoint`` with the template beside it; None without a state_dict."""
    trial_dir = posixpath.dirname(checkpoint.path.rstrip("/"))
    what = f"checkpoint {posixpath.basename(checkpoint.path.rstrip('/'))} of {posixpath.basename(trial_dir)}"
    with checkpoint.as_directory() as directory:
        state = read_state_dict(directory, what)
    if state is None:
        return None
    return TrialCheckpoint(state, read_template(checkpoint.filesystem, trial_dir), what)


def read_template(fs: Any, trial_dir: str) -> bytes | None:
    """The architecture template ``warm_start`` left in the trial directory ``trial_dir`` on the ``pyarrow.fs``
    filesystem ``fs``, or None where it left none (it ran elsewhere, e.g. in a Ray Train worker, whose template
    the zoo's store keeps by signature). The one reader of that file: the restore and the callback's
    registration both read it here."""
    try:
        with fs.open_input_file(f"{trial_dir}/{ARCHITECTURE_FILE}") as f:
            return f.read()
    except (FileNotFoundError, OSError):
        return None


def _as_checkpoint(given: Any) -> Any:
    """``given`` as a ``ray.train.Checkpoint`` (None stays None); else :class:`KeeperError` naming it."""
    if given is None:
        return None
    from ray.train import Checkpoint

    if isinstance(given, Checkpoint):
        return given
    if isinstance(given, (str, os.PathLike)) and os.path.isdir(given):
        return Checkpoint.from_directory(os.fspath(given))
    raise KeeperError(f"warm_start: checkpoint={given!r} is a {type(given).__name__}; pass a ray.train.Checkpoint "
                      "(e.g. tune.get_checkpoint(), handed to Ray Train workers through train_loop_config) or the "
                      "path of a checkpoint directory")


def save_lineage(result: WarmResult, trainable: Any = None) -> None:
    """``result.lineage()`` into the trial directory (in a Tune trial only)."""
    _save_trial_file(LINEAGE_FILE, json.dumps(result.lineage()).encode(), trainable)


def _save_trial_file(name: str, data: bytes, trainable: Any) -> None:
    """``data`` as the file ``name`` in the Tune trial's directory, where the callback looks first (outside a Tune
    trial, e.g. in a Ray Train worker, the template's copy in the zoo's store serves, and a model without lineage
    counts as trained from its own init)."""
    storage = _storage(trainable)
    if storage is None:
        return
    directory = storage.trial_fs_path
    path = f"{directory}/{name}"
    fs = storage.storage_filesystem
    fs.create_dir(directory, recursive=True)
    tmp = f"{path}.tmp"
    with fs.open_output_stream(tmp) as f:
        f.write(data)
    try:
        fs.move(tmp, path)
    except OSError:  # object stores without rename: the key is written once per trial anyway
        with fs.open_output_stream(path) as f:
            f.write(data)
        fs.delete_file(tmp)
