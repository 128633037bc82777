"""k-medoids over the zoo, and the two-stage candidate search that uses it.

Scoring a child against every zoo model costs one alignment each. Architectures come in families, so the zoo is
partitioned into clusters around medoids (FasterPAM, from the ``kmedoids`` package): a query scores the medoids
first, then only the members of the clusters whose medoids scored best.

Similarity is directed (``s(parent, child)`` is the share of the child inherited from the parent), but a
clustering needs a symmetric distance: callers pass ``d(a, b) = 1 - (s(a, b) + s(b, a)) / 2``, and
:meth:`ClusterIndex.fit` symmetrises whatever it gets (``(D + D.T) / 2``), zeroes the diagonal and clips to
[0, 1].

Invariants of :class:`ClusterIndex`:
    * every name is in exactly one cluster; every cluster has exactly one medoid, which is one of its members;
    * cluster ids are ``0 .. len(medoid_names) - 1`` (removing the last member of a cluster renumbers the
      clusters after it);
    * the index is pure data (lists of str and int): :meth:`~ClusterIndex.to_arrays` gives numpy arrays that Ray
      moves without pickling Python objects, and whose ``tolist()`` is JSON.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from keeper.errors import KeeperError, ModelNotFoundError

__all__ = ["ClusterIndex", "MemberGroups", "two_stage_search", "search_positions", "default_k"]


def default_k(n: int) -> int:
    """``round(sqrt(n))`` clipped to ``[1, n]`` (ModelKeeper's choice); 0 for an empty zoo."""
    if n <= 0:
        return 0
    return min(max(1, int(round(math.sqrt(n)))), n)


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


class ClusterIndex:
    """Members partitioned into clusters, each with a medoid. Pure data + numpy; no Ray.

    Args:
        names: member names, unique.
        medoids: for each cluster, the position in ``names`` of its medoid.
        labels: for each name, its cluster id (a position in ``medoids``).
        stale: adds and removes since the last fit.

    Example:
        >>> d = np.array([[0, .1, .9, .9], [.1, 0, .9, .9], [.9, .9, 0, .1], [.9, .9, .1, 0]])
        >>> index = ClusterIndex.fit(["a", "b", "c", "d"], d, k=2)
        >>> sorted(index.members(index.cluster_of("c")))
        ['c', 'd']
        >>> index.add("e", np.array([0.05, 0.8])) == index.cluster_of("a")
        True
    """

    def __init__(self, names: Sequence[str] = (), medoids: Sequence[int] = (), labels: Sequence[int] = (), *,
                 stale: int = 0) -> None:
        names = list(names)
        medoids = [int(m) for m in medoids]
        labels = [int(c) for c in labels]
        for n in names:
            if not isinstance(n, str):
                raise KeeperError(f"cluster index: member name {n!r} is not a str; pass model names")
        pos = {n: i for i, n in enumerate(names)}
        if len(pos) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise KeeperError(f"cluster index: names {dup} appear more than once; each model must be listed once")
        if len(labels) != len(names):
            raise KeeperError(f"cluster index: {len(labels)} labels for {len(names)} names; expected one cluster "
                              "id per name")
        if len(set(medoids)) != len(medoids) or any(not 0 <= m < len(names) for m in medoids):
            raise KeeperError(f"cluster index: medoids {medoids} must be distinct positions in names "
                              f"(0..{len(names) - 1})")
        if names and not medoids:
            raise KeeperError(f"cluster index: {len(names)} names but no medoid; every cluster needs one")
        for n, c in zip(names, labels):
            if not 0 <= c < len(medoids):
                raise KeeperError(f"cluster index: {n!r} has cluster id {c}; expected 0..{len(medoids) - 1}")
        for c, m in enumerate(medoids):
            if labels[m] != c:
                raise KeeperError(f"cluster index: medoid {names[m]!r} of cluster {c} is labelled {labels[m]}; "
                                  "a medoid must belong to its own cluster")
        if not _is_int(stale) or stale < 0:
            raise KeeperError(f"cluster index: stale {stale!r}; expected an integer >= 0")
        self._names = names
        self._medoids = medoids
        self._labels = labels
        self._pos = pos
        #: adds and removes since the last fit; a caller re-fits in the background once this exceeds a share of N
        self.stale = int(stale)
        self._groups: MemberGroups | None = None
        #: mean distance of the members to their medoid when the index was fitted (None: not known); the
        #: reference a caller measures drift against (:func:`keeper.actors.indexing.fit_index` sets it)
        self.fit_cost: float | None = None

    # -- building
    @classmethod
    def fit(cls, names: Sequence[str], distance: np.ndarray, k: int | None = None, *, seed: int = 0,
            max_iter: int = 100) -> "ClusterIndex":
        """Cluster ``names`` by FasterPAM over their pairwise ``distance`` matrix.

        The matrix is symmetrised (``(D + D.T) / 2``), its diagonal zeroed and its entries clipped to [0, 1], so
        ``1 - similarity`` in either direction may be passed; the symmetric form
        ``1 - (s(a, b) + s(b, a)) / 2`` is what it should mean. Identical points can leave FasterPAM with fewer
        than ``k`` distinct medoids; the index then has fewer clusters. Deterministic for a given ``seed``.

        Args:
            names: the members, unique; ``distance[i, j]`` is between ``names[i]`` and ``names[j]``.
            distance: ``(N, N)`` finite distances.
            k: number of clusters; default ``round(sqrt(N))``; clipped to ``[1, N]``.
            seed: seed of FasterPAM's random initialisation.
            max_iter: FasterPAM's iteration limit.

        Returns:
            A fresh index (``stale == 0``); empty when ``names`` is.

        Example:
            >>> d = np.array([[0, .1, .9], [.1, 0, .9], [.9, .9, 0]])
            >>> index = ClusterIndex.fit(["a", "b", "c"], d, k=2)
            >>> [index.members(c) for c in range(len(index.medoid_names))]
            [['a', 'b'], ['c']]
        """
        names = list(names)
        n = len(names)
        d = np.asarray(distance, dtype=np.float64)
        if d.shape != (n, n):
            raise KeeperError(f"cluster fit: distance matrix has shape {d.shape}; expected ({n}, {n}) for "
                              f"{n} names")
        if not np.all(np.isfinite(d)):
            raise KeeperError("cluster fit: distance matrix holds NaN or infinite entries; expected distances "
                              "in [0, 1] (1 - similarity)")
        if k is not None and (not _is_int(k) or k < 1):
            raise KeeperError(f"cluster fit: k={k!r}; expected an integer >= 1, or None for round(sqrt(N))")
        if not _is_int(max_iter) or max_iter < 1:
            raise KeeperError(f"cluster fit: max_iter={max_iter!r}; expected an integer >= 1")
        if n == 0:
            return cls()
        d = np.clip((d + d.T) / 2.0, 0.0, 1.0)
        np.fill_diagonal(d, 0.0)
        kk = default_k(n) if k is None else min(int(k), n)
        if kk >= n:
            medoids = list(range(n))
        else:
            # imported here, in the one process that fits: kmedoids imports scikit-learn where it is installed,
            # which no process that only searches or warms should pay for
            import kmedoids

            # n_cpu=1: the parallel variant is not reproducible from a seed
            res = kmedoids.fasterpam(d, kk, max_iter=int(max_iter), init="random", random_state=int(seed), n_cpu=1)
            medoids = sorted({int(m) for m in res.medoids})
        # Own assignment rather than FasterPAM's labels: ties go to the lowest cluster id and a medoid always
        # lands in its own cluster, even when it has a duplicate.
        labels = np.argmin(d[:, medoids], axis=1)
        labels[medoids] = np.arange(len(medoids))
        return cls(names, medoids, labels.tolist())

    def add(self, name: str, distance_to_medoids: np.ndarray) -> int:
        """Put ``name`` in the cluster of its nearest medoid at once (no re-fit); returns that cluster id.

        Args:
            name: a name not yet in the index.
            distance_to_medoids: its (symmetric) distance to each medoid, in ``medoid_names`` order; empty when
                the index is, and the newcomer then becomes the medoid of cluster 0.

        Returns:
            The cluster id (ties: the lowest).
        """
        if not isinstance(name, str):
            raise KeeperError(f"cluster index: member name {name!r} is not a str; pass the model's name")
        if name in self._pos:
            raise KeeperError(f"cluster index: {name!r} is already a member (cluster {self.cluster_of(name)}); "
                              "remove it first to move it")
        d = np.asarray(distance_to_medoids, dtype=np.float64).reshape(-1)
        if d.shape[0] != len(self._medoids):
            raise KeeperError(f"cluster index: {d.shape[0]} distances given for {name!r}; expected one per "
                              f"medoid ({len(self._medoids)}, in medoid_names order)")
        if np.any(np.isnan(d)):
            raise KeeperError(f"cluster index: distances for {name!r} hold NaN; expected numbers in [0, 1]")
        self._pos[name] = len(self._names)
        self._names.append(name)
        if not self._medoids:
            self._medoids.append(self._pos[name])
            c = 0
        else:
            c = int(np.argmin(d))
        self._labels.append(c)
        self.stale += 1
        self._groups = None
        return c

    def remove(self, name: str) -> None:
        """Take ``name`` out. A removed medoid hands its cluster to the cluster's first remaining member, or the
        cluster goes when it was the last one (later cluster ids shift down by one).

        The promoted medoid is not the best one (the index keeps no distances), which is why a removal counts
        toward :attr:`stale` as an add does.
        """
        p = self._position(name)
        c = self._labels[p]
        if self._medoids[c] == p:
            heir = next((i for i, lab in enumerate(self._labels) if lab == c and i != p), None)
            if heir is not None:
                self._medoids[c] = heir
            else:
                del self._medoids[c]
                self._labels = [lab - 1 if lab > c else lab for lab in self._labels]
        del self._names[p]
        del self._labels[p]
        self._medoids = [m - 1 if m > p else m for m in self._medoids]
        self._pos = {n: i for i, n in enumerate(self._names)}
        self.stale += 1
        self._groups = None

    # -- reading
    @property
    def names(self) -> list[str]:
        """Every member, in index order."""
        return list(self._names)

    @property
    def medoid_names(self) -> list[str]:
        """The medoid of each cluster, by cluster id."""
        return [self._names[m] for m in self._medoids]

    def members(self, cluster: int) -> list[str]:
        """Members of ``cluster`` (its medoid included), in index order."""
        if not _is_int(cluster) or not 0 <= cluster < len(self._medoids):
            raise KeeperError(f"cluster index: no cluster {cluster!r}; expected 0..{len(self._medoids) - 1}")
        return [self._names[i] for i in self.groups().members(np.array([cluster])).tolist()]

    def labels(self) -> np.ndarray:
        """The cluster id of every member, in index order (int64; a fresh array)."""
        return np.array(self._labels, dtype=np.int64)

    def medoid_positions(self) -> np.ndarray:
        """The position in :attr:`names` of each cluster's medoid, by cluster id (int64; a fresh array)."""
        return np.array(self._medoids, dtype=np.int64)

    def groups(self) -> "MemberGroups":
        """The members of every cluster as positions (kept until the next add or remove)."""
        if self._groups is None:
            self._groups = MemberGroups.of(self.labels(), len(self._medoids))
        return self._groups

    def cluster_of(self, name: str) -> int:
        """The cluster id of ``name``."""
        return self._labels[self._position(name)]

    def _position(self, name: str) -> int:
        try:
            return self._pos[name]
        except (KeyError, TypeError):
            raise ModelNotFoundError(f"cluster index: {name!r} is not a member; list members with .names") from None

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._pos

    def __repr__(self) -> str:
        return f"ClusterIndex({len(self._names)} members, {len(self._medoids)} clusters, stale={self.stale})"

    # -- moving and keeping
    def to_arrays(self) -> dict[str, np.ndarray]:
        """The index as plain numpy arrays (no object dtype): ``names`` (str), ``medoids``, ``labels``, ``stale``
        (int64). ``{k: v.tolist()}`` of it is JSON; :meth:`from_arrays` takes either form."""
        return {
            "names": np.array(self._names, dtype=str),
            "medoids": np.array(self._medoids, dtype=np.int64),
            "labels": np.array(self._labels, dtype=np.int64),
            "stale": np.array(self.stale, dtype=np.int64),
        }

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Any]) -> "ClusterIndex":
        """Rebuild an index from :meth:`to_arrays` output (numpy arrays or their ``tolist()``), checking it."""
        missing = {"names", "medoids", "labels"} - set(arrays)
        if missing:
            raise KeeperError(f"cluster index arrays lack {sorted(missing)}; pass the dict ClusterIndex.to_arrays() "
                              "returned")
        return cls([str(n) for n in np.asarray(arrays["names"]).reshape(-1).tolist()],
                   np.asarray(arrays["medoids"], dtype=np.int64).reshape(-1).tolist(),
                   np.asarray(arrays["labels"], dtype=np.int64).reshape(-1).tolist(),
                   stale=int(np.asarray(arrays.get("stale", 0))))


