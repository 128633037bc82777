"""The search rule (keeper.choice.inheritance): what a trial inherits, from the parent's learning curve and search."""

import dataclasses

import numpy as np
import pytest

from keeper.choice.inheritance import LATE_GAIN, MIN_REPORTS, PLATEAU_GAIN, Inheritances, Training, decide, training_of
from keeper.choice.selection import reason_of
from keeper.choice.selection import Candidate, ParentChoice


def test_a_curve_still_climbing_is_improving_and_a_flat_one_converged():
    assert training_of([0.1, 0.3, 0.5, 0.6, 0.7, 0.8], "s").improving is True
    assert training_of([0.5, 0.9, 0.95, 0.96, 0.96, 0.96], "s").improving is False
    assert training_of([0.3, 0.3, 0.3, 0.3]).improving is False, "a curve that gained nothing has converged"
    short = training_of([0.2, 0.9])
    assert short.improving is None and short.reports == 2, "two reports cannot tell a plateau from a climb"
    # the threshold is a share of the curve's own gain, whatever its scale
    late = 1.0 + LATE_GAIN  # second half adds just above LATE_GAIN of the total gain
    v = [0.0, 0.5, 0.8, 1.0, 1.0, late]
    assert training_of([x / late for x in v]).improving is True


def test_training_round_trips_through_a_record():
    t = training_of([0.1, 0.5, 0.6, 0.6], "exp-1", started_cold=True)
    assert Training.from_dict(t.as_dict()) == t and t.first == 0.1 and t.started_cold is True
    assert Training.from_dict(None) is None
    old = {"search": "s", "reports": 6, "late_gain": 0.0, "improving": False}  # a record from before first / cold
    assert Training.from_dict(old).first is None and Training.from_dict(old).started_cold is None
    assert Training.from_dict(old).flat_from is None and t.flat_from == 3


def test_a_cold_parent_at_its_plateau_by_the_middle_of_its_training_gives_any_child_nothing():
    """Training from scratch got there in half a budget, and a child that takes the function ends in its basin. Only
    a curve long enough to tell, only a parent that started cold, only inside a search; restarts and growths alike."""
    flat = training_of([0.985, 0.99, 0.99, 0.99, 0.99, 0.99], "earlier", started_cold=True)
    verdict = decide("p", flat, "new", True, parent_accuracy=0.99)
    assert not verdict.whole and "plateau by its first report (0.985, then 0.990" in verdict.why
    grown = decide("p", flat, "new", True, same_architecture=False, parent_accuracy=0.99)
    assert not grown.whole and "basin" in grown.why, "another architecture too"
    assert decide("p", flat, "", True, parent_accuracy=0.99).whole, "outside a search"
    middle = training_of([0.90, 0.95, 0.985, 0.99, 0.99, 0.99], "earlier", started_cold=True)
    assert middle.flat_from == 3
    assert not decide("p", middle, "new", True, same_architecture=False).whole
    assert "plateau by report 3 of 6" in decide("p", middle, "new", True).why
    late = training_of([0.90, 0.95, 0.97, 0.985, 0.99, 0.99], "earlier", started_cold=True)
    assert late.flat_from == 4 and decide("p", late, "new", True, same_architecture=False).whole, "second half"
    climbed = training_of([0.6, 0.9, 0.95, 0.96, 0.96, 0.96], "earlier", started_cold=True)
    assert climbed.flat_from == 4 and decide("p", climbed, "new", True, parent_accuracy=0.96).whole, "4 of 6"
    quick = training_of([0.6, 0.9, 0.955, 0.96, 0.96, 0.96], "earlier", started_cold=True)
    assert quick.improving is False and not decide("p", quick, "new", True, parent_accuracy=0.96).whole
    warmed = dataclasses.replace(flat, started_cold=False)  # its first report is its own parent's, not cold
    assert decide("p", warmed, "new", True, parent_accuracy=0.99).whole
    unknown = dataclasses.replace(flat, started_cold=None)
    assert decide("p", unknown, "new", True, parent_accuracy=0.99).whole
    cut = training_of([0.99] * (MIN_REPORTS - 1), "earlier", started_cold=True)  # an early-stopped trial
    assert decide("p", cut, "new", True, parent_accuracy=0.99).whole
    # one image in a hundred, read in float32, is a gain: a curve still rising by it is not at its plateau
    f32 = [float(np.float32(x)) for x in (0.95, 0.96, 0.97, 0.98, 0.99, 0.99)]
    assert training_of(f32, started_cold=True).flat_from == 5
    # a record from before flat_from was kept: read at its first report against the model's accuracy
    old = dataclasses.replace(flat, flat_from=None)
    assert not decide("p", old, "new", True, parent_accuracy=0.99).whole
    assert decide("p", old, "new", True, parent_accuracy=0.96 + PLATEAU_GAIN + 0.03).whole


