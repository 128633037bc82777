"""What a trial inherits from its parent: the one rule of a search with keeper.

A warm start helps a search only where it gives a trial something the search does not hold already and the trial
could not get within its own budget. keeper reads that off what it knows of the parent: the learning curve its
trial reported (the Tune callback records it with the model), the search that trained it, and whether the child is
the parent's own architecture. The rule:

* **A parent of another architecture** (a growth, a shrink, a partial transfer): its function as the transforms
  carry it, a head start on an architecture the search has not trained from it.
* **A parent of the child's own architecture** (a restart) that was **still improving** when its training stopped
  (its metric rose through its last reports, or it reported too few results to tell, as a trial an early-stopping
  scheduler cut): its whole function, to every trial that asks. The child continues the parent's training, which
  is more than its own budget gives it.
* **A parent of the child's own architecture that had converged, trained by this very search**: nothing; the
  child starts cold. The search holds that model already, and a restart of it ends in its basin (measured: below
  the parent, on average), so it would spend the child's budget without evaluating the child's configuration.
* **A parent of the child's own architecture that had converged, from elsewhere** (an earlier search, another
  team, a registration by hand): its whole function to the first trial of this search that asks, so the search
  holds that model from its first report; every later trial that would restart it starts cold, so the search
  keeps exploring.

* **A parent that started cold and was at its plateau by the middle of its training** (a report within
  :data:`PLATEAU_GAIN` of its best came in the first half of its reports, over a curve long enough to tell):
  nothing, whatever the child's architecture; the child starts cold. Training from scratch got there in half a
  budget, so the parent's function is a head start of at most that, and a child that takes it ends in the parent's
  basin rather than its own: such children (restarts and growths alike) ended below their cold twins, while
  trials whose training still gains through its second half, where a head start pays, never meet this test.
* **A parent from another search that started cold and reported fewer than** :data:`MIN_REPORTS` **results** (a
  trial an early-stopping scheduler cut), **to a child it does not carry its function onto whole** (a shrink, a
  partial transfer): nothing; the child starts cold. (A parent of the child's own search is held to that search's
  first reports instead, below; a trial whose whole budget is one report looks the same from its curve.) Its
  function is a few reports of training from scratch, and a transform that loses part of it leaves the child a
  start that cold training passes within its first report (measured: a shrink from a trial cut after one report
  started below its cold twin and ended 6 points below it). A restart or a growth that keeps its function whole
  continues that training, as for any parent still improving.

And above all of these, for a trial of a search: **a parent trained by this very search whose accuracy is below what
the search's trials that started cold report at their first result**: nothing; the child starts cold. Such a trial
reaches past the parent within one report of its own training, so the parent's function is a head start of less
than one report, and a trial that takes it is judged at its first rung (ASHA, PBT) on the parent's function, not on
its configuration. (Only this search's parents: another search's accuracy may be on another task.)

A model without a recorded curve (registered outside Tune) counts as converged: a trained model handed to the zoo
is usually finished.

Invariants: :func:`decide` is a pure function of its arguments; every :class:`Inheritance` says why in one
sentence, which the warm result's ``reason`` carries.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

if TYPE_CHECKING:
    from keeper.choice.selection import ParentChoice

__all__ = ["Training", "Inheritance", "Inheritances", "decide", "training_of", "LATE_GAIN", "MIN_REPORTS",
           "PLATEAU_GAIN"]

#: share of a curve's total gain its second half must add for the curve to count as still improving
LATE_GAIN = 0.2
#: fewer reports than this cannot tell a plateau from a climb: the parent counts as still improving
MIN_REPORTS = 4
#: accuracy below a curve's best within which a report counts as at its plateau
PLATEAU_GAIN = 0.01
# metrics reported in float32 (a share of images) differ from their decimal by up to ~1e-8
_FLOAT32_SLACK = 1e-6


@dataclass(frozen=True)
class Training:
    """How a model was trained, as far as keeper saw it: the search it came from and its learning curve's verdict.

    Attributes:
        search: the search (Tune experiment) that trained it; "" when unknown.
        reports: how many results its trial reported.
        late_gain: the share of the curve's gain made in its second half (None when it made no gain or too few
            reports were seen).
        improving: True when the curve was still climbing at its end, False when it had flattened, None when
            there were too few reports to tell.
        first: its first report (None when unknown).
        started_cold: whether its trial started from its own initialisation (None when unknown: a record made
            before keeper kept it, or a model registered outside Tune).
        flat_from: the first report (1-based) within :data:`PLATEAU_GAIN` of the curve's best (None when unknown:
            no curve, or a record made before keeper kept it).
    """

    search: str = ""
    reports: int = 0
    late_gain: float | None = None
    improving: bool | None = None
    first: float | None = None
    started_cold: bool | None = None
    flat_from: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"search": self.search, "reports": self.reports, "late_gain": self.late_gain,
                "improving": self.improving, "first": self.first, "started_cold": self.started_cold,
                "flat_from": self.flat_from}

    def plateau_by(self, accuracy: float | None) -> int | None:
        """The report (1-based) by which this training, of a model now at ``accuracy``, was at its plateau, when it
        started cold and that report is in the first half of at least :data:`MIN_REPORTS`; None otherwise. A record
        made before ``flat_from`` was kept is read at its first report (``accuracy`` less than
        :data:`PLATEAU_GAIN` above it)."""
        if self.started_cold is not True or self.reports < MIN_REPORTS:
            return None
        if self.flat_from is not None:
            return self.flat_from if self.flat_from <= self.reports // 2 else None
        if self.first is not None and accuracy is not None and accuracy - self.first < PLATEAU_GAIN:
            return 1
        return None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "Training | None":
        """The record's ``training`` entry, or None for a model registered without one."""
        if not d:
            return None
        late, improving, first, cold = d.get("late_gain"), d.get("improving"), d.get("first"), d.get("started_cold")
        flat = d.get("flat_from")
        return cls(search=str(d.get("search") or ""), reports=int(d.get("reports") or 0),
                   late_gain=None if late is None else float(late),
                   improving=None if improving is None else bool(improving),
                   first=None if first is None else float(first), started_cold=None if cold is None else bool(cold),
                   flat_from=None if flat is None else int(flat))