def two_stage_search(index: ClusterIndex, score: Callable[[Sequence[str]], np.ndarray], *,
                     clusters_to_probe: int = 3, early_stop: float = 0.95,
                     brute_force_below: int = 64, bounds: np.ndarray | None = None) -> tuple[list[str], np.ndarray]:
    """Score the members of ``index`` most likely to hold the best parent, in at most three ``score`` calls.

    Below ``brute_force_below`` members every member is scored in one call. Otherwise the medoids are scored
    first; if the best medoid reaches ``early_stop`` only its cluster is probed, else the ``clusters_to_probe``
    clusters with the best medoid scores; all the probed clusters' other members go to ``score`` in one call
    (``score`` is expected to fan out in parallel, so one large batch beats several small ones). With
    ``bounds``, a last call scores every member not scored yet whose bound exceeds the best score found so far:
    no member scores above its bound, so the best member is always found (the search is exact; the alignments it
    adds per query: reports/bench_scale.md). :func:`search_positions` is the same plan over member positions (what
    the service runs).

    Args:
        index: the zoo's clusters.
        score: maps a list of member names to their similarity scores, one float per name, in order.
        clusters_to_probe: clusters whose members are scored when no medoid reaches ``early_stop``.
        early_stop: medoid score from which its cluster alone is probed (above 1: never).
        brute_force_below: indexes with fewer members are scored whole.
        bounds: an upper bound of every member's score, in the order of ``index.names``
            (:func:`keeper.matching.upper_bounds`); None skips the last call.

    Returns:
        ``(names, scores)``: every name scored, once each (medoids first, by cluster id, then the probed members),
        and their scores as float64.

    Example:
        >>> d = np.array([[0, .1, .9, .9], [.1, 0, .9, .9], [.9, .9, 0, .1], [.9, .9, .1, 0]])
        >>> index = ClusterIndex.fit(["a", "b", "c", "d"], d, k=2)
        >>> query = dict(zip("abcd", [0.2, 0.3, 0.9, 0.97]))
        >>> names, s = two_stage_search(index, lambda ns: np.array([query[n] for n in ns]),
        ...                             clusters_to_probe=1, brute_force_below=0)
        >>> names[int(np.argmax(s))]
        'd'
    """
    names = index.names
    if bounds is not None:
        bounds = np.asarray(bounds, dtype=np.float64).reshape(-1)
        if bounds.shape[0] != len(index):
            raise KeeperError(f"two-stage search: {bounds.shape[0]} bounds for an index of {len(index)} members; "
                              "pass one bound per member, in the order of index.names")
    pos, scores = search_positions(index.labels(), index.medoid_positions(), lambda p: score([names[i] for i in p]),
                                   clusters_to_probe=clusters_to_probe, early_stop=early_stop,
                                   brute_force_below=brute_force_below, bounds=bounds, groups=index.groups())
    return [names[i] for i in pos.tolist()], scores


