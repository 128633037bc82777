"""``KeeperCallback``: the driver-side half of the Tune integration.

It finds or starts the keeper service, and registers every finished trial's trained model with its best metric
and its learning curve (what :mod:`keeper.choice.inheritance` reads to decide what later trials inherit). The
service starts with the experiment when the zoo holds models; on an empty zoo it starts when the first trial ends,
the first time there is a model to register, so nothing of keeper's competes with the first trials (their
``warm_start`` finds the zoo empty without it). Tune's loop never waits for the service: not for its boot (a trial
that Tune holds at its report while the loop waits would lose that time), not for a registration. The heavy part
of a registration (reading the checkpoint, filling the architecture template) runs in a thread of the driver, where
torch is loaded already, so no process of keeper's imports it again. A trial that starts after another ended can
still inherit from it: the driver notes each registration, and each search's best cold first report, in Ray's
key-value store (:mod:`keeper.actors.notices`) before Tune starts the next trial, and a parent choice reads them and
waits for the registrations noted before it (in the trial, at most ``timeouts.arrival_s``).

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
- A trial started from its parent's function whose first report falls far below the parent's accuracy gets one
  warning naming both figures and the fix in the trainable (its learning rate undid the warm start).

Example::

    tuner = tune.Tuner(trainable, param_space=space,
                       tune_config=tune.TuneConfig(metric="accuracy", mode="max"),
                       run_config=tune.RunConfig(callbacks=[KeeperCallback(metric="accuracy", mode="max")]))
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import math
import re
import time
from typing import Any, Callable, NamedTuple

import ray
from ray.tune import Callback

from keeper.actors import notices
from keeper.actors.config import load_config
from keeper.teams import Client
from keeper.actors.launcher import find, start
from keeper.actors.remote import demand_of, get
from keeper.choice.inheritance import training_of
from keeper.errors import ConfigError
from keeper.store import store_for, zoo_is_empty
from keeper.tune_integration import advice
from keeper.tune_integration.checkpoint import trial_lineage

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
            ``zoo="/data/zoo"``, or ``team="vision"`` (the team the trials' models belong to; its secret from
            ``secret_file=`` or ``$KEEPER_SECRET`` / ``$KEEPER_SECRET_FILE``; default ``$KEEPER_TEAM``). Trainables
            pass the same ``config`` to ``warm_start`` when it is not the default.
        model_builder: optional ``fn(trial_config) -> (module, example_input)``. With it, keeper can register
            checkpoints of trials that never called ``warm_start``.
        wait_for_registration: a trial's parent choice waits for the registrations of the trials that ended
            before it started (at most ``timeouts.arrival_s``), so it can inherit from them (True); False never
            waits. Either way the driver waits for neither the registration nor the service (the announcement
            is one write to Ray's key-value store).
        name_prefix: prefix of the zoo names (default: the experiment's directory name and ``-``); the
            trial id follows it.

    Attributes:
        outcomes: per trial id, what happened to it (``"registered as NAME"``, ``"recorded on NAME"`` for weights
            the zoo held already, ``"errored"``, ``"skipped: ..."``, ``"refused: ..."``).
        models: per registered trial id, the zoo model's name (the stored model's, for weights it held already).
        registration_s: per registered trial id, seconds from handing its checkpoint over to the driver seeing
            the zoo's record (an upper bound: the driver looks between Tune's steps).
        registration_cpu_s: per registered trial id, CPU seconds the driver's registration thread spent on it
            (reading the checkpoint, filling the template; the zoo's own work is the service's).
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
        # who registers: the config's team (KeeperCallback(team=...)) and secret file, else $KEEPER_TEAM...
        self.client = Client.from_config(self.config)
        self.model_builder = model_builder
        self.wait_for_registration = wait_for_registration
        self.name_prefix = name_prefix
        self.outcomes: dict[str, str] = {}
        self.models: dict[str, str] = {}
        self.registration_s: dict[str, float] = {}
        self.registration_cpu_s: dict[str, float] = {}
        self._registered: set[str] = set()
        self._errored: set[str] = set()
        self._curves: dict[str, list[float]] = {}
        self._checked_start: set[str] = set()
        self._cold_first: dict[str, float] = {}  # per search, the best first report of its trials started cold
        self._started_cold: dict[str, bool] = {}  # per trial, whether it started from its own initialisation
        self._cold_sent: dict[str, float] = {}  # what the notices say of it
        self._pending: dict[str, _Pending] = {}
        self._handle: Any = None
        self._starting: tuple[Any, float] | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.hook_s = 0.0

    # ------------------------------------------------------------------------------------------------ Tune hooks
    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info) -> None:
        with self._clock():
            self._handle = find(self.config)
            if self._handle is not None:  # a running service (`keeper serve`, an earlier search): use it
                return
            if zoo_is_empty(self.config.zoo_uri):
                # nothing for the first trials to inherit: they find the zoo empty on their own, and the service
                # boots at the first registration (_service), when the ended trial leaves a core, not beside the
                # first trials (every process it boots takes CPU from them, and on a search whose first trials
                # hold its best, delays that best by as much)
                return
            self._launch()

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info) -> None:
        with self._clock():
            value = result.get(self.metric)
            if _finite(value):
                self._curves.setdefault(trial.trial_id, []).append(self._accuracy(float(value)))
            if trial.trial_id not in self._checked_start:
                self._checked_start.add(trial.trial_id)
                self._check_first_report(trial, result)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info) -> None:
        self._errored.add(trial.trial_id)
        self.outcomes[trial.trial_id] = "errored"

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info) -> None:
        with self._clock():
            self._submit(trial)

    def on_step_end(self, iteration: int, trials: list, **info) -> None:
        if self._cold_first != self._cold_sent:  # a note that failed, or a search restored with its bars
            with self._clock():
                self._send_cold_starts()
        if self._starting is not None:
            with self._clock():
                self._check_started()
        if self._pending:
            with self._clock():
                self._collect(wait=False)

    def on_experiment_end(self, trials: list, **info) -> None:
        with self._clock():
            self._collect(wait=True)
            if self._pool is not None:
                self._pool.shutdown(wait=False)
            for search in self._cold_sent:
                with contextlib.suppress(Exception):  # a bar left behind is only read by a search of that name
                    notices.clear_cold_bar(self.config.name, self.config.namespace, search)

    def get_state(self) -> dict | None:
        return {"registered": sorted(self._registered), "pending": sorted(self._pending),
                "errored": sorted(self._errored), "outcomes": dict(self.outcomes), "models": dict(self.models),
                "curves": {tid: list(v) for tid, v in self._curves.items()}, "cold_first": dict(self._cold_first),
                "started_cold": dict(self._started_cold)}

    def set_state(self, state: dict) -> None:
        self._registered = set(state.get("registered", ()))
        self._errored = set(state.get("errored", ()))
        self.outcomes = dict(state.get("outcomes", {}))
        self.models = dict(state.get("models", {}))
        self._curves = {str(k): [float(x) for x in v] for k, v in dict(state.get("curves", {})).items()}
        self._cold_first = {str(k): float(v) for k, v in dict(state.get("cold_first", {})).items()}
        self._started_cold = {str(k): bool(v) for k, v in dict(state.get("started_cold", {})).items()}
        # a registration the driver had not seen settle before it stopped is handed over again when its trial
        # is seen finished (registration is idempotent by content: nothing is stored twice)
        self._resubmit = set(state.get("pending", ()))

    def on_step_begin(self, iteration: int, trials: list, **info) -> None:
        if getattr(self, "_resubmit", None):
            with self._clock():
                for trial in trials:
                    if trial.trial_id in self._resubmit and trial.status == "TERMINATED":
                        self._resubmit.discard(trial.trial_id)
                        if not self._landed(trial):
                            self._submit(trial)

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

    def _launch(self) -> None:
        """Start the service without waiting (its first answer is checked between Tune's steps, so a service that
        cannot start still ends the experiment)."""
        self._handle = start(self.config, wait=False)
        self._starting = (self._handle.ping.remote(), time.monotonic())

    def _service(self) -> Any:
        """The service's handle, started now if it is not yet (a deferred start: the first registration)."""
        if self._handle is None:
            self._launch()
        return self._handle

    def _thread(self) -> concurrent.futures.ThreadPoolExecutor:
        """The driver's one thread for keeper's work that Tune's loop must not wait for (registrations)."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="keeper-register")
        return self._pool

    def _accuracy(self, value: float) -> float:
        return float(self.score_fn(value)) if self.score_fn is not None else value

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

    def _check_first_report(self, trial: Any, result: dict) -> None:
        """A trial's first report: one warning when it started from its parent's whole function and reports far
        below it; when it started cold, its search's best cold first report (the bar a parent must pass for later
        trials of the search to inherit from it, :mod:`keeper.choice.inheritance`)."""
        value = result.get(self.metric)
        if not _finite(value):
            return
        accuracy = self._accuracy(float(value))
        lineage = trial_lineage(trial)
        cold = not (lineage or {}).get("parent")
        self._started_cold[trial.trial_id] = cold
        if cold and math.isfinite(accuracy):
            search = str(trial.storage.experiment_dir_name)
            self._cold_first[search] = max(accuracy, self._cold_first.get(search, -math.inf))
            self._send_cold_starts()
        why = advice.lost_inheritance(trial.trial_id, lineage, accuracy, self.metric)
        if why is not None:
            logger.warning("keeper: %s", why)

    def _send_cold_starts(self) -> None:
        """Note each search's best cold first report where the front door reads it (a note that fails only lets a
        later trial inherit a weaker parent, as without the rule; it is tried again between Tune's steps)."""
        for search, accuracy in self._cold_first.items():
            if self._cold_sent.get(search) != accuracy:
                try:
                    notices.set_cold_bar(self.config.name, self.config.namespace, search, accuracy)
                except Exception as exc:
                    logger.warning("keeper: search %s's best cold first report could not be noted (%s)", search, exc)
                    continue
                self._cold_sent[search] = accuracy

    def _submit(self, trial: Any) -> None:
        """Hand a finished trial's best checkpoint over for registration (announced to the front door first)."""
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
        accuracy = self._accuracy(value)
        why = advice.out_of_range(tid, self.metric, value, accuracy, self.score_fn is not None, last)
        if why is not None:
            self.outcomes[tid] = f"skipped: {self.metric!r} outside [0, 1]"
            logger.warning("keeper: %s", why)
            return
        name = self._name(trial)
        training = training_of(self._curves.get(tid, ()), str(trial.storage.experiment_dir_name),
                               self._started_cold.get(tid)).as_dict()
        handle = self._service()
        key = self._announce(name) if self.wait_for_registration else None
        future = self._thread().submit(_register, handle, name, checkpoint, trial.storage.storage_filesystem,
                                   trial.storage.trial_fs_path, accuracy, self.model_builder, dict(trial.config),
                                   self.config.timeouts.register_s, self.config.zoo_uri, training,
                                   self.client.to_wire(), key, self.config.namespace)
        self._pending[tid] = _Pending(future, name, time.perf_counter())

    def _announce(self, name: str) -> bytes | None:
        """Note ``name``'s registration before Tune starts another trial (which may wait for it); the key that
        settles it, or None when the note failed (that trial then does not wait for it)."""
        try:
            return notices.announce(self.config.name, self.config.namespace, name)
        except Exception as exc:  # never fail the experiment here; the registration reports its own failure
            logger.warning("keeper: the registration of %s could not be announced (%s); a trial starting now will "
                           "not wait for it", name, exc)
            return None

    def _landed(self, trial: Any) -> bool:
        """Whether a registration handed over before a restore reached the zoo after the state was saved (its
        record is then taken in, not sent again); False where the zoo cannot say."""
        name = self._name(trial)
        try:
            record = store_for(self.config.zoo_uri).record(name)  # a name not cached is looked up in the files
        except Exception:  # not there, or the zoo unreadable from here: hand it over again (idempotent by content)
            return False
        self._registered.add(trial.trial_id)
        self.models[trial.trial_id] = record.name
        self.outcomes[trial.trial_id] = f"registered as {record.name}"
        return True

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
        for tid in [t for t, p in self._pending.items() if wait or p.future.done()]:
            entry = self._pending.pop(tid)
            try:
                record, cpu_s = entry.future.result(timeout=self.config.timeouts.register_s if wait else 0)
            except concurrent.futures.TimeoutError:
                self.outcomes[tid] = (f"refused: registering trial {tid} as {entry.name} did not finish within "
                                      f"timeouts.register_s ({self.config.timeouts.register_s:g} s)")
                logger.warning("keeper: %s", self.outcomes[tid])
                continue
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
            self.registration_cpu_s[tid] = cpu_s