def test_a_lossy_transfer_from_another_searchs_cold_parent_cut_early_gives_nothing():
    """A parent trained for a few reports from scratch, carried onto a child by a transform that loses part of its
    function, is a start cold training passes at once; a restart or an exact growth continues its training."""
    cut = training_of([0.317], "other", started_cold=True)
    lossy = decide("p", cut, "new", True, same_architecture=False, parent_accuracy=0.317, preserved=False)
    assert not lossy.whole and "reported 1 result(s)" in lossy.why and "loses part" in lossy.why
    assert decide("p", cut, "new", True, same_architecture=False, preserved=True).whole, "an exact growth"
    assert decide("p", cut, "new", True, same_architecture=True).whole, "a restart continues it"
    assert decide("p", dataclasses.replace(cut, started_cold=False), "new", True, same_architecture=False,
                  preserved=False).whole, "a warmed parent carries more than its own reports"
    long = training_of([0.2, 0.3, 0.4, 0.5], "other", started_cold=True)
    assert decide("p", long, "new", True, same_architecture=False, preserved=False).whole
    assert decide("p", cut, "", True, same_architecture=False, preserved=False).whole, "outside a search"
    # a parent of the child's own search is held to the search's cold first reports instead (its whole budget may
    # be one report: a Trainer search of one epoch)
    assert decide("p", cut, "other", True, same_architecture=False, preserved=False).whole, "this very search"
    # through the rule's source: the candidate's own assessment says whether the transform keeps the function
    rule = Inheritances()
    shrink = Candidate(name="p", score=0.9, accuracy=0.317, preserved=False)
    choice = ParentChoice("p", 0.9, "zoo", 0.0, 0, candidates=(shrink,), qualified=1, models=1)
    out = rule.apply(choice, "new", lambda name: cut)
    assert out.parent is None and out.withheld == "p" and "loses part" in reason_of(out)
    assert rule.apply(_choice(), "new", lambda name: cut).parent == "p", "a preserved candidate keeps it"


@pytest.mark.parametrize("training, search, first, whole", [
    (Training("a", 8, 0.4, True), "b", False, True),       # still improving: every trial inherits
    (Training("a", 2, None, None), "a", False, True),      # too few reports (a trial cut early): improving
    (Training("a", 8, 0.0, False), "a", True, False),      # converged in this very search: cold
    (Training("a", 8, 0.0, False), "b", True, True),       # converged elsewhere: the first trial of b takes it
    (Training("a", 8, 0.0, False), "b", False, False),     # ... and only the first
    (None, "b", True, True),                               # registered by hand: as converged elsewhere
    (None, "b", False, False),
    (Training("a", 8, 0.0, False), "", False, True),       # outside a search: always inherits
])
def test_decide_follows_the_rule(training, search, first, whole):
    verdict = decide("p", training, search, first)
    assert verdict.whole is whole and "'p'" in verdict.why


def _choice(parent="p"):
    cand = Candidate(name="p", score=1.0, accuracy=0.9, preserved=True)
    return ParentChoice(parent, 1.0, "zoo", 0.0, 0, candidates=(cand,), qualified=1, models=1)


def test_a_converged_parent_from_elsewhere_goes_to_one_trial_per_search_and_says_so():
    rule = Inheritances()
    converged = Training("earlier", 8, 0.0, False)
    first = rule.apply(_choice(), "new", lambda name: converged)
    second = rule.apply(_choice(), "new", lambda name: converged)
    other = rule.apply(_choice(), "another", lambda name: converged)
    assert first.parent == "p" and "first trial of this search" in reason_of(first)
    assert second.parent is None and second.withheld == "p" and second.qualified == 0, "nothing left to probe"
    assert "keeps exploring" in reason_of(second) and "keeps its own weights" in reason_of(second)
    assert other.parent == "p", "each search takes it once"
    improving = Training("earlier", 8, 0.5, True)
    assert all(rule.apply(_choice(), "new", lambda name: improving).parent == "p" for _ in range(3))
    assert rule.apply(dataclasses.replace(_choice(), parent=None), "new", lambda n: converged).withheld is None


