"""A whole hyperparameter search with and without keeper, under the schedulers people run: what
``scripts/bench_search.py`` measures.

The search space is :class:`keeper_bench.pbt.PbtRun`'s (a width, a depth and a log-uniform learning rate; MNIST-1D
ResNets or byte-level GPT-2s) and the trainable is one function for every arm: it builds draw ``i``'s model from
draw ``i``'s seed, trains it in rounds of ``round_steps`` Adam steps, evaluates it after each round in eval mode
(validation: what the schedulers rank by; test: what the target reads) and reports with a checkpoint (model,
optimizer, architecture). The keeper arms differ from their cold twins by exactly what a user adds:
``KeeperCallback`` in the run config and one ``warm_start`` line, whose result the trainable follows through
``warm_lr`` (the recipe keeper ships).

Arms (:data:`ARMS`), each at the same budget of ``population x steps`` training steps:
    fifo, fifo+keeper: ``population`` draws, each trained for ``steps``, two at a time.
    fifo+keeper-shrink: fifo+keeper with ``warm_start(shrink=SHRINK_ARM)``: a same-architecture parent gives
        half its weights (shrink and perturb), the remedy for warmed trials that end below their cold twins.
    asha, asha+keeper: ASHA (grace one round, reduction factor 3, at most ``steps``) over up to
        ``asha_factor x population`` draws, stopped once the budget is spent.
    asha+copy: the copy bound under ASHA: each draw the cold FIFO arm trained starts from its own final weights
        there (under keeper's restart recipe), the others cold; what an ideal warm start could give this search.
    pbt, pbt+keeper: a population of ``population`` draws, synchronous, a perturbation every
        ``pbt_interval`` rounds, quantile 0.25: Tune's ``PopulationBasedTraining`` over the learning rate (an
        exploit takes the clone's whole config, architecture included, as Tune's PBT does), without and with
        keeper (``KeeperCallback`` and the ``warm_start`` line, which also restores the clone).
    keeperasha: asha+keeper under :class:`keeper_bench.asha.KeeperASHA` (warmed trials compared with warmed
        ones, cold with cold) instead of Tune's ASHA.
    keeperpbt: :class:`keeper.tune_integration.KeeperPBT` over the learning rate, the width and the depth (members
        keep their own, mutated architectures): another search than pbt's, reported beside it.

Draw ``i`` (architecture, learning rate, initial weights, data order) is the same in every arm that runs it. The
driver-side :class:`Lifecycle` callback records when each trial started, reported and ended, so the report can
say where a search's wall time went (waiting for a trial to start, a trial's own start, training).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from typing import Any

import numpy as np

from keeper_bench.pbt import (PbtRun, _accuracy, _build, _dataset, _read_checkpoint, _report_round, _train_round,
                              draws, make_optimizer, member_spec, restarts_parent)

__all__ = ["ARMS", "Lifecycle", "best_model", "best_models", "best_test", "cost_line", "keeper_actor_cpu", "run_arm", "scheduler_of", "start_gaps",
           "summarize", "target_of", "twins", "uses_keeper", "wall_to_target"]

ARMS = ("fifo", "fifo+keeper", "fifo+keeper-shrink", "asha", "asha+keeper", "keeperasha", "asha+copy", "pbt",
        "pbt+keeper", "keeperpbt")
#: warm_start's shrink in the arms named ``...-shrink`` (the others take keeper's default)
SHRINK_ARM = 0.5


def scheduler_of(arm: str) -> str:
    """``"fifo"``, ``"asha"`` or ``"pbt"``."""
    return {"keeperpbt": "pbt", "keeperasha": "asha"}.get(arm, arm.split("+")[0])


def uses_keeper(arm: str) -> bool:
    return "+keeper" in arm or arm in ("keeperpbt", "keeperasha")


def _copy_path(workdir: str, run: PbtRun, seed: int, index: int) -> str:
    """Where the cold FIFO arm leaves draw ``index``'s final weights, from which the copy arm restarts it."""
    return os.path.join(workdir, "copies", f"{run.workload}-s{seed}", f"draw{index}.pt")


