"""The language-modelling experiment through Ray Tune, run once per arm: what ``scripts/bench_lm.py`` measures.

Architectures (:func:`keeper_bench.lm.arrivals`: GPT-2- and Llama-style, interleaved) arrive in a fixed order and
Tune runs them in that order, ``concurrency`` at a time, so a trial inherits only from trials that finished before
it started. Every arm trains the same architectures from the same initial weights, data order and schedule; only
the warm start differs. The arms are those of :mod:`keeper_bench.nas` (cold, keeper, keeper-no-accuracy, published,
name-shape), warmed by :func:`keeper_bench.nas.warm_by_arm` through keeper's public Tune API
(:class:`keeper.tune_integration.KeeperCallback`, ``warm_start``). Beside them, the copy bounds of
:data:`keeper_bench.nas.BOUNDS` restart every trial from the final weights of its own cold trial (the cold arm of
the same seed leaves them in the work directory), without and with keeper's recipe for a restart: what the
schedule allows any warm start at best. Each trial reports its final validation
next-token accuracy to Tune as ``accuracy``, the figure the zoo's admission and the accuracy-aware parent choice
read.

Budget: each family trains a fixed number of steps (:attr:`LmRun.budgets`), chosen so that the cold runs are at
their plateau (validation loss improves by less than 1% relative over the last 20% of the steps,
:func:`keeper_bench.plateau.at_plateau`); :func:`summarize` checks every cold trial.

Steps to target: the first evaluated step at which a trial's validation loss is at most the cold trial's (same
architecture and seed) final loss times ``1 + tolerance``; a trial that never gets there counts its whole budget.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from keeper.recipe import Recipe
from keeper_bench.nas import ARMS, BOUNDS, copy_bound_start, service_config, warm_by_arm

__all__ = ["ARMS", "BOUNDS", "LmRun", "LmRecord", "run_arm", "steps_to_target", "summarize", "plateau_check",
           "records_to_json"]


@dataclass(frozen=True)
class LmRun:
    """Training settings shared by every trial of every arm."""

    budgets: tuple[tuple[str, int], ...] = (("gpt2", 800), ("llama", 800))  # steps per family (plateau budgets)
    evaluations: int = 10        # evaluations per run, evenly spaced (every 10% of the budget)
    batch_size: int = 8
    context: int = 64
    lr: float = 3e-3
    concurrency: int = 2
    noise: float = 0.01          # keeper's symmetry-breaking noise
    tolerance: float = 0.01      # target = cold final validation loss * (1 + tolerance)
    dynamo: bool = False         # exporter for warm starts (TorchScript: Llama's RoPE and GPT-2's masks export)

    def budget(self, family: str) -> int:
        return dict(self.budgets)[family]

    def eval_every(self, family: str) -> int:
        return max(1, self.budget(family) // self.evaluations)


@dataclass
class LmRecord:
    """One trial's outcome in one arm."""

    index: int
    family: str
    arch: str
    params: int
    parent: str
    score: float
    budget: int
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    seconds: float = 0.0         # training and evaluation, in the trial
    warm_seconds: float = 0.0    # the arm's warm start (export, parent choice, transfer), in the trial

    @property
    def final_loss(self) -> float:
        return self.losses[-1]

    @property
    def final_accuracy(self) -> float:
        return self.accuracies[-1]


