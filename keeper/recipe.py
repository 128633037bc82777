"""A learning-rate recipe for a warm start: a factor the trainable multiplies into its own schedule.

A warm-started model restarted at its recipe's full learning rate with fresh optimizer state loses much of what it
inherited in its first steps (Adam's first updates have the size of the learning rate on every weight, whatever the
gradient): an exact copy of a converged model needed 0.57-1.0x of its cold run's steps to get back
(``reports/bench_recipe.md``). The recipe lowers the rate at the start and ramps it back to the user's schedule, by
how much keeper knows the warm start is worth keeping:

* a cold result: factor 1 at every step (the user's recipe, untouched);
* the parent's function preserved (an exact growth): the factor starts at :attr:`Recipe.PRESERVED_START` and
  rises linearly to 1 over the first ``ramp`` share of the run;
* any other warm: the published system's rule for the start, ``max(0.3, 1 - inherited share)`` with the inherited
  share ``score x structure``, over the same ramp.

The peak rate of the user's schedule is kept after the ramp: a lower peak trades the early dip for a worse end.
The figures behind the constants are in ``reports/bench_recipe.md`` (``scripts/bench_recipe.py``).

Invariant: ``factor(step)`` is in (0, 1], non-decreasing in ``step``, and 1.0 for every step of a cold result and
from ``ramp_steps`` on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Recipe", "recipe_for"]


@dataclass(frozen=True)
class Recipe:
    """The learning-rate factor of one warm start over a run of ``total_steps`` optimizer steps."""

    #: factor at step 0 for a warm that preserves the parent's function
    PRESERVED_START = 0.1
    #: floor of the factor at step 0 for any other warm (the published system's)
    FIT_FLOOR = 0.3
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


def recipe_for(parent: str | None, score: float, structure: float, preserved: bool, total_steps: int,
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
    steps = max(1, round(ramp * total_steps))
    if preserved:
        return Recipe(Recipe.PRESERVED_START, steps,
                      f"the parent's function is preserved: start at {Recipe.PRESERVED_START:g}x and ramp to the "
                      f"schedule over {steps} steps, so the first updates do not undo it")
    share = max(0.0, min(1.0, float(score) * float(structure)))
    start = max(Recipe.FIT_FLOOR, 1.0 - share)
    return Recipe(start, steps, f"{share:.0%} of the child inherited block onto block: start at {start:.2g}x "
                                f"(max({Recipe.FIT_FLOOR:g}, 1 - share)) and ramp to the schedule over {steps} steps")
