"""``keeper demo`` (keeper_bench.demo), reached through keeper's command line as a ``keeper.commands`` plugin:
its arguments are checked before any work, and its table names parents as the demo's trials."""

from __future__ import annotations

import time

import pytest

from keeper.cli import main


@pytest.mark.parametrize("argv,message", [(["--archs", "0"], "--archs 0 is too small"),
                                          (["--steps", "-5"], "--steps -5 is too small"),
                                          (["--cpus", "0"], "--cpus 0 is too small"),
                                          (["--patience", "-1"], "--patience -1 is too small")])
def test_demo_checks_its_arguments_at_once(tmp_path, capsys, argv, message):
    t0 = time.monotonic()
    code = main(["demo", *argv, "--out", str(tmp_path / "demo")])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # before Ray starts (seconds) or anything trains: the first case also imports the command's plugin, which on a
    # loaded machine has passed 1 s
    assert code == 1 and message in err and time.monotonic() - t0 < 3.0
    assert not (tmp_path / "demo").exists()


def test_the_demo_table_names_parents_as_trials_with_their_architecture():
    from keeper_bench.demo import parent_label
    from keeper_bench.nas import arch_label, arrivals

    specs = arrivals(3, seed=0, families=("resnet", "vgg"))
    assert parent_label("keeper-s0-968c8_00001", specs) == f"trial 2 ({arch_label(specs[1])})"[:44]
    assert parent_label(None, specs) == "-"
    assert parent_label("mlp-a", specs) == "mlp-a"  # a name that is no trial of this demo stays as it is


def test_the_plot_reads_trials_stopped_early_at_different_steps(tmp_path):
    """Early stopping ends trials at different steps: the mean curves are over what each trial holds at every
    step (after its stop, its best evaluation's accuracy)."""
    from keeper_bench.demo import _plot
    from keeper_bench.nas import TrialRecord

    stopped = TrialRecord(0, "vgg", "a", 1, "parent", 1.0, [0, 20, 40], [0.5, 0.6, 0.7], 0.7)
    full = TrialRecord(0, "vgg", "a", 1, "", 0.0, [0, 20, 40, 60, 80], [0.1, 0.3, 0.5, 0.6, 0.65], 0.65)
    _plot(str(tmp_path / "demo.png"), [full], [stopped], 0.01)
    assert (tmp_path / "demo.png").stat().st_size > 0
