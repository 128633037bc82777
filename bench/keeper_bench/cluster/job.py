"""One job of the trace as its own process and Ray driver: ``python -m keeper_bench.cluster.job SPEC OUT``.

The process connects to the running cluster (``ray.init(address=...)``, the address in SPEC), runs the job's trials
through its own ``tune.Tuner`` (FIFO for ``nas`` and ``single``, ASHA for ``hpo``; at most the job's
``concurrency`` trials at once, one CPU each) and writes OUT when the Tuner is done. With a service in SPEC (the
keeper arm) it adds exactly what a user adds: ``KeeperCallback(config=service)`` among the run's callbacks, and in
the trainable one ``warm_start(config=service)`` line whose result the trial's schedule follows (``warm_lr``).
Nothing else differs between the arms: trial ``i`` of a job builds the same model from the same seed, draws the
same batches and reports (with a checkpoint, so the callback can register it) after the same rounds.

What a trial reports besides its accuracies: the node and process it ran in, its warm start (parent, reason,
seconds by phase: ``WarmResult.seconds``), the architecture cache's counts in its process
(:func:`keeper.torch_support.cache.stats`) before and after its warm start (a trace that was not a hit is a miss:
the reading counts misses per node), and whether numba was imported in it.

Invariant: OUT is written whole (a temporary file renamed) once the job ends, its error included when it failed.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from typing import Any

from keeper_bench.cluster.trace import Job

__all__ = ["dataset_file", "main", "run_job"]

#: What each reported round carries to the driver's recorder (besides the trial's id and the time).
REPORTED = ("val_accuracy", "test_accuracy", "member_steps", "round_steps", "workload", "width", "blocks", "lr",
            "parent", "same_arch", "reason", "warm_s", "warm_phases", "node", "pid", "cache_before", "cache_after",
            "numba", "entered", "ready", "round_cpu_s")


def experiment_name(job: Job, keeper: bool) -> str:
    """The Tune experiment of ``job`` in its arm: the job's name with keeper (the zoo names its models after it),
    and that name with ``-cold`` without. Twins launched in the same second on one node under one name would share
    Tune's local staging directory (``artifacts/<timestamp to the second>/<experiment name>``) and mix their
    experiment state."""
    return job.name if keeper else f"{job.name}-cold"


def dataset_file(root: str, job: Job) -> str:
    """The job's workload data as a torch file under ``root``, written once (atomically) by the first job that needs
    it: a driver then loads a few megabytes instead of importing scikit-learn or reading the corpus again."""
    import torch

    from keeper_bench.pbt import _dataset

    run = job.run()
    key = f"{job.workload}-d{run.data_seed}-v{run.val_size}-c{run.context}-w{run.eval_windows}"
    path = os.path.join(root, f"{key}.pt")
    if not os.path.exists(path):
        os.makedirs(root, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{key}.")
        os.close(fd)
        torch.save(_dataset(run), tmp)
        os.replace(tmp, path)
    return path


def _trainable(job: Job, service: dict | None, data_ref: Any):
    """The trial function both arms run (see the module docstring)."""
    from keeper_bench.pbt import (_accuracy, _build, _report_round, _train_round, make_optimizer, member_spec,
                                  restarts_parent)

    run = job.run()
    table = {int(t["index"]): t for t in job.trials}

    def trial(config: dict) -> None:
        entered = time.time()
        import ray
        import torch
        from ray import tune

        torch.set_num_threads(1)
        spec = table[int(config["index"])]
        arch = [int(spec["width"]), int(spec["blocks"])]
        torch.manual_seed(job.seed * 100_003 + int(spec["index"]))
        model, example = _build(run, member_spec(run, *arch))
        opt, sched = make_optimizer(run, model, float(spec["lr"]))
        factor = sched
        info: dict[str, Any] = {"parent": "", "same_arch": False, "reason": "", "warm_s": 0.0, "warm_phases": "{}",
                                "node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                                "cache_before": "{}", "cache_after": "{}"}
        if service is not None:
            from keeper.torch_support import cache
            from keeper.tune_integration import warm_lr, warm_start

            info["cache_before"] = json.dumps(cache.stats())
            t = time.perf_counter()
            warm = warm_start(model, example, config=service)
            info["warm_s"] = time.perf_counter() - t
            info["cache_after"] = json.dumps(cache.stats())
            factor = warm_lr(opt, warm, total_steps=run.steps, scheduler=sched)
            info.update(parent=warm.parent or "", same_arch=restarts_parent(warm),
                        reason=warm.reason or "", warm_phases=json.dumps(dict(warm.seconds)))
        info["numba"] = "numba" in sys.modules
        data = ray.get(data_ref)
        trial_id = tune.get_context().get_trial_id()
        start = {"entered": entered, "ready": time.time()}
        done = 0
        while done < run.steps:
            c1 = time.thread_time()
            n = min(run.round_steps, run.steps - done)
            _train_round(run, model, opt, data, n, job.seed * 1_000_003 + int(spec["index"]) * 10_007 + done,
                         after_step=factor.step if factor is not None else None)
            done += n
            metrics = {"val_accuracy": _accuracy(run, model, data, "val"),
                       "test_accuracy": _accuracy(run, model, data, "test"), "member_steps": done,
                       "round_steps": n, "workload": job.workload, "width": arch[0], "blocks": arch[1],
                       "lr": float(spec["lr"]), "round_cpu_s": time.thread_time() - c1, **start, **info}
            start = {"entered": 0.0, "ready": 0.0}
            info = {**info, "warm_s": 0.0, "warm_phases": "{}"}
            _report_round(metrics, model, opt, {"arch": arch, "steps": done, "trial": trial_id})
    return trial


def _recorder_class():
    from ray.tune import Callback

    class _Recorder(Callback):
        """Every trial's starts, reports and ends as the driver sees them (seconds since the epoch)."""

        def __init__(self):
            self.events: list[dict] = []
            self.trials: dict[str, dict] = {}

        def _trial(self, trial: Any) -> dict:
            return self.trials.setdefault(trial.trial_id, {"index": int(trial.config["index"]), "starts": [],
                                                            "ends": [], "error": False})

        def on_trial_start(self, iteration, trials, trial, **info) -> None:
            self._trial(trial)["starts"].append(time.time())

        def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
            self._trial(trial)
            self.events.append({"trial": trial.trial_id, "t": time.time(),
                                **{k: result.get(k) for k in REPORTED}})

        def on_trial_complete(self, iteration, trials, trial, **info) -> None:
            self._trial(trial)["ends"].append(time.time())

        def on_trial_error(self, iteration, trials, trial, **info) -> None:
            self._trial(trial)["ends"].append(time.time())
            self._trial(trial)["error"] = True

    return _Recorder


