"""Parent choice: preserved function first, then similarity weighted by structure, then accuracy.

A candidate is a zoo model with its similarity ``score`` to the child (in [0, 1], see :func:`keeper.similarity`),
its ``coverage`` (the fraction of the parent's own parameter elements that the child inherits), its recorded
``accuracy``, and what its alignment preserves (:mod:`keeper.choice.preservation`): ``preserved`` (the child is a
function-preserving growth of it) and ``structure`` (the share of inherited elements whose layers sit alike in their
blocks). Similarity counts elements, not function, so the choice optimises, in this order:

1. **Preserved function.** A clean candidate from which the child is a function-preserving growth qualifies
   whatever its element share (a 2x-narrower same-family parent scores 0.25, below the floor, yet the warmed child
   computes its function exactly) and ranks above every candidate that merely has elements to slice.
2. **Fit** ``= score * structure``: inherited elements that sit alike in their blocks. An alignment that maps a
   plain chain onto a residual branch, or full convolutions onto pointwise ones, counts for less than one that maps
   blocks onto blocks. Candidates whose fit is below ``policy.floor`` never become parents.
3. **Accuracy among the nearly-as-good**: the objective's range ``[floor, 1]`` is cut into ``policy.buckets``
   equal-width buckets and the most accurate model of the highest non-empty bucket wins (as ModelKeeper does).
4. **Across block structures only when vouched for.** A candidate whose alignment maps layers across block
   structures (``structure < 1``: another family, a chain onto residual branches, GPT-2 onto Llama) and that does
   not preserve function stays ranked, so a data probe scores it against the cold init, but it is never the
   parent on its own (``policy.cross_structure`` False, the default): without a probe the best candidate that
   preserves function or maps block onto block is the parent, else the child starts cold. Why: elements inherited
   across block structures sit where they compute something else, so what they carry of the parent's function is
   unknown until data says so, and a model trained from such a start is not clean, so it would also keep later
   children from their preserved parents (``docs/architecture.md`` names the measurements).

A candidate that is not ``clean`` (its own lineage holds a warm start across block structures, see
:meth:`keeper.zoo.Zoo.register`) ranks below every clean one: a model trained from a bad warm start must not
become everyone's parent. Coverage guards against a parent many times larger than the child: any large weight
matrix contains a block of the child's shape, so such a parent "covers" a small child completely by slicing, yet
the sliced blocks carry none of its function; candidates whose coverage is below ``policy.min_coverage`` are
considered only when no candidate clears it. ``SelectionPolicy(preserve=False, structure=False,
cross_structure=True)`` is the choice of earlier versions (similarity buckets, then accuracy).

Invariants:
    * the result is ``None`` exactly when no candidate is clean and preserved and none with structure 1 has fit
      ``>= policy.floor`` (with ``preserve=False``: none with structure 1 has fit ``>= policy.floor``; with
      ``cross_structure``: none has, whatever its structure);
    * a candidate that is not preserved and has structure below 1 is the result only with ``cross_structure``;
    * a clean preserved candidate, when there is one, wins over every candidate that is not preserved;
    * the result has coverage ``>= policy.min_coverage`` whenever an eligible candidate does;
    * among those considered, the result lies in the highest non-empty bucket (accuracy-aware) or has the
      highest objective (plain);
    * the result depends only on the set of candidates, never on their order (ties: higher objective or
      accuracy, then higher coverage, then the smaller name).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from keeper.errors import KeeperError

if TYPE_CHECKING:  # the assessment's module loads the aligner; a trial that reads a choice needs neither
    from keeper.choice.preservation import Assessment

__all__ = ["Candidate", "ParentChoice", "SelectionPolicy", "choose_parent", "rank_parents", "coverage", "make_choice",
           "reason_of", "SHOWN"]


def _is_real(x: object) -> bool:
    # numbers.Real also admits numpy scalars (np.float32 is no float subclass)
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and not math.isnan(x)


@dataclass(frozen=True)
class Candidate:
    """A possible parent: its zoo ``name``, its similarity ``score`` to the child, its ``accuracy``, its
    ``coverage``: the fraction of the parent's parameter elements the child inherits (see :func:`coverage`), and
    what its alignment keeps (:func:`keeper.choice.preservation.assess`): ``preserved`` (the child is a
    function-preserving growth of it) and ``structure`` (share of inherited elements mapped block onto block;
    1.0 when not assessed). ``clean``: its lineage holds no warm start across block structures. ``assessment``:
    the assessment behind ``preserved`` and ``structure``, with its alignment (None when not assessed); the
    transfer from this candidate reads it instead of aligning again. It is no part of the candidate's value
    (equality, hash, reports)."""

    name: str
    score: float
    accuracy: float
    coverage: float = 1.0
    preserved: bool = False
    structure: float = 1.0
    clean: bool = True
    assessment: Assessment | None = field(default=None, compare=False, repr=False)

    @property
    def fit(self) -> float:
        """``score * structure``: the inherited elements whose layers sit alike in their blocks."""
        return float(self.score) * float(self.structure)

    def as_dict(self) -> dict:
        """Plain data for reports (JSON-able)."""
        return {"name": self.name, "score": float(self.score), "coverage": float(self.coverage),
                "preserved": bool(self.preserved), "structure": float(self.structure), "fit": self.fit,
                "accuracy": float(self.accuracy), "clean": bool(self.clean)}

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise KeeperError(f"candidate name {self.name!r}: expected a str; pass the zoo model's name")
        # NaN would make every comparison below false and the choice order-dependent
        if not _is_real(self.score):
            raise KeeperError(f"candidate {self.name!r}: score {self.score!r} is not a number; expected a "
                              "similarity in [0, 1]")
        if not _is_real(self.accuracy):
            raise KeeperError(f"candidate {self.name!r}: accuracy {self.accuracy!r} is not a number; expected "
                              "the model's recorded metric")
        if not _is_real(self.coverage) or self.coverage < 0.0:
            raise KeeperError(f"candidate {self.name!r}: coverage {self.coverage!r} is not a fraction >= 0; "
                              "compute it with keeper.choice.selection.coverage(score, child_params, parent_params)")
        if not _is_real(self.structure) or not 0.0 <= self.structure <= 1.0:
            raise KeeperError(f"candidate {self.name!r}: structure {self.structure!r} is not a fraction in [0, 1]; "
                              "compute it with keeper.choice.preservation.assess")
        if not isinstance(self.preserved, (bool, np.bool_)) or not isinstance(self.clean, (bool, np.bool_)):
            raise KeeperError(f"candidate {self.name!r}: preserved and clean must be True or False")


def coverage(score: float, child_params: int, parent_params: int) -> float:
    """The fraction of the parent's parameter elements that a child inheriting ``score`` of its own uses.

    ``score * child_params`` elements are inherited, each from a distinct parent element, so this is at most 1
    (clipped against rounding); 0 for a parent without parameters.

    Example:
        >>> coverage(1.0, 7_000, 70_000)
        0.1
    """
    if parent_params <= 0:
        return 0.0
    return min(1.0, float(score) * float(child_params) / float(parent_params))


@dataclass(frozen=True)
class ParentChoice:
    """The answer of a parent search: the chosen ``parent`` (None: the child keeps its own weights) and its
    ``score``, the zoo ``uri`` to read it from, the ``noise`` and ``seed`` the transfer is to use, and the
    ``candidates`` the choice considered: the first ``qualified`` of them qualify, in rank order (a data probe scores
    the first ``probe_top`` of those), then the best of the rest by score. ``floor`` is the policy's floor and
    ``models`` how many models the zoo held, for the reason a result gives; ``note`` anything else the reason must say
