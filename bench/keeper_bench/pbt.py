"""One training budget spent four ways through Ray Tune, on two workloads: what ``scripts/bench_pbt.py`` measures.

The search spaces (:attr:`PbtRun.workload`), each over a width ``w`` in :attr:`PbtRun.widths`, a depth ``b`` in
:attr:`PbtRun.blocks` and a learning rate drawn log-uniformly from :attr:`PbtRun.lr_range` (Adam, constant rate):
    mnist1d: a 1-D ResNet of :mod:`keeper_bench.families` whose stages are ``[w, 2w, 4w]`` wide with ``b`` blocks
        each, on MNIST-1D; quality is classification accuracy.
    lm: a byte-level GPT-2 (:mod:`keeper_bench.lm`, a Hugging Face config) of width ``w``, ``b`` layers, heads of
        16 channels (``w / 16`` heads) and an FFN of ``4w``, on the Python standard library's source; quality is
        next-token accuracy on fixed windows; gradients clipped to norm 1.
Every member trains in rounds of :attr:`PbtRun.round_steps` steps; after each round it is evaluated in eval mode on
a validation split (what the schedulers rank by) and on the test split (what the target reads), and reports once.

Arms, all at the same budget of ``population x steps`` training steps:
    random: ``population`` configs drawn at random, each trained cold for ``steps``.
    asha-keeper: ASHA (one rung per round, reduction factor 3) over up to ``asha_factor x population`` draws,
        stopped once the budget is spent; every trial warm-starts from the zoo of the trials finished before it
        (``KeeperCallback`` + ``warm_start``).
    pbt: Tune's ``PopulationBasedTraining`` over the learning rate only, every member the middle architecture
        of the space; an exploit loads the clone's ``state_dict`` as Tune's examples do.
    keeper-pbt: :class:`keeper.tune_integration.KeeperPBT` over the learning rate, the width and the depth; the
        trainable's ``warm_start`` line restores the clone onto the member's own architecture.

Common random numbers: draw ``i`` (architecture, learning rate, initial weights, data order) is the same in every
arm that uses it; the PBT arm keeps draw ``i``'s learning rate and initial seed on its one architecture. Both PBT
arms run the same scheduler settings (synchronous, a perturbation every round, quantile 0.25).

A member's optimizer state travels with its checkpoint and is restored when the checkpoint is of its own
architecture (every resume, every same-architecture exploit); an exploit across architectures starts a fresh Adam.
Compute is counted as the training steps of every reported round, in the order the driver receives them
(:class:`Timeline`).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ARMS", "BudgetStopper", "PbtRun", "Timeline", "draws", "member_spec", "restarts_parent",
           "run_arm"]

ARMS = ("random", "asha-keeper", "pbt", "keeper-pbt")
KEEPER_ARMS = ("asha-keeper", "keeper-pbt")


@dataclass(frozen=True)
class PbtRun:
    """Settings shared by every arm."""

    population: int = 8
    steps: int = 800              # per member: the budget is population x steps
    round_steps: int = 100        # one evaluation, one report, one PBT round, one ASHA rung unit
    widths: tuple[int, ...] = (4, 8, 16)
    blocks: tuple[int, ...] = (1, 2, 3)
    kernel: int = 5
    lr_range: tuple[float, float] = (1e-4, 3e-2)
    batch_size: int = 128
    workload: str = "mnist1d"     # or "lm" (see the module docstring; :meth:`language` gives its settings)
    context: int = 64             # lm: bytes a window predicts from
    eval_windows: int = 64        # lm: fixed windows per evaluation split
    num_samples: int = 5000       # MNIST-1D samples generated: 4000 train (the last val_size held out), 1000 test
    val_size: int = 500
    data_seed: int = 0
    noise: float = 0.01           # keeper's symmetry-breaking noise on a transform across architectures
    asha_factor: int = 3          # ASHA draws up to asha_factor x population configs
    margin: float = 0.01          # target = best final test accuracy of the random arm - margin
    device: str = "cpu"           # where bench_search's trials train ("cuda": a share of the GPU each)
    optimizer: str = "adam"       # "adam", or "adamw" (weight decay 0.01)
    schedule: str = "constant"    # "constant", or "cosine" (to zero over ``steps``, as users' recipes run)

    @classmethod
    def language(cls, **overrides: Any) -> "PbtRun":
        """The language workload's settings: widths 32 and 64 (2 and 4 heads of 16 channels, so a width growth
        clones whole heads, exactly), 1-3 layers, learning rates 3e-4 to 1e-2, batches of 8 windows."""
        settings = {"workload": "lm", "widths": (32, 64), "blocks": (1, 2, 3), "lr_range": (3e-4, 1e-2),
                    "batch_size": 8}
        return cls(**{**settings, **overrides})

    @classmethod
    def digits(cls, **overrides: Any) -> "PbtRun":
        """The converging image workload: 2-D ResNets with BatchNorm (stages ``[w, 2w]``, ``b`` blocks each) on
        scikit-learn's 8x8 digits, AdamW under a cosine schedule, 16 draws of 320 steps in rounds of 40; its trials
        reach their plateau well within their budget, so the first trials of a search already hold its best."""
        settings = {"workload": "digits", "widths": (8, 16, 32), "blocks": (1, 2, 3), "kernel": 3,
                    "lr_range": (3e-4, 3e-2), "batch_size": 128, "optimizer": "adamw", "schedule": "cosine",
                    "population": 16, "steps": 320, "round_steps": 40, "val_size": 300}
        return cls(**{**settings, **overrides})

    @property
    def budget(self) -> int:
        return self.population * self.steps

    @property
    def rounds(self) -> int:
        return math.ceil(self.steps / self.round_steps)

    @property
    def middle(self) -> tuple[int, int]:
        """The architecture of the PBT arm: the middle width and depth of the space."""
        return self.widths[len(self.widths) // 2], self.blocks[len(self.blocks) // 2]


def member_spec(run: PbtRun, width: int, blocks: int) -> dict:
    """The workload's spec of width ``width`` and depth ``blocks`` (ValueError for one it cannot build)."""
    if run.workload == "lm":
        from keeper_bench import lm

        if width % 16 or not lm._valid({"family": "gpt2", "d_model": width, "layers": blocks, "heads": width // 16,
                                         "kv_heads": width // 16, "ffn": 4 * width}):
            raise ValueError(f"member_spec: no GPT-2 of width {width} and {blocks} layers in the language space")
        return {"family": "gpt2", "d_model": width, "layers": blocks, "heads": width // 16, "kv_heads": width // 16,
                "ffn": 4 * width}
    from keeper_bench.families import default_spec

    if run.workload == "digits":
        return {**default_spec("resnet", dim=2, input_length=8), "widths": [width, 2 * width],
                "blocks": [blocks] * 2, "kernel": run.kernel}
    if run.workload != "mnist1d":
        raise ValueError(f"member_spec: unknown workload {run.workload!r}; expected 'mnist1d', 'digits' or 'lm'")
    return {**default_spec("resnet"), "widths": [width, 2 * width, 4 * width], "blocks": [blocks] * 3,
            "kernel": run.kernel}


def _build(run: PbtRun, spec: dict) -> tuple[Any, Any]:
    """(the model of ``spec``, drawn from torch's global generator; an example input for tracing it)."""
    if run.workload == "lm":
        from keeper_bench import lm

        return lm.build(spec, run.context), lm.example_input(run.context)
    from keeper_bench.families import build, example_input

    return build(spec), example_input(spec)


def draws(run: PbtRun, seed: int, n: int) -> list[dict]:
    """``n`` random configs (``width``, ``blocks``, ``lr``); the first ``k`` are the same for any ``n >= k``."""
    rng = np.random.default_rng(seed)
    lo, hi = np.log(run.lr_range[0]), np.log(run.lr_range[1])
    out = []
    for _ in range(n):
        w = int(rng.choice(run.widths))
        b = int(rng.choice(run.blocks))
        out.append({"width": w, "blocks": b, "lr": float(np.exp(rng.uniform(lo, hi)))})
    return out


def make_optimizer(run: PbtRun, model: Any, lr: float, done: int = 0) -> tuple[Any, Any]:
    """The workload's optimizer at learning rate ``lr`` and its schedule's scheduler (None for a constant rate),
    positioned ``done`` steps into the run (a resumed member continues its schedule)."""
    import torch

    if run.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=lr)
    if run.schedule != "cosine":
        return opt, None
    total = run.steps
    return opt, torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1.0 + math.cos(math.pi * min(s + done, total) / total)))