def training_of(values: Sequence[float], search: str = "", started_cold: bool | None = None) -> Training:
    """The verdict on a learning curve: ``values`` are the metric of each report, in order, higher better (the
    zoo's accuracy terms); ``started_cold`` says whether the trial started from its own initialisation.

    The curve is still improving when the best report of its second half beats the best of its first half by at
    least :data:`LATE_GAIN` of its total gain (best report minus first report); a curve that gained nothing has
    converged; fewer than :data:`MIN_REPORTS` reports cannot tell. ``flat_from`` is the first report less than
    :data:`PLATEAU_GAIN` below the best (a gain of exactly :data:`PLATEAU_GAIN`, as one image in a hundred read in
    float32, is a gain).

    Example:
        >>> training_of([0.2, 0.5, 0.7, 0.8, 0.85, 0.9]).improving
        True
        >>> training_of([0.6, 0.9, 0.95, 0.95, 0.96, 0.95]).improving
        False
    """
    vals = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    n = len(vals)
    first = vals[0] if vals else None
    best = max(vals, default=None)
    flat = next((i + 1 for i, v in enumerate(vals) if best - v < PLATEAU_GAIN - _FLOAT32_SLACK), None)
    if n < MIN_REPORTS:
        return Training(search, n, None, None, first, started_cold, flat)
    half = n // 2
    total = best - vals[0]
    if total <= 0.0:
        return Training(search, n, None, False, first, started_cold, flat)
    late = (max(vals[half:]) - max(vals[:half])) / total
    return Training(search, n, late, late >= LATE_GAIN, first, started_cold, flat)


@dataclass(frozen=True)
class Inheritance:
    """What one trial inherits: ``whole`` (the parent's function, as the transforms carry it) or ``cold`` (the
    trial keeps its own initialisation), and the sentence saying why."""

    whole: bool
    why: str
    below_first: bool = False  # withheld by the first-report test: a later candidate above the bar may serve


