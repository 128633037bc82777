"""``KeeperCallback``: the driver-side half of the Tune integration.

It finds or starts the keeper service when the experiment starts, and registers every finished trial's trained
model with its best metric. The heavy part (reading the checkpoint, filling the architecture template, the
registration itself) runs in a zero-CPU Ray task, so the driver stays thin and no trial's CPU is needed.

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

import logging
import math
import re
import time
from typing import Any, Callable

import ray
from ray.tune import Callback

from keeper.actors.config import load_config
from keeper.actors.launcher import start
from keeper.actors.remote import Demand, get
from keeper.errors import ConfigError
from keeper.torch_support.export import export_graph
from keeper.torch_support.inputs import example_for
from keeper.tune_integration import advice
from keeper.tune_integration.checkpoint import register_trial

__all__ = ["KeeperCallback"]

logger = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


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
        wait_for_registration: finish registering a trial before Tune schedules the next one, so trials that
            start after it can inherit from it (True); False registers in the background.
        name_prefix: prefix of the zoo names (default: the experiment's directory name and ``-``); the
            trial id follows it.

    Attributes:
        outcomes: per trial id, what happened to it (``"registered as NAME"``, ``"recorded on NAME"`` for weights
            the zoo held already, ``"errored"``, ``"skipped: ..."``, ``"refused: ..."``).
        models: per registered trial id, the zoo model's name (the stored model's, for weights it held already).
        registration_s: per registered trial id, seconds from handing its checkpoint to the registration task to
            the zoo's record (the driver waits that long when ``wait_for_registration``).
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
        self._pending: dict[str, Any] = {}
        self._prepares: list[Any] = []
        self._handle: Any = None

    # ------------------------------------------------------------------------------------------------ Tune hooks
    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info) -> None:
        self._service()

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info) -> None:
        if self.model_builder is None:
            return
        self._prepares = [r for r in self._prepares if not _done(r)]
        self._prepares.append(ray.remote(_prepare).options(num_cpus=0).remote(
            self._service(), self.model_builder, dict(trial.config)))

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info) -> None:
        self._errored.add(trial.trial_id)
        self.outcomes[trial.trial_id] = "errored"

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info) -> None:
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
        name = self._name(trial)
        # retried when its worker or node dies: registration is idempotent by content, so a retry stores nothing twice
        ref = ray.remote(register_trial).options(num_cpus=0, max_retries=3).remote(
            self._service(), checkpoint, trial.storage.storage_filesystem, trial.storage.trial_fs_path, accuracy,
            name, self.model_builder, dict(trial.config), self.config.timeouts.register_s, self.config.zoo_uri)
        self._pending[tid] = (ref, name, time.perf_counter())
        if self.wait_for_registration:
            self._collect(wait=True, only=tid)

    def on_step_end(self, iteration: int, trials: list, **info) -> None:
        if self._pending:
            self._collect(wait=False)

    def on_experiment_end(self, trials: list, **info) -> None:
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

    def _service(self) -> Any:
        if self._handle is None:
            self._handle = start(self.config)
        return self._handle

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

    def _collect(self, wait: bool, only: str | None = None) -> None:
        for tid in [only] if only is not None else list(self._pending):
            ref, name, submitted = self._pending[tid]
            if not wait and not _done(ref):
                continue
            del self._pending[tid]
            try:
                record = get(ref, self.config.timeouts.register_s,
                             Demand(f"registering trial {tid} (timeouts.register_s)"))
            except Exception as exc:  # refused by admission, or a Ray failure: report it, never fail the experiment
                cause = getattr(exc, "cause", None) or exc
                self.outcomes[tid] = f"refused: {cause}"
                logger.warning("keeper: %s", advice.refused(tid, cause))
                continue
            self._registered.add(tid)
            stored = self.models[tid] = record.get("name", name)
            self.outcomes[tid] = f"registered as {stored}" if stored == name else f"recorded on {stored}"
            if stored != name:
                logger.info("keeper: %s", advice.recorded(tid, record))
            self.registration_s[tid] = time.perf_counter() - submitted


def _prepare(handle: Any, builder: Callable[[dict], tuple[Any, Any]], config: dict) -> None:
    """Build the trial's model from its config and ask for its parent, so the trial's own ask is a cache hit."""
    module, example = builder(config)
    handle.choose.remote(export_graph(module, example_for(module, example)).graph.to_arrays())


def _done(ref: Any) -> bool:
    ready, _ = ray.wait([ref], timeout=0)
    return bool(ready)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
