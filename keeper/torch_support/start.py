"""``warm_start`` and ``register`` for torch modules: the one torch entry to keeper, in any process, a Ray Tune
trial or a Ray Train worker.

``warm_start(module, example_input, zoo)`` exports the module's architecture (its weights are read in place,
never serialised), warms through the one warm path (:func:`keeper.warm.warm`; with a probe, on copies of the
module), and loads the winner into the module on its own device. The parent source is the embedded zoo
(:class:`keeper.Zoo`) or the service (a front door handle, a :class:`keeper.actors.ServiceClient`, or, when ``zoo``
is None, the running service named by ``config``). The child inherits in this process, reading the parent from the
zoo's store, so trials holding every CPU never wait for a task.

A trial that starts from a checkpoint (restored, or cloned by population-based training from a trial of any
architecture) is restored from it instead of from a zoo parent (:mod:`keeper.torch_support.restore`, through
:func:`keeper.warm.restore`). In a Tune trial it also leaves the architecture template and the warm's lineage for
the Tune callback (:mod:`keeper.torch_support.trial`); in a Ray Train trial rank 0 chooses and the other ranks
follow (:mod:`keeper.torch_support.distributed`), so every worker ends with the same weights.

Invariants: the result is built by the warm path and never changed here: why a checkpoint was not restored goes
in as its ``note``, what loading into the module found is its ``load`` report; a restart from a checkpoint never
leaves a member of a population worse than its own latest checkpoint without a probe saying so. Ray is imported
only when the caller names the service: with a :class:`keeper.Zoo`, ``warm_start`` and ``register`` run where Ray
is not installed (a GPU image, a notebook). Plumbing (the exporter, the bounds on the service's answers) is read
from the service's config, never passed per call.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import time
from typing import Any

from keeper.actors.config import ServiceConfig, load_config
from keeper.choice.selection import ParentChoice
from keeper.errors import CheckpointError, KeeperError, ServiceError, StoreError
from keeper.teams import Client
from keeper.torch_support import distributed, trial
from keeper.torch_support.export import Exported, export_graph, module_weights
from keeper.torch_support.inputs import example_for, trainer_building
from keeper.torch_support.load import load_result
from keeper.torch_support.probe import as_module_probe, module_probe
from keeper.torch_support.restore import restore, same_architecture
from keeper.torch_support.templates import architecture_template, find_template
from keeper.torch_support.trial import TrialCheckpoint
from keeper.warm import LoadReport, ParentSource, WarmResult, cold_result, warm
from keeper.weights import weights_bytes

__all__ = ["warm_start", "register", "parent_source"]

log = logging.getLogger(__name__)


def _service(what: str) -> Any:
    """keeper's service modules (:mod:`keeper.actors`), imported only for a caller that names the service, so the
    embedded :class:`keeper.Zoo` works where Ray is not installed; a KeeperError naming the fix where it is not."""
    try:
        import ray.actor

        from keeper.actors import client, launcher, remote
    except ImportError as exc:
        raise KeeperError(f"{what}: the keeper service needs Ray, which cannot be imported here ({exc}); pass a "
                          "keeper.Zoo (e.g. keeper.Zoo('path/to/zoo')), or install Ray (pip install 'ray[tune]')") \
            from None
    return ray.actor.ActorHandle, client.ServiceClient, launcher.connect, remote


def _is_zoo(zoo: Any) -> bool:
    """Whether ``zoo`` is an embedded :class:`keeper.Zoo`: one exists only where its module was imported, so a trial
    warmed through the service never imports the embedded zoo's modules to ask."""
    import sys

    module = sys.modules.get("keeper.zoo")
    return module is not None and isinstance(zoo, module.Zoo)


