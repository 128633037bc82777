"""The learning-rate recipe of a warm start (keeper.recipe, torch_support.warm_lr): 1.0 everywhere for a cold
start and for a child that must learn past its parent, a low start ramping back to the caller's schedule for a
restart (the parent's function whole on its own architecture), the caller's scheduler untouched."""

from __future__ import annotations

import pytest
import torch

import nets
from keeper.recipe import Recipe, recipe_for
from keeper.torch_support import register, warm_lr, warm_start
from keeper.warm import WarmResult
from keeper.zoo import Zoo


def _result(parent="p", score=1.0, structure=1.0, preserved=False) -> WarmResult:
    return WarmResult(parent, score, {}, {}, preserved=preserved, structure=structure)


def test_a_cold_result_leaves_the_schedule_alone():
    cold = _result(parent=None, score=0.0, structure=0.0)
    assert all(cold.lr_factor(s, 100) == 1.0 for s in range(0, 150))
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ref_opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.5)
    ref = torch.optim.lr_scheduler.StepLR(ref_opt, 3, 0.5)
    sched = warm_lr(opt, cold, 20, torch.optim.lr_scheduler.StepLR(opt, 3, 0.5))
    for _ in range(10):
        assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]
        opt.step(), ref_opt.step(), sched.step(), ref.step()


def test_a_restart_starts_low_and_ramps_back():
    rec = _result(preserved=True).recipe(1000)
    factors = [rec.factor(s) for s in range(1200)]
    assert factors[0] == Recipe.RESTART_START
    assert all(a <= b for a, b in zip(factors, factors[1:]))
    assert rec.ramp_steps == 250 and all(f == 1.0 for f in factors[250:])
    assert "restart" in rec.why


@pytest.mark.parametrize("score,preserved", [(0.9, True), (1.0, False), (0.5, False)])
def test_a_child_that_must_learn_past_its_parent_keeps_the_schedule(score, preserved):
    # a growth (preserved, part of the child new), a shrink or a partial transfer: measured slower with a low start
    rec = recipe_for("p", score, preserved, 200)
    assert rec.ramp_steps == 0 and all(rec.factor(s) == 1.0 for s in range(250))
    assert "past its parent" in rec.why


def test_the_callers_chainable_scheduler_compounds_as_without_keeper():
    warm = _result(preserved=True)
    opt = torch.optim.Adam(torch.nn.Linear(2, 2).parameters(), lr=1.0)
    sched = warm_lr(opt, warm, 100, torch.optim.lr_scheduler.ExponentialLR(opt, 0.9))
    rec = warm.recipe(100)
    for step in range(30):
        assert opt.param_groups[0]["lr"] == pytest.approx(0.9 ** step * rec.factor(step))
        opt.step()
        sched.step()


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, None])
def test_bad_total_steps_are_refused_with_the_fix(bad):
    with pytest.raises(ValueError, match="total_steps must be a positive integer"):
        _result().recipe(bad)


def test_warm_start_ramps_a_restart_and_leaves_a_growth_alone(tmp_path):
    def mlp(width, seed=0):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 3))

    zoo, x = Zoo(str(tmp_path / "zoo")), torch.randn(2, 8)
    with nets.quiet():
        register(mlp(16), x, zoo, 0.9, name="narrow")
        restart = warm_start(mlp(16, seed=1), x, zoo, noise=0.0)
        grown = warm_start(mlp(32), x, zoo, noise=0.0)
    assert restart.parent == "narrow" and restart.preserved and restart.score == 1.0
    assert restart.lr_factor(0, 500) == Recipe.RESTART_START and restart.lr_factor(125, 500) == 1.0
    assert grown.parent == "narrow" and grown.preserved and grown.score < 1.0
    assert grown.lr_factor(0, 500) == 1.0