def _member(arm: str, run: PbtRun, seed: int, service: dict, data_ref: Any, shrink: float | None = None,
            ramp: float | None = None, workdir: str = ""):
    """The trainable of ``arm`` (see the module docstring); ``shrink``: ``warm_start``'s, ``ramp``: ``warm_lr``'s
    (None: keeper's defaults)."""
    keeper = uses_keeper(arm)
    if arm.endswith("-shrink"):
        shrink = SHRINK_ARM

    def member(config: dict) -> None:
        entered = time.time()
        import ray
        import torch
        from ray import tune

        torch.set_num_threads(1)
        arch = [int(config["width"]), int(config["blocks"])]
        torch.manual_seed(seed * 100_003 + int(config["index"]))
        model, example = _build(run, member_spec(run, *arch))
        model, example = model.to(run.device), example.to(run.device)
        checkpoint = tune.get_checkpoint()
        meta, state, optim = _read_checkpoint(checkpoint)
        trial_id = tune.get_context().get_trial_id()
        info = {"parent": "", "preserved": False, "same_arch": False, "reason": "", "shrink": 1.0,
                "source_arch": json.dumps(meta["arch"]) if meta else "",
                "exploit": bool(meta and meta["trial"] != trial_id)}
        opt, sched = make_optimizer(run, model, float(config["lr"]), int(meta["steps"]) if meta else 0)
        factor = None
        warm_s, phases = 0.0, {}
        if keeper:
            from keeper.tune_integration import warm_lr, warm_start

            t = time.perf_counter()
            warm = warm_start(model, example, config=service, **({} if shrink is None else {"shrink": shrink}))
            warm_s, phases = time.perf_counter() - t, dict(warm.seconds)
            if meta is None or meta["arch"] != arch:  # a resume keeps its optimizer state: no restart ramp
                factor = warm_lr(opt, warm, total_steps=run.steps, scheduler=sched, ramp=ramp)
            info.update(parent=warm.parent or "", preserved=bool(warm.preserved), reason=warm.reason or "",
                        same_arch=restarts_parent(warm), shrink=warm.shrink)

        elif state is not None:  # Tune's PBT: a clone or a resume; the config is the checkpoint's architecture
            model.load_state_dict(state)
        elif arm == "asha+copy" and os.path.exists(_copy_path(workdir, run, seed, int(config["index"]))):
            from keeper.recipe import recipe_for
            from keeper.torch_support.schedule import WarmLR

            model.load_state_dict(torch.load(_copy_path(workdir, run, seed, int(config["index"])), weights_only=True))
            factor = WarmLR(opt, recipe_for("copy", 1.0, True, run.steps, ramp), sched)
            info.update(parent="copy", preserved=True, same_arch=True)
        if meta is not None and meta["arch"] == arch:
            opt.load_state_dict(optim)
            for group in opt.param_groups:  # the explored learning rate, not the clone's
                group["lr"] = float(config["lr"])
        done = int(meta["steps"]) if meta else 0
        if factor is None and sched is not None:
            factor = sched
        data = {k: v.to(run.device) for k, v in ray.get(data_ref).items()}
        start = {"entered": entered, "ready": time.time(), "warm_s": warm_s, "warm_phases": json.dumps(phases)}
        while done < run.steps:
            c1 = time.thread_time()
            n = min(run.round_steps, run.steps - done)
            loss = _train_round(run, model, opt, data, n, seed * 1_000_003 + int(config["index"]) * 10_007 + done,
                                after_step=factor.step if factor is not None else None)
            done += n
            metrics = {"val_accuracy": _accuracy(run, model, data, "val"),
                       "test_accuracy": _accuracy(run, model, data, "test"), "loss": loss,
                       "member_steps": done, "round_steps": n, "width": arch[0], "blocks": arch[1],
                       "round_cpu_s": time.thread_time() - c1, "reported": time.time(), **start, **info}
            start = {"entered": 0.0, "ready": 0.0, "warm_s": 0.0, "warm_phases": "{}"}
            info = {**info, "source_arch": "", "exploit": False}
            _report_round(metrics, model, opt, {"arch": arch, "steps": done, "trial": trial_id})
        if arm == "fifo":  # the copy arm's starts
            path = _copy_path(workdir, run, seed, int(config["index"]))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            torch.save(model.state_dict(), path + ".tmp")
            os.replace(path + ".tmp", path)
    return member