def parent_source(zoo: Any, config: Any = None) -> ParentSource:
    """The parent source ``zoo`` names: a :class:`keeper.Zoo` or a :class:`~keeper.actors.ServiceClient` as they
    are, a front door handle wrapped in a client (bounded by ``timeouts.choice_s`` of ``config``), None for the
    running service of ``config``.

    Raises:
        KeeperError: ``zoo`` is none of these, or names the service where Ray cannot be imported.
        ServiceError: ``zoo`` is None and no service is running.
    """
    if _is_zoo(zoo):
        return zoo
    ActorHandle, ServiceClient, connect, _ = _service("warm_start")  # noqa: N806 - classes, imported with Ray
    if isinstance(zoo, ServiceClient):
        return zoo
    cfg = load_config(config)
    if isinstance(zoo, ActorHandle):
        return ServiceClient(zoo, cfg.timeouts.choice_s, client=Client.from_config(cfg))
    if zoo is None:
        return ServiceClient(connect(cfg), cfg.timeouts.choice_s, client=Client.from_config(cfg))
    raise KeeperError(f"warm_start: zoo {zoo!r} is a {type(zoo).__name__}; pass a keeper.Zoo (e.g. "
                      "keeper.Zoo('path/to/zoo')), the service's handle (keeper.actors.start()), or nothing for the "
                      "running service")


def warm_start(module: Any, example_input: Any = None, zoo: Any = None, *, config: Any = None,
               noise: float | None = None, probe: Any = None, checkpoint: Any = None,
               shrink: float = 1.0) -> WarmResult:
    """Warm-start ``module`` (a ``torch.nn.Module``, on any device) in place from the best parent in a zoo.

    Args:
        example_input: an input the module accepts (a tensor or a tuple of them), for tracing its architecture;
            None for a module that makes its own (:mod:`keeper.torch_support.inputs`: a Hugging Face model, a
            LightningModule with ``example_input_array``).
        zoo: a :class:`keeper.Zoo`, the service's handle or a :class:`keeper.actors.ServiceClient`; None: the
            running keeper service (in a Tune trainable, the one ``KeeperCallback`` started).
        config: the service's config (YAML path, mapping or ServiceConfig), the same the ``KeeperCallback`` was
            given: which service ``zoo=None`` means, how long its answer may take (``timeouts.choice_s``) and which
            exporter reads the module (``dynamo``); None: the defaults.
        noise: relative std of symmetry-breaking noise; None takes the zoo's or service's ``noise`` setting.
        probe: optional data probe: a callable scoring a candidate module (lower is better), or ``(batches,
            loss_fn)`` / a :class:`~keeper.torch_support.DataProbe`. The best ranked candidates (the policy's
            ``probe_top``, default 3) and the module's own init are scored on copies of the module and the best is
            kept, cold included; ``result.probe`` reports the losses and the cost. In a Ray Train trial every rank
            probes alike (same data: same answer).
        checkpoint: a ``ray.train.Checkpoint`` (or its directory) to start from. Needed only in Ray Train workers
            run inside a Tune trial under (Keeper)PBT: Ray Train hands its workers only their own run's
            checkpoints, so the trial passes ``tune.get_checkpoint()`` through ``train_loop_config``. A checkpoint
            of the Train run itself (a restart after a worker failure) comes first; elsewhere the trial's own
            checkpoint is found without it.
        shrink: when the zoo's parent is the module's own architecture, the share of its weights the module
            starts from (shrink and perturb: ``shrink x parent + (1 - shrink) x the module's own init``); 1.0, the
            default, restarts from the parent's whole function, which keeps everything the parent learnt. A
            smaller share gives the trial's own hyperparameters more say, and is the remedy when warmed trials end
            below cold ones (a parent that over-fit its training data). Checkpoint restores are never shrunk.

    Returns:
        The WarmResult: ``parent`` is None (the module keeps its own weights) when the zoo holds nothing similar
        enough, e.g. for the first trials of an experiment; ``reason`` says why; ``load`` says what loading into
        the module found. A trial starting from a checkpoint is restored from it (``parent`` names the checkpoint;
        another architecture's is transformed); a checkpoint that cannot be restored leaves the trial on its own
        latest checkpoint, else on the zoo's warm start, and ``reason`` says why. The model the Hugging Face
        Trainer builds outside a search (``model_init(None)``, before ``hyperparameter_search`` starts the
        service) keeps its init when no service runs yet.

    Raises:
        ServiceError: ``zoo`` is None and no keeper service is running (start one with ``KeeperCallback`` or
            ``keeper serve``), or it did not answer within ``timeouts.choice_s``.
        KeeperError: ``example_input`` is None and the module can make none.

    Example:
        >>> result = keeper.warm_start(model, torch.randn(1, 1, 40), zoo)                     # doctest: +SKIP
        >>> result = keeper.warm_start(bert)        # a Hugging Face model makes its own input  # doctest: +SKIP
        >>> result.parent, result.score, result.preserved, result.reason                     # doctest: +SKIP
        >>> result = keeper.warm_start(model, x, zoo, probe=((xb, yb), torch.nn.CrossEntropyLoss()))  # doctest: +SKIP
    """
    if isinstance(shrink, bool) or not (isinstance(shrink, (int, float)) and 0.0 <= shrink <= 1.0):
        raise KeeperError(f"warm_start: shrink={shrink!r} is not a share in [0, 1] of the parent's weights; pass "
                          "e.g. 0.5, or 1.0 (the default) for the parent's whole function")
    clock = _Clock()
    with clock("connect"):
        cfg = load_config(config)
        example_input = example_for(module, example_input)
        rank, size = distributed.rank_and_size()
        if zoo is None and trainer_building() and not trial.in_trial():
            zoo = _running_service(cfg)
            if zoo is None:
                return WarmResult(None, 0.0, {}, {}, reason="built by the Hugging Face Trainer outside a search "
                                  "(model_init(None)) with no keeper service running: it keeps its own init; the "
                                  "search's trials are warmed", load=LoadReport(reason="nothing loaded"))
        source = _trial_source(cfg) if zoo is None and trial.in_trial() else parent_source(zoo, cfg)
    exported, choice = _choose_once(module, example_input, source, cfg, rank, size, clock)
    choice = dataclasses.replace(choice, restart_shrink=float(shrink))
    with clock("inherit"):
        result, failed = _restore_checkpoint(module, exported, choice, noise, checkpoint, probe)
    if result is None:
        with clock("inherit"):
            score = module_probe(module, exported.keys, probe) if probe is not None else None
            result = warm(source, exported.onnx, exported.graph, noise=noise, probe=score, choice=choice,
                          weights=module_weights(module, exported) if exported.apart else None, count=rank == 0,
                          note=failed, search=trial.search_name())
        with clock("load"):
            result = load_result(module, result, exported.keys)
    with clock("save"):
        if rank == 0:
            trial.save_lineage(result)
        if size > 1:
            distributed.sync_module(module)
    return dataclasses.replace(result, seconds=dict(clock.seconds))


