"""``KeeperCallback``: the driver-side half of the Tune integration.

It finds or starts the keeper service when the experiment starts, and registers every finished trial's trained
model with its best metric. The heavy part (reading the checkpoint, filling the architecture template, the
registration itself) runs in the service's registrar (:mod:`keeper.tune_integration.registrar`, one zero-CPU
process started with the experiment), and the driver never waits for it: Tune schedules the next trial as it would
without keeper. A trial that starts after another ended can still inherit from it: the driver announces each
registration to the front door, and a parent choice waits for the registrations announced before it (in the
trial, at most ``timeouts.arrival_s``).

Invariants:
- A trial is registered at most once, across ``Tuner.restore`` too (the registered set is the callback's
  state, saved with the experiment); registration is also idempotent in the zoo (same content, one model).
- Errored trials are never registered; trials stopped early by a scheduler (ASHA, a stopper) are registered
  with their metric and left to the zoo's admission rules.
- A trial that reported no checkpoint is skipped with a warning that says how to report one (for the Hugging Face
  Trainer: which ``save_strategy`` to set); every warning names what to change in the Tune code
  (:mod:`keeper.tune_integration.advice`).
- A trial whose weights are already in the zoo (a search repeated with the same seeds) is that model: it is
  recorded on it (the better accuracy kept, the registration counted), never refused for it.

Example::

    tuner = tune.Tuner(trainable, param_space=space,
                       tune_config=tune.TuneConfig(metric="accuracy", mode="max"),
                       run_config=tune.RunConfig(callbacks=[KeeperCallback(metric="accuracy", mode="max")]))
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import time
from typing import Any, Callable, NamedTuple

import ray
from ray.tune import Callback

from keeper.actors.config import load_config
from keeper.actors.launcher import launch_registrar, start
from keeper.actors.remote import Demand, demand_of, get
from keeper.errors import ConfigError
from keeper.tune_integration import advice

__all__ = ["KeeperCallback"]

logger = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class _Pending(NamedTuple):
    """A registration handed to the registrar and not yet back: its reference, the zoo name, when it was handed."""

    ref: Any
    name: str
    submitted: float


class KeeperCallback(Callback):
    """Registers finished Tune trials into the keeper zoo, and lets trials warm-start from it.

    Args:
        metric: the reported metric that measures a trial's model (e.g. ``"accuracy"``).
        mode: ``"max"`` or ``"min"``.
        score_fn: maps the metric to the zoo's accuracy in [0, 1]; needed when mode is ``"min"`` (e.g.
            ``lambda loss: math.exp(-loss)``). Default: the metric itself.
        config: the service's config (YAML path, mapping or ServiceConfig); ``**overrides`` on top, e.g.
            ``zoo="/data/zoo"``. Trainables pass the same ``config`` to ``warm_start`` when it is not the default.
        model_builder: optional ``fn(trial_config) -> (module, example_input)``. With it, keeper prepares each
            trial's match while the trial starts, and can register checkpoints of trials that never called
            ``warm_start``.
        wait_for_registration: a trial's parent choice waits for the registrations of the trials that ended
            before it started (at most ``timeouts.arrival_s``), so it can inherit from them (True); False never
            waits. Either way the driver does not wait: registration runs in the registrar.
        name_prefix: prefix of the zoo names (default: the experiment's directory name and ``-``); the
            trial id follows it.

    Attributes:
        outcomes: per trial id, what happened to it (``"registered as NAME"``, ``"recorded on NAME"`` for weights
            the zoo held already, ``"errored"``, ``"skipped: ..."``, ``"refused: ..."``).
        models: per registered trial id, the zoo model's name (the stored model's, for weights it held already).
        registration_s: per registered trial id, seconds from handing its checkpoint to the registrar to the
            driver seeing the zoo's record (an upper bound: the driver looks between Tune's steps).
        hook_s: seconds the driver spent in this callback's hooks, all told (what keeper adds to Tune's loop).
    """

    def __init__(self, metric: str, mode: str = "max", *, score_fn: Callable[[float], float] | None = None,
                 config: Any = None, model_builder: Callable[[dict], tuple[Any, Any]] | None = None,
                 wait_for_registration: bool = True, name_prefix: str | None = None, **overrides: Any):
        if mode not in ("max", "min"):
            raise ConfigError(f"KeeperCallback: mode must be 'max' or 'min', got {mode!r}")
        if mode == "min" and score_fn is None:
            raise ConfigError(f"KeeperCallback: metric {metric!r} is minimized, so pass score_fn mapping it to an "
                              "accuracy in [0, 1], e.g. score_fn=lambda loss: math.exp(-loss)")
        self.metric, self.mode = metric, mode
        self.score_fn = score_fn
        self.config = load_config(config, **overrides)  # checked now, on the driver, not in a trial
        self.model_builder = model_builder
        self.wait_for_registration = wait_for_registration
        self.name_prefix = name_prefix
        self.outcomes: dict[str, str] = {}
        self.models: dict[str, str] = {}
        self.registration_s: dict[str, float] = {}
        self._registered: set[str] = set()
        self._errored: set[str] = set()
        self._pending: dict[str, _Pending] = {}
        self._prepares: list[Any] = []
        self._handle: Any = None
        self._registrar: Any = None
        self._starting: tuple[Any, float] | None = None
        self.hook_s = 0.0

    # ------------------------------------------------------------------------------------------------ Tune hooks
    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info) -> None:
        with self._clock():
            # the service starts while the first trials do (their first asks queue until it answers); its first
            # answer is checked between Tune's steps, so a service that cannot start still ends the experiment
            self._handle = start(self.config, wait=False)
            self._starting = (self._handle.ping.remote(), time.monotonic())
            self._registrar_handle()  # started now: its imports overlap the first trials, not their registration

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info) -> None:
        if self.model_builder is None:
            return
        with self._clock():
            self._prepares = [r for r in self._prepares if not _done(r)]
            self._prepares.append(self._registrar_handle().prepare.remote(self._service(), self.model_builder,
                                                                           dict(trial.config)))

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info) -> None:
        self._errored.add(trial.trial_id)
        self.outcomes[trial.trial_id] = "errored"

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info) -> None:
        with self._clock():
            self._submit(trial)

    def on_step_end(self, iteration: int, trials: list, **info) -> None:
        if self._starting is not None:
            with self._clock():
                self._check_started()
        if self._pending:
            with self._clock():
                self._collect(wait=False)

    def on_experiment_end(self, trials: list, **info) -> None:
        with self._clock():
            self._collect(wait=True)

    def get_state(self) -> dict | None:
        # a pending registration completes in the service whatever the driver does next
        return {"registered": sorted(self._registered | set(self._pending)), "errored": sorted(self._errored),
                "outcomes": dict(self.outcomes), "models": dict(self.models)}

    def set_state(self, state: dict) -> None:
        self._registered = set(state.get("registered", ()))
        self._errored = set(state.get("errored", ()))
        self.outcomes = dict(state.get("outcomes", {}))
        self.models = dict(state.get("models", {}))

    # ------------------------------------------------------------------------------------------------- helpers
    @property
    def registered(self) -> set[str]:
        """Ids of the trials whose models reached the zoo."""
        return set(self._registered)

    @contextlib.contextmanager
    def _clock(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.hook_s += time.perf_counter() - t0

    def _service(self) -> Any:
        if self._handle is None:
            self._handle = start(self.config)
        return self._handle

    def _check_started(self) -> None:
        """The service's first answer, once it is back (raises the service's failure); ServiceError past
        ``timeouts.start_s`` without one."""
        ref, since = self._starting
        waited = time.monotonic() - since
        if not _done(ref) and waited < self.config.timeouts.start_s:
            return
        self._starting = None
        get(ref, max(0.0, self.config.timeouts.start_s - waited),
            demand_of(f"the keeper service {self.config.name!r} answering its first ping (timeouts.start_s; zoo "
                      f"{self.config.zoo_uri!r})", "keeper", self.config.actor_options("keeper"), self._handle))

    def _registrar_handle(self) -> Any:
        if self._registrar is None:
            self._registrar = launch_registrar(self.config)
        return self._registrar

    def _submit(self, trial: Any) -> None:
        """Hand a finished trial's best checkpoint to the registrar (announced to the front door first); no wait."""
        tid = trial.trial_id
        if tid in self._registered or tid in self._pending or tid in self._errored:
            return
        checkpoint, value = self._best(trial)
        last = dict(trial.last_result or {})
        if checkpoint is None:
            self.outcomes[tid] = "skipped: no checkpoint"
            logger.warning("keeper: %s", advice.no_checkpoint(tid, last))
            return
        if value is None:
            self.outcomes[tid] = f"skipped: no {self.metric!r} reported"
            logger.warning("keeper: %s", advice.no_metric(tid, self.metric, last))
            return
        accuracy = float(self.score_fn(value)) if self.score_fn is not None else float(value)
        why = advice.out_of_range(tid, self.metric, value, accuracy, self.score_fn is not None, last)
        if why is not None:
            self.outcomes[tid] = f"skipped: {self.metric!r} outside [0, 1]"
            logger.warning("keeper: %s", why)
            return
        self._hand_over(tid, trial, checkpoint, accuracy, self._name(trial))

    def _hand_over(self, tid: str, trial: Any, checkpoint: Any, accuracy: float, name: str) -> None:
        """Announce ``name`` to the front door and hand the checkpoint to the registrar; no wait."""
        handle = self._service()
        if self.wait_for_registration:
            handle.expect.remote(name)  # before the next trial asks: actor calls arrive in milliseconds
        # retried on the registrar's restart: registration is idempotent by content, so a retry stores nothing twice
        ref = self._registrar_handle().register.remote(
            handle, name, checkpoint, trial.storage.storage_filesystem, trial.storage.trial_fs_path, accuracy,
            self.model_builder, dict(trial.config), self.config.timeouts.register_s, self.config.zoo_uri)
        self._pending[tid] = _Pending(ref, name, time.perf_counter())

    def _best(self, trial: Any) -> tuple[Any, float | None]:
        """The trial's checkpoint with the best metric among those Tune kept, and that metric."""
        results = []
        try:
            results = list(trial.run_metadata.checkpoint_manager.best_checkpoint_results)
        except AttributeError:  # Tune internals moved: fall back to the latest checkpoint below
            pass
        sign = 1.0 if self.mode == "max" else -1.0
        scored = [(float(r.metrics[self.metric]), r.checkpoint) for r in results
                  if _finite(r.metrics.get(self.metric)) and r.checkpoint is not None]
        if scored:
            value, ckpt = max(scored, key=lambda vc: sign * vc[0])
            return ckpt, value
        value = (trial.last_result or {}).get(self.metric)
        return trial.checkpoint, (float(value) if _finite(value) else None)

    def _name(self, trial: Any) -> str:
        prefix = self.name_prefix
        if prefix is None:
            prefix = _UNSAFE.sub("-", str(trial.storage.experiment_dir_name)).strip(".-") + "-"
        return (prefix + trial.trial_id)[-128:].lstrip(".")

    def _collect(self, wait: bool) -> None:
        """Take in the registrations that are back (``wait``: all of them, each within ``timeouts.register_s``)."""
        refs = {tid: entry.ref for tid, entry in self._pending.items()}
        if not wait and refs:  # one look at all of them: the driver's loop must stay cheap
            ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=0)
            refs = {tid: ref for tid, ref in refs.items() if ref in ready}
        for tid in refs:
            entry = self._pending.pop(tid)
            try:
                record = get(entry.ref, self.config.timeouts.register_s,
                             Demand(f"registering trial {tid} as {entry.name} (timeouts.register_s)"))
            except Exception as exc:  # refused by admission, or a Ray failure: report it, never fail the experiment
                cause = getattr(exc, "cause", None) or exc
                self.outcomes[tid] = f"refused: {cause}"
                logger.warning("keeper: %s", advice.refused(tid, cause))
                continue
            self._registered.add(tid)
            stored = self.models[tid] = record.get("name", entry.name)
            self.outcomes[tid] = f"registered as {stored}" if stored == entry.name else f"recorded on {stored}"
            if stored != entry.name:
                logger.info("keeper: %s", advice.recorded(tid, record))
            self.registration_s[tid] = time.perf_counter() - entry.submitted


def _done(ref: Any) -> bool:
    ready, _ = ray.wait([ref], timeout=0)
    return bool(ready)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
