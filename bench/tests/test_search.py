"""keeper_bench.search's reading of a search (scripts/bench_search.py's figures), on hand-made runs: the first round
at the target, the best model, keeper's overhead, the idle slots, the warmed trials against their cold twins and
the cost line. The arms themselves run in the benchmark, not here (minutes of Tune each)."""

from __future__ import annotations

import pytest

from keeper_bench.search import best_model, best_models, best_test, cost_line, start_gaps, summarize, twins


def _event(trial: str, steps: int, wall: float, val: float, test: float, parent: str = "", **more) -> dict:
    return {"trial": trial, "population_steps": steps, "wall_s": wall, "val_accuracy": val, "test_accuracy": test,
            "width": 8, "blocks": 1, "lr": 0.01, "parent": parent, "same_arch": False, "source_arch": "",
            "warm_s": more.pop("warm_s", 0.0), **more}


def _run(events: list[dict], trials: dict, wall: float, actor_cpu: float = 0.0, hook_s: float = 0.0) -> dict:
    return {"events": events, "trials": trials, "wall_s": wall, "errors": [],
            "actor_cpu": {"FrontDoor": actor_cpu} if actor_cpu else {}, "callback": {"hook_s": hook_s}}


def test_a_search_is_read_at_its_first_round_at_the_target_and_at_its_own_final_choice():
    events = [_event("a", 50, 5.0, 0.5, 0.50, warm_s=0.4), _event("b", 100, 6.0, 0.6, 0.61),
              _event("a", 150, 9.0, 0.7, 0.69), _event("b", 200, 12.0, 0.65, 0.72)]
    trials = {"a": {"starts": [0.0], "ends": [9.5], "index": 0}, "b": {"starts": [0.1], "ends": [12.5], "index": 1},
              "c": {"starts": [10.0], "ends": [11.0], "index": 2}}
    r = summarize(_run(events, trials, wall=20.0, actor_cpu=2.0, hook_s=0.1), target=0.6)
    assert r["reached"] and r["wall_to_target_s"] == 6.0 and r["steps_to_target"] == 100
    # the search ends with the trial whose LAST round validates best (a: 0.7), read on test: not the best test seen
    assert best_model(events)["trial"] == "a" and r["best_test"] == 0.69 and r["max_test"] == 0.72
    assert r["overhead_s"] == pytest.approx(0.1 + 0.4 / 2 + 2.0 / 2) and r["overhead_share"] == pytest.approx(1.3 / 20)
    assert start_gaps(trials) == [pytest.approx(0.5)], "c started 0.5 s after a's end freed a slot"
    missed = summarize(_run(events, trials, wall=20.0), target=0.9)
    assert not missed["reached"] and missed["wall_to_target_s"] is None and missed["steps"] == 200


def test_trials_tied_at_the_best_validation_accuracy_count_the_mean_of_their_test_accuracies():
    events = [_event("a", 50, 5.0, 0.99, 0.98), _event("b", 50, 6.0, 0.99, 0.96), _event("c", 50, 7.0, 0.95, 0.99)]
    assert [e["trial"] for e in best_models(events)] == ["a", "b"] and best_model(events)["trial"] == "a"
    assert best_test(events) == pytest.approx(0.97), "the pick between a and b is arbitrary: their mean"
    r = summarize(_run(events, {t: {"starts": [0.0], "ends": [8.0], "index": i} for i, t in enumerate("abc")},
                       wall=10.0), target=0.5)
    assert r["best_test"] == pytest.approx(0.97) and r["best_tied"] == 2


def test_warmed_trials_are_set_against_the_same_draw_trained_cold():
    cold = _run([_event("c0", 10, 1.0, 0.5, 0.80), _event("c1", 20, 2.0, 0.5, 0.70)],
                {"c0": {"index": 0}, "c1": {"index": 1}}, wall=3.0)
    warm = _run([_event("w0", 10, 1.0, 0.5, 0.75, parent="p"), _event("w1", 20, 2.0, 0.5, 0.90)],
                {"w0": {"index": 0}, "w1": {"index": 1}}, wall=3.0)
    t = twins(cold, warm)  # draw 1 started cold in both arms: no twin pair
    assert t["warmed"] == 1 and t["below"] == 1 and t["worst_diff"] == pytest.approx(-0.05)
    assert twins(cold, warm, margin=0.1)["below"] == 0


def test_the_cost_line_splits_a_search_s_overhead_into_per_search_and_per_trial():
    fixed, per_trial = cost_line([10, 30, 60], [3.0 + 0.25 * n for n in (10, 30, 60)])
    assert fixed == pytest.approx(3.0) and per_trial == pytest.approx(0.25)
    assert cost_line([32, 32], [8.0, 9.0]) == (0.0, pytest.approx(8.5 / 32))


def test_a_restart_is_a_parent_of_the_child_s_own_architecture_not_a_shrink_that_gives_every_weight(tmp_path):
    """keeper_bench.pbt.restarts_parent on real warm starts from an embedded zoo: the same architecture is a
    restart; a narrower child of a wider parent is given every weight (score 1.0) but not the function, so it is
    not one, nor is a cold start."""
    import torch

    from keeper import Zoo
    from keeper.torch_support import register, warm_start
    from keeper_bench.pbt import restarts_parent

    def mlp(width: int) -> torch.nn.Module:
        torch.manual_seed(width)
        return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 3))

    x, zoo = torch.zeros(1, 8), Zoo(str(tmp_path / "zoo"))
    cold = warm_start(mlp(32), x, zoo)
    assert cold.parent is None and not restarts_parent(cold)
    register(mlp(32), x, zoo, 0.9, "wide")
    same, narrow = warm_start(mlp(32), x, zoo), warm_start(mlp(16), x, zoo)
    assert same.parent == "wide" and restarts_parent(same)
    assert narrow.parent == "wide" and narrow.score >= 1.0 and not narrow.preserved, narrow
    assert not restarts_parent(narrow)