class _Pending(NamedTuple):
    """A registration handed to the driver's registration thread and not yet taken in: its future, the zoo name,
    when it was handed over."""

    future: concurrent.futures.Future
    name: str
    submitted: float


def _register(handle: Any, name: str, checkpoint: Any, storage_fs: Any, trial_fs_path: str, accuracy: float,
              builder: Any, config: dict, timeout_s: float, zoo_uri: str | None, training: dict,
              client: dict | None, key: bytes | None, namespace: str) -> tuple[dict, float]:
    """The trial's checkpoint registered as ``name`` (in the driver's registration thread): the zoo's record and
    the thread's CPU seconds; the announcement under ``key`` is withdrawn and ``name`` settled at the front door
    whatever happens, so no parent choice waits for it longer than it runs."""
    from keeper.tune_integration.checkpoint import register_trial

    t0 = time.thread_time()
    try:
        record = register_trial(handle, checkpoint, storage_fs, trial_fs_path, accuracy, name, builder, config,
                                timeout_s, zoo_uri, training=training, client=client)
    finally:
        if key is not None:
            with contextlib.suppress(Exception):  # the front door forgets it after timeouts.register_s anyway
                notices.withdraw(key, namespace)
            handle.settled.remote(name)
    return record, time.thread_time() - t0


def _done(ref: Any) -> bool:
    ready, _ = ray.wait([ref], timeout=0)
    return bool(ready)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