def _lifecycle_class():
    from ray.tune import Callback

    class _Lifecycle(Callback):
        """Every trial's start, reports and end as the driver sees them (wall seconds from the run's start), with
        the budget consumed so far."""

        def __init__(self):
            self.events: list[dict] = []
            self.trials: dict[str, dict] = {}
            self.steps = 0
            self.t0 = time.time()

        def setup(self, **info) -> None:
            self.t0 = time.time()

        def _trial(self, trial: Any) -> dict:
            return self.trials.setdefault(trial.trial_id, {"starts": [], "ends": [], "index": trial.config["index"],
                                                            "lr": float(trial.config["lr"])})

        def on_trial_start(self, iteration, trials, trial, **info) -> None:
            self._trial(trial)["starts"].append(time.time() - self.t0)

        def on_trial_restore(self, iteration, trials, trial, **info) -> None:
            self._trial(trial)["starts"].append(time.time() - self.t0)

        def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
            self.steps += int(result["round_steps"])
            keys = ("val_accuracy", "test_accuracy", "member_steps", "width", "blocks", "parent", "preserved",
                    "same_arch", "shrink", "reason", "source_arch", "exploit", "round_cpu_s", "warm_s", "warm_phases")
            event = {"population_steps": self.steps, "wall_s": time.time() - self.t0, "load": os.getloadavg()[0],
                     "trial": trial.trial_id, "lr": float(trial.config["lr"]), **{k: result[k] for k in keys}}
            for key in ("entered", "ready", "reported"):  # the trial's clock, as seconds of the run
                event[key] = result[key] - self.t0 if result[key] else None
            self.events.append(event)

        def on_trial_complete(self, iteration, trials, trial, **info) -> None:
            self._trial(trial)["ends"].append(time.time() - self.t0)

        def on_trial_error(self, iteration, trials, trial, **info) -> None:
            self._trial(trial)["ends"].append(time.time() - self.t0)
            self._trial(trial)["error"] = True

    return _Lifecycle


def Lifecycle():  # noqa: N802 - reads like the class it makes (Tune imported lazily)
    return _lifecycle_class()()


def _scheduler(arm: str, run: PbtRun, pbt_interval: int) -> Any:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining

    from keeper.tune_integration import KeeperPBT
    from keeper_bench.asha import KeeperASHA

    kind = scheduler_of(arm)
    if kind == "asha":
        return (KeeperASHA if arm == "keeperasha" else ASHAScheduler)(time_attr="training_iteration", max_t=run.rounds, grace_period=1, reduction_factor=3)
    if kind != "pbt":
        return None
    common = {"time_attr": "training_iteration", "perturbation_interval": pbt_interval, "quantile_fraction": 0.25,
              "synch": True}
    lr = tune.loguniform(*run.lr_range)
    if arm != "keeperpbt":
        return PopulationBasedTraining(hyperparam_mutations={"lr": lr}, **common)
    return KeeperPBT(hyperparam_mutations={"lr": lr, "width": list(run.widths), "blocks": list(run.blocks)},
                     architecture_keys=("width", "blocks"),
                     validate=lambda c: member_spec(run, c["width"], c["blocks"]),
                     base_config=dict(zip(("width", "blocks"), run.middle)), **common)


def _space(arm: str, run: PbtRun, seed: int) -> tuple[dict, int]:
    """The arm's param space (draw ``index``'s values, looked up by Tune's ``sample_from``) and trial count."""
    from ray import tune

    n = run.population * (run.asha_factor if scheduler_of(arm) == "asha" else 1)
    table = draws(run, seed, n)
    space = {"index": tune.grid_search(list(range(n)))}
    for key in ("width", "blocks", "lr"):
        space[key] = tune.sample_from(lambda config, key=key: table[config["index"]][key])
    return space, n


