"""Whether a training run has converged: the relative improvement of its validation metric over the last 20% of
its steps (:func:`tail_gain`); a run is at its plateau when that is under 1% (:func:`at_plateau`). The benchmarks
pick each family's budget so that their cold runs are, and check every cold run.

Example:
    >>> at_plateau([100, 200, 300, 400, 500], [3.0, 2.4, 2.2, 2.15, 2.14])
    True
"""

from __future__ import annotations

__all__ = ["tail_gain", "at_plateau"]


def tail_gain(steps: list[int], values: list[float], tail: float = 0.2, lower_is_better: bool = True) -> float:
    """Relative improvement of ``values`` over the last ``tail`` share of the run's steps: from the last
    evaluation at or before step ``(1 - tail) * steps[-1]`` to the final one, divided by the former's magnitude
    (positive: it still improved).

    Raises:
        ValueError: no evaluation lies at or before that step (evaluate more often than ``tail`` of the run).
    """
    if len(steps) != len(values) or not steps:
        raise ValueError(f"tail_gain: steps and values must be non-empty and of one length, got {len(steps)} "
                         f"and {len(values)}")
    cut = (1.0 - tail) * steps[-1]
    before = [i for i, s in enumerate(steps) if s <= cut + 1e-9]
    if not before:
        raise ValueError(f"tail_gain: no evaluation at or before step {cut:g} of {steps[-1]}; evaluate at least "
                         f"every {tail:.0%} of the run")
    v0, v1 = float(values[before[-1]]), float(values[-1])
    gain = (v0 - v1) if lower_is_better else (v1 - v0)
    return gain / max(abs(v0), 1e-12)


def at_plateau(steps: list[int], values: list[float], tail: float = 0.2, threshold: float = 0.01,
               lower_is_better: bool = True) -> bool:
    """Whether the run improved by less than ``threshold`` (relative) over its last ``tail`` of steps."""
    return tail_gain(steps, values, tail, lower_is_better) < threshold