(registrations the choice did not wait for); ``restart_shrink`` the share of the parent's weights the transfer
keeps when the child is the parent's own architecture (1.0: all of it; see :mod:`keeper.transforms.shrink`);
``withheld`` the best parent the search rule kept from this child and ``rule`` the rule's sentence
(:mod:`keeper.choice.inheritance`).

    Plain data (strings, numbers, a tuple of Candidates), so it crosses Ray without pickling user objects, and
    :meth:`to_json` / :meth:`from_json` carry it as JSON (Ray Train ranks).
    """

    parent: str | None
    score: float
    uri: str
    noise: float
    seed: int
    candidates: tuple[Candidate, ...] = ()
    probe_top: int = 3
    qualified: int = 0
    floor: float = 0.3
    models: int = 0
    note: str = ""
    restart_shrink: float = 1.0
    withheld: str | None = None
    rule: str = ""

    def ranked(self) -> tuple[Candidate, ...]:
        """The qualifying candidates, best first."""
        return self.candidates[:self.qualified]

    def assessment_of(self, name: str | None) -> Assessment | None:
        """The assessment (and alignment) the choice made of candidate ``name``, None when it made none."""
        return next((c.assessment for c in self.candidates if c.name == name), None)

    def to_json(self) -> str:
        """JSON text of the choice, assessments and alignments included (pairs as lists): what Ray Train's ranks
        receive, so every rank transfers along rank 0's alignment."""
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["candidates"] = [_plain(c) for c in self.candidates]
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str | bytes) -> "ParentChoice":
        d = json.loads(text)
        d["candidates"] = tuple(Candidate(**{**c, "assessment": None if c.get("assessment") is None
                                              else _assessment(c["assessment"])}) for c in d["candidates"])
        return cls(**d)