def run_arm(arm: str, run: PbtRun, seed: int, workdir: str, *, pbt_interval: int = 2,
            callback_options: dict | None = None, shrink: float | None = None, ramp: float | None = None) -> dict:
    """Run one arm on one seed (Ray must be initialized); returns ``{"events", "trials", "wall_s", "n", "errors",
    "callback"}``. A keeper arm starts its own keeper service on an empty zoo under ``workdir`` (its start counted
    in the arm's wall time, as a user's first search pays it) and shuts it down at the end."""
    import ray
    from ray import tune

    from keeper.actors.launcher import shutdown
    from keeper_bench.pbt import BudgetStopper

    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; expected one of {ARMS}")
    if arm == "asha+copy" and not os.path.isdir(os.path.dirname(_copy_path(workdir, run, seed, 0))):
        raise ValueError(f"the copy arm restarts the cold FIFO arm's final weights: run 'fifo' for seed {seed} "
                         f"with the same workdir ({workdir}) first")
    # keeper's shipped defaults (configs/default.yaml) but for the zoo's place, a namespace and the noise seed
    name = f"{run.workload}-{arm.replace('+', '-')}"
    service = {"zoo": os.path.join(workdir, f"zoo-{name}-s{seed}"), "namespace": f"search-{name}-s{seed}-"
               f"{uuid.uuid4().hex[:6]}", "seed": seed}
    shutil.rmtree(service["zoo"], ignore_errors=True)  # every arm run starts on an empty zoo
    lifecycle = Lifecycle()
    callbacks: list[Any] = [lifecycle]
    keeper_cb = None
    if uses_keeper(arm):
        from keeper.tune_integration import KeeperCallback

        keeper_cb = KeeperCallback("val_accuracy", "max", config=service,
                                   name_prefix=f"{arm.replace('+', '-')}-s{seed}-", **(callback_options or {}))
        callbacks.append(keeper_cb)
    space, n = _space(arm, run, seed)
    scheduler = _scheduler(arm, run, pbt_interval)
    stop = BudgetStopper(run.budget) if scheduler_of(arm) == "asha" else None
    member = _member(arm, run, seed, service, ray.put(_dataset(run)), shrink, ramp, workdir)
    if run.device == "cuda":  # two trials at a time, as on the CPU: half the GPU each
        member = tune.with_resources(member, {"cpu": 1, "gpu": 0.5})
    tuner = tune.Tuner(
        member, param_space=space,
        tune_config=tune.TuneConfig(scheduler=scheduler, metric="val_accuracy" if scheduler else None,
                                    mode="max" if scheduler else None, reuse_actors=True),
        run_config=tune.RunConfig(name=f"{run.workload}-{arm.replace('+', '-')}-s{seed}-{uuid.uuid4().hex[:6]}",
                                  storage_path=os.path.join(workdir, "tune"),
                                  stop=stop, callbacks=callbacks, verbose=0))
    t0 = time.perf_counter()
    actor_cpu: dict[str, float] = {}
    try:
        grid = tuner.fit()
    finally:
        if uses_keeper(arm):
            actor_cpu = keeper_actor_cpu()  # before the actors go: their CPU over the whole search
            shutdown(service)
    out = {"events": lifecycle.events, "trials": lifecycle.trials, "wall_s": time.perf_counter() - t0, "n": n,
           "errors": [str(e) for e in grid.errors], "actor_cpu": actor_cpu}
    if keeper_cb is not None:
        out["callback"] = {"outcomes": dict(keeper_cb.outcomes), "registration_s": dict(keeper_cb.registration_s),
                           "registration_cpu_s": dict(keeper_cb.registration_cpu_s), "hook_s": keeper_cb.hook_s}
    return out