def _trainable(arm: str, specs: list[dict], run: LmRun, service: dict, states: str, prefix: str, seed: int,
               corpus_ref: Any):
    def trial(config: dict) -> None:
        import ray
        import torch
        from ray import tune

        from keeper_bench.lm import build, example_input, num_params, train

        torch.set_num_threads(1)  # `concurrency` trials share as many cores: threads would only contend
        i = int(config["index"])
        spec = specs[i]
        torch.manual_seed(seed * 100_003 + i)  # the same initial weights in every arm
        model = build(spec, run.context)
        info: dict = {"parent": "", "score": 0.0}
        budget = run.budget(spec["family"])
        t0 = time.perf_counter()
        if arm in BOUNDS:
            info = copy_bound_start(arm, model, states, seed, i, budget, prefix="lm-")
        elif arm != "cold":
            info = warm_by_arm(arm, model, example_input(run.context), service, run.dynamo, states, seed, budget)
        warm_seconds = time.perf_counter() - t0
        recipe = info.pop("recipe", None)
        corpus = ray.get(corpus_ref)
        h = train(model, corpus, steps=budget, eval_every=run.eval_every(spec["family"]),
                  batch_size=run.batch_size, context=run.context, lr=run.lr, seed=seed * 7_919 + i,
                  lr_factor=Recipe(**recipe).factor if recipe else None)
        history = json.dumps([h.steps, h.losses, h.accuracies])
        metrics = {"accuracy": h.final_accuracy, "loss": h.final_loss, "index": i, "history": history,
                   "params": num_params(model), "seconds": h.seconds, "warm_seconds": warm_seconds, **info}
        if arm in ("cold",) + BOUNDS:  # nothing registers these models: no checkpoint to write
            if arm == "cold":  # the copy bounds' start
                torch.save(model.state_dict(), os.path.join(states, f"{i}.pt"))
            tune.report(metrics)
            return
        with tempfile.TemporaryDirectory() as d:
            torch.save(model.state_dict(), os.path.join(d, "model.pt"))
            if arm == "name-shape":  # later trials of this arm load parents by name
                torch.save(model.state_dict(), os.path.join(states, f"{prefix}{tune.get_context().get_trial_id()}.pt"))
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))
    return trial


def run_arm(arm: str, specs: list[dict], run: LmRun, workdir: str, seed: int = 0,
            progress: Callable[[str, LmRecord], None] | None = None) -> list[LmRecord]:
    """Train ``specs`` in order through Ray Tune for one arm; one record per spec, in spec order.

    Ray must be initialized. An arm other than cold and the bounds starts its own keeper service on an empty zoo
    under ``workdir`` (through :class:`KeeperCallback`) and shuts it down at the end; the cold arm leaves its
    trials' final weights there for the copy bounds (:data:`BOUNDS`), which run after it in the same ``workdir``.
    """
    import ray
    from ray import tune

    from keeper.actors.launcher import shutdown
    from keeper.tune_integration import KeeperCallback
    from keeper_bench.lm import stdlib_corpus

    if arm not in ARMS + BOUNDS:
        raise ValueError(f"unknown arm {arm!r}; expected one of {ARMS + BOUNDS}")
    keeper_arm = arm not in ("cold",) + BOUNDS  # an arm with a keeper service and a zoo
    service = service_config(f"lm-{arm}", seed, workdir, run.noise)
    service["selection"] = {"accuracy_aware": arm != "keeper-no-accuracy"}
    states = os.path.join(workdir, f"lm-states-{arm}-s{seed}")
    os.makedirs(states, exist_ok=True)
    prefix = f"lm-{arm}-s{seed}-"
    callbacks: list[Any] = []
    if keeper_arm:
        callbacks.append(KeeperCallback("accuracy", "max", config=service, name_prefix=prefix))
    if progress is not None:
        callbacks.append(_Progress(arm, specs, run, progress))
    tuner = tune.Tuner(
        _trainable(arm, specs, run, service, states, prefix, seed, ray.put(stdlib_corpus())),
        param_space={"index": tune.grid_search(list(range(len(specs))))},
        tune_config=tune.TuneConfig(max_concurrent_trials=run.concurrency, reuse_actors=True),
        run_config=tune.RunConfig(name=f"lm-{arm}-s{seed}", storage_path=os.path.join(workdir, "tune"),
                                  callbacks=callbacks, verbose=0))
    try:
        grid = tuner.fit()
    finally:
        if keeper_arm:
            shutdown(service)
    if grid.errors:
        raise RuntimeError(f"{arm}: {len(grid.errors)} trials failed; first: {grid.errors[0]}")
    out: list[LmRecord | None] = [None] * len(specs)
    for r in grid:
        out[int(r.metrics["index"])] = _record(specs, r.metrics, run)
    missing = [i for i, r in enumerate(out) if r is None]
    if missing:
        raise RuntimeError(f"{arm}: no result for trials {missing}")
    return out  # type: ignore[return-value]


