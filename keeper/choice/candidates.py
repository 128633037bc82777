"""Which zoo models are candidates for a child, and what each one's alignment keeps.

The embedded zoo and the service's front door assemble candidates the same way, here: a model may qualify by fit
(its score, hence its signature bound, at or above the floor) or by preserved function (every parent element
inherited: its element count at most the child's and covered by its bound, whatever the floor); only those are
aligned exactly, and only those whose exact score qualifies them are assessed (preserved function, structure).

Invariant: the candidates of a child depend only on the zoo's models and their exact scores, never on which
process assembled them (the service may find more models by its search, but assesses each one alike).
"""

from __future__ import annotations

import collections
import hashlib
import threading
from typing import Callable, Hashable, Mapping, NamedTuple

import numpy as np

from keeper.choice.preservation import Assessment, Roles, assess, layer_roles
from keeper.choice.selection import Candidate, coverage
from keeper.graph import LayerGraph
from keeper.matching import MatchArrays, align, match_arrays

__all__ = ["ParentFacts", "Assessable", "AssessedPairs", "architecture_digest", "may_qualify_all", "assess_found",
           "assess_candidate"]


class ParentFacts(NamedTuple):
    """What the catalog says of a zoo model: its accuracy, whether its lineage is clean, its element count."""

    accuracy: float
    clean: bool
    total: int


class Assessable(NamedTuple):
    """What assessing an alignment reads of one model: its graph, its match arrays and its layer roles (a zoo keeps
    them per model, so each is computed once)."""

    graph: LayerGraph
    arrays: MatchArrays
    roles: Roles

    @classmethod
    def of(cls, graph: LayerGraph, arrays: MatchArrays | None = None) -> "Assessable":
        return cls(graph, arrays if arrays is not None else match_arrays(graph), layer_roles(graph))


class _Kept(NamedTuple):
    """One assessed pair: the candidate's coverage, preserved and structure, and the assessment behind them."""

    coverage: float
    preserved: bool
    structure: float
    assessment: Assessment


def architecture_digest(arrays: MatchArrays) -> bytes:
    """A child architecture's key: a digest of what its alignments read (layer classes, shapes, vectors)."""
    return hashlib.blake2b(b"".join(np.ascontiguousarray(a).tobytes() for a in (arrays.cls, arrays.shape,
                                                                                 arrays.vectors)),
                           digest_size=16).digest()


class AssessedPairs:
    """What assessing alignments found, per (child architecture, parent version, score, floor): coverage, preserved,
    structure, and the assessment with its alignment (which the transfer from a chosen parent reads). A pure
    function of the two graphs, so a search whose trials share a few architectures assesses each parent once per
    architecture instead of once per query (without it a search of n trials assesses ~n^2 / 2 pairs). Bounded LRU,
    thread-safe; a key must change whenever either graph may (the caller's versions)."""

    def __init__(self, size: int = 4096):
        self._size = size
        self._pairs: collections.OrderedDict[Hashable, _Kept] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> _Kept | None:
        with self._lock:
            hit = self._pairs.get(key)
            if hit is not None:
                self._pairs.move_to_end(key)
            return hit

    def put(self, key: Hashable, value: _Kept) -> None:
        with self._lock:
            self._pairs[key] = value
            while len(self._pairs) > self._size:
                self._pairs.popitem(last=False)


def may_qualify_all(bounds: np.ndarray, totals: np.ndarray, child_total: int, floor: float,
                    preserve: bool) -> np.ndarray:
    """Per parent, whether it may qualify for a child, as a boolean array: by fit (its score bound at or above
    ``floor``) or, with ``preserve``, by preserved function, which needs every parent element inherited (the
    parent's element count at most the child's and covered by the bound). The embedded zoo and the service alike
    skip the others."""
    b = np.asarray(bounds, dtype=np.float64)
    t = np.asarray(totals, dtype=np.int64)
    ok = b >= floor
    if preserve:
        ok |= (t <= child_total) & (b * child_total >= t * (1.0 - 1e-9))  # the bound is a rounded ratio
    return ok


def assess_found(found: Mapping[str, float], child: LayerGraph, floor: float,
                 facts: Callable[[str], ParentFacts],
                 parent: Callable[[str], Assessable],
                 child_arrays: MatchArrays | None = None, assessed: AssessedPairs | None = None,
                 version: Callable[[str], Hashable] | None = None) -> list[Candidate]:
    """One :class:`~keeper.choice.selection.Candidate` per model in ``found`` (name -> exact score).

    ``facts(name)`` is cheap (the catalog); ``parent(name)`` gives the model's :class:`Assessable` and is called
    only for models that may qualify (score at or above ``floor``, or every parent element inherited), whose
    alignment is then assessed; the others are listed with their score and coverage alone. With ``assessed`` and
    ``version(name)`` (a key that identifies the child's architecture and that model's stored content), a pair
    assessed before is taken from ``assessed``; accuracy and lineage are always the catalog's current ones.
    """
    ca = child_arrays if child_arrays is not None else match_arrays(child)
    me = None
    out = []
    for name, score in found.items():
        f = facts(name)
        if score >= floor or int(round(score * ca.total)) >= f.total:
            key = (version(name), float(score), float(floor)) if assessed is not None and version else None
            kept = assessed.get(key) if key is not None else None
            if kept is not None:
                out.append(Candidate(name, float(score), f.accuracy, kept.coverage, preserved=kept.preserved,
                                     structure=kept.structure, clean=f.clean, assessment=kept.assessment))
                continue
            me = me or Assessable.of(child, ca)
            cand = assess_candidate(name, float(score), f.accuracy, f.clean, floor, me, parent(name))
            if key is not None and cand.assessment is not None:
                assessed.put(key, _Kept(cand.coverage, cand.preserved, cand.structure, cand.assessment))
            out.append(cand)
        else:
            out.append(Candidate(name, float(score), f.accuracy, coverage(score, ca.total, f.total), clean=f.clean))
    return out


def assess_candidate(name: str, score: float, accuracy: float, clean: bool, floor: float, child: Assessable,
                     parent: Assessable) -> Candidate:
    """One parent's :class:`~keeper.choice.selection.Candidate` for a child: its exact ``score`` and coverage, and,
    when it may qualify (score at or above ``floor``, or every parent element inherited), what its alignment keeps,
    with the assessment (and its alignment) attached for the transfer.

    Invariant: ``preserved`` is True only when the whole parent is inherited and
    :func:`~keeper.choice.preservation.assess` finds the alignment function-preserving.
    """
    whole = int(round(float(score) * child.arrays.total)) >= parent.arrays.total  # every parent element inherited
    fit = None
    if score >= floor or whole:
        fit = assess(parent.graph, child.graph, align(parent.arrays, child.arrays), (parent.roles, child.roles))
    return Candidate(name, float(score), float(accuracy), coverage(score, child.arrays.total, parent.arrays.total),
                     preserved=bool(fit is not None and fit.preserved and whole),
                     structure=float(fit.structure) if fit is not None else 1.0, clean=bool(clean), assessment=fit)
