"""``warm_start``: the one line inside a Ray Tune trainable.

It exports the trial's model as a graph without weights (the module's tensors are read in place, never serialised
into ONNX), asks the running keeper service which zoo model to inherit from (sending the graph only), transforms
that parent's weights in the trial's own process (read, memory-mapped, straight from the zoo's store, so no
weights pass through a service actor, and no extra Ray task waits for a CPU the trials hold), and loads them on the
model's device.

It also writes the trial's architecture template (:func:`keeper.torch_support.architecture_template`: the ONNX
graph without parameter values, plus the ONNX-to-state_dict map) as ``keeper-architecture.onnx`` into the trial
directory on Tune's storage. That is how :class:`KeeperCallback` later turns the trial's ``model.pt`` checkpoint
into a zoo model without any further user code.

Example (function trainable)::

    def trainable(config):
        model = build(config).to(device)
        warm_start(model, torch.randn(1, 1, 40, device=device))   # parent None for the first trials
        ...train...
        with tempfile.TemporaryDirectory() as d:
            torch.save(model.state_dict(), os.path.join(d, "model.pt"))
            tune.report({"accuracy": acc}, checkpoint=tune.Checkpoint.from_directory(d))
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from keeper.errors import ServiceError
from keeper.warm import WarmResult

__all__ = ["warm_start", "ask_parent", "ARCHITECTURE_FILE", "LINEAGE_FILE"]


#: The architecture template's file name in the trial directory.
ARCHITECTURE_FILE = "keeper-architecture.onnx"
#: How the trial's model was obtained (``WarmResult.lineage()`` as JSON) in the trial directory: the callback
#: registers the trial with it, so a model trained from a warm across block structures does not become
#: everyone's parent (see :meth:`keeper.zoo.Zoo.register`).
LINEAGE_FILE = "keeper-lineage.json"


def warm_start(model: Any, example_input: Any, *, config: Any = None, noise: float | None = None,
               dynamo: bool | None = None, trainable: Any = None, timeout_s: float = 300.0,
               probe: Any = None) -> WarmResult:
    """Warm-start ``model`` (a ``torch.nn.Module``, on any device) in place from the keeper service's zoo.

    Args:
        example_input: an input the model accepts (a tensor or a tuple of them), for the ONNX export.
        config: the service's config (YAML path, mapping or ServiceConfig) when it is not the default one;
            the same the :class:`KeeperCallback` was given.
        noise: relative std of symmetry-breaking noise; None takes the service's ``noise`` setting.
        trainable: in a ``tune.Trainable`` class, ``self`` (found on the call stack when omitted).
        probe: optional data probe, as for :func:`keeper.torch_support.warm_start` (a callable scoring a module,
            or ``(batches, loss_fn)``): it runs here, in the trial's process, over the candidates the service's
            choice lists and the model's own init; the best is kept, cold included. In a Ray Train trial every
            rank probes alike (same data: same answer), or pass the probe on rank 0 only and the others follow.

    Returns:
        The WarmResult: ``parent`` is None (the model keeps its own weights) when the zoo holds nothing
        similar enough, e.g. for the first trials of an experiment.

    Raises:
        ServiceError: no keeper service is running (start one with ``KeeperCallback`` or ``keeper serve``),
            or it did not answer within ``timeout_s``.
    """
    from keeper.actors.transfer import warm_from_store
    from keeper.torch_support import export_graph, load_result, module_probe, module_weights, warm_choice
    from keeper.tune_integration import distributed

    rank, size = distributed.rank_and_size()
    if size == 1:
        exported, graph, choice = _ask(model, example_input, config, dynamo, trainable, timeout_s, True)
    elif rank == 0:  # one choice, one hit and one template per Ray Train trial
        try:
            exported, graph, choice = _ask(model, example_input, config, dynamo, trainable, timeout_s, True)
        except BaseException as exc:
            distributed.share_choice(exc)  # raises it here too, once the other ranks know
            raise
        choice = distributed.share_choice(choice)
    else:
        exported = export_graph(model, example_input, dynamo=dynamo)
        graph = None
        choice = distributed.share_choice(None)
    score = module_probe(model, exported, probe) if probe is not None else None
    result = warm_choice(choice, exported.onnx, graph, module_weights(model, exported), noise, score,
                         warm_from_store)
    result = load_result(model, result, exported.keys)
    if rank == 0:
        _save_trial_file(LINEAGE_FILE, json.dumps(result.lineage()).encode(), trainable)
    if size > 1:
        distributed.sync_module(model)
    return result


def ask_parent(model: Any, example_input: Any, *, config: Any = None, dynamo: bool | None = None,
               trainable: Any = None, timeout_s: float = 300.0, graph_only: bool = False) -> tuple[Any, Any]:
    """The first half of :func:`warm_start`: export ``model``, save its architecture template to the trial
    directory, and ask the service for a parent (counting a hit). Returns ``(Exported, choice)``, where
    ``choice`` is the :class:`~keeper.selection.ParentChoice` ``Keeper.choose`` returns; the model is not
    changed.

    ``graph_only``: export the graph without weights (:func:`keeper.torch_support.export_graph`; the caller reads
    the module's weights with ``module_weights``), else ONNX with weights (:func:`keeper.torch_support.export`)."""
    exported, _, choice = _ask(model, example_input, config, dynamo, trainable, timeout_s, graph_only)
    return exported, choice


def _ask(model: Any, example_input: Any, config: Any, dynamo: bool | None, trainable: Any,
         timeout_s: float, graph_only: bool) -> tuple[Any, Any, Any]:
    """(Exported, its LayerGraph, ParentChoice): the graph is extracted here, once; the front door gets its
    arrays (plain data) and the transfer in this process reuses it."""
    from keeper.actors.launcher import get_handle
    from keeper.actors.transfer import ask_service
    from keeper.graph import load_graph
    from keeper.torch_support import architecture_template, export, export_graph
    from keeper.tune_integration.templates import save_template

    handle = get_handle(config)
    if handle is None:
        raise ServiceError("warm_start: no keeper service is running; add KeeperCallback(...) to the "
                           "tune.RunConfig callbacks, or run `keeper serve` first")
    exported = (export_graph if graph_only else export)(model, example_input, dynamo=dynamo)
    template = architecture_template(exported)
    _save_trial_file(ARCHITECTURE_FILE, template, trainable)
    graph = exported.graph if exported.graph is not None else load_graph(exported.onnx)
    choice = ask_service(handle, graph, timeout_s)
    # also in the zoo's store, found from the checkpoint's state_dict alone (Ray Train runs, restored trials)
    save_template(choice.uri, template, model.state_dict())
    return exported, graph, choice


def _storage(trainable: Any) -> Any:
    """The trial's StorageContext: from ``trainable``, the function-trainable session, or the call stack."""
    if trainable is not None:
        return getattr(trainable, "_storage", None)
    try:
        from ray import tune

        storage = tune.get_context().get_storage()
        if storage is not None:
            return storage
    except Exception:  # outside a function trainable the session raises or returns nothing
        pass
    from ray.tune import Trainable

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
