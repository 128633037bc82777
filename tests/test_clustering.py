"""k-medoids index over the zoo and the two-stage candidate search."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keeper.actors.clustering import ClusterIndex, default_k, search_positions, two_stage_search
from keeper.errors import KeeperError, ModelNotFoundError


def pairwise(x: np.ndarray) -> np.ndarray:
    sq = np.einsum("ij,ij->i", x, x)
    d = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * x @ x.T, 0.0))
    np.fill_diagonal(d, 0.0)
    return d


def grid_blobs(seed: int, blobs: int, per: int, spread: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Points around ``blobs`` distinct cells of a unit grid (well separated), and their blob labels."""
    rng = np.random.default_rng(seed)
    side = int(np.ceil(np.sqrt(blobs)))
    cells = rng.permutation(side * side)[:blobs]
    centres = np.stack([cells // side, cells % side], axis=1).astype(np.float64)
    labels = np.repeat(np.arange(blobs), per)
    return centres[labels] + rng.normal(0.0, spread, (labels.size, 2)), labels


def check_invariants(index: ClusterIndex) -> None:
    names = index.names
    assert len(set(names)) == len(names) == len(index)
    clusters = [index.members(c) for c in range(len(index.medoid_names))]
    assert sorted(n for m in clusters for n in m) == sorted(names)  # each name in exactly one cluster
    for c, (medoid, members) in enumerate(zip(index.medoid_names, clusters)):
        assert medoid in members and index.cluster_of(medoid) == c
    ClusterIndex.from_arrays(index.to_arrays())  # the constructor's checks agree


def small_index() -> ClusterIndex:
    d = np.array([[0, .1, .1, .9, .9], [.1, 0, .1, .9, .9], [.1, .1, 0, .9, .9],
                  [.9, .9, .9, 0, .1], [.9, .9, .9, .1, 0]])
    return ClusterIndex.fit(list("abcde"), d, k=2)


# -- fit
@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 8), st.integers(2, 12))
def test_fit_recovers_blobs(seed, blobs, per):
    x, truth = grid_blobs(seed, blobs, per)
    d = pairwise(x)
    index = ClusterIndex.fit([f"m{i}" for i in range(len(x))], d / d.max(), k=blobs, seed=seed)
    got = np.array([index.cluster_of(f"m{i}") for i in range(len(x))])
    assert len(index.medoid_names) == blobs
    assert len(set(zip(truth.tolist(), got.tolist()))) == blobs  # same partition, up to renaming
    check_invariants(index)


def test_fit_default_k_and_small_sizes():
    x, _ = grid_blobs(0, 9, 11)
    d = pairwise(x) / pairwise(x).max()
    names = [f"m{i}" for i in range(len(x))]
    assert len(ClusterIndex.fit(names, d).medoid_names) == default_k(len(x)) == 10
    assert len(ClusterIndex.fit([], np.zeros((0, 0)))) == 0
    one = ClusterIndex.fit(["a"], np.zeros((1, 1)))
    assert one.medoid_names == ["a"] and one.members(0) == ["a"]
    two = ClusterIndex.fit(["a", "b"], np.array([[0, .5], [.5, 0]]), k=5)  # k clipped to N
    assert two.medoid_names == ["a", "b"]
    assert [default_k(n) for n in (0, 1, 2, 3, 4, 100)] == [0, 1, 1, 2, 2, 10]


def test_fit_with_identical_points_keeps_a_valid_index():
    index = ClusterIndex.fit(list("abcdef"), np.zeros((6, 6)), k=3)
    check_invariants(index)
    assert 1 <= len(index.medoid_names) <= 3


def test_fit_symmetrises_clips_and_is_deterministic():
    rng = np.random.default_rng(3)
    x, _ = grid_blobs(3, 5, 8)
    d = pairwise(x) / pairwise(x).max()
    skew = rng.uniform(-0.05, 0.05, d.shape)
    asym = d + skew - skew.T                  # (asym + asym.T) / 2 == d
    np.fill_diagonal(asym, 0.3)               # a non-zero diagonal is ignored
    names = [f"m{i}" for i in range(len(x))]
    a = ClusterIndex.fit(names, asym, k=5, seed=7).to_arrays()
    b = ClusterIndex.fit(names, d, k=5, seed=7).to_arrays()
    out_of_range = d.copy()
    out_of_range[d >= 1.0] = 7.0              # clipped back to 1, the largest distance
    np.fill_diagonal(out_of_range, -1.0)
    c = ClusterIndex.fit(names, out_of_range, k=5, seed=7).to_arrays()
    for key in a:
        assert np.array_equal(a[key], b[key]) and np.array_equal(b[key], c[key])


@pytest.mark.parametrize("names,dist,k", [(["a", "b"], np.zeros((3, 3)), None),
                                          (["a", "b"], np.array([[0, np.nan], [np.nan, 0]]), None),
                                          (["a", "b"], np.zeros((2, 2)), 0),
                                          (["a", "a"], np.zeros((2, 2)), None)])
