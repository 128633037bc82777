"""Tests of keeper.actors.viewsearch with the manager's own views, without Ray: models that arrive in a clustered
zoo are found by the exact search of the next view (no re-fit), the search keeps brute force's top-1, and
arrivals far from every medoid re-fit the index in the background."""

from __future__ import annotations

import numpy as np
import pytest

from keeper.actors.config import load_config
from keeper.actors.matcher import Matcher
from keeper.actors.viewsearch import SearchState, batches, plan
from keeper.matching import MatchArrays, score_many
from graph_only import GraphOnlyManager
from keeper_bench.synth_zoo import make_queries, make_zoo, random_spec, spec_key, synth_arrays


def search(mgr: GraphOnlyManager, child: MatchArrays) -> tuple[list[str], np.ndarray]:
    """The service's search over the manager's current view, scored in this process (shards passed by value)."""
    view = mgr.view()
    state = SearchState.build(view, {sid: mgr.shard(sid) for sid in view.shards})
    matcher = Matcher()

    def score(pos: np.ndarray, exact: bool) -> np.ndarray:
        requests, order = batches(state, child, pos, 2, None)
        out = np.zeros(pos.shape[0])
        out[np.concatenate(order)] = np.concatenate([matcher.score(*r) for r in requests])
        return out

    pos, scores = plan(state, child, score, clusters_to_probe=2, early_stop=1.0, brute_force_below=8)
    return view.names[pos].tolist(), scores


@pytest.fixture(scope="module")
def zoo():
    rng = np.random.default_rng(3)
    specs = make_zoo(300, rng)
    return specs, [synth_arrays(s) for s in specs], rng


def fitted(tmp_path, arrays: list[MatchArrays], **clustering) -> GraphOnlyManager:
    mgr = GraphOnlyManager(load_config(zoo=str(tmp_path), clustering={"brute_force_below": 8, **clustering}))
    mgr.add_graph_only([f"z{i:03d}" for i in range(len(arrays))], arrays)
    assert mgr.wait_index(120) and mgr.stats()["fits"] == 1
    return mgr


def test_arrivals_are_found_at_once_and_the_search_stays_exact(tmp_path, zoo):
    specs, arrays, rng = zoo
    mgr = fitted(tmp_path, arrays)
    names = [f"z{i:03d}" for i in range(len(arrays))]
    keys = {spec_key(s) for s in specs}
    arrived = 0
    while arrived < 6:
        spec = random_spec(rng, ["resnet", "vgg", "mlp", "transformer", "mobilenetv2"][arrived % 5])
        new = synth_arrays(spec)
        # an architecture no zoo model covers whole: the only right top-1 of a search for itself
        if spec_key(spec) in keys or float(np.max(score_many(arrays, new))) >= 1.0:
            continue
        keys.add(spec_key(spec))
        mgr.add_graph_only([f"new{arrived}"], [new])
        found, scores = search(mgr, new)
        assert found[int(np.argmax(scores))] == f"new{arrived}"
        assert len(found) < len(arrays)  # a two-stage search, not the whole zoo
        arrays, names = arrays + [new], names + [f"new{arrived}"]
        arrived += 1
    assert mgr.stats()["fits"] == 1  # nearest-medoid assignment only: no re-fit
    for q in make_queries(specs, 20, rng):
        child = synth_arrays(q)
        found, scores = search(mgr, child)
        assert float(np.max(scores)) == float(np.max(score_many(arrays, child)))  # brute force's top-1 score


def test_arrivals_far_from_every_medoid_refit_in_the_background(tmp_path, zoo):
    specs, arrays, rng = zoo
    mlps = [a for s, a in zip(specs, arrays) if s["family"] == "mlp"]
    convs = [synth_arrays(random_spec(rng, "vgg")) for _ in range(40)]
    # recluster_stale far out of reach: only drift can re-fit
    mgr = fitted(tmp_path / "a", mlps[:-32], recluster_stale=10.0)
    for i, a in enumerate(convs):
        mgr.add_graph_only([f"conv{i}"], [a])
        if i < 31:
            assert mgr.stats()["fits"] == 1 and not mgr.stats()["fitting"]  # under 32 arrivals are no drift
    assert mgr.stats()["drift"] is None or mgr.stats()["fitting"] or mgr.stats()["fits"] >= 2
    assert mgr.wait_index(120) and mgr.stats()["fits"] >= 2
    # as many arrivals like the fitted members (copies of them) re-fit nothing
    near = fitted(tmp_path / "b", mlps[:-32], recluster_stale=10.0)
    for i in range(40):
        near.add_graph_only([f"again{i}"], [mlps[int(rng.integers(len(mlps) - 32))]])
    assert near.wait_index(120) and near.stats()["fits"] == 1 and near.stats()["drift"] < 1.5