def _record(specs: list[dict], m: dict, run: LmRun) -> LmRecord:
    from keeper_bench.lm import arch_label

    i = int(m["index"])
    steps, losses, accs = json.loads(m["history"])
    fam = specs[i]["family"]
    return LmRecord(i, fam, arch_label(specs[i]), int(m["params"]), m["parent"], float(m["score"]),
                    run.budget(fam), steps, losses, accs, float(m["seconds"]), float(m.get("warm_seconds", 0.0)))


def _Progress(arm, specs, run, fn):  # noqa: N802 - a factory that reads like the class it makes
    from ray.tune import Callback

    class Progress(Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            if "history" in result:
                fn(arm, _record(specs, result, run))

    return Progress()


def steps_to_target(record: LmRecord, target: float) -> tuple[int, bool]:
    """(first evaluated step with validation loss <= target, reached?); (budget, False) when never reached."""
    for s, v in zip(record.steps, record.losses):
        if v <= target:
            return int(s), True
    return int(record.budget), False


def summarize(cold: list[LmRecord], arm: list[LmRecord], run: LmRun, slower: float = 1.25) -> dict:
    """Totals of one arm against cold over the same architectures (same order).

    ``slow``: warmed trials (those with a parent) that took more than ``slower`` times the cold trial's steps to
    target, as ``[index, cold steps, arm steps]``."""
    cold_steps, arm_steps, reached, per_trial, slow = [], [], 0, [], []
    for c, a in zip(cold, arm):
        target = c.final_loss * (1.0 + run.tolerance)
        cs, _ = steps_to_target(c, target)
        ws, ok = steps_to_target(a, target)
        cold_steps.append(cs)
        arm_steps.append(ws)
        reached += ok
        per_trial.append(cs / ws)
        if a.parent and ws > slower * cs:
            slow.append([a.index, cs, ws])
    total_cold, total_arm = float(sum(cold_steps)), float(sum(arm_steps))
    warm_idx = [i for i, a in enumerate(arm) if a.parent]
    warmed_speedup = (sum(cold_steps[i] for i in warm_idx) / sum(arm_steps[i] for i in warm_idx)
                      if warm_idx else 1.0)
    return {"speedup": total_cold / total_arm, "saved": 1.0 - total_arm / total_cold,
            "warmed_speedup": warmed_speedup, "cold_steps": cold_steps, "arm_steps": arm_steps,
            "per_trial_speedup": per_trial, "reached": reached, "trials": len(arm), "slow": slow,
            "loss_delta": float(np.mean([a.final_loss - c.final_loss for c, a in zip(cold, arm)])),
            "accuracy_delta": float(np.mean([a.final_accuracy - c.final_accuracy for c, a in zip(cold, arm)])),
            "warmed": len(warm_idx)}


def plateau_check(cold: list[LmRecord], tail: float = 0.2, threshold: float = 0.01) -> dict:
    """Per family: every cold trial's relative validation-loss gain over its last ``tail`` of steps
    (:func:`keeper_bench.plateau.tail_gain`), and how many are under ``threshold`` (at their plateau)."""
    from keeper_bench.plateau import tail_gain

    out: dict[str, dict] = {}
    for fam in sorted({r.family for r in cold}):
        gains = [tail_gain(r.steps, r.losses, tail) for r in cold if r.family == fam]
        out[fam] = {"gains": gains, "at_plateau": sum(g < threshold for g in gains), "trials": len(gains),
                    "max_gain": max(gains), "median_gain": float(np.median(gains))}
    return out


def records_to_json(records: list[LmRecord]) -> list[dict]:
    return [asdict(r) for r in records]
