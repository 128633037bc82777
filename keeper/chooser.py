"""The one warm path: parent choice, an optional data probe, the transfer, and the result's report.

Every entry point warms through :func:`warm`: the embedded zoo (:meth:`keeper.Zoo.warm`), the service's front door
(``handle.warm.remote(onnx)``), and torch modules (:func:`keeper.torch_support.warm_start`, in any process, a Tune
trial or a Ray Train worker). They differ only in their :class:`ParentSource`: who chooses (the zoo in this
process, or the service's front door) and where the transfer runs (here, reading the parent from the store, or in
the service's transfer task).

Invariants:
    * the report a result carries (``candidates``, ``reason``, ``probe``) is built here, once, from the choice and
      the probe (:func:`report_of`); no caller patches it afterwards;
    * a parent hit is counted once per warm, for the parent the result came from, never for a cold result;
    * a parent removed between its choice and its transfer is chosen again, once, on a fresh choice;
    * with a probe, only qualifying candidates are scored (the first ``probe_top`` in rank order), and the cold
      init wins unless a candidate scores strictly better (:func:`keeper.choice.probe.probe_choice`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Protocol

from keeper.choice.probe import ProbeReport, ResultScore, probe_choice
from keeper.choice.selection import SHOWN, ParentChoice
from keeper.errors import ModelNotFoundError
from keeper.graph import LayerGraph
from keeper.onnx_safety import ModelInput
from keeper.warm import WarmResult
from keeper.weights import WeightsInput

__all__ = ["ParentSource", "warm", "report_of", "reason_of"]


class ParentSource(Protocol):
    """Where parents come from: it chooses, transfers and counts hits.

    Implemented by :class:`keeper.Zoo` (all in this process), :class:`keeper.actors.ServiceClient` (the service
    chooses, the transfer runs in this process from the store) and the front door itself (its transfer task).
    """

    def choose(self, graph: LayerGraph, fresh: bool = False) -> ParentChoice:
        """The parent choice for the child ``graph`` (``fresh``: re-read the zoo first). Counts no hit."""

    def transfer(self, choice: ParentChoice, parent: str | None, child: ModelInput, graph: LayerGraph, *,
                 weights: WeightsInput | None, noise: float, out: str | os.PathLike | None,
                 report: dict[str, Any] | None) -> WarmResult:
        """``child`` warmed from ``parent`` (its own weights when None), carrying ``report``. Counts no hit.

        Raises:
            ModelNotFoundError: ``parent`` is no longer in the zoo.
        """

    def hit(self, parent: str) -> None:
        """Count one use of ``parent`` (best effort)."""


def reason_of(choice: ParentChoice) -> str:
    """One sentence: why this parent, or why none (and the choice's note, when it has one)."""
    why = _why(choice)
    return f"{why}; {choice.note}" if choice.note else why


def _why(choice: ParentChoice) -> str:
    if choice.parent is None:
        if choice.models == 0 and not choice.candidates:
            return "the zoo holds no model yet; the child keeps its own weights"
        if choice.qualified:  # every qualifying candidate maps across block structures (SelectionPolicy)
            top = choice.candidates[0]
            return (f"{top.name!r} (similarity {top.score:.3f}, structure {top.structure:.3f}) maps layers across "
                    "block structures without preserving function, and no data probe vouched for it: such parents "
                    "gained nothing over cold in keeper's benchmarks; the child keeps its own weights (a probe, or "
                    "selection cross_structure: true, lets it be used)")
        return (f"no candidate preserves function or has a fit (similarity x structure) of at least the floor "
                f"{choice.floor}; the child keeps its own weights")
    best = next(c for c in choice.candidates if c.name == choice.parent)
    if best.preserved and best.score >= 1.0 - 1e-9 and choice.restart_shrink < 1.0:
        return (f"the child is {best.name!r}'s architecture: it starts from {choice.restart_shrink:g} x its weights + "
                f"{1 - choice.restart_shrink:g} x its own initialisation (shrink and perturb), so its own "
                "hyperparameters, not only the parent's, decide where it ends")
    if best.preserved and best.score >= 1.0 - 1e-9:
        return (f"the child is {best.name!r}'s architecture: it restarts from that model's whole function (whether "
                "that model over-fit its training data keeper cannot tell: if warmed trials end below cold ones, "
                "warm_start(..., shrink=0.5) starts from half of it)")
    if best.preserved:
        return f"the child grows from {best.name!r} without losing its function"
    return (f"{best.name!r} has the best fit ({best.fit:.3f} = similarity {best.score:.3f} x structure "
            f"{best.structure:.3f}) among the most accurate")


def report_of(choice: ParentChoice, probe: ProbeReport | None = None) -> dict[str, Any]:
    """What a result of ``choice`` reports: the candidate table, the reason and the probe's report."""
    return {"candidates": [c.as_dict() for c in choice.candidates[:SHOWN]],
            "reason": probe.reason if probe is not None else reason_of(choice),
            "probe": probe.as_dict() if probe is not None else None}


def warm(source: ParentSource, child: ModelInput, graph: LayerGraph, *, weights: WeightsInput | None = None,
         noise: float | None = None, seed: int | None = None, out: str | os.PathLike | None = None,
         probe: ResultScore | None = None, choice: ParentChoice | None = None, count: bool = True) -> WarmResult:
    """``child`` (its ONNX, and its LayerGraph ``graph``) warmed from the parent ``source`` chooses.

    Args:
        weights: the child's initial weights when ``child`` is its graph alone.
        noise: relative std of symmetry-breaking noise (None: the choice's, i.e. the zoo's setting).
        seed: the transfer's seed (None: the choice's).
        out: stream the warmed weights into this safetensors file.
        probe: a score over WarmResults (lower is better): the qualifying candidates the choice ranks first and
            the cold init are scored and the best kept (see :mod:`keeper.choice.probe`).
        choice: a choice already made (a Ray Train rank receives rank 0's); None: ``source.choose(graph)``.
        count: count the parent hit (False on all but one rank of a Ray Train trial).
    """
    for attempt in (0, 1):
        choice = choice if choice is not None else source.choose(graph, fresh=attempt > 0)
        if seed is not None:
            choice = dataclasses.replace(choice, seed=int(seed))
        try:
            result = _warm_chosen(source, choice, child, graph, weights, noise, out, probe)
            break
        except ModelNotFoundError:
            if attempt:
                raise
            choice = None  # removed or evicted after it was chosen: choose again on a fresh view of the zoo
    if count and result.parent is not None:
        source.hit(result.parent)
    return result


def _warm_chosen(source: ParentSource, choice: ParentChoice, child: ModelInput, graph: LayerGraph,
                 weights: WeightsInput | None, noise: float | None, out: str | os.PathLike | None,
                 probe: ResultScore | None) -> WarmResult:
    level = choice.noise if noise is None else float(noise)

    def make(name: str | None, report: dict | None, to: Any = None) -> WarmResult:
        return source.transfer(choice, name, child, graph, weights=weights, noise=level, out=to, report=report)

    ranked = choice.ranked()
    if probe is None or not ranked:
        return make(choice.parent, report_of(choice), out)
    result, measured = probe_choice(ranked, lambda name: make(name, None), lambda: make(None, None), probe,
                                    choice.probe_top)
    report = report_of(choice, measured)
    if out is not None:  # the probe ran in memory; the winner is made again into the file
        return make(result.parent, report, out)
    return dataclasses.replace(result, **report)
