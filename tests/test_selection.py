"""Parent choice: floor, coverage, buckets, accuracy-awareness, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keeper.choice.selection import (Candidate, SelectionPolicy, choose_parent, coverage, make_choice, rank_parents,
                                     reason_of)
from keeper.errors import KeeperError

unit = st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 0.3, 0.5, 0.95, 1.0]))
candidates = st.lists(st.builds(Candidate, st.sampled_from("abcdefgh"), unit, unit, unit), max_size=12)
policies = st.builds(SelectionPolicy, unit, st.integers(1, 20), st.booleans(), unit)
aware_policies = st.builds(SelectionPolicy, unit, st.integers(1, 20), st.just(True), unit)


def considered(cands, policy):
    """The candidates the policy ranks: above the floor, and of those the well-covered ones if any."""
    eligible = [c for c in cands if c.score >= policy.floor]
    return [c for c in eligible if c.coverage >= policy.min_coverage] or eligible


@settings(max_examples=100, deadline=None)
@given(candidates, policies)
def test_none_iff_nothing_clears_the_floor(cands, policy):
    best = choose_parent(cands, policy)
    assert (best is None) == (not any(c.score >= policy.floor for c in cands))
    if best is not None:
        assert best in cands and best.score >= policy.floor


@settings(max_examples=100, deadline=None)
@given(candidates, aware_policies)
def test_accuracy_aware_picks_the_most_accurate_of_the_best_bucket(cands, policy):
    best = choose_parent(cands, policy)
    eligible = considered(cands, policy)
    if best is None:
        return
    top = max(policy.bucket(c.score) for c in eligible)
    assert policy.bucket(best.score) == top
    same = [c for c in eligible if policy.bucket(c.score) == top]
    assert best.accuracy == max(c.accuracy for c in same)
    # independent of bucket(): nobody eligible is a full bucket width more similar
    width = (1.0 - policy.floor) / policy.buckets
    assert max(c.score for c in eligible) - best.score <= width + 1e-12


@settings(max_examples=100, deadline=None)
@given(candidates, policies)
def test_plain_mode_gives_the_max_score(cands, policy):
    plain = SelectionPolicy(policy.floor, policy.buckets, accuracy_aware=False, min_coverage=policy.min_coverage)
    best = choose_parent(cands, plain)
    eligible = considered(cands, plain)
    if best is None:
        return
    top = max(c.score for c in eligible)
    assert best.score == top
    assert best.accuracy == max(c.accuracy for c in eligible if c.score == top)


@settings(max_examples=100, deadline=None)
@given(candidates, policies)
def test_a_poorly_covered_parent_is_a_last_resort(cands, policy):
    best = choose_parent(cands, policy)
    if best is None:
        return
    covered = [c for c in cands if c.score >= policy.floor and c.coverage >= policy.min_coverage]
    assert (best.coverage >= policy.min_coverage) == bool(covered)


def test_a_small_child_of_a_much_larger_parent_prefers_its_own_kind():
    # the small MLP is covered completely by slices of a transformer 10x its size, and at 0.9 by an MLP
    transformer = Candidate("transformer", 1.0, 0.80, coverage=coverage(1.0, 7_000, 70_000))
    mlp = Candidate("mlp", 0.9, 0.40, coverage=coverage(0.9, 7_000, 6_300))
    assert transformer.coverage == pytest.approx(0.1) and mlp.coverage == 1.0
    assert choose_parent([transformer, mlp]).name == "mlp"
    assert choose_parent([transformer, mlp], SelectionPolicy(accuracy_aware=False)).name == "mlp"
    assert choose_parent([transformer, mlp], SelectionPolicy(min_coverage=0.0)).name == "transformer"
    assert choose_parent([transformer]).name == "transformer"  # still better than no parent
    assert coverage(0.5, 10, 0) == 0.0


@settings(max_examples=100, deadline=None)
@given(candidates, policies, st.randoms(use_true_random=False))
def test_deterministic_and_order_free(cands, policy, rnd):
    first = choose_parent(cands, policy)
    shuffled = list(cands)
    rnd.shuffle(shuffled)
    assert choose_parent(shuffled, policy) == first
    assert choose_parent(iter(cands), policy) == first  # any iterable, read once


@settings(max_examples=100, deadline=None)
@given(policies, unit, unit)
def test_bucket_is_monotone_and_in_range(policy, a, b):
    lo, hi = sorted([max(a, policy.floor), max(b, policy.floor)])
    assert 0 <= policy.bucket(lo) <= policy.bucket(hi) <= policy.buckets - 1
    assert policy.bucket(1.0) == policy.buckets - 1
    if policy.floor < 1.0:
        assert policy.bucket(policy.floor) == 0


def test_example_from_the_docstring():
    cands = [Candidate("a", 0.99, 0.70), Candidate("b", 0.95, 0.90), Candidate("c", 0.50, 0.99)]
    assert choose_parent(cands).name == "b"
    assert choose_parent(cands, SelectionPolicy(accuracy_aware=False)).name == "a"
    assert choose_parent(cands, SelectionPolicy(buckets=1)).name == "c"
    assert choose_parent(cands, SelectionPolicy(floor=1.0)) is None
    assert choose_parent([], SelectionPolicy()) is None


def test_ties_break_on_score_then_name():
    cands = [Candidate("z", 0.96, 0.9), Candidate("y", 0.97, 0.9), Candidate("x", 0.97, 0.9)]
    assert choose_parent(cands).name == "x"
    plain = SelectionPolicy(accuracy_aware=False)
    assert choose_parent([Candidate("b", 0.9, 0.5), Candidate("a", 0.9, 0.5), Candidate("c", 0.9, 0.6)],
                         plain).name == "c"


def test_ties_break_on_coverage_before_the_name():
    # equal name, score and accuracy: only coverage tells them apart, whatever the input order
    full, sliced = Candidate("a", 1.0, 0.0, coverage=1.0), Candidate("a", 1.0, 0.0, coverage=0.0)
    for policy in (SelectionPolicy(0.0, 1, False, 0.0), SelectionPolicy(0.0, 1, True, 0.0)):
        assert choose_parent([full, sliced], policy) == choose_parent([sliced, full], policy) == full


def test_numpy_scalars_are_accepted():
    best = choose_parent([Candidate("a", np.float32(0.8), np.float64(0.5))])
    assert best is not None and best.name == "a"


@pytest.mark.parametrize("kwargs", [{"floor": -0.1}, {"floor": 1.1}, {"floor": math.nan}, {"floor": "0.3"},
                                    {"buckets": 0}, {"buckets": -2}, {"buckets": 2.5}, {"buckets": True},
                                    {"accuracy_aware": "yes"}])
def test_bad_policy_raises(kwargs):
    with pytest.raises(KeeperError, match="selection"):
        SelectionPolicy(**kwargs)


@pytest.mark.parametrize("args", [("a", math.nan, 0.5), ("a", 0.5, math.nan), (3, 0.5, 0.5), ("a", None, 0.5)])
def test_bad_candidate_raises(args):
    with pytest.raises(KeeperError, match="candidate"):
        Candidate(*args)


# ---------------------------------------------------------------------------------------- preserved function

def test_preserved_candidate_qualifies_below_the_floor_and_beats_a_slice():
    grow = Candidate("narrow-resnet", 0.25, 0.80, preserved=True)
    slice_ = Candidate("vgg", 0.34, 0.95, structure=1.0)
    assert choose_parent([slice_, grow]).name == "narrow-resnet"
    assert choose_parent([Candidate("x", 0.25, 0.8)]) is None  # not preserved: the floor applies
    legacy = SelectionPolicy(preserve=False, structure=False)
    assert choose_parent([slice_, grow], legacy).name == "vgg"


def test_structure_is_part_of_the_objective():
    cross = Candidate("resnet", 1.0, 0.95, structure=0.5)   # fit 0.5
    same = Candidate("vgg", 0.8, 0.70, structure=1.0)       # fit 0.8
    assert choose_parent([cross, same]).name == "vgg"
    assert choose_parent([cross, same], SelectionPolicy(structure=False, cross_structure=True)).name == "resnet"
    assert choose_parent([Candidate("far", 0.9, 0.9, structure=0.2)]) is None  # fit 0.18 < floor


def test_unclean_candidates_rank_last_and_lose_the_preserved_tier():
    tainted = Candidate("t", 0.25, 0.99, preserved=True, clean=False)
    assert choose_parent([tainted]) is None
    tainted_fit = Candidate("t", 0.95, 0.99, clean=False)
    clean = Candidate("c", 0.5, 0.5)
    assert [c.name for c in rank_parents([tainted_fit, clean])] == ["c", "t"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1), st.booleans(), st.booleans()),
                min_size=1, max_size=8))
def test_rank_is_order_free_and_preserved_first(rows):
    cands = [Candidate(f"m{i}", s, a, structure=t, preserved=p, clean=c) for i, (s, a, t, p, c) in enumerate(rows)]
    ranked = rank_parents(cands)
    assert [c.name for c in ranked] == [c.name for c in rank_parents(cands[::-1])]
    tiers = [0 if c.preserved and c.clean else (1 if c.clean else 2) for c in ranked]
    assert tiers == sorted(tiers)
    assert all((c.preserved and c.clean) or c.fit >= 0.3 for c in ranked)


# ---------------------------------------------------------------------------------------- across block structures

def test_a_parent_across_block_structures_needs_a_probe_or_the_switch():
    cross = Candidate("resnet", 1.0, 0.95, structure=0.5)  # fit 0.5 clears the floor; not preserved
    assert choose_parent([cross]) is None
    choice = make_choice([cross], SelectionPolicy(), "zoo", 0.0, 0)
    assert choice.parent is None and choice.ranked() == (cross,)  # still ranked: a probe may score it
    assert "across block structures" in reason_of(choice) and "'resnet'" in reason_of(choice)
    assert choose_parent([cross], SelectionPolicy(cross_structure=True)).name == "resnet"
    same = Candidate("vgg", 0.4, 0.7)  # ranks below it (a lower bucket), yet may be the parent on its own
    choice = make_choice([cross, same], SelectionPolicy(), "zoo", 0.0, 0)
    assert [c.name for c in choice.ranked()] == ["resnet", "vgg"] and choice.parent == "vgg"
    assert reason_of(choice).startswith("'vgg' has the best fit")
    grown = Candidate("narrow", 0.2, 0.6, structure=1.0, preserved=True)
    assert choose_parent([cross, grown]).name == "narrow"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1), st.booleans()), min_size=1, max_size=8))
def test_without_the_switch_the_parent_preserves_or_maps_block_onto_block(rows):
    cands = [Candidate(f"m{i}", s, a, structure=t, preserved=p) for i, (s, a, t, p) in enumerate(rows)]
    best = choose_parent(cands)
    alone = [c for c in rank_parents(cands) if c.preserved or c.structure >= 1.0]
    assert best == (alone[0] if alone else None)
    loose = choose_parent(cands, SelectionPolicy(cross_structure=True))
    assert loose == (rank_parents(cands)[0] if rank_parents(cands) else None)


def test_policy_checks_new_keys():
    with pytest.raises(KeeperError, match="probe_top"):
        SelectionPolicy(probe_top=0)
    with pytest.raises(KeeperError, match="preserve"):
        SelectionPolicy(preserve="yes")
    with pytest.raises(KeeperError, match="cross_structure"):
        SelectionPolicy(cross_structure=1)
    with pytest.raises(KeeperError, match="structure"):
        Candidate("x", 0.5, 0.5, structure=1.5)


def test_a_choice_travels_as_json_with_its_alignments():
    # Ray Train's ranks receive rank 0's choice as JSON: each transfers along the same alignment, not a new one
    import numpy as np

    from keeper.choice.preservation import Assessment
    from keeper.choice.selection import ParentChoice
    from keeper.matching import Alignment

    assessed = Assessment(True, 1.0, "", Alignment(0.5, 10, 20, np.array([0, -1, 1], dtype=np.int64)))
    choice = make_choice([Candidate("a", 0.5, 0.9, 1.0, preserved=True, assessment=assessed),
                          Candidate("b", 0.2, 0.8)], SelectionPolicy(), "/zoo", 0.0, 3, 2)
    back = ParentChoice.from_json(choice.to_json())
    assert back == choice and back.parent == "a"
    got = back.assessment_of("a")
    assert got == assessed and got.alignment.score == 0.5 and got.alignment.pairs.tolist() == [0, -1, 1]
    assert back.assessment_of("b") is None and back.assessment_of(None) is None
