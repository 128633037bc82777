"""The projected wall time of a benchmark setting on idle cores, from measured per-trial training costs.

Both training benchmarks (``scripts/bench_training.py``, ``scripts/bench_lm.py``) run arm runs of one trial per
architecture, ``concurrency`` trials at a time; their ``--estimate`` reads the cost of training and evaluating one
trial per architecture and adds the time outside training from :data:`OVERHEAD_S`.
"""

from __future__ import annotations

__all__ = ["OVERHEAD_S", "projection"]

#: Seconds outside training (core-seconds per trial for Tune's trial start, report and checkpoint; per warmed trial
#: for the warm start and its registration; wall seconds per arm run for the Tuner's and the service's start),
#: rough figures from runs of these benchmarks; each report's profile gives the measured ones of its run.
OVERHEAD_S = {"trial": 2.0, "warm": 4.0, "arm_run": 10.0}


def projection(per_trial: list[float], plan: list[tuple[int, str]], concurrency: int) -> str:
    """One line: the projected minutes of training and evaluation plus overhead for ``plan`` ((seed, arm) arm
    runs, each of ``len(per_trial)`` trials costing ``per_trial`` core-seconds) at ``concurrency``."""
    trials = len(per_trial)
    train_s = sum(per_trial) * len(plan) / concurrency
    warmed = sum(arm != "cold" for _, arm in plan) * trials
    over_s = ((OVERHEAD_S["trial"] * len(plan) * trials + OVERHEAD_S["warm"] * warmed) / concurrency
              + OVERHEAD_S["arm_run"] * len(plan))
    return (f"{len(plan)} arm runs x {trials} trials, {concurrency} at a time: training and evaluation "
            f"{train_s / 60:.1f} min + warm starts and Tune overhead {over_s / 60:.1f} min = "
            f"{(train_s + over_s) / 60:.1f} min on {concurrency} idle cores")