def _train_round(run: PbtRun, model: Any, opt: Any, data: dict, steps: int, seed: int,
                 after_step: Any = None) -> float:
    """``steps`` Adam steps on batches drawn (with replacement) by a generator seeded with ``seed``; mean loss.
    ``after_step``: called after every optimizer step (a learning-rate schedule's ``step``)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    model.train()
    total = 0.0
    if run.workload == "lm":
        text = data["train"]
        starts = torch.randint(0, len(text) - run.context - 1, (steps, run.batch_size), generator=gen)
        offsets = torch.arange(run.context + 1)
    else:
        idx = torch.randint(0, len(data["y"]), (steps, run.batch_size), generator=gen)
    for i in range(steps):
        if run.workload == "lm":
            w = text[(starts[i][:, None] + offsets).to(text.device)]  # batches drawn on the CPU, the same anywhere
            logits = model(w[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
        else:
            rows = idx[i].to(data["y"].device)
            loss = torch.nn.functional.cross_entropy(model(data["x"][rows]), data["y"][rows])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if run.workload == "lm":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        if after_step is not None:
            after_step()
        total += loss.item()
    return total / steps


def _accuracy(run: PbtRun, model: Any, data: dict, split: str) -> float:
    """Accuracy on ``split`` ("val" or "test") in eval mode: classification accuracy, or next-token accuracy over
    the split's fixed windows."""
    import torch

    model.eval()
    with torch.no_grad():
        if run.workload != "lm":
            return float((model(data[f"x_{split}"]).argmax(1) == data[f"y_{split}"]).float().mean())
        w = data[f"windows_{split}"]
        return float((model(w[:, :-1]).argmax(-1) == w[:, 1:]).float().mean())


