"""A NAS experiment on MNIST-1D through Ray Tune, run once per arm (cold, keeper, baselines): what the demo and
``scripts/bench_training.py`` measure.

Architectures arrive in a fixed order (a seeded random walk over :mod:`keeper_bench.families`: each family's first
model is sampled, later ones mutate an earlier model by one width, depth or kernel step, as an evolutionary
NAS does). Tune runs them in that order, ``concurrency`` at a time, so a trial can inherit only from trials
that finished before it started. Every arm trains the same architectures from the same initial weights, data
order and schedule; only the warm start differs.

Arms:
    cold: no warm start.
    keeper: ``warm_start`` from the arm's own zoo (accuracy-aware parent choice, keeper's operators).
    keeper-recipe: the same, and the trial multiplies the warm start's learning-rate recipe
        (``WarmResult.recipe``, :mod:`keeper.recipe`) into its schedule, as the README's trainable does.
    keeper-no-accuracy: the same with the highest-similarity parent, accuracy ignored.
    keeper-probe: keeper with a data probe (two training batches, the loss over two SGD steps): the best ranked
        candidates and the cold init are scored and the best kept, cold included.
    published: keeper's parent choice, the published system's operators
        (:func:`keeper_bench.baselines.published_transfer`).
    name-shape: keeper's parent choice, then ``load_state_dict`` of the tensors whose name and shape match.

A bound, not an arm a user could run (``BOUNDS``):
    copy: every trial starts from the final weights of the cold trial of its own architecture and seed (run
        before it in the same work directory) and trains again under the same recipe: more than any parent can
        hand over, so its steps to target are what the recipe allows a warm start at best.
    copy-recipe: the same copy under keeper's recipe for a restart (:mod:`keeper.recipe`).

Budgets: ``NasRun.budgets`` gives each family its own number of steps (the plateau budgets of
``scripts/bench_training.py``: cold runs whose test accuracy improves by less than 1% relative over their last 20%
of steps, checked by :func:`plateau_check`); a family not listed trains ``steps``.

Steps to target: the first evaluated step at which a trial reaches its target accuracy, the accuracy the cold
arm's trial of the same architecture and seed ends with, minus ``margin``; a trial that never reaches it
counts its whole budget.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

import numpy as np

from keeper.recipe import Recipe, recipe_for
from keeper.torch_support import warm_start
from keeper.torch_support.load import load_result

__all__ = ["ARMS", "BOUNDS", "NasRun", "TrialRecord", "arrivals", "copy_bound_start", "run_arm", "steps_to_target",
           "summarize", "service_config", "warm_by_arm", "plateau_check"]

ARMS = ("cold", "keeper", "keeper-recipe", "keeper-no-accuracy", "keeper-probe", "published", "name-shape")
BOUNDS = ("copy", "copy-recipe")


@dataclass(frozen=True)
class NasRun:
    """Training settings shared by every trial of every arm."""

    steps: int = 400             # budget of a family not in ``budgets``
    eval_every: int = 20
    batch_size: int = 128
    lr: float = 3e-3
    num_samples: int = 4000      # MNIST-1D samples generated (80% train)
    data_seed: int = 0
    concurrency: int = 2         # trials at once
    noise: float = 0.01          # keeper's symmetry-breaking noise
    margin: float = 0.01         # target = cold final accuracy - margin
    precise_bn: bool = True      # evaluate with BatchNorm statistics of the current weights (workload.with_precise_bn)
    dynamo: bool = False         # exporter for warm starts (TorchScript is the faster of the two)
    budgets: tuple[tuple[str, int], ...] = ()  # (family, steps): per-family budgets
    eval_at_start: bool = False  # also evaluate at step 0, where a warm start begins (the demo's plot shows it)
    patience: int | None = None  # early stopping (workload.train): evaluations without a gain of min_delta
    min_delta: float = 0.002

    def budget(self, family: str) -> int:
        """Training steps of a trial of ``family``."""
        return dict(self.budgets).get(family, self.steps)


@dataclass
class TrialRecord:
    """One trial's outcome in one arm."""

    index: int
    family: str
    arch: str
    params: int
    parent: str
    score: float
    steps: list[int] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    final_accuracy: float = 0.0
    seconds: float = 0.0
    running_accuracies: list[float] = field(default_factory=list)  # with precise_bn: read with running statistics
    cpu_seconds: float = 0.0     # training and evaluation, CPU time of the trial's thread (torch runs one)
    warm_seconds: float = 0.0    # the warm start, wall time (asking the service, loading the parent, transforming)
    warm_cpu_seconds: float = 0.0  # the warm start, CPU time of the trial's thread (the service's share not counted)
    trial_seconds: float = 0.0   # the trial function from its start to its report, wall time
    trained_steps: int = 0       # steps trained: the budget, or fewer where early stopping (NasRun.patience) ended it
    kept_step: int = -1          # the evaluated step whose weights the trial ended with (-1: its last evaluation)

    def read_with_running_statistics(self) -> "TrialRecord":
        """This trial as the model's running BatchNorm statistics read it (itself when nothing else was read)."""
        if not self.running_accuracies:
            return self
        kept = self.steps.index(self.kept_step) if self.kept_step in self.steps else -1
        return replace(self, accuracies=list(self.running_accuracies), final_accuracy=self.running_accuracies[kept],
                       running_accuracies=[])