#: Process titles of keeper's actors (Ray names an actor's process ``ray::<Class>``).
KEEPER_ACTORS = ("FrontDoor", "ZooManager", "Matcher")


def keeper_actor_cpu() -> dict[str, float]:
    """CPU seconds used so far by the processes of keeper's actors, per actor class: those of the local Ray this
    process started (its raylet is this process's child, the actors' workers the raylet's)."""
    import psutil

    me = os.getpid()
    out = {name: 0.0 for name in KEEPER_ACTORS}
    for proc in psutil.process_iter(["cmdline"]):
        try:
            title = " ".join(proc.info["cmdline"] or [])
            if not title.startswith("ray::") or me not in {p.pid for p in proc.parents()}:
                continue
            for name in KEEPER_ACTORS:
                if title.startswith(f"ray::{name}"):
                    t = proc.cpu_times()
                    out[name] += t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def final_by_trial(events: list[dict]) -> dict[str, dict]:
    """Each trial's last reported round."""
    last: dict[str, dict] = {}
    for e in events:
        last[e["trial"]] = e
    return last


def best_models(events: list[dict]) -> list[dict]:
    """The models the search may end with: the last rounds of every trial tied at the best validation accuracy (a
    validation split of a few hundred examples often cannot tell the best trials apart; the search's pick among
    them is arbitrary)."""
    finals = list(final_by_trial(events).values())
    top = max(e["val_accuracy"] for e in finals)
    return [e for e in finals if e["val_accuracy"] == top]


def best_model(events: list[dict]) -> dict:
    """The model the search ends with: the trial whose last round has the best validation accuracy (of tied ones,
    the first to start)."""
    return best_models(events)[0]


def best_test(events: list[dict]) -> float:
    """The test accuracy of the search's final pick, in expectation over the tied trials it might pick: their mean
    (a pick by trial order would let one example of validation decide the figure)."""
    tied = best_models(events)
    return sum(e["test_accuracy"] for e in tied) / len(tied)


def target_of(events: list[dict]) -> float:
    """The benchmark's target for a search against this cold run: its best model's test accuracy less 1% of it."""
    return 0.99 * best_test(events)


def wall_to_target(summary: dict) -> float:
    """A :func:`summarize` row's wall seconds to its target; a search that never reached it counts its whole
    wall time."""
    return summary["wall_to_target_s"] if summary["reached"] else summary["wall_s"]


def start_gaps(trials: dict[str, dict], concurrency: int = 2) -> list[float]:
    """For every trial start after the first ``concurrency``: seconds since the latest trial end before it (how
    long a freed slot stood empty on the driver's clock)."""
    starts = sorted(s for t in trials.values() for s in t["starts"])
    ends = sorted(e for t in trials.values() for e in t["ends"])
    gaps = []
    for s in starts[concurrency:]:
        before = [e for e in ends if e <= s + 1e-6]
        if before:
            gaps.append(s - before[-1])
    return gaps


