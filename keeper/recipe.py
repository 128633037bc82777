"""A learning-rate recipe for a warm start: a factor the trainable multiplies into its own schedule.

A model restarted at its recipe's full learning rate with fresh optimizer state loses much of what it had in its
first steps: Adam's first updates have the size of the learning rate on every weight, whatever the gradient, so a
converged model's function is shaken before its moments adapt. A lower rate ramped back over the first steps lets
the moments settle first.

A child that must learn past its parent (a growth, a transfer onto another architecture) is another matter: it has
to leave the parent's optimum, and a lower rate only trades the early dip for a slower climb (``docs/architecture.md``,
"The learning-rate recipe", gives the measurements behind both rules). So:

* a cold result, or a warm onto another architecture: factor 1 at every step (the user's schedule, untouched);
* a restart (the parent's function kept whole on a child it covers whole: the same architecture, as a resumed
  run, a restored checkpoint or a same-architecture exploit of population-based training): the factor starts at
  :attr:`Recipe.RESTART_START` and rises linearly to 1 over the first ``ramp`` share of the run.

The peak rate of the user's schedule is kept after the ramp: a lower peak trades the early dip for a worse end.

Invariant: ``factor(step)`` is in (0, 1], non-decreasing in ``step``, and 1.0 for every step of a result that is
not a restart and from ``ramp_steps`` on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Recipe", "recipe_for"]


@dataclass(frozen=True)
class Recipe:
    """The learning-rate factor of one warm start over a run of ``total_steps`` optimizer steps."""

    #: factor at step 0 of a restart (the parent's function kept whole on its own architecture)
    RESTART_START = 0.1
    #: share of the run over which the factor rises back to 1
    RAMP = 0.25

    start: float
    ramp_steps: int
    why: str

    def factor(self, step: int) -> float:
        """The factor at optimizer step ``step`` (0-based)."""
        if self.ramp_steps <= 0 or step >= self.ramp_steps:
            return 1.0
        return self.start + (1.0 - self.start) * max(step, 0) / self.ramp_steps

    def as_dict(self) -> dict[str, Any]:
        return {"start": self.start, "ramp_steps": self.ramp_steps, "why": self.why}


def recipe_for(parent: str | None, score: float, preserved: bool, total_steps: int,
               ramp: float | None = None) -> Recipe:
    """The recipe of a warm start from what keeper knows of it (see the module docstring).

    Args:
        total_steps: the optimizer steps the caller will run (the ramp is a share of them).
        ramp: share of the run the factor rises over; None for :attr:`Recipe.RAMP`.
    """
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"learning-rate recipe: total_steps must be a positive integer (the optimizer steps the "
                         f"run will take), got {total_steps!r}")
    ramp = Recipe.RAMP if ramp is None else ramp
    if not 0.0 <= ramp <= 1.0:
        raise ValueError(f"learning-rate recipe: ramp must be a share of the run in [0, 1], got {ramp!r}")
    if parent is None:
        return Recipe(1.0, 0, "cold start: the trainable's own schedule")
    if not (preserved and score >= 1.0 - 1e-9):
        return Recipe(1.0, 0, "a child that must learn past its parent: the trainable's own schedule (a lower "
                              "start only slows it on its way past the parent)")
    steps = max(1, round(ramp * total_steps))
    return Recipe(Recipe.RESTART_START, steps,
                  f"a restart of the parent's function on its own architecture: start at {Recipe.RESTART_START:g}x "
                  f"and ramp to the schedule over {steps} steps, so the first updates do not undo it")
