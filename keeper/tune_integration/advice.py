"""What ``KeeperCallback`` tells the user about a trial, in the terms of their Tune code.

A Tune user has no keeper command line: every message names the trial, what happened, and what to change where
they can change it (``KeeperCallback(...)``'s arguments, the trainable or ``model_init``, ``TrainingArguments``,
the ``tune.report`` call). The zoo's own refusals name its settings (``outlier_z``, ``capacity_bytes``); here they
are given as the ``KeeperCallback`` arguments that set them.

Invariant: pure functions of what Tune reports; nothing here calls Ray or reads files.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from keeper.errors import (AdmissionError, RateLimitedError, ReadOnlyClientError, SecretMissingError, SecretRejectedError,
                           ServiceError, TeamMismatchError, UnknownTeamError)

__all__ = ["is_hf_trainer", "no_checkpoint", "no_metric", "out_of_range", "refused", "recorded"]


def is_hf_trainer(result: Mapping[str, Any]) -> bool:
    """Whether a trial's last result is one the Hugging Face Trainer's ``hyperparameter_search`` reported (its
    ``objective`` beside the ``eval_`` metrics)."""
    return "objective" in result and any(str(k).startswith("eval_") for k in result)


def no_checkpoint(trial_id: str, result: Mapping[str, Any]) -> str:
    """A trial that reported no checkpoint, and how to have it report one."""
    if is_hf_trainer(result):
        return (f"trial {trial_id} reported no checkpoint, so it is not registered: the Hugging Face Trainer "
                "reports one only at an evaluation that falls on a save step; set TrainingArguments(save_strategy=) "
                "to its eval_strategy (e.g. eval_strategy='epoch', save_strategy='epoch'; for 'steps', save_steps "
                "equal to eval_steps)")
    return (f"trial {trial_id} reported no checkpoint, so it is not registered; report one holding the model's "
            "weights: tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d)) with d holding model.pt "
            "(torch.save(model.state_dict(), ...)); under Ray Train pass the Train result's checkpoint to "
            "tune.report, and for Lightning add ray.train.lightning.RayTrainReportCallback() to the Trainer's "
            "callbacks")


def no_metric(trial_id: str, metric: str, result: Mapping[str, Any]) -> str:
    """A trial that never reported the callback's metric."""
    numbers = sorted(str(k) for k, v in result.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool) and not str(k).startswith(
                         ("time_", "timestamp", "training_iteration", "pid", "iterations_since", "done")))
    shown = ", ".join(numbers[:12]) + (" ..." if len(numbers) > 12 else "") if numbers else "no numbers"
    return (f"trial {trial_id} never reported metric {metric!r}, so it is not registered (it reported {shown}); "
            f"set KeeperCallback(metric=...) to the metric that measures the model")


def out_of_range(trial_id: str, metric: str, value: float, accuracy: float, scored: bool,
                 result: Mapping[str, Any]) -> str | None:
    """None when ``accuracy`` (``value`` through the callback's ``score_fn`` when ``scored``) is a fraction in
    [0, 1], as the zoo keeps accuracies; else why the trial is not registered and what to pass."""
    if math.isfinite(accuracy) and 0.0 <= accuracy <= 1.0:
        return None
    through = f" (score_fn gave {accuracy!r})" if scored else ""
    hint = (" The Hugging Face Trainer's 'objective' is the sum of compute_metrics' values: metric='eval_accuracy' "
            "is one of them" if is_hf_trainer(result) and metric == "objective" else "")
    return (f"trial {trial_id}: metric {metric!r} is {value!r}{through}, but the zoo keeps accuracies in [0, 1], so "
            "it is not registered; pass KeeperCallback(score_fn=...) mapping the metric into [0, 1] (e.g. "
            f"score_fn=lambda loss: math.exp(-loss)) or a metric that is a fraction already.{hint}")


def refused(trial_id: str, cause: BaseException) -> str:
    """A registration the zoo or the service refused, with the ``KeeperCallback`` argument that changes it."""
    text = str(cause)
    fix = ""
    if isinstance(cause, AdmissionError):
        if "outlier_z" in text:
            fix = "KeeperCallback(..., outlier_z=None) admits such trials"
        elif "capacity" in text:
            fix = "KeeperCallback(..., capacity_bytes=...) sets the zoo's byte budget"
        elif "taken by" in text or "already stored as" in text:
            fix = "KeeperCallback(..., name_prefix=...) names this experiment's models apart from earlier ones"
    elif isinstance(cause, (SecretMissingError, SecretRejectedError, UnknownTeamError, TeamMismatchError)):
        fix = ("KeeperCallback(..., team=..., secret_file=...) names the trials' team and its secret (or set "
               "KEEPER_TEAM and KEEPER_SECRET_FILE where the Tune driver runs)")
    elif isinstance(cause, ReadOnlyClientError):
        fix = "a read-only client registers nothing: drop KeeperCallback(read_only=True) / KEEPER_READ_ONLY"
    elif isinstance(cause, RateLimitedError):
        fix = "the team's registration rate is spent; an operator raises it (`keeper team policy --rate-burst`)"
    elif isinstance(cause, ServiceError) or type(cause).__name__ in ("GetTimeoutError", "ActorDiedError"):
        fix = "KeeperCallback(..., timeouts={'register_s': ...}) waits longer for a registration"
    return f"trial {trial_id} was not registered: {text}" + (f". In the Tune code: {fix}" if fix else "")


def recorded(trial_id: str, record: Mapping[str, Any]) -> str:
    """A trial whose weights were in the zoo already: it is that model, and was recorded on it."""
    summary = record.get("summary") or {}
    return (f"trial {trial_id} trained the same weights as the stored model {record.get('name')!r} (a repeated seed), "
            f"so it was recorded on that model: trained {summary.get('trained', 2)} times, accuracy "
            f"{float(record.get('accuracy', 0.0)):.4f} (the best reported)")


#: a warmed trial whose first report is below this share of its parent's accuracy lost what it inherited
LOST_SHARE = 0.95


def lost_inheritance(trial_id: str, lineage: Mapping[str, Any] | None, first: float, metric: str) -> str | None:
    """The warning for a trial that started from its parent's whole function (``lineage``: what ``warm_start``
    left in the trial directory) and first reported ``first`` (in the zoo's accuracy terms), far below the parent's
    accuracy; None when it kept what it was given, or was not given a function."""
    if not lineage or not lineage.get("parent") or not lineage.get("preserved"):
        return None
    given = lineage.get("parent_accuracy")
    if not isinstance(given, (int, float)) or isinstance(given, bool) or not given > 0 or first >= LOST_SHARE * given:
        return None
    return (f"trial {trial_id} started from the function of {lineage['parent']!r} (registered at {given:.3f}) but "
            f"first reported {metric} {first:.3f}: its first steps undid most of what it inherited. In the trainable, "
            "apply keeper's learning-rate recipe over its schedule (schedule = warm_lr(optimizer, warm, total_steps, "
            "scheduler), then schedule.step() where scheduler.step() was), or in a hand-written schedule multiply "
            "the rate by warm.lr_factor(step, total_steps)")
