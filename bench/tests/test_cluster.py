"""keeper_bench.cluster's trace and its reading (scripts/bench_cluster.py's figures), on hand-made results: the
trace's tenants, kinds and arrivals; completion at the cold twin's final quality; the saving and the speed-up, and
a keeper job that never got there counting as no saving and no speed-up. The trace itself runs in the benchmark
(a loopback cluster and a Tune driver per job), not here."""

from __future__ import annotations

import json

import numpy as np
import pytest

from keeper_bench.cluster import reading
from keeper_bench.cluster.trace import KINDS, QUICK, SPACES, WORKLOADS, Job, make_trace, zoo_start_searches


def test_the_trace_is_seeded_and_has_every_tenant_kind_and_workload():
    trace = make_trace(60, seed=3)
    assert [j.as_dict() for j in trace] == [j.as_dict() for j in make_trace(60, seed=3)]
    assert [j.as_dict() for j in trace] != [j.as_dict() for j in make_trace(60, seed=4)]
    assert len({j.tenant for j in trace}) >= 3 and {j.kind for j in trace} == set(KINDS)
    assert {j.workload for j in trace} == set(WORKLOADS)
    arrivals = [j.arrival_s for j in trace]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals)
    gaps = np.diff(arrivals)
    assert 0.5 * QUICK.gap_s < gaps.mean() < 2.0 * QUICK.gap_s  # exponential gaps of the size's mean
    for j in trace:
        space = SPACES[j.workload]
        assert all(t["width"] in space["widths"] and t["blocks"] in space["blocks"] for t in j.trials)
        assert [t["index"] for t in j.trials] == list(range(len(j.trials)))
        if j.kind == "nas":
            assert len({(t["width"], t["blocks"]) for t in j.trials}) == len(j.trials) == QUICK.nas_archs
        assert Job.from_dict(json.loads(json.dumps(j.as_dict()))) == j


def test_single_jobs_train_what_another_tenant_trained_before():
    trace = make_trace(80, seed=0)
    for k, j in enumerate(trace):
        if j.kind != "single":
            continue
        (t,) = j.trials
        before = {(o.workload, x["width"], x["blocks"]) for o in trace[:k] if o.tenant != j.tenant for x in o.trials}
        if any(w == j.workload for w, _, _ in before):
            assert (j.workload, t["width"], t["blocks"]) in before


def test_searches_that_start_with_a_zoo_follow_the_first():
    first, repeat, adjacent = zoo_start_searches("digits", trials=12, start=500)
    assert (first.after, repeat.after, adjacent.after) == (None, 500, 500)
    assert all(j.kind == "hpo" and j.concurrency == 1 and len(j.trials) == 12 for j in (first, repeat, adjacent))
    assert repeat.space["widths"] == first.space["widths"] and repeat.seed != first.seed
    assert repeat.space["lr_range"][0] > first.space["lr_range"][0]
    assert min(adjacent.space["widths"]) >= max(first.space["widths"])
    assert min(adjacent.space["blocks"]) >= max(first.space["blocks"])


def _result(reports: list[tuple[str, float, float, float]], trials: dict, arrived: float = 0.0,
            ended: float = 10.0) -> dict:
    """A job's result: ``reports`` as (trial, time, val, test), each of 10 steps."""
    return {"arrived": arrived, "ended": ended, "trials": trials,
            "events": [{"trial": tr, "t": t, "val_accuracy": v, "test_accuracy": x, "round_steps": 10}
                       for tr, t, v, x in reports]}


def _job(name: str = "j") -> Job:
    return Job(index=0, tenant="ana", kind="nas", workload="digits", seed=0, arrival_s=0.0,
               trials=({"index": 0}, {"index": 1}), steps=20, round_steps=10, concurrency=2, label=name)


def test_completion_is_the_first_report_at_the_cold_twins_final_quality():
    trials = {"a": {"starts": [1.0], "ends": [5.0]}, "b": {"starts": [1.0], "ends": [9.0]}}
    cold = _result([("a", 3, 0.5, 0.50), ("a", 5, 0.9, 0.90), ("b", 6, 0.6, 0.60), ("b", 9, 0.7, 0.95)], trials)
    # the job ends with a (best final validation), read on test: 0.90, though b's test was higher
    assert reading.final_quality(cold) == 0.90
    keep = _result([("a", 2, 0.8, 0.895), ("a", 3, 0.9, 0.91), ("b", 4, 0.7, 0.92), ("b", 5, 0.7, 0.93)],
                   {"a": {"starts": [1.0], "ends": [3.0]}, "b": {"starts": [1.0], "ends": [5.0]}}, ended=6.0)
    (t,) = reading.twins([_job()], {_job().name: cold}, {_job().name: keep}, margin=0.01)
    assert t.target == pytest.approx(0.891)
    assert t.cold.reached and t.cold.tc_s == 5.0 and t.cold.trial_s == pytest.approx(8.0) and t.cold.steps == 20
    assert t.keeper.reached and t.keeper.tc_s == 2.0 and t.keeper.trial_s == pytest.approx(2.0)
    assert t.tc == pytest.approx(2.5) and t.tc_train == pytest.approx(4.0)
    g = reading.group([t])
    assert g["saving"] == pytest.approx(0.75) and g["saving_steps"] == pytest.approx(0.5) and g["worse"] == 0


def test_a_keeper_job_that_never_gets_there_saves_nothing_however_early_it_ends():
    trials = {"a": {"starts": [0.0], "ends": [8.0]}}
    cold = _result([("a", 4, 0.5, 0.80), ("a", 8, 0.9, 0.90)], trials)
    # ASHA stopped the keeper job's trials early, below the target
    keep = _result([("a", 1, 0.5, 0.70)], {"a": {"starts": [0.0], "ends": [1.0]}}, ended=1.0)
    (t,) = reading.twins([_job()], {_job().name: cold}, {_job().name: keep})
    assert not t.keeper.reached and t.tc == 1.0 and t.keeper_cost == (8.0, 20.0)
    g = reading.group([t])
    assert g["saving"] == pytest.approx(0.0) and g["reached"] == 0 and g["worse"] == 1
    assert g["worst_diff"] == pytest.approx(-0.2)


def test_twins_run_under_experiment_names_of_their_own():
    """Twins launched in the same second on one node would share Tune's local staging directory under one name; the
    keeper arm keeps the job's name, which the zoo names its models after."""
    from keeper_bench.cluster.job import experiment_name

    job = make_trace(1, seed=0)[0]
    assert experiment_name(job, keeper=True) == job.name
    assert experiment_name(job, keeper=False) != job.name


def test_the_nodes_hold_every_running_jobs_trials_at_once():
    from keeper_bench.cluster.drive import needed_node_cpus

    # the defaults with both arms: 2 arms x 6 drivers x 2 trials = 24 over 3 nodes
    assert needed_node_cpus(3, 6, 2, 2) == 8.0
    # rounded up, so that a share left over still has a CPU: 1 x 5 x 2 = 10 over 3 nodes
    assert needed_node_cpus(3, 5, 2, 1) == 4.0 and 3 * needed_node_cpus(3, 5, 2, 1) >= 10