def test_fit_rejects_bad_input(names, dist, k):
    with pytest.raises(KeeperError):
        ClusterIndex.fit(names, dist, k=k)


# -- add / remove
@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=2))
def test_add_joins_the_nearest_medoid(dist):
    index = small_index()
    before = index.stale
    c = index.add("new", np.array(dist))
    assert c == int(np.argmin(dist)) and index.cluster_of("new") == c and "new" in index.members(c)
    assert index.stale == before + 1
    check_invariants(index)


def test_add_to_an_empty_index_makes_a_medoid():
    index = ClusterIndex()
    assert index.add("a", np.zeros(0)) == 0
    assert index.medoid_names == ["a"] and index.members(0) == ["a"]
    assert index.add("b", np.array([0.4])) == 0
    check_invariants(index)


def test_add_rejects_duplicates_and_wrong_lengths():
    index = small_index()
    with pytest.raises(KeeperError, match="already"):
        index.add("a", np.zeros(2))
    with pytest.raises(KeeperError, match="one per medoid"):
        index.add("z", np.zeros(3))
    with pytest.raises(KeeperError, match="NaN"):
        index.add("z", np.array([np.nan, 0.1]))
    assert len(index) == 5


def test_remove_medoid_keeps_its_members():
    index = small_index()
    c = index.cluster_of("a")
    medoid = index.medoid_names[c]
    others = [n for n in index.members(c) if n != medoid]
    index.remove(medoid)
    assert medoid not in index
    assert sorted(index.members(c)) == sorted(others)
    assert index.medoid_names[c] in others
    assert index.stale == 1
    check_invariants(index)


def test_removing_the_last_member_drops_the_cluster():
    index = small_index()
    lone = ClusterIndex(["p", "q", "r"], medoids=[0, 1, 2], labels=[0, 1, 2])
    lone.remove("q")
    assert lone.medoid_names == ["p", "r"] and lone.cluster_of("r") == 1
    check_invariants(lone)
    for name in index.names:
        index.remove(name)
        check_invariants(index)
    assert len(index) == 0 and index.medoid_names == []
    with pytest.raises(ModelNotFoundError):
        index.remove("a")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 30), st.lists(st.floats(0, 1), min_size=8, max_size=8)),
                max_size=40))
def test_adds_and_removes_keep_the_invariants(ops):
    index = small_index()
    for is_add, i, dist in ops:
        name = f"n{i}"
        if is_add and name not in index:
            index.add(name, np.array(dist[:len(index.medoid_names)]))
        elif not is_add and index.names:
            index.remove(index.names[i % len(index)])
        check_invariants(index)


# -- persistence
def test_to_arrays_round_trip_through_numpy_and_json():
    index = small_index()
    index.add("f", np.array([0.2, 0.7]))
    index.remove(index.medoid_names[0])
    arrays = index.to_arrays()
    assert all(a.dtype != object for a in arrays.values())
    for again in (ClusterIndex.from_arrays(arrays),
                  ClusterIndex.from_arrays(json.loads(json.dumps({k: v.tolist() for k, v in arrays.items()})))):
        assert again.names == index.names and again.medoid_names == index.medoid_names
        assert [again.cluster_of(n) for n in again.names] == [index.cluster_of(n) for n in index.names]
        assert again.stale == index.stale
    empty = ClusterIndex.from_arrays(ClusterIndex().to_arrays())
    assert len(empty) == 0 and empty.medoid_names == []


@pytest.mark.parametrize("arrays", [
    {"names": ["a", "b"], "medoids": [0], "labels": [0, 1]},   # label out of range
    {"names": ["a", "b"], "medoids": [0, 1], "labels": [1, 0]},  # medoids outside their own clusters
    {"names": ["a", "b"], "medoids": [0], "labels": [0]},      # a label missing
    {"names": ["a"], "medoids": [], "labels": [0]},            # no medoid
    {"names": ["a"], "labels": [0]},                           # key missing
])
def test_from_arrays_rejects_inconsistent_data(arrays):
    with pytest.raises(KeeperError):
        ClusterIndex.from_arrays(arrays)


# -- two-stage search
class CountingScore:
    """``score`` for a query point: 1 - scaled Euclidean distance; records every call."""

    def __init__(self, points: np.ndarray, names: list[str], query: np.ndarray, scale: float) -> None:
        self.pos = {n: i for i, n in enumerate(names)}
        self.all = np.clip(1.0 - np.linalg.norm(points - query, axis=1) / scale, 0.0, 1.0)
        self.calls: list[int] = []

    def __call__(self, names):
        self.calls.append(len(names))
        return self.all[[self.pos[n] for n in names]]


def test_small_index_is_scored_whole_in_one_call():
    index = small_index()
    f = CountingScore(np.arange(5.0)[:, None], index.names, np.array([2.0]), 4.0)
    names, scores = two_stage_search(index, f)
    assert sorted(names) == sorted(index.names) and f.calls == [5]
    assert np.array_equal(scores, f(names))
    assert two_stage_search(ClusterIndex(), f) == ([], pytest.approx(np.zeros(0)))