def run_job(job: Job, address: str, storage: str, data_path: str, service: dict | None) -> dict:
    """Run ``job``'s Tuner on the cluster at ``address``; returns what OUT holds."""
    started = time.time()
    import ray
    import torch

    ray.init(address=address, log_to_driver=False)
    connected = time.time()
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    run = job.run()
    data_ref = ray.put(torch.load(data_path, weights_only=True))
    recorder = _recorder_class()()
    callbacks: list[Any] = [recorder]
    keeper_cb = None
    if service is not None:
        from keeper.tune_integration import KeeperCallback

        keeper_cb = KeeperCallback("val_accuracy", "max", config=service)
        callbacks.append(keeper_cb)
    scheduler = (ASHAScheduler(time_attr="training_iteration", max_t=run.rounds, grace_period=1, reduction_factor=3)
                 if job.scheduler == "asha" else None)
    tuner = tune.Tuner(
        _trainable(job, service, data_ref),
        param_space={"index": tune.grid_search([int(t["index"]) for t in job.trials])},
        tune_config=tune.TuneConfig(scheduler=scheduler, metric="val_accuracy" if scheduler else None,
                                    mode="max" if scheduler else None, max_concurrent_trials=job.concurrency),
        # the best checkpoint of each trial is the one the callback registers: the others need no disk
        run_config=tune.RunConfig(name=experiment_name(job, service is not None), storage_path=storage,
                                  callbacks=callbacks, verbose=0, checkpoint_config=tune.CheckpointConfig(
                                      num_to_keep=1, checkpoint_score_attribute="val_accuracy",
                                      checkpoint_score_order="max")))
    fit_start = time.time()
    grid = tuner.fit()
    out = {"job": job.name, "keeper": service is not None, "started": started, "connected": connected,
           "fit_start": fit_start, "ended": time.time(), "events": recorder.events, "trials": recorder.trials,
           "errors": [str(e) for e in grid.errors]}
    if keeper_cb is not None:
        out["callback"] = {"outcomes": dict(keeper_cb.outcomes), "models": dict(keeper_cb.models),
                           "registration_s": dict(keeper_cb.registration_s), "hook_s": keeper_cb.hook_s}
    ray.shutdown()
    return out


def _write(path: str, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".job-")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    spec_path, out_path = argv if argv is not None else sys.argv[1:3]
    with open(spec_path) as f:
        spec = json.load(f)
    job = Job.from_dict(spec["job"])
    try:
        out = run_job(job, spec["address"], spec["storage"], spec["data"], spec.get("service"))
    except BaseException as exc:  # the job failed: the reading counts it, with its error
        out = {"job": job.name, "keeper": spec.get("service") is not None, "failed": True,
               "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(), "ended": time.time()}
        _write(out_path, out)
        return 1
    _write(out_path, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
