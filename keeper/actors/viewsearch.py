"""The front door's search over one zoo View: the state a query reads, built once per view off the query path,
and the exact two-stage plan over view positions (:func:`keeper.actors.clustering.search_positions`).

Invariants:
    * a :class:`SearchState` is built from one View and never changes; the front door swaps it whole, so a query
      never sees half of a change, and a query never waits for one to be built;
    * building one is numpy work over the view's arrays (no Python loop over models): tens of milliseconds for
      100,000 models;
    * the search is exact: a model outside the probed clusters (or in no cluster yet) is scored too when its
      signature bound exceeds the best score the clusters gave, and no model scores above its bound.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from keeper.actors.clustering import MemberGroups, search_positions
from keeper.actors.metrics import QueryClock
from keeper.actors.snapshot import View
from keeper.matching import MatchArrays, upper_bounds

__all__ = ["SearchState", "plan", "batches"]


class SearchState(NamedTuple):
    """What one query reads: the view, the references of its shards, and its clusters as position groups
    (None: the zoo is searched whole)."""

    view: View
    refs: dict
    groups: MemberGroups | None
    is_medoid: np.ndarray  # bool (n,)

    @classmethod
    def build(cls, view: View, refs: dict) -> "SearchState":
        is_medoid = np.zeros(view.n, dtype=bool)
        if view.labels is None or not view.medoids.shape[0]:
            return cls(view, refs, None, is_medoid)
        is_medoid[view.medoids] = True
        return cls(view, refs, MemberGroups.of(view.labels, int(view.medoids.shape[0])), is_medoid)

    @classmethod
    def empty(cls) -> "SearchState":
        return cls.build(View.empty(), {})


def plan(state: SearchState, child: MatchArrays, score: Callable[[np.ndarray, bool], np.ndarray], *,
         clusters_to_probe: int, early_stop: float, brute_force_below: int, two_stage: bool = True,
         clock: QueryClock | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(positions, scores) of the models the plan visited; ``score(positions, exact)`` scores positions of the
    view (``exact``: the call ranks clusters, so a selection floor must not zero any score)."""
    clock = clock or QueryClock()
    view = state.view
    if view.n == 0:
        return np.zeros(0, np.int64), np.zeros(0)
    if not two_stage or state.groups is None or view.n < brute_force_below:
        every = np.arange(view.n, dtype=np.int64)
        return every, score(every, False)
    def bounds() -> np.ndarray:  # O(n): computed only when the clusters leave the best score below 1
        with clock.phase("bounds"):
            return upper_bounds(view.sigs, child)

    def scored(pos: np.ndarray) -> np.ndarray:
        # medoid-only calls rank clusters and need exact scores; the others only feed the choice
        return score(pos, bool(pos.shape[0]) and bool(state.is_medoid[pos].all()))

    with clock.phase("plan"):  # the whole two-stage search; its scoring is in pool_s, its bounds in bounds_s
        return search_positions(view.labels, view.medoids, scored, clusters_to_probe=clusters_to_probe,
                                early_stop=early_stop, brute_force_below=brute_force_below, bounds=bounds,
                                groups=state.groups)


def batches(state: SearchState, child: MatchArrays, pos: np.ndarray, parts: int,
            floor: float | None) -> tuple[list[tuple], list[np.ndarray]]:
    """``pos`` split into ``parts`` contiguous requests of equal size, one part per shard within each: the
    requests (``Matcher.score_timed`` arguments) and, for each part in order, the indices into ``pos`` it
    scores."""
    view = state.view
    requests, order = [], []
    for chunk in np.array_split(np.arange(pos.shape[0]), max(1, min(parts, pos.shape[0]))):
        p = pos[chunk]
        shard_of = view.shard[p]
        items: list[Any] = []
        for s in np.unique(shard_of):
            sel = shard_of == s
            sid = view.shards[int(s)]
            items.append((sid, state.refs[sid], view.row[p[sel]]))
            order.append(chunk[sel])
        requests.append((child, items, floor, view.shards))
    return requests, order
