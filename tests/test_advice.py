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
