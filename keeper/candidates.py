"""Which zoo models are candidates for a child, and what each one's alignment keeps.

The embedded zoo and the service's front door assemble candidates the same way, here: a model may qualify by fit
(its score, hence its signature bound, at or above the floor) or by preserved function (every parent element
inherited: its element count at most the child's and covered by its bound, whatever the floor); only those are
aligned exactly, and only those whose exact score qualifies them are assessed (preserved function, structure).

Invariant: the candidates of a child depend only on the zoo's models and their exact scores, never on which
process assembled them (the service may find more models by its search, but assesses each one alike).
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple

import numpy as np

from keeper.graph import LayerGraph
from keeper.matching import MatchArrays, match_arrays
from keeper.preservation import assess_candidate, layer_roles
from keeper.selection import Candidate, coverage

__all__ = ["ParentFacts", "may_qualify_all", "assess_found"]


class ParentFacts(NamedTuple):
    """What the catalog says of a zoo model: its accuracy, whether its lineage is clean, its element count."""

    accuracy: float
    clean: bool
    total: int


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
                 parent: Callable[[str], tuple[LayerGraph, MatchArrays, tuple[np.ndarray, np.ndarray]]],
                 child_arrays: MatchArrays | None = None) -> list[Candidate]:
    """One :class:`~keeper.selection.Candidate` per model in ``found`` (name -> exact score).

    ``facts(name)`` is cheap (the catalog); ``parent(name)`` gives (graph, match arrays, layer roles) and is called
    only for models that may qualify (score at or above ``floor``, or every parent element inherited), whose
    alignment is then assessed; the others are listed with their score and coverage alone.
    """
    ca = child_arrays if child_arrays is not None else match_arrays(child)
    me = None
    out = []
    for name, score in found.items():
        f = facts(name)
        if score >= floor or int(round(score * ca.total)) >= f.total:
            me = me or (child, ca, layer_roles(child))
            out.append(assess_candidate(name, float(score), f.accuracy, f.clean, floor, me, parent(name)))
        else:
            out.append(Candidate(name, float(score), f.accuracy, coverage(score, ca.total, f.total), clean=f.clean))
    return out