def test_early_stop_probes_one_cluster_and_no_name_twice():
    x, _ = grid_blobs(1, 6, 10, spread=0.02)
    names = [f"m{i}" for i in range(len(x))]
    d = pairwise(x)
    index = ClusterIndex.fit(names, d / d.max(), k=6)
    m = index.names.index(index.medoid_names[2])
    f = CountingScore(x, names, x[m], d.max())          # the query sits on medoid 2: score 1.0
    got, scores = two_stage_search(index, f, brute_force_below=0)
    assert len(f.calls) == 2 and len(set(got)) == len(got)
    assert set(got) == set(index.medoid_names) | set(index.members(2))
    f = CountingScore(x, names, x[m], d.max())
    got, _ = two_stage_search(index, f, brute_force_below=0, early_stop=1.5, clusters_to_probe=3)
    assert len(f.calls) == 2 and len(got) > len(index.medoid_names) + len(index.members(2)) - 1


def test_search_rejects_bad_arguments_and_bad_scores():
    index = small_index()
    with pytest.raises(KeeperError, match="one score per name"):
        two_stage_search(index, lambda ns: np.zeros(len(ns) + 1))
    for kwargs in ({"clusters_to_probe": 0}, {"brute_force_below": -1}, {"early_stop": float("nan")}):
        with pytest.raises(KeeperError):
            two_stage_search(index, lambda ns: np.zeros(len(ns)), **kwargs)


@pytest.fixture(scope="module")
def zoo_2000():
    """2,000 points in 40 Gaussian blobs at random centres (they may overlap), fitted with the default k."""
    rng = np.random.default_rng(1)
    centres = rng.uniform(0.0, 1.0, (40, 2))
    labels = np.repeat(np.arange(40), 50)
    x = centres[labels] + rng.normal(0.0, 0.02, (2000, 2))
    d = pairwise(x)
    names = [f"m{i}" for i in range(2000)]
    return x, names, float(d.max()), ClusterIndex.fit(names, d / d.max()), centres, rng


def test_two_stage_recall_against_brute_force(zoo_2000):
    x, names, scale, index, centres, rng = zoo_2000
    queries = centres[rng.integers(0, 40, 300)] + rng.normal(0.0, 0.02, (300, 2))
    hits, scored = 0, []
    for q in queries:
        f = CountingScore(x, names, q, scale)
        got, scores = two_stage_search(index, f)
        assert len(f.calls) <= 2 and len(set(got)) == len(got)
        hits += bool(scores.max() == f.all.max())   # the best score found is the brute-force best
        scored.append(len(got))
    recall = hits / len(queries)
    print(f"recall@1 {recall:.3f}; items scored mean {np.mean(scored):.0f}, max {max(scored)} of {len(x)}")
    assert recall >= 0.95, f"recall@1 {recall:.3f}"
    assert np.mean(scored) <= 0.1 * len(x) and max(scored) <= 0.2 * len(x)


def test_score_bounds_make_the_search_exact(zoo_2000):
    x, names, scale, index, centres, rng = zoo_2000
    queries = centres[rng.integers(0, 40, 200)] + rng.normal(0.0, 0.05, (200, 2))
    extra = []
    for q in queries:
        f = CountingScore(x, names, q, scale)
        # valid bounds, loose by up to 0.1, in index order
        bounds = np.minimum(f.all[[f.pos[n] for n in index.names]] + rng.uniform(0.0, 0.1, len(names)), 1.0)
        plain, _ = two_stage_search(index, CountingScore(x, names, q, scale), clusters_to_probe=1, early_stop=2.0)
        got, scores = two_stage_search(index, f, clusters_to_probe=1, early_stop=2.0, bounds=bounds)
        assert scores.max() == f.all.max()  # always the brute-force best
        assert len(f.calls) <= 3 and len(set(got)) == len(got) and got[:len(plain)] == plain
        best = scores.max()
        assert all(b <= best for n, b in zip(index.names, bounds) if n not in set(got))
        extra.append(len(got) - len(plain))
    assert np.mean(extra) < 0.1 * len(names)  # the bounds add a few members, not the zoo
    with pytest.raises(KeeperError, match="one bound per member"):
        two_stage_search(index, f, bounds=np.zeros(3))


def test_bounds_are_computed_only_when_the_best_found_is_below_one():
    """Bounds cost O(zoo) per query: a function of them is called only when the clusters probed leave the best
    score below 1 (nothing beats a full score), and then the member they point to is found."""
    labels, medoids = np.array([0, 0, 1, 1]), np.array([0, 2])
    calls = []

    def bounds() -> np.ndarray:
        calls.append(1)
        return np.ones(4)

    for full, called, best in (([0.2, 1.0, 0.3, 0.9], 1, 1), ([0.2, 0.5, 0.3, 1.0], 0, 3)):
        calls.clear()
        pos, s = search_positions(labels, medoids, lambda p, f=np.array(full): f[p], clusters_to_probe=1,
                                  early_stop=2.0, brute_force_below=0, bounds=bounds)
        assert len(calls) == called and int(pos[int(np.argmax(s))]) == best, (full, calls, pos, s)