class MemberGroups(NamedTuple):
    """The members of every cluster: cluster ``c`` holds positions ``order[starts[c]:starts[c + 1]]``, ascending.
    Positions labelled below 0 (in no cluster) are in none."""

    order: np.ndarray    # int64 (members,)
    starts: np.ndarray   # int64 (clusters + 1,)

    @classmethod
    def of(cls, labels: np.ndarray, clusters: int) -> "MemberGroups":
        labels = np.asarray(labels, dtype=np.int64)
        order = np.argsort(labels, kind="stable")
        return cls(order.astype(np.int64), np.searchsorted(labels[order], np.arange(clusters + 1)).astype(np.int64))

    def members(self, clusters: np.ndarray) -> np.ndarray:
        """Positions of the members of ``clusters``, cluster after cluster."""
        parts = [self.order[self.starts[c]:self.starts[c + 1]] for c in np.asarray(clusters).tolist()]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def search_positions(labels: np.ndarray, medoids: np.ndarray, score: Callable[[np.ndarray], np.ndarray], *,
                     clusters_to_probe: int = 3, early_stop: float = 0.95, brute_force_below: int = 64,
                     bounds: np.ndarray | Callable[[], np.ndarray] | None = None,
                     groups: MemberGroups | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`two_stage_search` over positions ``0 .. len(labels) - 1``, in numpy (no per-member Python).

    Args:
        labels: the cluster of every position (int); below 0: in no cluster, found through ``bounds`` only.
        medoids: the position of each cluster's medoid, by cluster id.
        score: maps an int64 array of positions to their scores, in order.
        bounds: an upper bound of every position's score, or a function computing them, called only when the
            best score found is below 1 (O(n) work most queries, whose child a model covers whole, never pay);
            None skips the last call.
        groups: ``MemberGroups.of(labels, len(medoids))``, when the caller keeps it across queries.
        clusters_to_probe, early_stop, brute_force_below: as for :func:`two_stage_search`.

    Returns:
        ``(positions, scores)``: every position scored, once each, in the order of :func:`two_stage_search`.
    """
    _check_plan(clusters_to_probe, brute_force_below, early_stop)
    scored = functools.partial(_scored, score)
    labels = np.asarray(labels)
    n = labels.shape[0]
    medoids = np.asarray(medoids, dtype=np.int64).reshape(-1)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, dtype=np.float64)
    if n < brute_force_below or medoids.shape[0] == 0:
        every = np.arange(n, dtype=np.int64)
        return every, scored(every)
    medoid_scores = scored(medoids)
    # a NaN (a failed score) ranks last instead of poisoning the order
    ranked = np.argsort(-np.nan_to_num(medoid_scores, nan=-np.inf), kind="stable")
    probe = ranked[:1] if float(medoid_scores[ranked[0]]) >= early_stop else ranked[:clusters_to_probe]
    seen = np.zeros(n, dtype=bool)
    seen[medoids] = True
    rest = (groups or MemberGroups.of(labels, medoids.shape[0])).members(probe)
    rest = rest[~seen[rest]]
    pos, scores = medoids, medoid_scores
    if rest.shape[0]:
        pos, scores = np.concatenate([pos, rest]), np.concatenate([scores, scored(rest)])
    if bounds is None:
        return pos, scores
    seen[rest] = True
    found = float(np.max(np.nan_to_num(scores, nan=-np.inf)))
    if found >= 1.0:  # scores and bounds are ratios capped at 1: nothing beats a full score, no bound is read
        return pos, scores
    # no position scores above its bound: one bounded by the best found cannot beat it, the others are all that can
    bounds = bounds() if callable(bounds) else bounds
    last = np.flatnonzero((np.asarray(bounds, dtype=np.float64).reshape(-1) > found) & ~seen)
    if not last.shape[0]:
        return pos, scores
    return np.concatenate([pos, last]), np.concatenate([scores, scored(last)])


def _scored(score: Callable[[Sequence[str]], np.ndarray], names: list[str]) -> np.ndarray:
    """``score(names)`` as float64, one value per name (else :class:`KeeperError`)."""
    out = np.asarray(score(names), dtype=np.float64).reshape(-1)
    if out.shape[0] != len(names):
        raise KeeperError(f"two-stage search: score returned {out.shape[0]} values for {len(names)} names; "
                          "it must return one score per name, in order")
    return out


def _check_plan(clusters_to_probe: object, brute_force_below: object, early_stop: object) -> None:
    """Raise :class:`KeeperError` naming the first of :func:`two_stage_search`'s plan arguments that is off."""
    if not _is_int(clusters_to_probe) or clusters_to_probe < 1:
        raise KeeperError(f"two-stage search: clusters_to_probe={clusters_to_probe!r}; expected an integer >= 1")
    if not _is_int(brute_force_below) or brute_force_below < 0:
        raise KeeperError(f"two-stage search: brute_force_below={brute_force_below!r}; expected an integer >= 0")
    if not isinstance(early_stop, numbers.Real) or math.isnan(early_stop):
        raise KeeperError(f"two-stage search: early_stop={early_stop!r}; expected a score (above 1 disables it)")