def arch_label(spec: dict) -> str:
    """A short readable description of a spec (family and its shape keys)."""
    keys = {"resnet": ("widths", "blocks", "kernel"), "vgg": ("widths", "depths", "kernel"),
            "mobilenetv2": ("widths", "blocks", "expansion", "kernel"), "mlp": ("widths",),
            "transformer": ("d_model", "layers", "ffn")}[spec["family"]]
    parts = []
    for k in keys:
        v = spec[k]
        parts.append(f"{k[0]}{'x'.join(map(str, v)) if isinstance(v, list) else v}")
    return f"{spec['family']}:{'/'.join(parts)}"


def arrivals(n: int, seed: int = 0, families: tuple[str, ...] = ("vgg", "resnet", "mlp", "transformer")) -> list[dict]:
    """``n`` distinct architectures in arrival order, families interleaved (see the module docstring)."""
    from keeper_bench.families import neighbours, sample_spec

    rng = np.random.default_rng(seed)
    seen: set[str] = set()
    out: list[dict] = []
    by_family: dict[str, list[dict]] = {f: [] for f in families}
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 100 * n:
            raise RuntimeError(f"arrivals: found only {len(out)} distinct architectures of {n}")
        family = families[len(out) % len(families)]
        pool = by_family[family]
        if not pool:
            spec = sample_spec(rng, family)
        else:
            options = neighbours(pool[int(rng.integers(len(pool)))], rng)
            if not options:
                continue
            spec = options[int(rng.integers(len(options)))]
        key = json.dumps(spec, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        pool.append(spec)
        out.append(spec)
    return out


def service_config(arm: str, seed: int, workdir: str, noise: float) -> dict:
    """The keeper service settings of one arm and seed: its own zoo under ``workdir``, its own namespace."""
    return {"zoo": os.path.join(workdir, f"zoo-{arm}-s{seed}"), "namespace": f"nas-{arm}-s{seed}-{uuid.uuid4().hex[:6]}",
            "matchers": 1, "noise": noise, "seed": seed,
            "selection": {"accuracy_aware": arm != "keeper-no-accuracy"}}


def _choose(model: Any, example: Any, service: dict, dynamo: bool) -> tuple[Any, Any]:
    """The model's architecture and the service's parent choice for it, with the trial's architecture template saved
    and a hit counted for the chosen parent, as ``warm_start`` does; the module is not changed. For the arms that
    transfer weights their own way (the baselines)."""
    from keeper.torch_support import trial
    from keeper.torch_support.export import export_graph
    from keeper.torch_support.inputs import example_for
    from keeper.torch_support.start import parent_source
    from keeper.torch_support.templates import architecture_template

    source = parent_source(None, service)
    exported = export_graph(model, example_for(model, example), dynamo=dynamo)
    choice = source.choose(exported.graph)
    state = model.state_dict()
    trial.save_architecture(architecture_template(exported, state), state, choice.uri)
    if choice.parent is not None:
        source.hit(choice.parent)
    return exported, choice


def warm_by_arm(arm: str, model: Any, example: Any, service: dict, dynamo: bool, states: str, seed: int,
                total_steps: int = 1, probe_data: Any = None) -> dict:
    """Warm ``model`` the arm's way (in a Tune trial; ``states``: where the name-shape arm finds its parents'
    state_dicts; ``probe_data``: the training data keeper-probe draws its probe's batches from); returns
    ``{"parent", "score"}``, and for keeper-recipe ``"recipe"``: the warm start's learning-rate recipe over
    ``total_steps`` (:meth:`keeper.recipe.Recipe.as_dict`)."""
    if arm in ("keeper", "keeper-recipe", "keeper-no-accuracy", "keeper-probe"):
        probe = None
        if arm == "keeper-probe":
            import torch

            from keeper.torch_support import DataProbe

            x, y = probe_data.x_train, probe_data.y_train  # two training batches: the start of a learning curve
            probe = DataProbe([(x[k * 128:(k + 1) * 128], y[k * 128:(k + 1) * 128]) for k in range(2)],
                              torch.nn.CrossEntropyLoss(), steps=2)
        r = warm_start(model, example, config={**service, "dynamo": dynamo}, probe=probe)
        info = {"parent": r.parent or "", "score": float(r.score)}
        if arm == "keeper-recipe":
            info["recipe"] = r.recipe(total_steps).as_dict()
        return info
    exported, choice = _choose(model, example, service, dynamo)
    parent = choice.parent
    if parent is None:
        return {"parent": "", "score": 0.0}
    if arm == "published":
        from keeper.torch_support import module_weights
        from keeper_bench.baselines import published_warm_from_store

        r = published_warm_from_store(choice.uri, parent, exported.onnx,
                                      child_weights=module_weights(model, exported), seed=seed)
        load_result(model, r, exported.keys)
        return {"parent": parent, "score": float(r.score)}
    if arm == "name-shape":
        import torch

        from keeper_bench.baselines import name_shape_load

        name_shape_load(model, torch.load(os.path.join(states, f"{parent}.pt"), weights_only=True))
        return {"parent": parent, "score": float(choice.score)}
    raise ValueError(f"unknown arm {arm!r}; expected one of {ARMS}")


def _trainable(arm: str, specs: list[dict], run: NasRun, service: dict, states: str, prefix: str, seed: int,
               data_ref: Any):
    def trial(config: dict) -> None:
        import ray
        import torch
        from ray import tune

        from keeper_bench.families import build, example_input
        from keeper_bench.workload import train

        torch.set_num_threads(1)  # ``concurrency`` trials share as many cores: more threads would only contend
        t_trial = time.perf_counter()
        i = int(config["index"])
        spec = specs[i]
        torch.manual_seed(seed * 100_003 + i)  # the same initial weights in every arm
        model = build(spec)
        info: dict[str, Any] = {"parent": "", "score": 0.0}
        budget = run.budget(spec["family"])
        data = ray.get(data_ref)  # generated once by the driver; shared read-only through the object store
        t_warm, c_warm = time.perf_counter(), time.thread_time()
        if arm in BOUNDS:
            info = copy_bound_start(arm, model, states, seed, i, budget)
        elif arm != "cold":
            info = warm_by_arm(arm, model, example_input(spec), service, run.dynamo, states, seed, budget,
                               probe_data=data)
        info.update(warm_seconds=time.perf_counter() - t_warm, warm_cpu_seconds=time.thread_time() - c_warm)
        recipe = info.pop("recipe", None)

        def report(r: dict) -> None:  # each evaluation but the last, which the final report below carries
            if not r["last"]:
                tune.report({"accuracy": r["accuracy"], "index": i, "step": r["step"]})

        h = train(model, data, steps=budget, eval_every=run.eval_every, batch_size=run.batch_size, lr=run.lr,
                  seed=seed * 7_919 + i, precise_bn=run.precise_bn, eval_at_start=run.eval_at_start,
                  lr_factor=Recipe(**recipe).factor if recipe else None, report=report, patience=run.patience,
                  min_delta=run.min_delta)
        history = json.dumps([h.steps, h.accuracies, h.running_accuracies])
        metrics = {"accuracy": h.final_accuracy, "index": i, "history": history, "seconds": h.seconds,
                   "cpu_seconds": h.cpu_seconds, "trained_steps": h.steps[-1], "kept_step": h.kept_step, **info}
        if arm in ("cold",) + BOUNDS:  # nothing registers these models: no checkpoint to write and copy
            if arm == "cold":  # the copy bound's start
                torch.save(model.state_dict(), os.path.join(states, f"{i}.pt"))
            tune.report({**metrics, "trial_seconds": time.perf_counter() - t_trial})
            return
        with tempfile.TemporaryDirectory() as d:
            torch.save(model.state_dict(), os.path.join(d, "model.pt"))
            if arm == "name-shape":  # later trials of this arm load parents by name
                torch.save(model.state_dict(), os.path.join(states, f"{prefix}{tune.get_context().get_trial_id()}.pt"))
            tune.report({**metrics, "trial_seconds": time.perf_counter() - t_trial},
                        checkpoint=tune.Checkpoint.from_directory(d))
    return trial


def copy_bound_start(arm: str, model: Any, states: str, seed: int, index: int, budget: int,
                     prefix: str = "") -> dict:
    """Load into ``model`` the final weights the cold arm of ``seed`` left for trial ``index`` (in
    ``{prefix}states-cold-s{seed}`` beside ``states``, the bound's own directory; ``prefix``: the benchmark's, "lm-"
    for the language models); returns the trial's ``{"parent", "score"}``, and for copy-recipe the recipe of a
    restart over ``budget`` steps."""
    import torch

    path = os.path.join(os.path.dirname(states), f"{prefix}states-cold-s{seed}", f"{index}.pt")
    if not os.path.exists(path):
        raise FileNotFoundError(f"copy bound, seed {seed}, trial {index}: no cold-trained weights at {path}; run the "
                                f"cold arm of seed {seed} first in the same work directory")
    model.load_state_dict(torch.load(path, weights_only=True))
    info: dict[str, Any] = {"parent": f"cold-s{seed}-{index}", "score": 1.0}
    if arm == "copy-recipe":
        info["recipe"] = recipe_for(info["parent"], 1.0, True, budget).as_dict()
    return info


_datasets: dict[tuple[int, int], Any] = {}


def _dataset(run: NasRun) -> Any:
    """An object reference to the run's MNIST-1D dataset (generated once per driver and Ray session)."""
    import ray

    from keeper_bench.workload import mnist1d_dataset

    key = (run.data_seed, run.num_samples)
    if key not in _datasets:
        _datasets[key] = ray.put(mnist1d_dataset(seed=run.data_seed, num_samples=run.num_samples))
    return _datasets[key]


def run_arm(arm: str, specs: list[dict], run: NasRun, workdir: str, seed: int = 0,
            progress: Callable[[str, TrialRecord], None] | None = None,
            timeline: list | None = None) -> list[TrialRecord]:
    """Train ``specs`` in order through Ray Tune for one arm; returns one record per spec, in spec order.

    Ray must be initialized. An arm other than cold and copy starts its own keeper service on an empty zoo under
    ``workdir`` and shuts it down at the end; the cold arm leaves its trials' final weights there for the copy
    bound (:data:`BOUNDS`), which must run after the cold arm of its seed in the same ``workdir``.
    """
    from ray import tune

    from keeper.actors.launcher import shutdown
    from keeper_bench.families import num_params
    from keeper.tune_integration import KeeperCallback

    if arm not in ARMS + BOUNDS:
        raise ValueError(f"unknown arm {arm!r}; expected one of {ARMS + BOUNDS}")
    keeper_arm = arm not in ("cold",) + BOUNDS  # an arm with a keeper service and a zoo
    service = service_config(arm, seed, workdir, run.noise)
    states = os.path.join(workdir, f"states-{arm}-s{seed}")
    os.makedirs(states, exist_ok=True)
    prefix = f"{arm}-s{seed}-"
    callbacks: list[Any] = []
    if keeper_arm:
        callbacks.append(KeeperCallback("accuracy", "max", config=service, name_prefix=prefix))
    if progress is not None or timeline is not None:
        callbacks.append(_Progress(arm, specs, progress, timeline))
    tuner = tune.Tuner(
        _trainable(arm, specs, run, service, states, prefix, seed, _dataset(run)),
        param_space={"index": tune.grid_search(list(range(len(specs))))},
        # reused trial processes skip the imports (seconds each) between trials
        tune_config=tune.TuneConfig(max_concurrent_trials=run.concurrency, reuse_actors=True),
        run_config=tune.RunConfig(name=f"{arm}-s{seed}", storage_path=os.path.join(workdir, "tune"), callbacks=callbacks,
                                  verbose=0))
    try:
        grid = tuner.fit()
    finally:
        if keeper_arm:
            shutdown(service)
    if grid.errors:
        raise RuntimeError(f"{arm}: {len(grid.errors)} trials failed; first: {grid.errors[0]}")
    out: list[TrialRecord | None] = [None] * len(specs)
    for r in grid:
        out[int(r.metrics["index"])] = _record(specs, r.metrics, num_params)
    return [r for r in out if r is not None]


def _record(specs: list[dict], m: dict, num_params: Callable[[dict], int]) -> TrialRecord:
    i = int(m["index"])
    steps, accs, running = json.loads(m["history"])
    return TrialRecord(i, specs[i]["family"], arch_label(specs[i]), num_params(specs[i]), m["parent"],
                       float(m["score"]), steps, accs, float(m["accuracy"]), float(m["seconds"]), running,
                       float(m.get("cpu_seconds", 0.0)), float(m.get("warm_seconds", 0.0)),
                       float(m.get("warm_cpu_seconds", 0.0)), float(m.get("trial_seconds", 0.0)),
                       int(m.get("trained_steps", steps[-1] if steps else 0)), int(m.get("kept_step", -1)))


def _progress_class():
    from ray.tune import Callback

    class Progress(Callback):
        """Each finished trial's record to ``fn``; every report's (seconds since the search started, accuracy) to
        ``timeline``: when the search first held a model of a given quality."""

        def __init__(self, arm: str, specs: list[dict], fn: Callable[[str, TrialRecord], None] | None,
                     timeline: list | None):
            self.arm, self.specs, self.fn, self.timeline = arm, specs, fn, timeline
            self.t0 = time.perf_counter()

        def setup(self, **info):
            self.t0 = time.perf_counter()

        def on_trial_result(self, iteration, trials, trial, result, **info):
            from keeper_bench.families import num_params

            if self.timeline is not None and "accuracy" in result:
                self.timeline.append((time.perf_counter() - self.t0, float(result["accuracy"])))
            if "history" in result and self.fn is not None:
                self.fn(self.arm, _record(self.specs, result, num_params))

    return Progress


def _Progress(arm, specs, fn, timeline=None):  # noqa: N802 - a factory that reads like the class it makes
    return _progress_class()(arm, specs, fn, timeline)


def steps_to_target(record: TrialRecord, target: float, budget: int, every: int | None = None) -> tuple[int, bool]:
    """(first evaluated step with accuracy >= target, reached?) ; (budget, False) when never reached.

    ``every``: consider only the evaluations at multiples of ``every`` steps (and the last one), which reads a
    run evaluated more often as if it had been evaluated on that coarser grid."""
    last = record.steps[-1] if record.steps else None
    for s, a in zip(record.steps, record.accuracies):
        if every and s % every and s != last:
            continue
        if a >= target:
            return int(s), True
    return int(budget), False


def summarize(cold: list[TrialRecord], arm: list[TrialRecord], run: NasRun, every: int | None = None,
              running_statistics: bool = False) -> dict:
    """Totals of one arm against cold over the same architectures (same order); ``every`` as in
    :func:`steps_to_target`, for both arms; ``running_statistics``: read both arms' evaluations as the models'
    running BatchNorm statistics saw them (:meth:`TrialRecord.read_with_running_statistics`).

    ``slow``: the warmed trials that needed more than 1.25x the cold trial's steps to target, as
    ``[index, cold steps, arm steps]``."""
    if running_statistics:
        cold = [c.read_with_running_statistics() for c in cold]
        arm = [a.read_with_running_statistics() for a in arm]
    cold_steps, arm_steps, reached, per_trial, slow = [], [], 0, [], []
    for c, a in zip(cold, arm):
        target = c.final_accuracy - run.margin
        budget = run.budget(c.family)
        cs, _ = steps_to_target(c, target, budget, every)
        ws, ok = steps_to_target(a, target, budget, every)
        cold_steps.append(cs)
        arm_steps.append(ws)
        reached += ok
        per_trial.append(cs / max(ws, 1))  # 0 steps: at target from the warm start itself (eval_at_start)
        if a.parent and ws > 1.25 * cs:
            slow.append([a.index, cs, ws])
    total_cold, total_arm = float(sum(cold_steps)), float(max(sum(arm_steps), 1))
    # the trials that had a parent: what a warm start does once the zoo can serve the architecture
    warm_idx = [i for i, a in enumerate(arm) if a.parent]
    warmed_speedup = (sum(cold_steps[i] for i in warm_idx) / max(sum(arm_steps[i] for i in warm_idx), 1)
                      if warm_idx else 1.0)
    return {"speedup": total_cold / total_arm, "saved": 1.0 - total_arm / total_cold,
            "warmed_speedup": warmed_speedup,
            "cold_steps": cold_steps, "arm_steps": arm_steps, "per_trial_speedup": per_trial,
            "reached": reached, "trials": len(arm), "slow": slow,
            "accuracy_delta": float(np.mean([a.final_accuracy - c.final_accuracy for c, a in zip(cold, arm)])),
            "final_accuracy": float(np.mean([a.final_accuracy for a in arm])),
            "warmed": sum(1 for a in arm if a.parent)}


def plateau_check(cold: list[TrialRecord], running_statistics: bool = True, tail: float = 0.2,
                  threshold: float = 0.01) -> dict:
    """Per family: every cold trial's relative test-accuracy gain over its last ``tail`` of steps
    (:func:`keeper_bench.plateau.tail_gain`), read with the running BatchNorm statistics unless told otherwise,
    and how many are under ``threshold`` (at their plateau)."""
    from keeper_bench.plateau import tail_gain

    out: dict[str, dict] = {}
    for fam in sorted({r.family for r in cold}):
        recs = [r.read_with_running_statistics() if running_statistics else r for r in cold if r.family == fam]
        gains = [tail_gain(r.steps, r.accuracies, tail, lower_is_better=False) for r in recs]
        out[fam] = {"gains": gains, "at_plateau": sum(g < threshold for g in gains), "trials": len(gains),
                    "max_gain": max(gains), "median_gain": float(np.median(gains))}
    return out


def records_to_json(records: list[TrialRecord]) -> list[dict]:
    return [asdict(r) for r in records]