def restarts_parent(warm: Any) -> bool:
    """Whether a warm start restarted its parent: the child is the parent's own architecture (every weight given,
    the function kept whole or shrunk and perturbed). A shrink from a wider parent also gives every weight (score
    1.0) but keeps no function: it is a transfer, not a restart."""
    return bool(warm.parent) and warm.score >= 1.0 and (bool(warm.preserved) or warm.shrink < 1.0)


def _report_round(metrics: dict, model: Any, opt: Any, meta: dict) -> None:
    """``tune.report`` of a round with the member's checkpoint, as :func:`_read_checkpoint` reads it back."""
    import torch
    from ray import tune

    with tempfile.TemporaryDirectory() as d:
        torch.save(model.state_dict(), os.path.join(d, "model.pt"))
        torch.save(opt.state_dict(), os.path.join(d, "optim.pt"))
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(meta, f)
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))


def _read_checkpoint(checkpoint: Any) -> tuple[dict | None, dict | None, dict | None]:
    """(meta, model state_dict, optimizer state) of a member's checkpoint; Nones without one."""
    import torch

    if checkpoint is None:
        return None, None, None
    with checkpoint.as_directory() as d:
        with open(os.path.join(d, "meta.json")) as f:
            meta = json.load(f)
        state = torch.load(os.path.join(d, "model.pt"), weights_only=True)
        optim = torch.load(os.path.join(d, "optim.pt"), weights_only=True)
    return meta, state, optim