def _assessment(plain: dict) -> "Assessment":
    """An assessment read back; its module (which loads the aligner) is imported only when a choice carries one."""
    from keeper.choice.preservation import Assessment

    return Assessment.from_plain(plain)


def _plain(c: Candidate) -> dict[str, Any]:
    d: dict[str, Any] = {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
    d.update(score=float(c.score), accuracy=float(c.accuracy), coverage=float(c.coverage),
             preserved=bool(c.preserved), structure=float(c.structure), clean=bool(c.clean),
             assessment=None if c.assessment is None else c.assessment.to_plain())
    return d


#: How many candidates a choice lists at least (the report's table).
SHOWN = 5


def make_choice(candidates: Iterable[Candidate], policy: "SelectionPolicy", uri: str, noise: float, seed: int,
                models: int = 0) -> ParentChoice:
    """The :class:`ParentChoice` for ``candidates`` under ``policy``: the best ranked one that may be the parent
    without a probe (:meth:`SelectionPolicy.stands_alone`; None when none does), the qualifying ones in rank order
    (a probe scores the first ``probe_top``, those across block structures included), then the others by score,
    at least :data:`SHOWN` and at least ``policy.probe_top`` of them."""
    cands = list(candidates)
    ranked = rank_parents(cands, policy)
    rest = sorted((c for c in cands if c not in ranked), key=lambda c: (-c.score, c.name))
    keep = max(SHOWN, policy.probe_top)
    listed = tuple((ranked + rest)[:keep])
    best = next((c for c in ranked if policy.stands_alone(c)), None)
    return ParentChoice(best.name if best else None, float(best.score) if best else 0.0, uri, float(noise),
                        int(seed), listed, int(policy.probe_top), min(len(ranked), keep), float(policy.floor),
                        int(models))


@dataclass(frozen=True)
class SelectionPolicy:
    """How :func:`choose_parent` ranks candidates.

    Attributes:
        floor: similarity below which a candidate is never used (in [0, 1]).
        buckets: number of equal-width similarity buckets over ``[floor, 1]`` (>= 1).
        accuracy_aware: True: most accurate model of the highest non-empty bucket; False: highest score.
        min_coverage: candidates whose coverage is below this (in [0, 1]) are chosen only when no eligible
            candidate reaches it; 0 turns the rule off.
        preserve: clean candidates the child grows from without losing their function qualify whatever their
            score and rank first (False: they compete on their objective like the rest).
        structure: the objective is ``score * structure`` (False: ``score`` alone, whatever the blocks).
        probe_top: how many of the best-ranked candidates a data probe transforms and scores (>= 1).
        cross_structure: a candidate mapped across block structures (structure below 1) that does not preserve
            function may be the parent without a data probe (False: it stays ranked for a probe, which scores it
            against the cold init, but is never chosen on its own; see the module docstring for why).
    """

    floor: float = 0.3
    buckets: int = 10
    accuracy_aware: bool = True
    min_coverage: float = 0.3
    preserve: bool = True
    structure: bool = True
    probe_top: int = 3
    cross_structure: bool = False

    def __post_init__(self) -> None:
        if not _is_real(self.floor) or not 0.0 <= self.floor <= 1.0:
            raise KeeperError(f"selection floor {self.floor!r}: expected a similarity in [0, 1]; "
                              "0 accepts every candidate, 1 only identical architectures")
        if not isinstance(self.buckets, numbers.Integral) or isinstance(self.buckets, bool) or self.buckets < 1:
            raise KeeperError(f"selection buckets {self.buckets!r}: expected an integer >= 1 "
                              "(1 means: most accurate candidate above the floor)")
        if not isinstance(self.accuracy_aware, bool):
            raise KeeperError(f"selection accuracy_aware {self.accuracy_aware!r}: expected True or False")
        if not _is_real(self.min_coverage) or not 0.0 <= self.min_coverage <= 1.0:
            raise KeeperError(f"selection min_coverage {self.min_coverage!r}: expected a fraction in [0, 1]; "
                              "0 turns the coverage rule off")
        for key in ("preserve", "structure", "cross_structure"):
            if not isinstance(getattr(self, key), bool):
                raise KeeperError(f"selection {key} {getattr(self, key)!r}: expected True or False")
        if not isinstance(self.probe_top, numbers.Integral) or isinstance(self.probe_top, bool) or self.probe_top < 1:
            raise KeeperError(f"selection probe_top {self.probe_top!r}: expected an integer >= 1 (how many "
                              "candidates a data probe scores besides the cold init)")

    def objective(self, c: Candidate) -> float:
        """What the buckets cut: the candidate's fit (``score * structure``), or its score with ``structure``
        off."""
        return c.fit if self.structure else float(c.score)

    def qualifies(self, c: Candidate) -> bool:
        """Whether ``c`` may become a parent at all: preserved and clean (with ``preserve``), or objective at or
        above the floor."""
        return (self.preserve and c.preserved and c.clean) or self.objective(c) >= self.floor

    def stands_alone(self, c: Candidate) -> bool:
        """Whether ``c``, once it qualifies, may be the parent without a data probe: it preserves function or maps
        block onto block (structure 1), or ``cross_structure`` allows any."""
        return self.cross_structure or c.preserved or c.structure >= 1.0

    def bucket(self, score: float) -> int:
        """The bucket of ``score``: 0 just above the floor, ``buckets - 1`` at similarity 1.

        Scores above 1 (rounding) fall in the top bucket; the caller has already dropped those below the floor.

        Example:
            >>> SelectionPolicy(floor=0.5, buckets=5).bucket(0.95)
            4
        """
        width = 1.0 - self.floor
        if width <= 0.0:  # floor == 1: only exact matches remain, all in one bucket
            return self.buckets - 1
        b = math.floor((score - self.floor) / width * self.buckets)
        return min(max(b, 0), self.buckets - 1)


def rank_parents(candidates: Iterable[Candidate], policy: SelectionPolicy = SelectionPolicy()) -> list[Candidate]:
    """Every qualifying candidate, best first (the first is :func:`choose_parent`'s answer; a data probe scores
    the first ``policy.probe_top``).

    Order: tier (clean and preserved, then clean, then the rest), then, accuracy-aware, the bucket of the objective
    (highest first) and accuracy; plain: the objective and accuracy. Within a tier, candidates below
    ``policy.min_coverage`` follow those above it when any is above it. Ties: higher objective, higher accuracy,
    higher coverage, smaller name. The order does not depend on the input order.

    Example:
        >>> cands = [Candidate("slice", 1.0, 0.9, structure=0.4), Candidate("grow", 0.25, 0.8, preserved=True)]
        >>> [c.name for c in rank_parents(cands)]
        ['grow', 'slice']
    """
    eligible = [c for c in candidates if policy.qualifies(c)]
    if not eligible:
        return []
    covered = any(c.coverage >= policy.min_coverage for c in eligible)

    def key(c: Candidate) -> tuple:
        tier = (0 if policy.preserve and c.preserved and c.clean else 1) if c.clean else 2
        short = 1 if covered and c.coverage < policy.min_coverage and not (policy.preserve and c.preserved) else 0
        obj = policy.objective(c)
        if policy.accuracy_aware:
            return (tier, short, -policy.bucket(obj), -c.accuracy, -obj, -c.coverage, c.name)
        return (tier, short, -obj, -c.accuracy, -c.coverage, c.name)

    return sorted(eligible, key=key)


def choose_parent(candidates: Iterable[Candidate], policy: SelectionPolicy = SelectionPolicy()) -> Candidate | None:
    """The candidate to warm-start from without a data probe, or None when none qualifies (see
    :func:`rank_parents`).

    A clean candidate the child grows from without losing its function wins over any that merely has elements to
    slice; among the rest, the objective (``score * structure``) is bucketed over ``[floor, 1]`` and the most
    accurate of the highest non-empty bucket wins (accuracy-aware, the default), or the highest objective wins
    (plain). Candidates below ``policy.min_coverage`` win only when no qualifying one reaches it. One mapped across
    block structures that does not preserve function wins only with ``policy.cross_structure``.

    Args:
        candidates: scored zoo models.
        policy: floor, buckets, rule, and whether preserved function and structure count.

    Returns:
        The chosen candidate, or None.

    Example:
        >>> cands = [Candidate("a", 0.99, 0.70), Candidate("b", 0.95, 0.90), Candidate("c", 0.50, 0.99)]
        >>> choose_parent(cands).name
        'b'
        >>> choose_parent(cands, SelectionPolicy(accuracy_aware=False)).name
        'a'
        >>> choose_parent([Candidate("big", 1.0, 0.9, coverage=0.1), Candidate("mlp", 0.9, 0.4)]).name
        'mlp'
        >>> vgg, narrow = Candidate("vgg", 1.0, 0.9, structure=0.3), Candidate("narrow", 0.25, 0.8, preserved=True)
        >>> choose_parent([vgg, narrow]).name
        'narrow'
        >>> choose_parent([vgg]) is None, choose_parent([vgg], SelectionPolicy(cross_structure=True)).name
        (True, 'vgg')
    """
    return next((c for c in rank_parents(candidates, policy) if policy.stands_alone(c)), None)


def reason_of(choice: ParentChoice) -> str:
    """One sentence: why this parent, or why none (and the search rule's verdict and the choice's note, when it has
    them)."""
    if choice.withheld is not None:
        why = f"{choice.rule}; the child keeps its own weights"
    else:
        why = _why(choice) + (f"; {choice.rule}" if choice.rule else "")
    return f"{why}; {choice.note}" if choice.note else why


def _why(choice: ParentChoice) -> str:
    if choice.parent is None:
        if choice.models == 0 and not choice.candidates:
            return "the zoo holds no model yet; the child keeps its own weights"
        if choice.qualified:  # every qualifying candidate maps across block structures (SelectionPolicy)
            top = choice.candidates[0]
            return (f"{top.name!r} (similarity {top.score:.3f}, structure {top.structure:.3f}) maps layers across "
                    "block structures without preserving function, and no data probe vouched for it: what it "
                    "inherits sits elsewhere in the child's blocks and computes something else there, so the child "
                    "keeps its own weights (a probe, or selection cross_structure: true, lets it be used)")
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