def test_a_parent_of_this_search_below_its_cold_trials_first_report_gives_nothing():
    rule = Inheritances()
    improving = Training("s", 8, 0.5, True)  # would be inherited by every trial without the first-report test
    assert rule.apply(_choice(), "s", lambda name: improving).parent == "p", "no cold trial has reported yet"
    for bad in (float("nan"), float("inf")):
        rule.observe_cold_start("s", bad)
    assert rule.apply(_choice(), "s", lambda name: improving).parent == "p", "non-finite reports are ignored"
    rule.observe_cold_start("s", 0.95)
    rule.observe_cold_start("s", 0.60)  # the best first report counts, not the last
    below = rule.apply(_choice(), "s", lambda name: improving)
    assert below.parent is None and below.withheld == "p" and below.qualified == 0
    assert "first result (0.950)" in reason_of(below) and "(0.900)" in reason_of(below)
    # another search's parent may be on another task, and another search's cold reports are not this one's
    assert rule.apply(_choice(), "s", lambda name: Training("t", 8, 0.5, True)).parent == "p"
    assert rule.apply(_choice(), "u", lambda name: Training("u", 8, 0.5, True)).parent == "p"
    rule.observe_cold_start("u", 0.90)  # equal is not below
    assert rule.apply(_choice(), "u", lambda name: Training("u", 8, 0.5, True)).parent == "p"


def _mlp(width: int, seed: int):
    import torch

    from keeper.torch_support import export

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 3))
    return export(model, torch.zeros(1, 8)).onnx


def test_the_embedded_zoo_applies_the_rule_from_the_curves_its_models_were_registered_with(tmp_path):
    from keeper import Zoo, load_graph

    zoo = Zoo(str(tmp_path / "zoo"))
    flat = training_of([0.5, 0.8, 0.8, 0.8, 0.8, 0.8], "first").as_dict()
    zoo.register(_mlp(16, 0), 0.8, "converged", lineage={"parent": None, "training": flat})
    child = load_graph(_mlp(16, 1))
    same = zoo.choose(child, search="first")
    assert same.parent is None and same.withheld == "converged" and "in this search" in same.rule
    again = [zoo.choose(child, search="second") for _ in range(2)]
    assert [c.parent for c in again] == ["converged", None], "once per search from elsewhere"
    assert zoo.choose(child).parent == "converged", "outside a search every warm inherits"
    wider = zoo.choose(load_graph(_mlp(32, 2)), search="first")
    assert wider.parent == "converged" and "head start" in wider.rule, "another architecture: a head start"
    rising = training_of([0.1, 0.3, 0.5, 0.7, 0.8, 0.9], "first").as_dict()
    zoo.register(_mlp(16, 3), 0.9, "climbing", lineage={"parent": None, "training": rising})
    assert all(zoo.choose(child, search="first").parent == "climbing" for _ in range(2)), "improving: every trial"
    result = zoo.warm(_mlp(16, 4))
    assert result.parent == "climbing" and "outside a search" in result.reason
    assert Training.from_dict(zoo.store.record("climbing").summary["lineage"]["training"]).improving is True


def test_past_a_parent_below_the_cold_first_report_the_next_candidate_above_it_is_chosen():
    """Only parents below the bar are passed over: the next qualifying candidate that clears it (and the rest of the
    rule) is the parent, the ones passed over leave the candidates; with none above it the child starts cold."""
    weak, strong = Candidate(name="weak", score=1.0, accuracy=0.80), Candidate(name="strong", score=0.9, accuracy=0.95)
    choice = ParentChoice("weak", 1.0, "zoo", 0.0, 0, candidates=(weak, strong), qualified=2, models=2)
    rule = Inheritances()
    rule.observe_cold_start("s", 0.90)
    mine = Training("s", 8, 0.5, True)
    got = rule.apply(choice, "s", lambda name: mine)
    assert got.parent == "strong" and got.score == 0.9 and got.withheld is None and got.ranked() == (strong,)
    assert "'weak' ranked above it but below" in reason_of(got) and "(0.900)" in reason_of(got)
    rule.observe_cold_start("s", 0.99)
    none = rule.apply(choice, "s", lambda name: mine)
    assert none.parent is None and none.withheld == "weak" and "(0.800)" in reason_of(none)
