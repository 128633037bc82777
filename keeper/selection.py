"""Parent choice: similarity first, then accuracy among the nearly-as-similar.

A candidate is a zoo model with its similarity ``score`` to the child (in [0, 1], see
:func:`keeper.similarity`), its ``coverage`` (the fraction of the parent's own parameter elements that the
child inherits) and its recorded ``accuracy``. Candidates below ``policy.floor`` never become parents: too
little of the child would be inherited to be worth the transform. Among the rest, a plain "highest score" rule
would pick a barely-more-similar but much worse model, so (as ModelKeeper does) the similarity range
``[floor, 1]`` is cut into ``policy.buckets`` equal-width buckets and the most accurate model of the highest
non-empty bucket wins.

Coverage guards against a parent many times larger than the child: any large weight matrix contains a block of
the child's shape, so such a parent "covers" a small child completely by slicing, yet the sliced blocks carry
none of its function (a small MLP scores 1.0 against a transformer whose linear layers are wider). Candidates
whose coverage is below ``policy.min_coverage`` are therefore considered only when no candidate clears it.

Invariants:
    * the result is ``None`` exactly when no candidate scores ``>= policy.floor``;
    * the result has coverage ``>= policy.min_coverage`` whenever an eligible candidate does;
    * among those considered, the result lies in the highest non-empty bucket (accuracy-aware) or has the
      highest score (plain);
    * the result depends only on the set of candidates, never on their order (ties: higher score or accuracy,
      then higher coverage, then the smaller name).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Iterable

from keeper.errors import KeeperError

__all__ = ["Candidate", "ParentChoice", "SelectionPolicy", "choose_parent", "coverage"]


def _is_real(x: object) -> bool:
    # numbers.Real also admits numpy scalars (np.float32 is no float subclass)
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and not math.isnan(x)


@dataclass(frozen=True)
class Candidate:
    """A possible parent: its zoo ``name``, its similarity ``score`` to the child, its ``accuracy``, and its
    ``coverage``: the fraction of the parent's parameter elements the child inherits (see :func:`coverage`)."""

    name: str
    score: float
    accuracy: float
    coverage: float = 1.0

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
                              "compute it with keeper.selection.coverage(score, child_params, parent_params)")


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
    ``score``, the zoo ``uri`` to read it from, the ``noise`` and ``seed`` the transfer is to use, and the best
    ``candidates`` the choice considered (by score, at most five).

    Plain data (strings, floats, a tuple of Candidates), so it crosses Ray without pickling user objects.
    """

    parent: str | None
    score: float
    uri: str
    noise: float
    seed: int
    candidates: tuple[Candidate, ...] = ()


@dataclass(frozen=True)
class SelectionPolicy:
    """How :func:`choose_parent` ranks candidates.

    Attributes:
        floor: similarity below which a candidate is never used (in [0, 1]).
        buckets: number of equal-width similarity buckets over ``[floor, 1]`` (>= 1).
        accuracy_aware: True: most accurate model of the highest non-empty bucket; False: highest score.
        min_coverage: candidates whose coverage is below this (in [0, 1]) are chosen only when no eligible
            candidate reaches it; 0 turns the rule off.
    """

    floor: float = 0.3
    buckets: int = 10
    accuracy_aware: bool = True
    min_coverage: float = 0.3

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


def choose_parent(candidates: Iterable[Candidate], policy: SelectionPolicy = SelectionPolicy()) -> Candidate | None:
    """The candidate to warm-start from, or None when none clears ``policy.floor``.

    Candidates below ``policy.floor`` are dropped; if any of the rest has coverage ``>= policy.min_coverage``,
    those with less are dropped too. Accuracy-aware (the default): the remaining candidates are bucketed by
    similarity normalised over ``[floor, 1]``, and the most accurate of the highest non-empty bucket wins (ties:
    higher score, higher coverage, then smaller name). Otherwise the highest score wins (ties: higher accuracy,
    higher coverage, then smaller name). The result does not depend on input order.

    Args:
        candidates: scored zoo models.
        policy: floor, bucket count and rule.

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
    """
    eligible = [c for c in candidates if c.score >= policy.floor]
    if not eligible:
        return None
    eligible = [c for c in eligible if c.coverage >= policy.min_coverage] or eligible
    if not policy.accuracy_aware:
        return min(eligible, key=lambda c: (-c.score, -c.accuracy, -c.coverage, c.name))
    top = max(policy.bucket(c.score) for c in eligible)
    return min((c for c in eligible if policy.bucket(c.score) == top),
               key=lambda c: (-c.accuracy, -c.score, -c.coverage, c.name))
