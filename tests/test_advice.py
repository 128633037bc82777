"""What KeeperCallback tells a Tune user (keeper.tune_integration.advice): each message names the trial and what to
change in the Tune code. The results below are what Tune held for real trials: the Hugging Face Trainer's last
report (its eval_ metrics and objective) and a hand-written trainable's."""

from __future__ import annotations

from keeper.errors import AdmissionError, ServiceError
from keeper.tune_integration import advice

HF_RESULT = {"eval_loss": 0.69, "eval_accuracy": 0.55, "eval_runtime": 0.02, "epoch": 2.0, "objective": 0.55,
             "training_iteration": 2, "time_this_iter_s": 1.2, "done": True}
PLAIN_RESULT = {"accuracy": 0.8, "loss": 0.4, "training_iteration": 3, "time_total_s": 9.1}


def test_no_checkpoint_from_the_hf_trainer_says_which_save_strategy_to_set():
    text = advice.no_checkpoint("t1", HF_RESULT)
    assert text.startswith("trial t1 reported no checkpoint") and "save_strategy" in text and "eval_strategy" in text
    plain = advice.no_checkpoint("t2", PLAIN_RESULT)
    assert "save_strategy" not in plain and "tune.Checkpoint.from_directory" in plain and "model.pt" in plain
    assert "RayTrainReportCallback" in plain


def test_a_metric_never_reported_lists_the_ones_that_were():
    text = advice.no_metric("t1", "acc", PLAIN_RESULT)
    assert "never reported metric 'acc'" in text and "accuracy, loss" in text and "KeeperCallback(metric=" in text
    assert "training_iteration" not in text and "time_total_s" not in text


def test_an_accuracy_outside_0_1_names_score_fn_and_for_the_hf_objective_a_metric_that_fits():
    assert advice.out_of_range("t1", "objective", 0.55, 0.55, False, HF_RESULT) is None
    text = advice.out_of_range("t1", "objective", 1.4, 1.4, False, HF_RESULT)
    assert "KeeperCallback(score_fn=" in text and "metric='eval_accuracy'" in text
    scored = advice.out_of_range("t2", "loss", 0.4, float("nan"), True, PLAIN_RESULT)
    assert "score_fn gave nan" in scored and "eval_accuracy" not in scored


def test_zoo_refusals_name_the_keeper_callback_argument_that_changes_them():
    outlier = AdmissionError("model 'm': accuracy 0.1000 is more than 3.0 std below the zoo mean ... Set "
                             "outlier_z=None to admit it anyway")
    assert advice.refused("t1", outlier).endswith("In the Tune code: KeeperCallback(..., outlier_z=None) admits "
                                                  "such trials")
    assert "capacity_bytes=" in advice.refused("t1", AdmissionError("model 'm': 9 bytes exceeds the zoo capacity"))
    assert "timeouts={'register_s'" in advice.refused("t1", ServiceError("registering trial t1 was not back"))
    assert advice.refused("t1", ValueError("x")) == "trial t1 was not registered: x"


def test_a_trial_recorded_on_a_stored_model_says_so():
    text = advice.recorded("t9", {"name": "exp1-t0", "accuracy": 0.9, "summary": {"trained": 3}})
    assert text == ("trial t9 trained the same weights as the stored model 'exp1-t0' (a repeated seed), so it was "
                    "recorded on that model: trained 3 times, accuracy 0.9000 (the best reported)")


def test_a_warmed_trial_that_first_reports_far_below_its_parent_is_told_how_to_keep_what_it_was_given():
    given = {"parent": "exp-t0", "preserved": True, "structure": 1.0, "probed": False, "parent_accuracy": 0.971}
    text = advice.lost_inheritance("t3", given, 0.898, "val_accuracy")
    assert text.startswith("trial t3 started from the function of 'exp-t0' (registered at 0.971)")
    assert "val_accuracy 0.898" in text and "warm_lr(" in text and "warm.lr_factor(step, total_steps)" in text
    assert advice.lost_inheritance("t3", given, 0.95, "val_accuracy") is None, "within 5% of what it was given"
    assert advice.lost_inheritance("t3", {**given, "preserved": False}, 0.5, "acc") is None, "no function given"
    assert advice.lost_inheritance("t3", {**given, "parent": None}, 0.5, "acc") is None
    assert advice.lost_inheritance("t3", None, 0.5, "acc") is None, "warm_start never ran"


def test_the_callback_warns_once_from_the_lineage_the_trial_left(tmp_path, caplog):
    import json
    import logging
    from types import SimpleNamespace

    import pyarrow.fs

    from keeper.torch_support.trial import LINEAGE_FILE
    from keeper.tune_integration import KeeperCallback

    (tmp_path / LINEAGE_FILE).write_text(json.dumps({"parent": "exp-t0", "preserved": True, "parent_accuracy": 0.97}))
    trial = SimpleNamespace(trial_id="t3", storage=SimpleNamespace(storage_filesystem=pyarrow.fs.LocalFileSystem(),
                                                                   trial_fs_path=str(tmp_path)))
    cb = KeeperCallback(metric="acc", mode="max", zoo=str(tmp_path / "zoo"))
    with caplog.at_level(logging.WARNING, logger="keeper.tune_integration.callback"):
        cb.on_trial_result(0, [], trial, {"acc": 0.80})
        cb.on_trial_result(1, [], trial, {"acc": 0.60})
    assert [r.getMessage() for r in caplog.records if "started from the function" in r.getMessage()] == [
        "keeper: " + advice.lost_inheritance("t3", json.loads((tmp_path / LINEAGE_FILE).read_text()), 0.80, "acc")]
    assert cb._curves["t3"] == [0.80, 0.60], "every report joins the trial's learning curve"
