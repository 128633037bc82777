"""``KeeperASHA``: Tune's asynchronous successive halving with warmed trials compared only with warmed ones: a
scheduler the search benchmark measures against Tune's ASHA (its ``keeperasha`` arm), not part of keeper.

ASHA compares trials at equal training time: at each rung a trial continues only if its metric is in the top
``1 / reduction_factor`` of those recorded there. A trial that keeper warmed is not at the start of its training
at its first rung: it reports its parent's function plus a rung of its own training. Beside trials trained from
scratch it raises every rung's cutoff, so the configurations that train best from scratch are stopped at their
first rung by trials that are ahead only by their parents' training (measured on a converging search: the cold
search's best configuration, cold in both searches, cut at its first rung in the search with keeper).

``KeeperASHA`` keeps two sets of rungs, one for the trials that started from their own initialisation and one for
the trials that started from a parent (the lineage ``warm_start`` leaves in the trial's directory, read at the
trial's first result), and compares each trial only with trials of its own kind. Each kind is halved at the rate
ASHA halves a whole search, so a search with keeper trains as many trials past each rung as one without it, and
its cold trials meet the cutoffs they would meet without keeper. A trial whose directory holds no lineage (no
``warm_start`` line, or a trainable outside keeper) counts as cold.

Everything else is Tune's ``ASHAScheduler`` (same arguments, brackets, ``max_t``, ``stop_last_trials``).

Measured (reports/search_rule/bench_search.md, 3 seeds per workload): no better than Tune's ASHA with keeper where
trials converge (digits: the cold best no sooner, the final model within noise), and worse where warm starts pay
(the language models: the whole search 0.84x against 1.00x, as its cold trials take rungs from warmed ones that
were better), so keeper ships none: Tune's ASHA with ``KeeperCallback`` is what the README shows.
"""

from __future__ import annotations

import copy
from typing import Any

from ray.tune.schedulers import ASHAScheduler

from keeper.errors import ConfigError
from keeper.tune_integration.checkpoint import trial_lineage

__all__ = ["KeeperASHA"]


class KeeperASHA(ASHAScheduler):
    """ASHA whose trials started from a parent are compared with each other, and those trained from scratch with
    each other (see the module docstring).

    Example:
        >>> from keeper_bench.asha import KeeperASHA
        >>> asha = KeeperASHA(time_attr="training_iteration", max_t=8, grace_period=1,  # doctest: +SKIP
        ...                   reduction_factor=3)
        >>> tune.Tuner(trainable, tune_config=tune.TuneConfig(scheduler=asha, metric="accuracy", mode="max"),
        ...            run_config=tune.RunConfig(callbacks=[KeeperCallback(metric="accuracy", mode="max")]))
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        brackets = getattr(self, "_brackets", None)
        if not isinstance(brackets, list) or not isinstance(getattr(self, "_trial_info", None), dict):
            import ray

            raise ConfigError(f"KeeperASHA: this Ray ({ray.__version__}) keeps ASHA's rungs otherwise than keeper "
                              "expects (AsyncHyperBandScheduler._brackets and ._trial_info); use Tune's "
                              "ASHAScheduler, or a Ray release keeper supports (pyproject.toml)")
        # the warmed trials' rungs: a second bracket beside each of Tune's, of the same shape (empty copies)
        self._warm_brackets = copy.deepcopy(brackets)
        self._warmed: dict[str, bool] = {}  # trial id -> started from a parent (decided at its first result)

    @property
    def warmed_trials(self) -> list[str]:
        """The trials compared with the warmed ones (started from a parent)."""
        return [tid for tid, warmed in self._warmed.items() if warmed]

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        tid = trial.trial_id
        if tid not in self._warmed and tid in self._trial_info:
            # a lineage naming a parent: the trial started from it (none, or unreadable: cold, as plain ASHA)
            self._warmed[tid] = bool((trial_lineage(trial) or {}).get("parent"))
            if self._warmed[tid]:
                self._trial_info[tid] = self._warm_brackets[self._brackets.index(self._trial_info[tid])]
        return super().on_trial_result(tune_controller, trial, result)

    def debug_string(self) -> str:
        warm = "\n".join(b.debug_str() for b in self._warm_brackets)
        return f"{super().debug_string()}\nwarmed trials ({len(self.warmed_trials)}):\n{warm}"
