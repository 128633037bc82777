"""The data probe: score the best-ranked parents and the child's own init on the caller's data, keep the best.

The structural choice (:mod:`keeper.choice.selection`) predicts which parent helps from the graphs alone. Where the
caller has data at hand, a probe measures it: the first ``top`` ranked candidates are transformed, each warmed
child and the cold one are scored by the caller's ``score`` (lower is better), and the lowest wins, the cold init
included. If no warmed child beats the cold one, the child stays cold and the report says why. The report also
gives the probe's cost: seconds spent transforming and seconds spent in ``score``.

What ``score`` runs is the caller's: the torch helpers (:func:`keeper.torch_support.warm_start` with
``probe=(batches, loss_fn)``) load each result into a copy of the module and sum its training losses over a few
SGD steps (see ``docs/architecture.md`` for why that, not one batch's loss). This module stays framework-free: a
score reads a :class:`~keeper.warm.WarmResult`.

Invariant: the result is the cold one exactly when no scored candidate's loss is strictly below the cold loss;
otherwise it is the candidate of least loss (ties: the better ranked).
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from keeper.choice.selection import Candidate
from keeper.errors import ProbeError

if TYPE_CHECKING:  # the warm path imports this module: its result type is named here only
    from keeper.warm import WarmResult

__all__ = ["ProbeReport", "probe_choice", "ResultScore"]

#: A probe over warm results: lower is better; ``inf`` marks a result unusable (diverged).
ResultScore = Callable[["WarmResult"], float]


@dataclass
class ProbeReport:
    """What a probe measured.

    Attributes:
        losses: candidate name -> its probe loss, for every candidate scored (in rank order).
        cold: the probe loss of the child's own init.
        chosen: the winning candidate's name, or None when the cold init won.
        reason: one sentence on the outcome ("no candidate beat the cold init: ..." when it stays cold).
        transform_s / forward_s: seconds spent in the transforms and in the probe's scoring.
    """

    losses: dict[str, float] = field(default_factory=dict)
    cold: float = math.inf
    chosen: str | None = None
    reason: str = ""
    transform_s: float = 0.0
    forward_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _loss(score: ResultScore, result: WarmResult, what: str) -> float:
    value = score(result)
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        try:
            value = float(value)  # a 0-d tensor or numpy scalar
        except (TypeError, ValueError):
            raise ProbeError(f"probe on {what}: returned {type(value).__name__}; expected a loss (a float, lower "
                             "is better)") from None
    value = float(value)
    return math.inf if math.isnan(value) else value


def probe_choice(ranked: Sequence[Candidate], warm: Callable[[str], WarmResult], cold: Callable[[], WarmResult],
                 score: ResultScore, top: int) -> tuple[WarmResult, ProbeReport]:
    """The best of the cold init and the first ``top`` of ``ranked``, by ``score`` (see the module docstring).

    Args:
        ranked: qualifying candidates, best first (:func:`keeper.choice.selection.rank_parents`).
        warm: warms the child from the named candidate.
        cold: the child's own weights as a WarmResult.
        score: the probe; lower is better, NaN counts as infinite.
        top: how many candidates to score (>= 1).

    Raises:
        ProbeError: ``score`` returned something that is not a number.

    Example:
        >>> result, report = probe_choice(rank_parents(cands), zoo_warm, cold, my_loss, top=3)  # doctest: +SKIP
        >>> report.chosen, report.cold, report.losses                                           # doctest: +SKIP
    """
    report = ProbeReport()
    t0 = time.perf_counter()
    base = cold()
    report.transform_s += time.perf_counter() - t0
    t0 = time.perf_counter()
    report.cold = _loss(score, base, "the cold init")
    report.forward_s += time.perf_counter() - t0
    best, best_loss = base, report.cold
    for cand in list(ranked)[:max(1, int(top))]:
        t0 = time.perf_counter()
        result = warm(cand.name)
        report.transform_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        loss = _loss(score, result, f"parent {cand.name!r}")
        report.forward_s += time.perf_counter() - t0
        report.losses[cand.name] = loss
        if loss < best_loss:
            best, best_loss = result, loss
    if best is base:
        report.reason = (f"no candidate beat the cold init on the probe (cold {report.cold:.4g}; "
                         + ", ".join(f"{n} {v:.4g}" for n, v in report.losses.items()) + "): the child stays cold"
                         if report.losses else "no candidate qualified; the child stays cold")
    else:
        report.chosen = best.parent
        report.reason = (f"parent {best.parent!r} scored {best_loss:.4g} on the probe against the cold init's "
                         f"{report.cold:.4g}")
    return best, report
