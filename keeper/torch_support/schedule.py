"""A warm start's learning-rate recipe applied to a torch optimizer, alone or on top of the caller's scheduler.

Invariants: the caller's scheduler sees the learning rates it set itself (the factor is taken off before it steps
and put back after), so chainable schedulers (``ExponentialLR``, ``StepLR``, ``ReduceLROnPlateau`` is not one)
compound as they would without keeper; for a cold result the rates are exactly the scheduler's.
"""

from __future__ import annotations

from typing import Any

import torch

from keeper.recipe import Recipe
from keeper.warm import WarmResult

__all__ = ["WarmLR", "warm_lr"]


class WarmLR:
    """Multiplies ``recipe.factor(step)`` into every param group's learning rate; call :meth:`step` once per
    optimizer step, after ``optimizer.step()``, in place of ``scheduler.step()``."""

    def __init__(self, optimizer: torch.optim.Optimizer, recipe: Recipe, scheduler: Any = None):
        self.optimizer, self.recipe, self.scheduler = optimizer, recipe, scheduler
        self.steps = 0
        self._plain = [g["lr"] for g in optimizer.param_groups]  # the rates without the factor
        self._apply()

    def _apply(self) -> None:
        f = self.recipe.factor(self.steps)
        for g, lr in zip(self.optimizer.param_groups, self._plain):
            g["lr"] = lr * f

    def step(self) -> None:
        self.steps += 1
        if self.scheduler is not None:
            for g, lr in zip(self.optimizer.param_groups, self._plain):
                g["lr"] = lr  # the scheduler steps from its own rates
            self.scheduler.step()
            self._plain = [g["lr"] for g in self.optimizer.param_groups]
        self._apply()

    def factor(self) -> float:
        """The factor in force now."""
        return self.recipe.factor(self.steps)

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "plain": list(self._plain), "recipe": self.recipe.as_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps, self._plain = int(state["steps"]), list(state["plain"])
        self._apply()


def warm_lr(optimizer: torch.optim.Optimizer, result: WarmResult, total_steps: int, scheduler: Any = None,
            ramp: float | None = None) -> WarmLR:
    """Apply ``result``'s learning-rate recipe (:meth:`WarmResult.recipe`) to ``optimizer`` for a run of
    ``total_steps`` optimizer steps; call the returned object's ``step()`` where ``scheduler.step()`` was.

    Example:
        >>> warm = warm_start(model, x)                                          # doctest: +SKIP
        >>> opt = torch.optim.AdamW(model.parameters(), lr=3e-4)                 # doctest: +SKIP
        >>> sched = warm_lr(opt, warm, 1000, torch.optim.lr_scheduler.CosineAnnealingLR(opt, 1000))  # doctest: +SKIP
        >>> for batch in data: loss(batch).backward(); opt.step(); sched.step()  # doctest: +SKIP
    """
    return WarmLR(optimizer, result.recipe(total_steps, ramp), scheduler)
