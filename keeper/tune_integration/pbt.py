"""``KeeperPBT``: Tune's population-based training across architectures.

Tune's ``PopulationBasedTraining`` clones a strong trial's checkpoint into a weak trial and perturbs its
hyperparameters; it assumes one architecture, and a trial whose width or depth differs fails to load the clone's
``state_dict``. With keeper the trainable's one ``warm_start(model, example_input)`` line restores whatever
checkpoint the trial starts from (:mod:`keeper.torch_support.restore`): the trial's own architecture exactly, any
other by keeper's function-preserving transforms. ``KeeperPBT`` adds what the scheduler must know about
architectures:

* ``architecture_keys``: the config keys that define the model (``width``, ``depth``...); a key in a nested
  config is its path joined by ``/`` as Tune writes it (``"model/width"``), and a bare key missing from the top
  level is looked up in ``train_loop_config`` (a Ray Train trainer handed to the Tuner). With
  ``keep_architecture=True`` (the default) an exploiting trial keeps its own values of them and inherits only the
  clone's function, so the population keeps its architectures; with False it takes the clone's, as Tune's PBT
  does; either way a key in ``hyperparam_mutations`` may mutate.
* An exploit never throws the clone's training away: keeper carries a clone's function exactly onto a member that
  grows from it (wider, deeper), but not onto a narrower or shallower one (a width-24 clone shrunk into a width-8
  member started at chance in a held-out run). So when the member's architecture after the exploit is not a
  growth of the clone's, the member takes the clone's architecture for that exploit, as Tune's PBT does, and
  inherits its weights exactly (logged). ``grows(clone_arch, member_arch)`` decides it, over the dicts of
  architecture key -> value; the default: every key equal, or a number no smaller than the clone's.
* ``validate(config)``: raises (any exception, its message naming what is wrong) for a config whose architecture
  cannot be built. The values listed in ``hyperparam_mutations`` for architecture keys are checked at
  construction, each in ``base_config`` when given; every explored config is checked before its trial runs, redrawn
  up to :attr:`KeeperPBT.MAX_REDRAWS` times, and otherwise the trial's own architecture is kept (logged).

Everything else is Tune's PBT (same arguments, same behaviour, except that in synchronous mode a trial that errs no
longer leaves the rest of the population paused forever); a same-architecture exploit stays a plain copy.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Callable

from ray.tune.schedulers import PopulationBasedTraining

from keeper.errors import ConfigError

__all__ = ["KeeperPBT", "grows_from"]

log = logging.getLogger(__name__)


class KeeperPBT(PopulationBasedTraining):
    """Population-based training whose exploit step may cross architectures (see the module docstring).

    Example:
        >>> pbt = KeeperPBT(metric="accuracy", mode="max", perturbation_interval=2,          # doctest: +SKIP
        ...                 hyperparam_mutations={"lr": tune.loguniform(1e-4, 1e-1), "width": [16, 32, 64]},
        ...                 architecture_keys=("width", "depth"))
        >>> tune.Tuner(trainable, tune_config=tune.TuneConfig(scheduler=pbt, num_samples=4,  # doctest: +SKIP
        ...                                                   reuse_actors=True))
    """

    #: explored configs tried before an exploiting trial keeps its own architecture
    MAX_REDRAWS = 10

    def __init__(self, *args: Any, architecture_keys: tuple[str, ...] | list[str] = (),
                 keep_architecture: bool = True, validate: Callable[[dict], Any] | None = None,
                 base_config: dict | None = None, grows: Callable[[dict, dict], bool] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if isinstance(architecture_keys, str):
            architecture_keys = (architecture_keys,)
        self.architecture_keys = tuple(architecture_keys)
        self.keep_architecture = bool(keep_architecture)
        self.validate = validate
        self.grows = grows or grows_from
        #: exploits whose member took the clone's architecture because it would not grow from it
        self.took_clone_architecture = 0
        self._check_listed(kwargs.get("hyperparam_mutations") or {}, base_config or {})

    def _check_listed(self, mutations: dict, base: dict) -> None:
        """Every listed value of an architecture key must pass ``validate`` (in ``base``)."""
        if self.validate is None:
            return
        for key in self.architecture_keys:
            path = _path(mutations, key)
            values = _get(mutations, path)
            if not isinstance(values, (list, tuple)):
                continue
            for value in values:
                config = copy.deepcopy(base)
                _set(config, path, value)
                why = self._invalid(config)
                if why is not None:
                    raise ConfigError(f"KeeperPBT: hyperparam_mutations[{key!r}] lists {value!r}, whose architecture "
                                      f"is invalid ({why}); remove the value or fix validate")

    def _invalid(self, config: dict) -> str | None:
        try:
            self.validate(config)
        except Exception as exc:  # noqa: BLE001 - validate is the user's: any exception means invalid
            return f"{type(exc).__name__}: {exc}"
        return None

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        trial = super().choose_trial_to_run(tune_controller)
        if trial is None and self._synch and self._stalled(tune_controller):
            trial = super().choose_trial_to_run(tune_controller)
        return trial

    def _stalled(self, tune_controller: Any) -> bool:
        """In synchronous mode a trial waits, paused, until every live trial reaches the next perturbation point;
        a trial that errs never does, and Tune's PBT then leaves the others paused forever (the experiment hangs).
        When nothing runs and every waiting trial is at the point, it moves on so they resume (that round's exploit
        is skipped; ``Tuner.restore(..., resume_errored=True)`` brings the errored trial back). True when moved."""
        from ray.tune.experiment import Trial

        trials = tune_controller.get_trials()
        waiting = [t for t in trials if t.status in (Trial.PAUSED, Trial.PENDING) and t in self._trial_state]
        if not waiting or any(t.status == Trial.RUNNING for t in trials):
            return False
        times = [self._trial_state[t].last_train_time for t in waiting]
        if min(times) < self._next_perturbation_sync:
            return False
        log.warning("KeeperPBT: the population waits at time %s for trials that will not report (errored); it "
                    "resumes without that round's exploit", self._next_perturbation_sync)
        self._next_perturbation_sync = max(self._next_perturbation_sync + self._perturbation_interval, max(times))
        return True

    def _get_new_config(self, trial: Any, trial_to_clone: Any) -> tuple[dict, dict]:
        why = None
        for _ in range(self.MAX_REDRAWS):
            config, operations = super()._get_new_config(trial, trial_to_clone)
            if self.keep_architecture:
                for key in self.architecture_keys:
                    path = _path(trial.config, key)
                    if _get(trial.config, path) is not _MISSING and _get(operations, path) is _MISSING:
                        _set(config, path, copy.deepcopy(_get(trial.config, path)))
            self._grow_or_copy(trial, trial_to_clone, config, operations)
            why = self._invalid(config) if self.validate is not None else None
            if why is None:
                return config, operations
        own = self.grows(self._architecture(trial_to_clone.config), self._architecture(trial.config))
        log.warning("KeeperPBT: %d explored configs of trial %s had invalid architectures (last: %s); it keeps %s",
                    self.MAX_REDRAWS, trial, why, "its own architecture" if own else "the clone's architecture")
        source = trial.config if own else trial_to_clone.config
        for key in self.architecture_keys:
            path = _path(source, key)
            if _get(source, path) is not _MISSING:
                _set(config, path, copy.deepcopy(_get(source, path)))
            _drop(operations, path)
        return config, operations


    def _architecture(self, config: dict) -> dict[str, Any]:
        return {key: _get(config, _path(config, key)) for key in self.architecture_keys}

    def _grow_or_copy(self, trial: Any, clone: Any, config: dict, operations: dict) -> None:
        """The member keeps (or mutates to) an architecture only when it grows from the clone's; else it takes the
        clone's, so the exploit inherits the clone's function exactly (see the module docstring)."""
        theirs, mine = self._architecture(clone.config), self._architecture(config)
        if not self.architecture_keys or self.grows(theirs, mine):
            return
        for key in self.architecture_keys:
            path = _path(clone.config, key)
            if theirs[key] is not _MISSING:
                _set(config, path, copy.deepcopy(theirs[key]))
                _drop(operations, path)
        self.took_clone_architecture += 1
        log.info("KeeperPBT: trial %s does not grow from %s's architecture (%s -> %s), so it takes that architecture "
                 "for this exploit and inherits the clone exactly", trial, clone, _shown(theirs), _shown(mine))


def grows_from(parent: dict[str, Any], child: dict[str, Any]) -> bool:
    """Whether architecture ``child`` grows from ``parent`` (dicts of architecture key -> value): every key equal,
    or a number (not a bool) no smaller than the parent's. A key missing on either side counts as equal only when
    missing on both."""
    for key in set(parent) | set(child):
        a, b = parent.get(key, _MISSING), child.get(key, _MISSING)
        if a == b:
            continue
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
        if not numbers or b < a:
            return False
    return True


def _shown(arch: dict[str, Any]) -> str:
    return ", ".join(f"{k}={'?' if v is _MISSING else v}" for k, v in arch.items())


_MISSING = object()
#: where a Ray Train trainer handed to the Tuner keeps its train loop's config
_TRAIN_LOOP = "train_loop_config"


def _path(config: dict, key: str) -> tuple[str, ...]:
    """The path of architecture key ``key`` in ``config`` (see the module docstring)."""
    if "/" in key:
        return tuple(key.split("/"))
    if key not in config and isinstance(config.get(_TRAIN_LOOP), dict) and key in config[_TRAIN_LOOP]:
        return (_TRAIN_LOOP, key)
    return (key,)


def _get(config: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(config, dict) or part not in config:
            return _MISSING
        config = config[part]
    return config


def _set(config: dict, path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        config = config.setdefault(part, {})
    config[path[-1]] = value


def _drop(config: dict, path: tuple[str, ...]) -> None:
    parent = _get(config, path[:-1])
    if isinstance(parent, dict):
        parent.pop(path[-1], None)
