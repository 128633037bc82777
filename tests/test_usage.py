"""docs/usage.md's examples run as written, as the README's do (tests/test_readme.py, tests/doc_blocks.py): each
block marked ``<!-- doc-test: NAME -->`` in a fresh process, on a local Ray with 2 CPUs that the examples join,
the shipped defaults, the zoo in ``$KEEPER_ZOO`` and ``$HOME`` in a temporary directory."""

from __future__ import annotations

import re

import pytest

from doc_blocks import USAGE, SharedRay, run_python

pytestmark = pytest.mark.ray  # starts Ray on loopback; `-m "not ray"` leaves these out


@pytest.fixture(scope="module")
def ray_once():
    """The 2-CPU Ray the module's examples join."""
    shared = SharedRay()
    yield shared
    shared.shutdown()


@pytest.mark.slow  # > 20 s on two idle cores
def test_hf_trainer_search_registers_every_trial_and_warms_the_deeper_ones_from_the_shallower(tmp_path, ray_once):
    """docs/usage.md's Hugging Face Trainer search (a grid of 4, 1 CPU each, 2 CPUs): every trial is registered
    from the Trainer's checkpoint-<step>/ with the objective it reported, and the 2-layer trials, which start after
    the 1-layer ones, are warmed from them (a 64-wide 2-layer BERT has no other parent above the floor), but for a
    parent below what the search's cold trials first reported (the first-report rule: that child starts cold)."""
    out = run_python("hf-trainer", tmp_path, ray_once, doc=USAGE).strip().splitlines()
    rows = [re.fullmatch(r"(\{.*?\}) (\S+) ([0-9.]+) parent: (\S+)", line) for line in out[-5:-1]]
    assert all(rows), out[-5:]
    configs = [eval(r.group(1), {}) for r in rows]  # noqa: S307 - dicts this test's own subprocess printed
    names = {r.group(2): c for r, c in zip(rows, configs)}
    parents = {(c["hidden"], c["layers"]): (None if r.group(4) == "None" else names[r.group(4)])
               for r, c in zip(rows, configs)}
    assert len(names) == 4 and all(0.0 <= float(r.group(3)) <= 1.0 for r in rows), out[-5:]
    # the two 1-layer trials start together (2 CPUs), so both cold; on a loaded machine one of them may start only
    # after the other was registered, and then it inherits from it (either may be first: seen both ways)
    assert parents[(32, 1)] is None or parents[(64, 1)] is None, parents
    assert parents[(32, 1)] in (None, {"hidden": 64, "layers": 1}), parents
    assert parents[(64, 1)] in (None, {"hidden": 32, "layers": 1}), parents
    accuracy = {(c["hidden"], c["layers"]): float(r.group(3)) for r, c in zip(rows, configs)}
    assert parents[(64, 2)] == {"hidden": 64, "layers": 1}, parents
    # The 32-wide 2-layer trial's best parent is a 1-layer trial; it is withheld (the child starts cold) only where
    # that parent is below the best first report of the search's cold trials (each 1-layer trial reports once).
    if parents[(32, 2)] is None:
        assert accuracy[(32, 1)] < accuracy[(64, 1)], (parents, accuracy)
    else:
        assert parents[(32, 2)]["layers"] == 1, parents
    best = float(out[-1].split()[-1])  # the Trainer's best last objective; keeper keeps each trial's best
    assert max(float(r.group(3)) for r in rows) >= best - 1e-4, out[-5:]
