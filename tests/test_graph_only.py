"""Tests of graph_only: graph-only entries beside stored models, without Ray (the service tests in
test_actors.py run the service with this manager and load its matchers through it)."""

from __future__ import annotations

import numpy as np
import pytest

from keeper.actors.config import load_config
from keeper.errors import AdmissionError
from keeper.graph import load_graph
from keeper.matching import match_arrays
from graph_only import GraphOnlyManager
from test_actors import random_model


def test_manager_graph_only_entries_and_background_refit(tmp_path):
    cfg = load_config(zoo=str(tmp_path), clustering={"brute_force_below": 8, "recluster_stale": 0.2})
    mgr = GraphOnlyManager(cfg)
    rng = np.random.default_rng(1)
    arrays = [match_arrays(load_graph(random_model(rng, i))) for i in range(40)]
    assert mgr.add_graph_only([f"g{i}" for i in range(30)], arrays[:30]) == 30
    assert mgr.wait_index(60) and mgr.stats()["fits"] == 1
    with pytest.raises(AdmissionError):
        mgr.add_graph_only(["g1"], arrays[:1])
    # a few newcomers join their nearest medoid at once; past 20% of N a re-fit runs in the background
    mgr.add_graph_only(["h0", "h1"], arrays[30:32])
    assert mgr.stats()["fits"] == 1 and mgr.stats()["changes_since_fit"] == 2
    mgr.add_graph_only([f"h{i}" for i in range(2, 10)], arrays[32:40])
    assert mgr.wait_index(60) and mgr.stats()["fits"] >= 2
    view = mgr.view()
    assert view.n == 40 and not view.weighted.any()
    mgr.remove("g0")
    assert "g0" not in mgr.view().names.tolist()
    assert GraphOnlyManager(cfg).view().n == 0  # graph-only entries live in memory only


def test_graph_only_names_and_stored_names_never_collide(tmp_path):
    mgr = GraphOnlyManager(load_config(zoo=str(tmp_path), clustering={"brute_force_below": 8}))
    rng = np.random.default_rng(2)
    stored, graph = random_model(rng, 0), random_model(rng, 1)
    mgr.register(stored, 0.8, "m")
    with pytest.raises(AdmissionError):
        mgr.add_graph_only(["m"], [match_arrays(load_graph(graph))])
    mgr.add_graph_only(["g"], [match_arrays(load_graph(graph))], [0.9])
    with pytest.raises(AdmissionError):
        mgr.register(graph, 0.8, "g")
    mgr.hit("g")  # nothing stored to count on: ignored
    view = mgr.view()
    assert view.names.tolist() == ["g", "m"] and view.weighted.tolist() == [False, True]
    assert mgr.stats()["stored"] == 1 and mgr.stats()["graph_only"] == 1
    assert mgr.remove_graph_only() == 1 and mgr.view().names.tolist() == ["m"]
