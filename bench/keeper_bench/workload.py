"""The MNIST-1D training workload that the demo and the training benchmark share.

MNIST-1D (Greydanus, 2020) is generated offline here with the ``mnist1d`` package's generator, never downloaded:
10 classes of 40-sample signals, 80% train / 20% test. Inputs are ``(N, 1, 40)`` float32, so one dataset serves
every family of :mod:`keeper_bench.families` (the transformer and the MLP accept that shape too).

:func:`train` runs Adam with a cosine-decayed learning rate over a fixed number of steps and evaluates test
accuracy every ``eval_every`` steps; steps-to-target is what a warm start should shorten. It does not touch
``torch.set_num_threads``: that is the caller's choice.

Example:
    >>> from keeper_bench.families import build, default_spec
    >>> data = mnist1d_dataset()
    >>> history = train(build(default_spec("mlp")), data, steps=100)  # doctest: +SKIP
    >>> history.final_accuracy > 0.2                                   # doctest: +SKIP
    True
"""

from __future__ import annotations

import copy
import functools
import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from torch import nn

__all__ = ["Dataset", "TrainHistory", "mnist1d_dataset", "train", "evaluate", "with_precise_bn"]


@dataclass
class Dataset:
    """Train and test split: ``x_*`` float32 ``(N, 1, L)``, ``y_*`` int64 ``(N,)``."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def num_classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1


@dataclass
class TrainHistory:
    """What :func:`train` observed.

    Attributes:
        steps: the optimizer step after which each evaluation ran.
        accuracies: test accuracy at each of those steps.
        running_accuracies: with ``precise_bn``, the same evaluations read with the model's running BatchNorm
            statistics (empty otherwise).
        losses: mean training loss over the steps since the previous evaluation.
        final_accuracy: test accuracy of the weights the model holds at the end: after the last step run, or with
            ``patience`` those of its best evaluation.
        stopped_at: with ``patience``, the step after which training stopped early (None: it ran its budget or
            stopped at its target).
        kept_step: the evaluated step whose weights the model ends with (the last one, or with ``patience`` the
            best one).
        steps_to_target: the first evaluated step whose accuracy reached ``target``; None if none did.
        seconds: wall time of the whole run, evaluations included.
        cpu_seconds: CPU time of the calling thread over the run (what the run costs on an idle core when torch
            runs one thread, as the benchmarks set it; other threads' work is not counted).
    """

    steps: list[int] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    running_accuracies: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    final_accuracy: float = 0.0
    steps_to_target: int | None = None
    stopped_at: int | None = None
    kept_step: int | None = None
    seconds: float = 0.0
    cpu_seconds: float = 0.0


@functools.lru_cache(maxsize=8)
def _generate(seed: int, num_samples: int) -> tuple[np.ndarray, ...]:
    from mnist1d.data import get_dataset_args, make_dataset  # imports matplotlib: pay only when used

    args = get_dataset_args()
    args.seed, args.num_samples = seed, num_samples
    # the generator reseeds the global random and numpy RNGs; give the caller theirs back
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        d = make_dataset(args)
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    return (d["x"].astype(np.float32)[:, None, :], d["y"].astype(np.int64),
            d["x_test"].astype(np.float32)[:, None, :], d["y_test"].astype(np.int64))


def mnist1d_dataset(seed: int = 0, num_samples: int = 5000) -> Dataset:
    """MNIST-1D generated offline (deterministic in ``seed``), cached in-process; each call returns fresh tensors.

    Args:
        seed: the generator's seed (the published dataset used 42).
        num_samples: total samples, 80% of them for training; at least 10 (one per class).
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 10:
        raise ValueError(f"mnist1d_dataset: num_samples must be an integer >= 10, got {num_samples!r}; "
                         "the generator makes num_samples // 10 signals per class")
    return Dataset(*(torch.from_numpy(a.copy()) for a in _generate(int(seed), num_samples)))


def _device_of(model: nn.Module) -> torch.device:
    p = next(iter(model.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset, device: torch.device | str | None = None,
             batch_size: int = 1024) -> float:
    """Test accuracy of ``model`` on ``data`` in eval mode; the model's training mode is restored."""
    device = torch.device(device) if device is not None else _device_of(model)
    was_training = model.training
    model.eval()
    try:
        correct = 0
        for i in range(0, len(data.y_test), batch_size):
            x = data.x_test[i:i + batch_size].to(device)
            y = data.y_test[i:i + batch_size].to(device)
            correct += int((model(x).argmax(dim=1) == y).sum())
    finally:
        model.train(was_training)
    return correct / max(1, len(data.y_test))


@torch.no_grad()
def with_precise_bn(model: nn.Module, data: Dataset, batches: int = 4, batch_size: int = 256) -> nn.Module:
    """A copy of ``model`` whose BatchNorm statistics are re-estimated from the first ``batches * batch_size``
    training samples (a plain average over those batches, in train mode, without gradients); ``model`` itself
    is untouched, and returned as is when it has no BatchNorm.

    Running statistics are an exponential average (momentum 0.1) over the last ~10-20 steps' batches. Read
    every few steps, accuracy then lags the weights: a model whose weights moved in the last steps is judged
    with statistics of older weights. Re-estimating them reads the accuracy of the weights as they are, the
    way an evaluation once per epoch (hundreds of steps, statistics long converged) does.
    """
    if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return model
    fresh = copy.deepcopy(model)
    for m in fresh.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the batches below
    device = _device_of(fresh)
    fresh.train()
    for i in range(batches):
        x = data.x_train[i * batch_size:(i + 1) * batch_size]
        if len(x):
            fresh(x.to(device))
    return fresh


def train(model: nn.Module, data: Dataset, *, steps: int, batch_size: int = 128, lr: float = 3e-3,
          eval_every: int = 50, target: float | None = None, stop_at_target: bool = False, seed: int = 0,
          device: torch.device | str | None = None, precise_bn: bool = False,
          report: Callable[[dict], None] | None = None,
          lr_factor: Callable[[int], float] | None = None, eval_at_start: bool = False,
          patience: int | None = None, min_delta: float = 0.002) -> TrainHistory:
    """Train ``model`` in place with Adam (cosine decay to zero over ``steps``) and cross-entropy.

    Batches are drawn without replacement, epoch by epoch, from a generator seeded by ``seed`` (the global
    torch RNG is not touched). Test accuracy is measured every ``eval_every`` steps and after the last one.

    Args:
        steps: optimizer steps to run (fewer when ``stop_at_target`` stops early).
        lr: Adam's peak learning rate; 3e-3 trains every family in :mod:`keeper_bench.families` well.
        target: the test accuracy that ``steps_to_target`` records reaching.
        stop_at_target: stop at the first evaluation that reaches ``target``.
        device: where to train; None keeps the model where it is. The model is moved there.
        precise_bn: evaluate with BatchNorm statistics re-estimated for the current weights
            (:func:`with_precise_bn`); training and the model's own running statistics are unaffected.
        report: called after each evaluation with ``{"step", "accuracy", "loss", "seconds", "last"}`` (a Tune
            ``report`` fits; ``last``: no evaluation follows).
        lr_factor: step (0-based) -> factor multiplied into the schedule (a warm start's recipe,
            ``WarmResult.recipe(steps).factor``); None keeps the schedule.
        eval_at_start: also evaluate before the first step (recorded as step 0, loss NaN): where a warm start
            begins.
        patience: early stopping, as a search that trains each trial until it stops improving runs it: stop after
            ``patience`` evaluations in a row that do not beat the best one by more than ``min_delta``, and end
            holding the best evaluation's weights (the schedule stays the one over ``steps``, so the run up to
            the stop is the same run as without it). None trains the whole budget.

    Example:
        >>> history = train(model, mnist1d_dataset(), steps=1500, target=0.8)  # doctest: +SKIP
        >>> history.steps_to_target                                             # doctest: +SKIP
        650
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"train: steps must be a positive integer, got {steps!r}")
    if eval_every < 1 or batch_size < 1:
        raise ValueError(f"train: eval_every and batch_size must be >= 1, got {eval_every!r} and {batch_size!r}")
    if stop_at_target and target is None:
        raise ValueError("train: stop_at_target=True needs a target accuracy; pass target=0.8 for instance")
    if patience is not None and (isinstance(patience, bool) or not isinstance(patience, int) or patience < 1):
        raise ValueError(f"train: patience must be a positive number of evaluations or None, got {patience!r}")
    device = torch.device(device) if device is not None else _device_of(model)
    model.to(device)
    x_train, y_train = data.x_train.to(device), data.y_train.to(device)
    n = len(y_train)
    gen = torch.Generator().manual_seed(seed)
    # fused: one kernel updates every parameter (the same Adam update; the per-tensor loop's Python overhead is
    # a third of a small MLP's step)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, fused=_fused_ok(model))
    factor = lr_factor or (lambda s: 1.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 0.5 * (1.0 + math.cos(math.pi * min(s, steps) / steps)) * factor(s))
    loss_fn = nn.CrossEntropyLoss()
    history = TrainHistory()
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    start, cpu_start = time.perf_counter(), time.thread_time()
    order, cursor, running, count = torch.randperm(n, generator=gen), 0, 0.0, 0
    best = {"accuracy": -math.inf, "step": None, "state": None, "stale": 0}  # early stopping's best evaluation

    def record(step: int, loss: float) -> bool:
        """Evaluate after ``step``; whether training ends here."""
        if precise_bn:
            history.running_accuracies.append(evaluate(model, data, device))
            # without BatchNorm both readings are the same model: read it once
            acc = evaluate(with_precise_bn(model, data), data, device) if has_bn else history.running_accuracies[-1]
        else:
            acc = evaluate(model, data, device)
        history.steps.append(step)
        history.accuracies.append(acc)
        history.losses.append(loss)
        if target is not None and history.steps_to_target is None and acc >= target:
            history.steps_to_target = step
        stop = bool(stop_at_target and history.steps_to_target is not None)
        if patience is not None:
            if acc > best["accuracy"] + min_delta:  # the first evaluation always: from -inf
                best.update(accuracy=acc, step=step, stale=0,
                            state={k: v.detach().clone() for k, v in model.state_dict().items()})
            else:
                best["stale"] += 1
            if best["stale"] >= patience and step < steps:
                history.stopped_at = step
                stop = True
        if report is not None:
            report({"step": step, "accuracy": acc, "loss": loss, "seconds": time.perf_counter() - start,
                    "last": stop or step == steps})
        return stop

    done = record(0, float("nan")) if eval_at_start else False
    model.train()
    for step in range(1, 0 if done else steps + 1):
        if cursor + batch_size > n:
            order, cursor = torch.randperm(n, generator=gen), 0
        idx = order[cursor:cursor + batch_size].to(device)
        cursor += batch_size
        loss = loss_fn(model(x_train[idx]), y_train[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        running, count = running + loss.item(), count + 1
        if step % eval_every and step != steps:
            continue
        stop = record(step, running / count)
        running, count = 0.0, 0
        if stop:
            break
    history.final_accuracy, history.kept_step = history.accuracies[-1], history.steps[-1]
    if patience is not None and best["state"] is not None:
        model.load_state_dict(best["state"])  # the best evaluation's weights, which final_accuracy then reads
        history.final_accuracy, history.kept_step = best["accuracy"], best["step"]
    history.seconds = time.perf_counter() - start
    history.cpu_seconds = time.thread_time() - cpu_start
    return history


def _fused_ok(model: nn.Module) -> bool:
    """Whether torch's fused Adam serves every parameter of ``model`` (floating point, on one CPU or CUDA
    device); otherwise the default implementation runs."""
    params = list(model.parameters())
    return bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params) \
        and len({p.device for p in params}) == 1