class _Clock:
    """Seconds per phase of one warm_start (``with clock("trace"): ...``), summed over a phase's parts."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0


class _EmptyZoo:
    """The parent source of a trial that finds no service running and the zoo empty (the first trials of a search
    on a new zoo, while the service waits to start): nothing to choose from, so nothing to wait for."""

    def __init__(self, cfg: ServiceConfig):
        self.uri, self.noise, self.seed = cfg.zoo_uri, cfg.noise, cfg.seed

    def choose(self, graph: Any, fresh: bool = False, search: str = "") -> ParentChoice:
        return ParentChoice(None, 0.0, self.uri, self.noise, self.seed)

    def inherit(self, choice: ParentChoice, parent: str | None, child: Any, graph: Any, *, weights: Any,
                noise: float, out: Any) -> WarmResult:
        return cold_result(child, weights, out=out, graph=graph)

    def hit(self, parent: str) -> None:
        pass


def _trial_source(cfg: ServiceConfig) -> ParentSource:
    """The parent source of a trial that names no zoo: the running service's client, else an :class:`_EmptyZoo`
    when its zoo holds no model (the first trials of a search, while the service waits to start). One Ray name
    lookup, and one listing of the zoo's catalog when no service runs.

    Raises:
        ServiceError: no service runs and the zoo holds models (see :func:`parent_source`).
    """
    from keeper.actors.launcher import find
    from keeper.store import zoo_is_empty

    handle = find(cfg)
    if handle is None and zoo_is_empty(cfg.zoo_uri):
        return _EmptyZoo(cfg)
    return parent_source(handle, cfg)


def _running_service(cfg: ServiceConfig) -> ParentSource | None:
    """The running service of ``cfg`` as a parent source, or None; never starts Ray to look for it."""
    import sys

    if "ray" not in sys.modules or not sys.modules["ray"].is_initialized():
        return None
    try:
        return parent_source(None, cfg)
    except ServiceError:
        return None


def _choose_once(module: Any, example_input: Any, source: ParentSource, cfg: ServiceConfig, rank: int,
                 size: int, clock: _Clock) -> tuple[Exported, ParentChoice]:
    """The module's architecture, and the parent choice made by rank 0 and shared with every rank of a Ray Train
    trial (one choice, one hit and one template per trial); an error on rank 0 is raised on every rank."""
    if rank == 0:
        try:
            exported, choice = _choose(module, example_input, source, cfg, clock)
        except BaseException as exc:
            if size > 1:
                distributed.share_choice(exc)  # raises it here too, once the other ranks know
            raise
    else:
        with clock("trace"):
            exported, choice = export_graph(module, example_input, dynamo=cfg.dynamo), None
    if size > 1:
        with clock("choose"):
            choice = distributed.share_choice(choice)
    return exported, choice


def _choose(module: Any, example_input: Any, source: ParentSource, cfg: ServiceConfig,
            clock: _Clock) -> tuple[Exported, ParentChoice]:
    with clock("trace"):
        exported = export_graph(module, example_input, dynamo=cfg.dynamo)
    with clock("choose"):
        choice = source.choose(exported.graph, search=trial.search_name())
    with clock("save"):
        state = module.state_dict()
        trial.save_architecture(architecture_template(exported, state), state, choice.uri)
    return exported, choice


def _restore_checkpoint(module: Any, exported: Exported, choice: ParentChoice, noise: float | None,
                        given: Any = None, probe: Any = None) -> tuple[WarmResult | None, str]:
    """The trial's checkpoint (or ``given``, see :func:`trial.checkpoint_state`) restored into ``module`` (every
    rank alike: same checkpoint, same seed), else the trial's own latest checkpoint (a function trainable's, when
    the one cloned into it cannot be restored or would not keep its function: :func:`_keep_better`), or (None, why
    not) when there is none or neither can be restored; a failure never ends the trial."""
    try:
        found = trial.checkpoint_state(given=given)
    except CheckpointError as exc:  # a checkpoint that cannot be read whole (a bad layout): the zoo's warm start
        log.warning("keeper: %s; the trial starts from the zoo instead", exc)
        return None, f"its checkpoint could not be read ({exc})"
    if found is None:
        return None, ""
    noise = choice.noise if noise is None else noise
    try:
        result = _restore_one(module, exported, found, choice, noise)
    except (KeeperError, StoreError) as exc:
        failed = f"{found.label} could not be restored ({exc})"
    else:
        if result.preserved:
            return result, ""
        return _keep_better(module, exported, found, result, choice, noise, probe), ""
    # a checkpoint cloned from another trial that cannot be restored: the trial goes on from its own latest one
    try:
        own = trial.own_checkpoint_state(exclude=found.label)
    except CheckpointError:  # its own latest cannot be read either
        own = None
    if own is not None:
        try:
            result = _restore_one(module, exported, own, choice, noise,
                                  note=f"{failed}; the trial continues from its own {own.label}")
        except (KeeperError, StoreError) as exc:
            failed = f"{failed}; nor could its own {own.label} ({exc})"
        else:
            log.warning("keeper: %s; the trial continues from its own %s", failed, own.label)
            return result, ""
    log.warning("keeper: %s; the trial starts from the zoo instead", failed)
    return None, failed


def _keep_better(module: Any, exported: Exported, found: TrialCheckpoint, clone: WarmResult, choice: ParentChoice,
                 noise: float, probe: Any) -> WarmResult:
    """After a checkpoint of another architecture was carried into ``module`` without its function (``clone``:
    a population-based-training exploit into a narrower or shallower member), the better of it and the member's
    own latest checkpoint stays in ``module``, so an exploit never leaves a member worse than its own last
    checkpoint: with a ``probe``, the lower loss of the two; without one, the member's own checkpoint when it is of
    the module's architecture (its quality is known, the transformed clone's is not). ``reason`` says which: the
    comparison is made once both results exist, so its outcome is written into a new result (:func:`_decided`);
    neither of the two is changed."""
    own = trial.own_checkpoint_state(exclude=found.label)
    if own is None:
        return _decided(clone, f"{clone.reason}; the member has no checkpoint of its own to compare it with")
    if probe is None and not same_architecture(module, own.state):
        return _decided(clone, f"{clone.reason}; kept over the member's own {own.label}, which is another "
                               "architecture as well (pass probe= to warm_start to compare the two on data)")
    twin = copy.deepcopy(module)
    try:
        mine = _restore_one(twin, exported, own, choice, noise)
    except (KeeperError, StoreError) as exc:
        return _decided(clone, f"{clone.reason}; the member's own {own.label} could not be restored to compare "
                               f"({exc})")
    if probe is not None:
        judge = as_module_probe(probe)
        clone_loss, own_loss = judge(copy.deepcopy(module)), judge(copy.deepcopy(twin))
        if clone_loss < own_loss:
            return _decided(clone, f"{clone.reason}; kept over the member's own {own.label} (probe loss "
                                   f"{clone_loss:.4g} < {own_loss:.4g})")
        why = f"the probe's loss was no lower ({clone_loss:.4g} against {own_loss:.4g})"
    else:
        why = "its function was not kept and no probe= was given to compare the two on data"
    module.load_state_dict(twin.state_dict())
    log.warning("keeper: %s was not carried onto this architecture with its function; the member keeps its own %s",
                found.label, own.label)
    return _decided(mine, f"{clone.reason}, but {why}: the member keeps its own {own.label} ({mine.reason})")


def _decided(kept: WarmResult, reason: str) -> WarmResult:
    """``kept``, the result a comparison between a clone and the member's own checkpoint kept, with the
    comparison's ``reason``: a new result; ``kept`` stays as the warm path made it."""
    return dataclasses.replace(kept, reason=reason)