def _member(arm: str, run: PbtRun, seed: int, service: dict, data_ref: Any):
    """The trainable of ``arm``: one population member (see the module docstring)."""

    def member(config: dict) -> None:
        import ray
        import torch
        from ray import tune

        from keeper.tune_integration import warm_start

        torch.set_num_threads(1)
        c0, t0 = time.thread_time(), time.perf_counter()
        arch = [int(config["width"]), int(config["blocks"])]
        spec = member_spec(run, *arch)
        torch.manual_seed(seed * 100_003 + int(config["index"]))
        model, example = _build(run, spec)
        meta, state, optim = _read_checkpoint(tune.get_checkpoint())
        trial_id = tune.get_context().get_trial_id()
        info = {"parent": "", "preserved": False, "source_arch": json.dumps(meta["arch"]) if meta else "",
                "exploit": bool(meta and meta["trial"] != trial_id)}
        if arm in KEEPER_ARMS:
            warm = warm_start(model, example, config=service)
            info.update(parent=warm.parent or "", preserved=bool(warm.preserved))
        elif state is not None:  # Tune's PBT: a clone or a resume, always this architecture
            model.load_state_dict(state)
        opt = torch.optim.Adam(model.parameters(), lr=float(config["lr"]))
        if meta is not None and meta["arch"] == arch:
            opt.load_state_dict(optim)
            for group in opt.param_groups:  # the explored learning rate, not the clone's
                group["lr"] = float(config["lr"])
        done = int(meta["steps"]) if meta else 0
        data = ray.get(data_ref)
        setup = {"setup_cpu_s": time.thread_time() - c0, "setup_s": time.perf_counter() - t0}
        while done < run.steps:
            c1 = time.thread_time()
            n = min(run.round_steps, run.steps - done)
            loss = _train_round(run, model, opt, data, n, seed * 1_000_003 + int(config["index"]) * 10_007 + done)
            done += n
            metrics = {"val_accuracy": _accuracy(run, model, data, "val"),
                       "test_accuracy": _accuracy(run, model, data, "test"), "loss": loss,
                       "member_steps": done, "round_steps": n, "width": arch[0], "blocks": arch[1],
                       "round_cpu_s": time.thread_time() - c1, **setup, **info}
            setup = {"setup_cpu_s": 0.0, "setup_s": 0.0}
            info = {**info, "source_arch": "", "exploit": False}  # a restore is reported with its first round
            if arm == "random":  # nothing restores or registers a random-search member: no checkpoint to write
                tune.report(metrics)
                continue
            _report_round(metrics, model, opt, {"arch": arch, "steps": done, "trial": trial_id})
    return member


def _timeline_class():
    from ray.tune import Callback

    class _Timeline(Callback):
        """Every reported round in the order the driver receives it, with the population's steps so far."""

        def __init__(self):
            self.events: list[dict] = []
            self.steps = 0
            self.t0 = time.perf_counter()

        def setup(self, **info) -> None:
            self.t0 = time.perf_counter()

        def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
            self.steps += int(result["round_steps"])
            keys = ("val_accuracy", "test_accuracy", "member_steps", "width", "blocks", "parent", "preserved",
                    "source_arch", "exploit", "round_cpu_s", "setup_cpu_s", "setup_s")
            self.events.append({"population_steps": self.steps, "wall_s": time.perf_counter() - self.t0,
                                "load": os.getloadavg()[0], "trial": trial.trial_id,
                                "lr": float(trial.config["lr"]), **{k: result[k] for k in keys}})

    return _Timeline


def Timeline():
    return _timeline_class()()


def _stopper_class():
    from ray.tune import Stopper

    class _BudgetStopper(Stopper):
        """Stops the whole experiment once the reported rounds have consumed ``budget`` training steps."""

        def __init__(self, budget: int):
            self.budget, self.steps = int(budget), 0

        def __call__(self, trial_id: str, result: dict) -> bool:
            self.steps += int(result.get("round_steps", 0))
            return False

        def stop_all(self) -> bool:
            return self.steps >= self.budget

    return _BudgetStopper


def BudgetStopper(budget: int):
    return _stopper_class()(budget)


