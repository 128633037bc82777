"""Data probes over torch modules: score a candidate warm start on the caller's data.

A :class:`DataProbe` scores the start of the learning curve (the mean training loss over a few SGD steps on a
copy of the module plus the loss after the last one; see ``docs/architecture.md``); :func:`module_probe` turns a
probe over modules into the probe over WarmResults that :mod:`keeper.choice.probe` runs.

Invariant: the module itself is never touched; every candidate is loaded into and trained on a fresh copy.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from keeper.errors import KeeperError, PartialWarmWarning
from keeper.torch_support.load import load_result
from keeper.warm import WarmResult

__all__ = ["DataProbe", "as_module_probe", "module_probe"]


@dataclass
class DataProbe:
    """A probe from data: ``batches`` (one ``(inputs, targets)`` pair or a list of them) and ``loss_fn(output,
    targets)``. A candidate's score is the mean training loss over ``steps`` SGD steps (momentum ``momentum``,
    learning rate ``lr``) on a copy of the module, each step on the next batch, plus the loss after the last step:
    the start of the learning curve, not one loss at the start (see ``docs/architecture.md``). The module
    trains in train mode (batch statistics), as the real training does.
    """

    batches: Any
    loss_fn: Any
    steps: int = 2
    lr: float = 0.01
    momentum: float = 0.9

    def __post_init__(self) -> None:
        if isinstance(self.batches, tuple) and len(self.batches) == 2 and isinstance(self.batches[0], torch.Tensor):
            self.batches = [self.batches]
        if not isinstance(self.batches, (list, tuple)) or not self.batches or not all(
                isinstance(b, (list, tuple)) and len(b) == 2 for b in self.batches):
            raise KeeperError("probe batches: expected an (inputs, targets) pair or a non-empty list of them; "
                              "pass e.g. (x[:128], y[:128])")
        if not callable(self.loss_fn):
            raise KeeperError(f"probe loss_fn {self.loss_fn!r}: expected a callable loss_fn(output, targets), e.g. "
                              "torch.nn.CrossEntropyLoss()")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 0:
            raise KeeperError(f"probe steps {self.steps!r}: expected an integer >= 0 (0: the loss at the start)")
        if not (self.lr >= 0.0 and np.isfinite(self.lr)):
            raise KeeperError(f"probe lr {self.lr!r}: expected a finite learning rate >= 0")

    def __call__(self, module: torch.nn.Module) -> float:
        device = next((p.device for p in module.parameters()), torch.device("cpu"))
        module.train()
        params = [p for p in module.parameters() if p.requires_grad]
        opt = torch.optim.SGD(params, lr=self.lr, momentum=self.momentum) if params else None
        losses = []
        for step in range(self.steps + 1):
            x, y = self.batches[step % len(self.batches)]
            loss = self.loss_fn(module(x.to(device)), y.to(device))
            losses.append(float(loss.detach()))
            if not np.isfinite(losses[-1]):
                return float("inf")
            if step < self.steps and opt is not None:
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        return float(np.mean(losses))


def as_module_probe(probe: Any) -> Callable[[torch.nn.Module], float]:
    """``probe`` as a callable over modules (lower is better): itself when callable, a :class:`DataProbe` for a
    ``(batches, loss_fn)`` pair."""
    if isinstance(probe, (tuple, list)) and len(probe) == 2 and callable(probe[1]) and not callable(probe):
        probe = DataProbe(probe[0], probe[1])
    if not callable(probe):
        raise KeeperError(f"probe {probe!r}: expected a callable probe(module) -> loss, a DataProbe, or a "
                          "(batches, loss_fn) pair")
    return probe


def module_probe(module: torch.nn.Module, keys: dict[str, tuple[str, str]],
                 probe: Any) -> Callable[[WarmResult], float]:
    """A probe over WarmResults from a probe over modules: each result is loaded into a fresh copy of ``module``
    (the module itself is never touched), which ``probe`` scores.

    ``probe``: a callable ``probe(module) -> loss`` (lower is better; it may train the copy), a
    :class:`DataProbe`, or ``(batches, loss_fn)``, which becomes ``DataProbe(batches, loss_fn)``.
    """
    probe = as_module_probe(probe)

    def score(result: WarmResult) -> float:
        twin = copy.deepcopy(module)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PartialWarmWarning)  # reported once, for the winner
            load_result(twin, result, keys)
        return probe(twin)

    return score