def summarize(run: dict, target: float, concurrency: int = 2) -> dict:
    """One arm run's figures against ``target`` (a test accuracy): time and steps to the first round that reaches
    it, the best model at the end, keeper's overhead and the slots' idle time."""
    events = run["events"]
    hit = next((e for e in events if e["test_accuracy"] >= target), None)
    best = best_model(events)
    first = {}
    for e in events:
        first.setdefault(e["trial"], e)
    warm_s = sum(e["warm_s"] for e in events)
    phases: dict[str, float] = {}
    for e in events:
        for k, v in json.loads(e.get("warm_phases") or "{}").items():
            phases[k] = phases.get(k, 0.0) + float(v)
    cb = run.get("callback") or {}
    hook_s = float(cb.get("hook_s", 0.0))
    register_s = float(sum((cb.get("registration_cpu_s") or {}).values()))
    actors = {k: float(v) for k, v in (run.get("actor_cpu") or {}).items() if v}
    actor_cpu = float(sum(actors.values()))
    # wall-equivalent seconds: the driver's hooks hold Tune's loop; the rest is CPU taken from the cores the
    # trials share (warm_start delays its trial, the registration thread and the actors take a core's share)
    overhead = hook_s + (warm_s + register_s + actor_cpu) / concurrency
    gaps = start_gaps(run["trials"], concurrency)
    return {"reached": hit is not None, "wall_to_target_s": hit["wall_s"] if hit else None,
            "steps_to_target": hit["population_steps"] if hit else None,
            "best_test": best_test(events), "best_val": best["val_accuracy"],
            "best_tied": len(best_models(events)),
            "best_arch": f"w{best['width']}/b{best['blocks']}", "best_lr": best["lr"],
            "best_parent": best["parent"], "max_test": max(e["test_accuracy"] for e in events),
            "steps": events[-1]["population_steps"] if events else 0, "wall_s": run["wall_s"],
            "trials": len(first), "errors": len(run["errors"]),
            "warmed": sum(1 for e in first.values() if e["parent"] and not e["source_arch"]),
            "same_arch": sum(1 for e in first.values() if e["same_arch"] and not e["source_arch"]),
            "shrunk": sum(1 for e in first.values() if e.get("shrink", 1.0) < 1.0),
            "warm_s": warm_s, "hook_s": hook_s, "actor_cpu_s": actor_cpu, "register_cpu_s": register_s,
            "warm_phases": phases, "actor_cpu": actors,
            "first_report_s": min((e["wall_s"] for e in events), default=None),
            "overhead_s": overhead, "overhead_share": overhead / run["wall_s"] if run["wall_s"] else 0.0,
            "gap_median_s": float(sorted(gaps)[len(gaps) // 2]) if gaps else 0.0,
            "gap_mean_s": float(sum(gaps) / len(gaps)) if gaps else 0.0}


def cost_line(trials: list[int], overhead_s: list[float]) -> tuple[float, float]:
    """(fixed s, s per trial): the least-squares line through keeper arm runs' overhead against the trials each
    started; with a single trial count, the mean per trial and no fixed part."""
    n, y = np.asarray(trials, dtype=float), np.asarray(overhead_s, dtype=float)
    if len(n) < 2 or np.ptp(n) == 0:
        return 0.0, float(np.mean(y / n))
    per_trial, fixed = np.polyfit(n, y, 1)
    return float(fixed), float(per_trial)


def twins(cold: dict, warm: dict, margin: float = 0.0) -> dict:
    """Per draw index run in both FIFO arms (the same config, the same steps): how many warmed trials ended below
    their cold twin (by more than ``margin``), and the mean final difference."""
    def by_index(run: dict) -> dict[int, dict]:
        index = {tid: t["index"] for tid, t in run["trials"].items()}
        return {index[tid]: e for tid, e in final_by_trial(run["events"]).items()}

    def training_cpu(run: dict) -> dict[int, float]:
        index = {tid: t["index"] for tid, t in run["trials"].items()}
        out: dict[int, float] = {}
        for e in run["events"]:
            out[index[e["trial"]]] = out.get(index[e["trial"]], 0.0) + float(e.get("round_cpu_s", 0.0))
        return out

    c, w = by_index(cold), by_index(warm)
    pairs = [(c[i], w[i]) for i in sorted(set(c) & set(w)) if w[i]["parent"]]
    diffs = [b["test_accuracy"] - a["test_accuracy"] for a, b in pairs]
    cc, wc = training_cpu(cold), training_cpu(warm)
    same = sorted(set(cc) & set(wc))
    return {"warmed": len(pairs), "below": sum(d < -margin for d in diffs),
            "mean_diff": float(sum(diffs) / len(diffs)) if diffs else 0.0,
            "worst_diff": float(min(diffs)) if diffs else 0.0,
            # the same draws' training rounds (the same steps of the same architectures), CPU-s in each arm: how
            # fast the machine ran each arm's training, apart from keeper
            "training_cpu_ratio": (sum(wc[i] for i in same) / sum(cc[i] for i in same)
                                   if same and sum(cc[i] for i in same) else float("nan"))}
