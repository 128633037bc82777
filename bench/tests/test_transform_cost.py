"""keeper_bench.transform_cost and keeper_bench.footprint, on a pair small enough for a test: the pair is exported,
measured in a process of its own (``python -m keeper_bench.transform_cost``), its files removed, and tabled as the
report does; the memory probe sees what a block allocates."""

from __future__ import annotations

import sys

import pytest

from keeper_bench.footprint import AnonPeak, proc_status, timed
from keeper_bench.transform_cost import cost_case, cost_tables

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the probes read /proc/self/status")


def test_a_pair_is_measured_in_its_own_process_and_tabled(tmp_path):
    r = cost_case("resnet", 30_000, reps=2, seed=0, workdir=tmp_path)
    assert not list(tmp_path.iterdir()), "the exported pair is removed once measured"
    assert r["child_params"] > r["parent_params"] and r["child_layers"] > r["parent_layers"]
    assert len(r["copy_s"]) == len(r["transform_s"]) == len(r["align_s"]) == 2 and r["first_s"] > 0
    assert 0 < r["score"] <= 1 and r["tensors"] > 0 and r["operators"]
    assert r["parent_spec"]["blocks"] == [2, 2, 2, 2] and r["child_spec"]["blocks"] == [3, 3, 3, 3]
    lines, _ = cost_tables([r])
    rows = [line for line in lines if line.startswith("| resnet 0.03M | ")]
    assert [row.count("|") for row in rows] == [11, 7], "one row in the time table, one in the memory table"


def test_the_probes_read_this_process():
    assert proc_status("VmRSS") > 0
    with pytest.raises(RuntimeError, match="no NoSuchField"):
        proc_status("NoSuchField")
    assert len(timed(lambda: None, 3)) == 3
    with AnonPeak() as mem:
        block = b"x" * 64_000_000
    assert mem.extra >= 48_000_000 and len(block)