def _restore_one(module: Any, exported: Exported, found: TrialCheckpoint, choice: ParentChoice, noise: float,
                 note: str = "") -> WarmResult:
    """``found`` restored into ``module``, ``note`` first in the reason; KeeperError / StoreError when it cannot
    be."""
    template = found.template
    if template is None and choice.uri:  # a Ray Train worker's trial directory is not beside its checkpoint
        template = find_template(choice.uri, found.state)
    try:
        return restore(module, exported, found.state, template, found.label, noise, choice.seed, note)
    except KeeperError:
        # the template beside the checkpoint is its trial's latest architecture, which population-based
        # training may have changed since this checkpoint: the zoo's store keeps one per architecture
        stored = find_template(choice.uri, found.state) if choice.uri else None
        if stored is None or stored == template:
            raise
        return restore(module, exported, found.state, stored, found.label, noise, choice.seed, note)


def register(module: Any, example_input: Any, zoo: Any, accuracy: float, name: str | None = None, *,
             lineage: dict | None = None, config: Any = None) -> Any:
    """Register a trained ``module`` into a zoo (a :class:`keeper.Zoo`, or the service's handle): its graph and its
    weights apart (safetensors in the store), so no weight is serialised into ONNX and any size works.

    ``lineage``: ``WarmResult.lineage()`` of the warm start the module was trained from (see
    :meth:`keeper.Zoo.register`). ``config``: the service's config, for the exporter (``dynamo``) and the bound on
    the service's answer (``timeouts.register_s``), and, through the service, who registers (its ``team`` and
    ``secret_file``, else ``$KEEPER_TEAM`` / ``$KEEPER_SECRET``), as for :func:`warm_start`; a :class:`keeper.Zoo`
    registers as its own client. Returns the zoo's record (a dict through the service).

    Example:
        >>> keeper.register(model, torch.randn(1, 1, 40), keeper.Zoo("/tmp/zoo"), 0.91, name="net-a")  # doctest: +SKIP
    """
    cfg = load_config(config)
    exported = export_graph(module, example_for(module, example_input), dynamo=cfg.dynamo)
    weights = module_weights(module, exported)
    if _is_zoo(zoo):
        return zoo.register(exported.onnx, accuracy, name, weights=weights, lineage=lineage)
    ActorHandle, ServiceClient, _, remote = _service("register")  # noqa: N806 - classes, imported with Ray
    handle = zoo.handle if isinstance(zoo, ServiceClient) else zoo
    if not isinstance(handle, ActorHandle):
        raise KeeperError(f"register: zoo {zoo!r} is a {type(zoo).__name__}; pass a keeper.Zoo or the service's "
                          "handle (keeper.actors.start())")
    who = zoo.client if isinstance(zoo, ServiceClient) and zoo.client is not None else Client.from_config(cfg)
    ref = handle.register.remote(exported.onnx, float(accuracy), name, weights_bytes(weights), lineage,
                                 client=who.to_wire())
    return remote.get(ref, cfg.timeouts.register_s,
                      remote.Demand(f"registering model {name!r} (timeouts.register_s)", actor=handle))