def decide(parent: str, training: Training | None, search: str, first_in_search: bool,
           same_architecture: bool = True, parent_accuracy: float | None = None,
           cold_first: float | None = None, preserved: bool = True) -> Inheritance:
    """The rule of the module docstring for one trial of ``search`` whose best parent is ``parent``.

    Args:
        training: the parent's :class:`Training` (None: registered without a curve, counted as converged).
        search: the asking trial's search; "" outside a search (every start then inherits: nothing to explore).
        first_in_search: no trial of ``search`` has inherited ``parent``'s converged function yet.
        same_architecture: the child is the parent's own architecture (a restart).
        parent_accuracy: the parent's accuracy in the zoo (None: not known; the first-report test is skipped).
        cold_first: the best first report (in the zoo's accuracy terms) of this search's trials that started cold;
            None while none has reported (the first-report test is skipped).
        preserved: the transform carries the parent's function onto the child whole (a restart, an exact growth).
    """
    if not search:
        return Inheritance(True, f"{parent!r} gives its function (outside a search, nothing to explore)")
    if (parent_accuracy is not None and cold_first is not None and parent_accuracy < cold_first
            and training is not None and training.search == search):
        return Inheritance(False, f"{parent!r} ({parent_accuracy:.3f}) is below what this search's trials that "
                                  f"started cold report at their first result ({cold_first:.3f}): its function is a "
                                  "head start of less than one report, so the child starts cold and its "
                                  "configuration is judged on its own training", below_first=True)
    by = None if training is None else training.plateau_by(parent_accuracy)
    if by is not None:
        at = (f"its first report ({training.first:.3f}, then {parent_accuracy:.3f} at best)"
              if by == 1 and training.first is not None and parent_accuracy is not None
              else f"report {by} of {training.reports}")
        return Inheritance(False, f"{parent!r} started cold and was at its plateau by {at}: training from scratch "
                                  "gets there within half a budget, and a child that takes its function ends in its "
                                  "basin, so the child starts cold and its configuration is judged on its own "
                                  "training")
    if (not preserved and training is not None and training.started_cold is True and training.search != search
            and 0 < training.reports < MIN_REPORTS):
        return Inheritance(False, f"{parent!r} started cold and reported {training.reports} result(s) (a trial cut "
                                  "early): its function is a few reports of training, and the transform onto the "
                                  "child loses part of it, so the child starts cold")
    if not same_architecture:
        return Inheritance(True, f"the child is another architecture than {parent!r}: it starts from its function, "
                                 "a head start")
    if training is not None and training.improving is not False:
        how = ("was still improving when its training stopped" if training.improving
               else f"reported {training.reports} result(s), too few to tell a plateau")
        return Inheritance(True, f"{parent!r} {how}: the child continues its training")
    if training is not None and training.search == search:
        return Inheritance(False, f"{parent!r} had converged in this search, which holds it already: the child "
                                  "starts cold, so its own configuration is evaluated")
    origin = "had converged in another search" if training is not None else "was registered without a learning curve"
    if first_in_search:
        return Inheritance(True, f"{parent!r} {origin}: the first trial of this search to ask takes its function, "
                                 "so the search holds it from its first report")
    return Inheritance(False, f"{parent!r} {origin} and a trial of this search took its function already: the "
                              "child starts cold, so the search keeps exploring")


class Inheritances:
    """The rule applied to the choices of one parent source (the embedded zoo, the service's front door), which
    remembers which converged parents each search has taken already (thread-safe; in memory: a source that
    restarts forgets, and a search may then take such a parent once more)."""

    def __init__(self) -> None:
        self._taken: set[tuple[str, str]] = set()
        self._cold_first: dict[str, float] = {}
        self._lock = threading.Lock()

    def observe_cold_start(self, search: str, accuracy: float) -> None:
        """A trial of ``search`` that started cold first reported ``accuracy`` (the zoo's terms): the best such
        report of each search is what the rule compares parents with."""
        if not search or not isinstance(accuracy, (int, float)) or not math.isfinite(accuracy):
            return
        with self._lock:
            self._cold_first[search] = max(float(accuracy), self._cold_first.get(search, -math.inf))

    def apply(self, choice: "ParentChoice", search: str,
              training: Callable[[str], Training | None]) -> "ParentChoice":
        """``choice`` under the rule for a trial of ``search``: its parent kept (the rule's sentence added) or
        withheld (no parent, no candidate left to probe); ``training(name)`` reads a model's :class:`Training`."""
        if choice.parent is None:
            return choice
        ranked = list(choice.ranked())
        best = next((c for c in choice.candidates if c.name == choice.parent), None)
        # the chosen parent first, then (only past parents below the search's cold first report) the next
        # qualifying candidates in rank order: a weaker parent gives nothing, a stronger one may still
        order = [best] + (ranked[ranked.index(best) + 1:] if best in ranked else [])
        names = [choice.parent] + [c.name for c in order[1:]]
        first = None
        for at, (name, cand) in enumerate(zip(names, order)):
            trained = training(name)  # outside the lock: it may read the store
            same = cand is not None and cand.preserved and cand.score >= 1.0 - 1e-9
            with self._lock:
                key = (search, name)
                verdict = decide(name, trained, search, key not in self._taken, same,
                                 None if cand is None else cand.accuracy, self._cold_first.get(search),
                                 preserved=cand is None or bool(cand.preserved))
                if verdict.whole and search and (trained is None or trained.improving is False):
                    self._taken.add(key)
            if first is None:
                first = verdict
            if verdict.whole or not verdict.below_first:
                break
        if not verdict.whole:
            return dataclasses.replace(choice, parent=None, score=0.0, qualified=0, withheld=choice.parent,
                                       rule=first.why)
        if at == 0:
            return dataclasses.replace(choice, rule=verdict.why)
        # a later candidate, past parents below the bar (dropped, so no probe picks them)
        kept = order[at:]
        rest = [c for c in choice.candidates if c not in ranked]
        skipped = ", ".join(repr(n) for n in names[:at])
        return dataclasses.replace(choice, parent=name, score=cand.score, candidates=tuple(kept + rest),
                                   qualified=len(kept),
                                   rule=f"{skipped} ranked above it but below what this search's trials that started "
                                        f"cold report at their first result ({self._cold_first.get(search, 0.0):.3f}),"
                                        f" a head start of less than one report; {verdict.why}")