def _dataset(run: PbtRun) -> dict:
    """The workload's data as tensors: MNIST-1D's splits, or the corpus's training bytes and fixed validation and
    test windows (the corpus's validation text halved: the first half ranks, the second is the target's)."""
    if run.workload == "lm":
        import torch

        from keeper_bench import lm

        corpus = lm.stdlib_corpus()
        tok = lm.ByteTokenizer()
        held = tok.encode(corpus.validation)
        out = {"train": torch.from_numpy(tok.encode(corpus.train).astype(np.int64))}
        for split, part in (("val", held[:len(held) // 2]), ("test", held[len(held) // 2:])):
            starts = np.linspace(0, len(part) - run.context - 2, run.eval_windows).astype(np.int64)
            out[f"windows_{split}"] = torch.from_numpy(part[starts[:, None] + np.arange(run.context + 1)]
                                                       .astype(np.int64))
        return out
    if run.workload == "digits":
        return _digits(run)
    from keeper_bench.workload import mnist1d_dataset

    d = mnist1d_dataset(seed=run.data_seed, num_samples=run.num_samples)
    cut = len(d.y_train) - run.val_size
    return {"x": d.x_train[:cut], "y": d.y_train[:cut], "x_val": d.x_train[cut:], "y_val": d.y_train[cut:],
            "x_test": d.x_test, "y_test": d.y_test}


def _digits(run: PbtRun) -> dict:
    """scikit-learn's 8x8 digits (shipped with it: nothing downloaded) as ``(N, 1, 8, 8)`` images in [0, 1], split
    by a permutation of ``data_seed``: ``val_size`` for validation, as many for test, the rest for training."""
    import torch
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(run.data_seed).permutation(len(y))
    x = torch.from_numpy((x[order] / 16.0).astype(np.float32)).reshape(-1, 1, 8, 8)
    y = torch.from_numpy(y[order].astype(np.int64))
    v, t = run.val_size, 2 * run.val_size
    return {"x": x[t:], "y": y[t:], "x_val": x[:v], "y_val": y[:v], "x_test": x[v:t], "y_test": y[v:t]}


def _scheduler(arm: str, run: PbtRun) -> Any:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining

    from keeper.tune_integration import KeeperPBT

    if arm == "asha-keeper":
        return ASHAScheduler(time_attr="training_iteration", max_t=run.rounds, grace_period=1, reduction_factor=3)
    common = {"time_attr": "training_iteration", "perturbation_interval": 1, "quantile_fraction": 0.25,
              "synch": True}
    lr = tune.loguniform(*run.lr_range)
    if arm == "pbt":
        return PopulationBasedTraining(hyperparam_mutations={"lr": lr}, **common)
    if arm == "keeper-pbt":
        return KeeperPBT(hyperparam_mutations={"lr": lr, "width": list(run.widths), "blocks": list(run.blocks)},
                         architecture_keys=("width", "blocks"),
                         validate=lambda c: member_spec(run, c["width"], c["blocks"]),
                         base_config=dict(zip(("width", "blocks"), run.middle)), **common)
    return None


def _space(arm: str, run: PbtRun, seed: int) -> tuple[dict, int]:
    """The arm's param space (draw ``index``'s values, looked up by Tune's ``sample_from``) and trial count."""
    from ray import tune

    n = run.population * (run.asha_factor if arm == "asha-keeper" else 1)
    table = draws(run, seed, n)
    if arm == "pbt":
        w, b = run.middle
        table = [{**t, "width": w, "blocks": b} for t in table]
    space = {"index": tune.grid_search(list(range(n)))}
    for key in ("width", "blocks", "lr"):
        space[key] = tune.sample_from(lambda config, key=key: table[config["index"]][key])
    return space, n


def run_arm(arm: str, run: PbtRun, seed: int, workdir: str) -> dict:
    """Run one arm on one seed (Ray must be initialized); returns ``{"events", "wall_s", "trials", "errors"}``.

    A keeper arm starts its own keeper service on an empty zoo under ``workdir`` and shuts it down at the end.
    """
    import ray
    from ray import tune

    from keeper.actors.launcher import shutdown
    from keeper.tune_integration import KeeperCallback
    from keeper_bench.nas import service_config

    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; expected one of {ARMS}")
    service = service_config(arm, seed, workdir, run.noise)
    timeline = Timeline()
    callbacks: list[Any] = [timeline]
    if arm in KEEPER_ARMS:
        callbacks.append(KeeperCallback("val_accuracy", "max", config=service, name_prefix=f"{arm}-s{seed}-"))
    space, n = _space(arm, run, seed)
    scheduler = _scheduler(arm, run)
    stop = BudgetStopper(run.budget) if arm == "asha-keeper" else None
    tuner = tune.Tuner(
        _member(arm, run, seed, service, ray.put(_dataset(run))), param_space=space,
        tune_config=tune.TuneConfig(scheduler=scheduler, metric="val_accuracy" if scheduler else None,
                                    # no max_concurrent_trials: its limiter would keep a population to that
                                    # many members; Ray's num_cpus bounds what runs at once
                                    mode="max" if scheduler else None, reuse_actors=True),
        run_config=tune.RunConfig(name=f"{arm}-s{seed}", storage_path=os.path.join(workdir, "tune"), stop=stop,
                                  callbacks=callbacks, verbose=0))
    t0 = time.perf_counter()
    try:
        grid = tuner.fit()
    finally:
        if arm in KEEPER_ARMS:
            shutdown(service)
    return {"events": timeline.events, "wall_s": time.perf_counter() - t0, "trials": n,
            "errors": [str(e) for e in grid.errors]}
