"""Building the two-stage search index of a zoo: k-medoids over ``1 - similarity``, fitted on a sample.

Similarity is directed (parent -> child); the clustering distance is its symmetric form
``d(a, b) = 1 - (s(a -> b) + s(b -> a)) / 2``. FasterPAM (:meth:`keeper.actors.clustering.ClusterIndex.fit`) runs on at
most ``fit_sample`` models; the others join their nearest medoid (``ClusterIndex.add``), which costs ``k``
alignments each instead of ``N``. k defaults to ``round(sqrt(N))`` as in ModelKeeper.

Invariant: the returned index holds exactly the names given, each in one cluster; its ``fit_cost`` is the mean
distance of the members other than medoids to their medoid (the reference of the manager's drift criterion).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from keeper.actors.clustering import ClusterIndex, default_k
from keeper.matching import MatchArrays, PackedParents, score_many

__all__ = ["pair_scores", "symmetric_distance", "fit_index"]


def pair_scores(parents: Sequence[MatchArrays], children: Sequence[MatchArrays]) -> np.ndarray:
    """``S[i, j] = similarity(parents[i], children[j])`` (one compiled batch call per child)."""
    out = np.zeros((len(parents), len(children)), dtype=np.float64)
    if not parents:
        return out
    packed = PackedParents.pack(list(parents))
    for j, child in enumerate(children):
        out[:, j] = score_many(packed, child)
    return out


def symmetric_distance(a: Sequence[MatchArrays], b: Sequence[MatchArrays] | None = None) -> np.ndarray:
    """``D[i, j] = 1 - (s(a_i -> b_j) + s(b_j -> a_i)) / 2``, in [0, 1]; ``b`` None means ``a`` against itself
    (half the alignments: both directions come from one score matrix)."""
    if b is None:
        ba = pair_scores(a, a)  # s(a_i -> a_j)
        ab = ba.T
    else:
        ab = pair_scores(b, a).T   # s(b_j -> a_i): one call per a_i
        ba = pair_scores(a, b)     # s(a_i -> b_j): one call per b_j
    return np.clip(1.0 - (ab + ba) / 2.0, 0.0, 1.0)


def fit_index(names: Sequence[str], arrays: dict[str, MatchArrays], *, k: int | None = None,
              fit_sample: int = 1000, seed: int = 0) -> ClusterIndex:
    """A ClusterIndex over ``names`` (their arrays in ``arrays``).

    Example:
        >>> index = fit_index(zoo.names(), {n: match_arrays(zoo.graph(n)) for n in zoo.names()})  # doctest: +SKIP
        >>> len(index.medoid_names)                                                              # doctest: +SKIP
        12
    """
    names = sorted(names)
    if len(names) > fit_sample:
        rng = np.random.default_rng(seed)
        sample = sorted(rng.choice(np.array(names, dtype=object), fit_sample, replace=False).tolist())
    else:
        sample = list(names)
    dist = symmetric_distance([arrays[n] for n in sample])
    np.fill_diagonal(dist, 0.0)
    kk = min(k or default_k(len(names)), len(sample))
    index = ClusterIndex.fit(sample, dist, k=kk)
    # the medoids (distance 0) left out: arrivals are compared with the members a medoid has to describe
    own = np.ones(len(sample), dtype=bool)
    own[index.medoid_positions()] = False
    costs = [dist[own][:, index.medoid_positions()].min(axis=1)] if len(index) else []
    in_sample = set(sample)
    rest = [n for n in names if n not in in_sample]
    if rest:
        medoids = list(index.medoid_names)
        d = symmetric_distance([arrays[n] for n in rest], [arrays[m] for m in medoids])
        for name, row in zip(rest, d):
            index.add(name, row)
        costs.append(d.min(axis=1))
    index.stale = 0
    every = np.concatenate(costs) if costs else np.zeros(0)
    index.fit_cost = float(np.mean(every)) if every.size else None
    return index
