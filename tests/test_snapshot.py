"""Tests of keeper.actors.snapshot: the View a manager publishes after arrivals, removals and compactions equals
the one it would build from scratch, and every entry points at its own arrays."""

from __future__ import annotations

import numpy as np

from keeper.actors.config import load_config
from keeper.actors.manager import ZooManager
from keeper.actors.snapshot import ViewTable
from keeper.matching import MatchArrays, signature
from graph_only import GraphOnlyManager


def linear_arrays(rng: np.random.Generator) -> MatchArrays:
    """Match arrays of a random MLP (graph-only entries need no model)."""
    import dataclasses

    n = int(rng.integers(1, 5))
    shape = np.ones((n, 5), np.int64)
    shape[:, 0] = rng.choice([8, 16, 32, 64], n)
    shape[:, 1] = rng.choice([8, 16, 32, 64], n)
    fields = {f.name: np.zeros(n, np.int64) for f in dataclasses.fields(MatchArrays)}
    fields.update(cls=np.full(n, 3, np.int32), shape=shape, vectors=np.ones(n, np.int64),
                  total=int((shape[:, 0] * shape[:, 1] + shape[:, 0]).sum()))
    return MatchArrays(**fields)


def check_view(mgr: ZooManager) -> None:
    """The published view lists exactly the live models, sorted, each at the shard row holding its arrays, with
    the labels of the manager's index (once a background fit is done: the view is a snapshot of one index)."""
    assert mgr.wait_index(60)
    view = mgr.view()
    assert view.names.tolist() == sorted(mgr._arrays)
    for p, name in enumerate(view.names.tolist()):
        shard = mgr.shard(view.shards[view.shard[p]])
        assert np.array_equal(shard.sigs[view.row[p]], signature(mgr._arrays[name]))
        assert np.array_equal(view.sigs[p], shard.sigs[view.row[p]])
        assert view.params[p] == mgr._arrays[name].total
    index = mgr._index
    if index is None:
        assert view.labels is None
        return
    assert view.labels.tolist() == [index.cluster_of(n) if n in index else -1 for n in view.names.tolist()]
    assert view.names[view.medoids].tolist() == index.medoid_names
    assert view.sigs.flags.f_contiguous  # bounds read a query's bins only


def test_view_table_changes_equal_a_fresh_build():
    rng = np.random.default_rng(0)
    entries = {f"m{i:03d}": (float(i), bool(i % 2), True, i, i % 3, i, rng.integers(0, 9, 64), i) for i in range(60)}
    table = ViewTable.build({k: v for k, v in entries.items() if k < "m030"})
    later = {k: v for k, v in entries.items() if k >= "m030"}
    table = table.changed(later, ["m003", "m017"])
    for k in ("m003", "m017"):
        entries.pop(k)
    fresh = ViewTable.build(entries)
    for a, b in zip(table._columns(), fresh._columns()):
        assert np.array_equal(a, b)


def test_arrivals_removals_and_compactions_keep_the_view_exact(tmp_path, monkeypatch):
    import keeper.actors.manager as manager

    monkeypatch.setattr(manager, "_MAX_SHARDS", 3)  # compactions happen every few publishes
    monkeypatch.setattr(manager, "_SHARD_MODELS", 16)
    rng = np.random.default_rng(1)
    mgr = GraphOnlyManager(load_config(zoo=str(tmp_path), clustering={"brute_force_below": 8}))
    mgr.add_graph_only([f"g{i:03d}" for i in range(40)], [linear_arrays(rng) for _ in range(40)])
    check_view(mgr)
    live = [f"g{i:03d}" for i in range(40)]
    first = dict(zip(mgr.view().names.tolist(), mgr.view().ident.tolist()))
    for step in range(12):  # one or two arrivals, sometimes a removal, a publish after each
        names = [f"a{step:02d}{j}" for j in range(1 + step % 2)]
        mgr.add_graph_only(names, [linear_arrays(rng) for _ in names])
        live += names
        if step % 3 == 2:
            gone = live.pop(int(rng.integers(len(live))))
            mgr.remove(gone)
        check_view(mgr)
        now = dict(zip(mgr.view().names.tolist(), mgr.view().ident.tolist()))
        # compactions move models between shards, never change what identifies their registration
        assert all(now[n] == first[n] for n in now if n in first)
        first.update(now)
    assert mgr.stats()["fits"] >= 2  # arrivals past recluster_stale x N re-fitted the index on the way
    assert len(mgr._shards) <= 3 + 1
    assert len(set(first.values())) == len(first), "every registration has its own number"
    # a name registered again after its removal is another registration: the front door's caches must miss
    mgr.remove(live[0])
    mgr.add_graph_only([live[0]], [linear_arrays(rng)])
    again = dict(zip(mgr.view().names.tolist(), mgr.view().ident.tolist()))[live[0]]
    assert again > max(first.values())
