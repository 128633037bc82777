#!/usr/bin/env python
"""The cluster keeper is for: many tenants' searches and training jobs, arriving over time, share one Ray cluster and
one long-lived keeper service and zoo. Measured as the published system measures it, and beside its table.

Parts (``--parts``, all by default):

* **trace**: a seeded trace (keeper_bench.cluster.trace) of jobs from 4 tenants with Poisson arrivals: NAS searches
  over a family space every tenant shares, ASHA searches over width x depth x learning rate, and single training
  jobs of architectures other tenants trained, on two workloads (2-D ResNets with BatchNorm on scikit-learn's
  digits; byte-level GPT-2s). Every job is its own process, a Ray driver with its own ``tune.Tuner``
  (keeper_bench.cluster.job), on one ``ray.cluster_utils.Cluster`` of ``--nodes`` nodes on 127.0.0.1. The keeper
  arm shares one service started as an operator starts it (``keeper serve --config ... --address ...``); its jobs
  add ``KeeperCallback(config=...)`` and ``warm_start(config=...)`` and nothing else. The cold arm is the same
  trace (same jobs, seeds, order and arrival times) without keeper. Each job runs its own budget; its completion is
  the first report at its cold twin's final quality (less ``--margin`` of it); compute saving counts trial-seconds
  up to completion (and training steps, which load does not move); TC speed-up is the cold twin's time from
  arrival to completion over the keeper job's.
* **zoo-start**: searches that start with a zoo, as a new user would try them: on a 2-CPU Ray, one trial at a
  time per tenant, ASHA over ``--zoo-trials`` draws; tenant ana searches first (an empty zoo), then at once tenant
  ben searches the same space again (another seed, a narrower learning-rate range) and tenant chen an adjacent,
  wider and deeper space, each against its cold twin (time to the cold twin's best, final best). scikit-learn's
  digits stand in for MNIST's 5,000-image sample: nothing is downloaded.
* **capacity**: the keeper arm of the trace's first ``--capacity-jobs`` jobs again under ``capacity_bytes`` at
  10%, 30% and 100% of what those jobs register (measured on the unbounded run first): what admission and
  eviction keep, and how the saving falls with the budget (against the same jobs' cold arm).

Usage:
    python scripts/bench_cluster.py                      # quick look: 16 jobs and the small parts (~10-15 min)
    python scripts/bench_cluster.py --parts trace --jobs 8   # the trace alone, 8 jobs (~3-5 min)
    python scripts/bench_cluster.py --jobs 300           # the report's run: hours (see below)
    python scripts/bench_cluster.py --jobs 300 --resume  # go on from where a stopped run ended
    python scripts/bench_cluster.py --jobs 300 --report  # the report again from reports/bench_cluster.json

Capacity: jobs that arrive faster than the cluster finishes them wait for a driver slot, and a wait that grows over
the trace swamps the TC speed-up from arrival (both arms wait alike, so it tends to 1x); the report gives the TC from
each job's first trial start beside it. On 2 cores both arms of the quick size finish about 2.7 jobs a minute
together (48 jobs in 18 min), so a 300-job trace there needs ``--gap`` of 25 s or more (some 2 h of arrivals); at the
quick size's 6-s gap the wait had grown past 25 min by the 50th job. The report size's trials are about 3x longer.

Writes reports/bench_cluster.md and .json (bench_cluster_quick.* for the quick budgets; ``--name``), rewritten as
each job ends (marked incomplete until the end); the jobs' results, logs and zoos stay in ``--workdir``. A job a
stopped run left half done runs again from its start on ``--resume`` (what its first run registered stays in the
zoo). The loopback nodes' CPUs share this machine's cores: run it on an otherwise idle machine (the report gives
the load beside the figures).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import time
import uuid

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np

from keeper_bench.cluster import reading
from keeper_bench.cluster.drive import needed_node_cpus
from keeper_bench.cluster.trace import KINDS, QUICK, REPORT, WORKLOADS, Job, Sizes, make_trace, zoo_start_searches

PARTS = ("trace", "zoo-start", "capacity")
#: Fields of a job's reported rounds kept in the report's json (the full results stay in the work directory), and
#: those only a trial's first round carries (its warm start's).
_KEPT = ("trial", "t", "val_accuracy", "test_accuracy", "round_steps")
_FIRST = ("workload", "width", "blocks", "lr", "parent", "same_arch", "warm_s", "warm_phases", "node", "pid",
          "cache_before", "cache_after", "numba")


def _compact(result: dict) -> dict:
    """A job's result as the report's json keeps it: its rounds' figures, and each trial's warm start with its first
    round (its reason cut short)."""
    out = {k: v for k, v in result.items() if k not in ("events", "traceback")}
    events, seen = [], set()
    for e in sorted(result.get("events") or [], key=lambda e: e["t"]):
        kept = {k: e.get(k) for k in _KEPT}
        if e["trial"] not in seen:
            seen.add(e["trial"])
            kept.update({k: e.get(k) for k in _FIRST})
        if e.get("warm_phases") not in (None, "{}"):
            reason = e.get("reason") or ""
            kept["reason"] = reason[:300]
            # the choice's note ends the reason: a wait for registrations in flight that ran out
            kept["arrival_wait_ran_out"] = "were not waited for" in reason
        events.append(kept)
    out["events"] = events
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--jobs", type=int, default=16, help="jobs in the trace (the report's run: 300)")
    p.add_argument("--seed", type=int, default=0, help="the trace's seed (tenants, kinds, arrivals, job seeds)")
    p.add_argument("--size", choices=("quick", "report"), help="the jobs' budgets (default: report from 100 jobs)")
    p.add_argument("--gap", type=float, help="mean seconds between arrivals (default: the size's)")
    p.add_argument("--steps", type=int, help="training steps per trial (default: the size's)")
    p.add_argument("--round-steps", type=int, help="steps between reports (default: the size's)")
    p.add_argument("--nodes", type=int, default=3, help="nodes of the loopback cluster, the head included (2-4)")
    p.add_argument("--node-cpus", type=float, help="logical CPUs per node (they share the real cores; default: enough "
                   "that no trial of a running job waits for one: keeper_bench.cluster.drive.needed_node_cpus)")
    p.add_argument("--max-drivers", type=int, default=6, help="job processes at once per arm; later arrivals wait")
    p.add_argument("--together", action="store_true", help="run the cold and the keeper arm of the trace (and the "
                   "bounded zoos) at once, each job's twins arriving together: on a machine whose load changes, "
                   "both arms share it")
    p.add_argument("--margin", type=float, default=0.01, help="completion: the cold twin's final quality less this "
                   "share of it")
    p.add_argument("--zoo-workloads", help="workloads of the searches that start with a zoo (default: digits,lm; "
                   "quick digits)")
    p.add_argument("--zoo-trials", type=int, help="draws per search that starts with a zoo (default: 12; quick 4)")
    p.add_argument("--capacity-jobs", type=int, help="jobs of the capacity curve (default: 60; quick 6)")
    p.add_argument("--capacities", default="0.1,0.3,1.0", help="capacity_bytes as shares of what those jobs register")
    p.add_argument("--resume", action="store_true", help="go on from the report's json and the work directory")
    p.add_argument("--report", action="store_true", help="only write the report again from its json")
    p.add_argument("--workdir", help="default: OUT/tmp/NAME")
    p.add_argument("--out", default="reports")
    p.add_argument("--name", help="the report's name (default: bench_cluster for the report's budgets, "
                   "bench_cluster_quick for the quick ones)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    parts = [x for x in args.parts.split(",") if x]
    if set(parts) - set(PARTS):
        p.error(f"unknown parts {sorted(set(parts) - set(PARTS))}; expected a subset of {','.join(PARTS)}")
    if not 2 <= args.nodes <= 4 and "trace" in parts:
        p.error("--nodes: the trace runs on 2-4 loopback nodes")
    if args.name is None:
        args.name = "bench_cluster" if (args.size or ("report" if args.jobs >= 100 else "quick")) == "report" \
            else "bench_cluster_quick"
    json_path = os.path.join(args.out, f"{args.name}.json")
    if (args.report or args.resume) and not os.path.exists(json_path):
        p.error(f"no run to {'report' if args.report else 'resume'} at {json_path}: give the run's --jobs (or --name) "
                "and --out")
    if args.report:
        with open(json_path) as f:
            state = json.load(f)
        _write(args.out, args.name, state)
        return 0
    workdir = os.path.abspath(args.workdir or os.path.join(args.out, "tmp", args.name))
    if args.resume:
        with open(json_path) as f:
            state = json.load(f)
        settings = state["settings"]
    else:
        shutil.rmtree(workdir, ignore_errors=True)
        report = (args.size or ("report" if args.jobs >= 100 else "quick")) == "report"
        sizes = REPORT if report else QUICK
        given = {"gap_s": args.gap, "steps": args.steps, "round_steps": args.round_steps}
        sizes = Sizes(**{**sizes.as_dict(), **{k: v for k, v in given.items() if v is not None}})
        if sizes.steps % sizes.round_steps:
            raise SystemExit(f"--steps {sizes.steps} is not a whole number of rounds of {sizes.round_steps} steps")
        node_cpus = args.node_cpus or needed_node_cpus(args.nodes, args.max_drivers, sizes.concurrency,
                                                       2 if args.together else 1)
        settings = {"jobs": args.jobs, "seed": args.seed, "sizes": sizes.as_dict(), "size": "report" if report
                    else "quick", "nodes": args.nodes, "node_cpus": node_cpus, "max_drivers": args.max_drivers,
                    "together": args.together,
                    "margin": args.margin,
                    "zoo_workloads": [w for w in (args.zoo_workloads or ("digits,lm" if report else "digits"))
                                      .split(",") if w],
                    "zoo_trials": args.zoo_trials or (12 if report else 4),
                    "capacity_jobs": min(args.jobs, args.capacity_jobs or (60 if report else 6)),
                    "capacities": [float(x) for x in args.capacities.split(",")], "parts": parts}
        state = {"settings": settings, "commands": [], "arms": {}, "results": {}, "jobs": {}}
    state["commands"].append("python scripts/bench_cluster.py" + (" " + " ".join(sys.argv[1:]) if argv is None
                                                                  and sys.argv[1:] else ""))
    state["complete"] = False
    os.makedirs(workdir, exist_ok=True)
    bench = _Bench(state, settings, workdir, args.out, args.name)
    t0 = time.time()
    if "trace" in parts or "capacity" in parts:
        bench.with_cluster(settings["nodes"], settings["node_cpus"], lambda: (
            bench.trace() if "trace" in parts else None, bench.capacity() if "capacity" in parts else None))
    if "zoo-start" in parts:
        bench.with_cluster(1, 2.0, bench.zoo_start)
    state["wall_min"] = state.get("wall_min", 0.0) + (time.time() - t0) / 60
    import ray
    import torch

    state["versions"] = f"torch {torch.__version__}, ray {ray.__version__}, python {platform.python_version()}"
    state["complete"] = True
    bench.write(0)
    _print_summary(state)
    return 0


class _Bench:
    """The run: its state (the report's json), the work directory, the cluster of the part that runs."""

    def __init__(self, state: dict, settings: dict, workdir: str, out: str, name: str):
        self.state, self.settings, self.workdir, self.out, self.name = state, settings, workdir, out, name
        self.cluster = None
        self.numbers: dict[str, int] = {}

    # -------------------------------------------------------------------------------------------- plumbing
    def write(self, every_s: float = 60.0) -> None:
        """The json now; the markdown at most every ``every_s`` seconds (0: now), since reading every job again
        as each of 600 ends would take minutes of the cores the jobs run on."""
        now = time.monotonic()
        markdown = now - getattr(self, "_written", -math.inf) >= every_s
        _write(self.out, self.name, self.state, markdown)
        if markdown:
            self._written = now

    def with_cluster(self, nodes: int, cpus: float, body) -> None:
        import ray

        from keeper_bench.cluster.drive import start_cluster

        self.cluster, numbers = start_cluster(nodes, cpus, os.path.join(self.workdir, "caches"))
        self.numbers = numbers
        self.state.setdefault("nodes", {}).update(numbers)
        try:
            body()
        finally:
            ray.shutdown()
            self.cluster.shutdown()
            self.cluster = None

    def trace_jobs(self) -> list[Job]:
        return make_trace(self.settings["jobs"], self.settings["seed"], Sizes(**self.settings["sizes"]))

    def run_arms(self, arms: list[tuple[str, dict | None]], jobs: list[Job]) -> None:
        """Drive ``jobs`` once per arm of ``arms`` (name, service config or None) at once, resuming each arm's
        finished jobs; each service is started with ``keeper serve`` first and stopped at the end (the CPU of
        keeper's actors recorded: per arm where one service ran, else shared by the arms that ran together)."""
        from keeper_bench.cluster import drive
        from keeper_bench.search import keeper_actor_cpu

        address = self.cluster.address
        self.state["jobs"].update({j.name: j.as_dict() for j in jobs})
        arms = [(arm, svc) for arm, svc in arms
                if not all(j.name in self.state["results"].get(arm, {}) for j in jobs)]
        if not arms:
            return
        records = {arm: self.state["arms"].setdefault(arm, {"segments": []}) for arm, _ in arms}
        services = [(arm, svc) for arm, svc in arms if svc is not None]
        for arm, svc in services:
            records[arm]["serve_s"] = drive.serve(address, svc, self.workdir)
        cpu0 = keeper_actor_cpu() if services else {}

        def done(arm: str, job: Job, result: dict) -> None:
            self.state["results"].setdefault(arm, {})[job.name] = _compact(result)
            status = "failed: " + result.get("error", "") if result.get("failed") else (
                f"{len(result.get('errors') or [])} trial errors")
            print(f"  {arm} {job.name}: {result['ended'] - result['arrived']:.0f} s, {status}", flush=True)
            self.write()

        print(f"{' + '.join(arm for arm, _ in arms)}: {len(jobs)} jobs", flush=True)
        node_env = drive._node_env(os.path.join(self.workdir, "caches"), 0)
        try:
            seg = drive.drive(jobs, arms=arms, address=address, workdir=self.workdir,
                              max_drivers=self.settings["max_drivers"], node_env=node_env, on_done=done)
        finally:
            if services:
                cpu1 = keeper_actor_cpu()
                used = sum(max(0.0, cpu1.get(k, 0.0) - cpu0.get(k, 0.0)) for k in cpu1)
                for arm, svc in services:
                    records[arm]["actor_cpu_s"] = records[arm].get("actor_cpu_s", 0.0) + used
                    records[arm]["actor_cpu_shared_with"] = [a for a, _ in services if a != arm]
                    records[arm].setdefault("service_stats", []).append(
                        drive.service_stats(address, svc, self.workdir))
                    drive.stop_service(address, svc, self.workdir)
        for arm, _ in arms:
            records[arm]["segments"].append({"wall_s": seg["wall_s"], "started": seg["started"],
                                             "samples": seg["samples"], "with": [a for a, _ in arms if a != arm]})
        self.write(0)

    def pair(self, arms: list[tuple[str, dict | None]], jobs: list[Job]) -> None:
        """``arms`` together (``--together``: their twins arrive at once and share the load) or one after the
        other."""
        if self.settings.get("together"):
            self.run_arms(arms, jobs)
        else:
            for arm in arms:
                self.run_arms([arm], jobs)

    def service(self, arm: str, capacity: int | None = None) -> dict:
        from keeper_bench.cluster.drive import service_config

        return service_config(os.path.join(self.workdir, f"zoo-{arm}"), f"{self.name}-{arm}-{uuid.uuid4().hex[:6]}",
                              capacity)

    # -------------------------------------------------------------------------------------------- the parts
    def trace(self) -> None:
        jobs = self.trace_jobs()
        self.pair([("cold", None), ("keeper", self.service("keeper"))], jobs)

    def capacity(self) -> None:
        jobs = self.trace_jobs()[:self.settings["capacity_jobs"]]
        self.run_arms([("cold", None)], jobs)  # the trace's cold arm: only the jobs it has not run yet
        self.run_arms([("keeper-cap-full", self.service("keeper-cap-full"))], jobs)
        registered = _zoo_bytes(os.path.join(self.workdir, "zoo-keeper-cap-full"))
        self.state["arms"]["keeper-cap-full"]["registered_bytes"] = registered
        bounded = []
        for share in self.settings["capacities"]:
            if share >= 1.0:
                continue
            arm = f"keeper-cap{int(round(100 * share))}"
            cap = max(1, int(share * registered))
            self.state["arms"].setdefault(arm, {"segments": []})["capacity_bytes"] = cap
            bounded.append((arm, self.service(arm, cap)))
        self.pair(bounded, jobs)
        for arm in ["keeper-cap-full", *(a for a, _ in bounded)]:
            self.state["arms"][arm]["zoo_end"] = _zoo_bytes(os.path.join(self.workdir, f"zoo-{arm}"), count=True)

    def zoo_start(self) -> None:
        """One arm at a time, whatever ``--together`` says: the setting is a 2-CPU Ray, one trial per tenant."""
        trials = self.settings["zoo_trials"]
        sizes = Sizes(**self.settings["sizes"])
        start = 10_000
        for workload in self.settings["zoo_workloads"]:
            jobs = zoo_start_searches(workload, seed=self.settings["seed"], trials=trials,
                                      steps=2 * sizes.steps, round_steps=sizes.round_steps, start=start)
            start += len(jobs)
            self.run_arms([(f"zoo-{workload}-cold", None)], jobs)
            self.run_arms([(f"zoo-{workload}-keeper", self.service(f"zoo-{workload}-keeper"))], jobs)


def _zoo_bytes(zoo: str, count: bool = False):
    """The bytes (and, with ``count``, the models) the zoo's catalog holds."""
    total = n = 0
    catalog = os.path.join(zoo, "catalog")
    for name in os.listdir(catalog) if os.path.isdir(catalog) else []:
        if name.endswith(".json"):
            with open(os.path.join(catalog, name)) as f:
                total += int(json.load(f).get("nbytes", 0))
            n += 1
    return {"bytes": total, "models": n} if count else total


# --------------------------------------------------------------------------------------------------- report
def _jobs(state: dict, names=None) -> list[Job]:
    jobs = [Job.from_dict(d) for d in state["jobs"].values()]
    return sorted([j for j in jobs if names is None or j.name in names], key=lambda j: j.index)


def _trace_twins(state: dict, keeper_arm: str = "keeper") -> list:
    res = state["results"]
    trace = [j for j in _jobs(state) if j.index < 10_000]
    return reading.twins(trace, res.get("cold", {}), res.get(keeper_arm, {}), state["settings"]["margin"])


def _pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{100 * x:.1f}%"


def _ci(ci, fmt) -> str:
    lo, hi = ci
    if np.isnan(lo):
        return ""
    return f" [{fmt(lo)}, {fmt(hi)}]"


def _row(label: str, g: dict) -> str:
    if "saving" not in g:
        return f"| {label} | {g['jobs']} | {g['failed']} | - | - | - | - | - | - | - | - |"
    x = lambda v: f"{v:.2f}x"  # noqa: E731
    return (f"| {label} | {g['jobs']} | {g['failed']} | **{_pct(g['saving'])}**{_ci(g['saving_ci'], _pct)} | "
            f"{_pct(g['saving_steps'])} | **{x(g['tc_median'])}**{_ci(g['tc_ci'], x)} | "
            f"{x(g['tc_quartiles'][0])}-{x(g['tc_quartiles'][1])} ({x(g['tc_min'])}-{x(g['tc_max'])}) | "
            f"{x(g['tc_train_median'])} | "
            f"{g['reached']} of {g['jobs'] - g['failed']} | {g['worse']} ({g['worse_1pt']} by > 1 pt; worst "
            f"{100 * g['worst_diff']:+.1f} pts) | {g['warmed']} of {g['trials']} |")


_HEAD = ("| jobs | n | failed | compute saving (trial-s) [90% CI] | saving (steps) | TC speed-up, median [90% CI] | "
         "TC quartiles (min-max) | TC from the first trial's start, median | reached cold's final | ended worse than "
         "cold twin | trials warmed |\n|---|---|---|---|---|---|---|---|---|---|---|")


def _markdown(state: dict) -> str:
    s = state["settings"]
    sizes = s["sizes"]
    out = ["# Many tenants, one cluster, one keeper service (scripts/bench_cluster.py)", ""]
    if not state.get("complete"):
        out += ["**Incomplete**: the run is still going or was stopped; the tables hold the jobs that finished.", ""]
    loads = [x["load"] for arm in state["arms"].values() for seg in arm.get("segments", []) for x in seg["samples"]]
    # the load's samples and the wall time are kept when a part ends: a run still going has neither yet
    measured = (f"1-minute load average over the runs {np.mean(loads):.1f} (max {max(loads):.1f}). Wall "
                f"{state.get('wall_min', 0):.0f} min." if loads else "load and wall time: when the run ends.")
    out += [f"Commands: {'; '.join(f'`{c}`' for c in state['commands'])}. Machine: {platform.machine()}, "
            f"{os.cpu_count()} cores; {state.get('versions', '')}; {measured}", "",
            f"- **Cluster**: `ray.cluster_utils.Cluster` of {s['nodes']} nodes on 127.0.0.1 (the head and "
            f"{s['nodes'] - 1} workers), {s['node_cpus']:g} logical CPU each: the nodes' "
            f"{s['nodes'] * s['node_cpus']:g} CPUs share this machine's {os.cpu_count()} real cores, so the figures "
            "show the service's behaviour and overheads under concurrent drivers, not a cluster's capacity. Every "
            "node has its own architecture and kernel cache directory, as separate machines have separate disks. "
            f"At most {s['max_drivers']} job processes at once per arm (a later arrival waits; its time counts from "
            "its arrival). "
            + ("The cold and the keeper arm ran together, each job's twins arriving at once (`--together`): a load "
               "that changed over the run moved both alike." if s.get("together") else
               "The arms ran one after the other, each with the cluster to itself: compare their loads below."),
            f"- **Trace**: {s['jobs']} jobs, seed {s['seed']}, 4 tenants, Poisson arrivals (mean gap "
            f"{sizes['gap_s']:g} s); kinds nas (FIFO over {sizes['nas_archs']} architectures of the shared family "
            f"space), hpo (ASHA over {sizes['hpo_draws']} draws of width x depth x lr) and single (one trial of an "
            f"architecture another tenant trained); each trial {sizes['steps']} steps, a report every "
            f"{sizes['round_steps']}; at most {sizes['concurrency']} trials at once per search. Workloads: digits "
            "(2-D ResNets with BatchNorm, widths 8/12/16 x 1-2 blocks) and lm (byte-level GPT-2s, widths 32/64 x 1-3 "
            "layers).",
            "- **Service**: one `keeper serve --config ... --address ...` with the shipped defaults (zoo and "
            "namespace set), shared by every keeper job; jobs add `KeeperCallback(config=...)` and "
            "`warm_start(config=...)` (with `warm_lr` over the trial's schedule) and nothing else.",
            f"- **Measures**: completion = the first report at the cold twin's final quality (its chosen model on "
            f"the test split) less {100 * s['margin']:g}% of it; compute saving = 1 - keeper's trial-seconds up to "
            "completion / cold's (summed over jobs; steps: the same in training steps, which load does not move); "
            "TC speed-up = the cold twin's seconds from arrival to completion over the keeper job's (a user's wait, "
            "the driver's start included; also from each run's first trial start, training alone); 90% intervals "
            "from 1,000 bootstrap resamples of the jobs. A keeper job that never reaches the target saved nothing "
            "and was not sooner, however early it ended: its speed-up counts at most 1x, its trial-seconds at least "
            "its cold twin's.",
            ""]
    twins = _trace_twins(state)
    if twins:
        out += _published(twins) + _kinds(twins) + _service(state) + _caches(state)
    out += _zoo_start(state) + _capacity(state) + _closing(state, twins)
    return "\n".join(out) + "\n"


def _select(twins: list, key) -> list:
    if key is None:
        return []
    field, value = key
    return [t for t in twins if getattr(t, field) == value]


def _published(twins: list) -> list[str]:
    out = ["## Beside the published system's table", "",
           "| published workload | models | published GPU saving | published TC | this trace's part | jobs | "
           "compute saving [90% CI] | TC median [90% CI] | ended worse |", "|---|---|---|---|---|---|---|---|---|"]
    for label, models, saving, tc, key in reading.PUBLISHED:
        part = _select(twins, key)
        g = reading.group(part) if part else {}
        name = "-" if key is None else f"{key[0]} {key[1]}"
        if "saving" in g:
            x = lambda v: f"{v:.2f}x"  # noqa: E731
            out.append(f"| {label} | {models:,} | {100 * saving:.1f}% | {tc:.1f}x | {name} | {g['jobs']} | "
                       f"**{_pct(g['saving'])}**{_ci(g['saving_ci'], _pct)} | **{x(g['tc_median'])}**"
                       f"{_ci(g['tc_ci'], x)} | {g['worse']} |")
        else:
            out.append(f"| {label} | {models:,} | {100 * saving:.1f}% | {tc:.1f}x | {name} | {len(part)} | - | - | - |")
    g = reading.group(twins)
    if "saving" in g:
        out.append(f"| (all of the trace) | | | | all | {g['jobs']} | **{_pct(g['saving'])}**"
                   f"{_ci(g['saving_ci'], _pct)} | **{g['tc_median']:.2f}x**"
                   f"{_ci(g['tc_ci'], lambda v: f'{v:.2f}x')} | {g['worse']} |")
    out += ["", "Rows read against the trace: NAS rows against its nas jobs (NASBench) and its ASHA searches over "
            "architectures and learning rates (AutoKeras, a Bayesian search over both); image classification and "
            "language modelling against every job of the digits and lm workloads. The trace has no ensembles.", ""]
    return out


def _kinds(twins: list) -> list[str]:
    out = ["## Per kind and workload", "", _HEAD]
    for kind in KINDS:
        for workload in WORKLOADS:
            part = [t for t in twins if t.kind == kind and t.workload == workload]
            if part:
                out.append(_row(f"{kind}, {workload}", reading.group(part)))
        part = [t for t in twins if t.kind == kind]
        if part:
            out.append(_row(f"**{kind}**", reading.group(part)))
    for workload in WORKLOADS:
        part = [t for t in twins if t.workload == workload]
        if part:
            out.append(_row(f"**{workload}**", reading.group(part)))
    out.append(_row("**all**", reading.group(twins)))
    bins = reading.TC_BINS
    labels = [f"{lo:g}-{hi:g}x" if hi != float("inf") else f">= {lo:g}x" for lo, hi in zip(bins[:-1], bins[1:])]
    out += ["", "TC speed-up per job, how many jobs in each range:", "",
            "| jobs | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for kind in (*KINDS, None):
        part = [t for t in twins if (kind is None or t.kind == kind) and not t.failed]
        if part:
            hist = reading.tc_histogram(np.array([t.tc for t in part]))
            out.append(f"| {kind or 'all'} | " + " | ".join(str(h) for h in hist) + " |")
    worse = sorted([t for t in twins if not t.failed and t.diff < 0], key=lambda t: t.diff)
    if worse:
        out += ["", "Jobs that ended worse than their cold twin (final quality, keeper against cold):", "",
                "| job | kind | keeper | cold | difference | trials warmed |", "|---|---|---|---|---|---|"]
        for t in worse[:20]:
            out.append(f"| {t.name} | {t.kind} | {t.keeper_final:.3f} | {t.cold_final:.3f} | {100 * t.diff:+.1f} pts "
                       f"| {t.warmed} of {t.trials} |")
    return out + [""]


def _service(state: dict) -> list[str]:
    res = list(state["results"].get("keeper", {}).values())
    lat = reading.warm_latency(res)
    share = reading.keeper_share(res)
    arm = state["arms"].get("keeper", {})
    wall = sum(seg["wall_s"] for seg in arm.get("segments", []))
    errors = sum(len(r.get("errors") or []) for r in res)
    failed = sum(bool(r.get("failed")) for r in res)
    cold_errors = sum(len(r.get("errors") or []) for r in state["results"].get("cold", {}).values())
    out = ["## The service under the trace's load", ""]
    if lat.get("n"):
        out += [f"`warm_start` in {lat['n']} trials, concurrent drivers: **p50 {lat['p50']:.2f} s, p99 "
                f"{lat['p99']:.2f} s** (max {lat['max']:.2f} s). By phase (`WarmResult.seconds`):", "",
                "| phase | p50 (s) | p99 (s) | max (s) |", "|---|---|---|---|"]
        for k, v in sorted(lat["phases"].items()):
            out.append(f"| {k} | {v['p50']:.3f} | {v['p99']:.3f} | {v['max']:.3f} |")
        out.append("")
    out += [f"- keeper's share of the jobs' time: {_pct(share['share'])} ({share['warm_s']:.0f} s in `warm_start` "
            f"in trials + {share['hook_s']:.0f} s in the drivers' callback hooks, over {share['trial_s']:.0f} "
            "trial-seconds).",
            f"- keeper's actors (front door, zoo manager, matchers): {arm.get('actor_cpu_s', 0):.0f} CPU-seconds over "
            f"the keeper arm's {wall:.0f} s of wall time "
            f"({_pct(arm.get('actor_cpu_s', 0) / max(wall * os.cpu_count(), 1e-9))} of the machine's cores).",
            _loads(state),
            f"- failed jobs: {failed} keeper; errored trials: {errors} keeper, {cold_errors} cold; warm starts whose "
            f"wait for registrations in flight ran out (`timeouts.arrival_s`): "
            f"{sum(bool(e.get('arrival_wait_ran_out')) for r in res for e in r.get('events') or [])} of "
            f"{lat.get('n', 0)}.", ""]
    for st in arm.get("service_stats", []):
        if "error" in st:
            out += [f"- `keeper stats` at the end: {st['error']}", ""]
            continue
        sec = lambda v: "-" if v is None else f"{1e3 * v:.0f} ms"  # noqa: E731
        out += [f"- `keeper stats` at the end of the arm: {st.get('models')} models, {st.get('registers')} "
                f"registrations and {st.get('queries')} queries through the front door, {st.get('errors')} errors; "
                f"parent search p50 {sec(st.get('search_p50'))}, p99 {sec(st.get('search_p99'))}; "
                f"{st.get('matchers')} matchers ({st.get('matcher_deaths')} died, {st.get('batches_redone')} batches "
                f"redone, {st.get('local_batches')} stages scored in the front door).", ""]
    samples = [x for seg in arm.get("segments", []) for x in seg["samples"]]
    growth = reading.zoo_growth(samples)
    if growth:
        out += ["The zoo over the trace:", "", "| time (s) | models | MB | drivers running | load |",
                "|---|---|---|---|---|"]
        out += [f"| {g['t']:.0f} | {g['models']} | {g['bytes'] / 1e6:.1f} | {g['drivers']} | {g['load']:.1f} |"
                for g in growth]
        out.append("")
    return out


def _loads(state: dict) -> str:
    """The 1-minute load average over each trace arm's run (both arms' under ``--together``)."""
    parts = []
    for arm in ("cold", "keeper"):
        xs = [x["load"] for seg in state["arms"].get(arm, {}).get("segments", []) for x in seg["samples"]]
        if xs:
            parts.append(f"{arm} {np.mean(xs):.1f} (max {max(xs):.1f})")
    return "- load (1 minute) over the arms: " + ", ".join(parts) + "." if parts else ""


def _caches(state: dict) -> list[str]:
    res = list(state["results"].get("keeper", {}).values())
    rows = reading.node_caches(res, state.get("nodes", {}))
    if not rows:
        return []
    out = ["## What keeper builds for trials, per node", "",
           ("Each trial's warm start reads its module's architecture: traced once (a miss), then read from the "
            "node's cache directory by any other process (a disk hit) or remembered in the process (a hit: Tune "
            "reuses a trial's actor for the next trial of its job). Once per node means misses <= distinct "
            "architectures on that node."), "",
           "| node | trials | trial processes | distinct architectures | traces (misses) | disk hits | in-process hits "
           "| trials that imported numba |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['node']} | {r['trials']} | {r['processes']} | {r['archs']} | {r['misses']} | "
                   f"{r['disk_hits']} | {r['hits']} | {r['numba']} |")
    return out + [""]


def _zoo_start(state: dict) -> list[str]:
    rows = _zoo_start_twins(state)
    if not rows:
        return []
    out = ["## Searches that start with a zoo", "",
           ("A 2-CPU Ray, one trial at a time per tenant, ASHA (grace one round, reduction 3). ana searches first, "
            "on an empty zoo; then ben (the same space, another seed, a narrower learning-rate range) and chen (an "
            "adjacent space, wider and deeper) search at once, on the zoo ana left; the cold arm runs the same three "
            "searches without keeper. **Sooner**: the cold twin's seconds to its own final best (less the margin) "
            "over the keeper search's seconds to it (from the search's arrival)."), "",
           "| workload | search | space | cold: final best | keeper: final best | cold: s to its best | keeper: s to "
           "cold's best | sooner | trials warmed |", "|---|---|---|---|---|---|---|---|---|"]
    for workload, j, t in rows:
        space = f"w {j.space.get('widths')} x b {j.space.get('blocks')}, lr {j.space.get('lr_range')[0]:.0e}-" \
                f"{j.space.get('lr_range')[1]:.0e}"
        if t.failed:
            out.append(f"| {workload} | {j.label} ({j.tenant}) | {space} | failed | | | | | |")
            continue
        to_best = f"{t.keeper.tc_s:.0f}" if t.keeper.reached else f"not reached (ended at {t.keeper.tc_s:.0f})"
        sooner = f"**{t.tc:.2f}x**" if t.keeper.reached else "-"
        out.append(f"| {workload} | {j.label} ({j.tenant}) | {space} | {t.cold_final:.3f} | {t.keeper_final:.3f} | "
                   f"{t.cold.tc_s:.0f} | {to_best} | {sooner} | {t.warmed} of {len(j.trials)} |")
    return out + [""]


def _capacity(state: dict) -> list[str]:
    arms = state["arms"]
    full = arms.get("keeper-cap-full")
    if not full or "registered_bytes" not in full:
        return []
    registered = full["registered_bytes"]
    shares = sorted(state["settings"]["capacities"])
    out = ["## A zoo of bounded size", "",
           (f"The trace's first {state['settings']['capacity_jobs']} jobs, keeper arm, again under `capacity_bytes` "
            f"at shares of what they register unbounded ({registered / 1e6:.1f} MB); admission (the outlier filter) "
            "and eviction (value per byte: hits, decayed, and near-duplicates) on the fly, as shipped. Against the "
            "same jobs' cold arm."), "",
           "| capacity | bytes | models kept at the end | registered | refused (outliers, or larger than the budget) "
           "| evicted | trials warmed | compute saving | TC median | ended worse |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for share in shares:
        arm = "keeper-cap-full" if share >= 1.0 else f"keeper-cap{int(round(100 * share))}"
        if arm not in state["results"]:
            continue
        res = state["results"][arm]
        jobs = _jobs(state, set(res))
        tw = reading.twins(jobs, state["results"].get("cold", {}), res, state["settings"]["margin"])
        g = reading.group(tw)
        outcomes = [o for r in res.values() for o in ((r.get("callback") or {}).get("outcomes") or {}).values()]
        registered_n = sum(o.startswith("registered as") or o.startswith("recorded on") for o in outcomes)
        refused = sum(o.startswith("refused") for o in outcomes)
        end = arms[arm].get("zoo_end", {})
        cap = None if share >= 1.0 else arms[arm].get("capacity_bytes")
        evicted = registered_n - end.get("models", 0) if end else "-"
        out.append(f"| {100 * share:.0f}% | {'unbounded' if cap is None else f'{cap / 1e6:.2f} MB'} | "
                   f"{end.get('models', '-')} ({end.get('bytes', 0) / 1e6:.2f} MB) | {registered_n} | {refused} | "
                   f"{evicted} | {g.get('warmed', 0)} of {g.get('trials', 0)} | {_pct(g.get('saving'))} | "
                   f"{g.get('tc_median', float('nan')):.2f}x | {g.get('worse', '-')} |")
    return out + [""]


def _verdict(value: float, target: float, points: bool) -> str:
    """'met', or by how much ``value`` misses ``target`` (in points of a share, or in x of a speed-up)."""
    if value >= target:
        return "met"
    return f"missed by {100 * (target - value):.1f} pts" if points else f"missed by {target - value:.2f}x"


def _zoo_start_twins(state: dict) -> list[tuple[str, Job, object]]:
    rows = []
    res = state["results"]
    for workload in state["settings"].get("zoo_workloads", []):
        cold, keep = res.get(f"zoo-{workload}-cold", {}), res.get(f"zoo-{workload}-keeper", {})
        jobs = [j for j in _jobs(state) if j.index >= 10_000 and j.workload == workload]
        names = {t.name: t for t in reading.twins(jobs, cold, keep, state["settings"]["margin"])}
        rows += [(workload, j, names[j.name]) for j in jobs if j.name in names]
    return rows


def _closing(state: dict, twins: list) -> list[str]:
    out = ["## Targets", ""]
    lines = []
    for workload, j, t in _zoo_start_twins(state):
        if j.label == "first" or t.failed:
            continue
        sooner = f"{t.tc:.2f}x sooner ({_verdict(t.tc, 3.0, False)})" if t.keeper.reached else \
            "never reached its cold twin's best (target 3x sooner: missed)"
        lines.append(f"- search that starts with a zoo, {workload} {j.label}: {sooner}; final best "
                     f"{t.keeper_final:.3f} against {t.cold_final:.3f} "
                     f"({'not worse' if t.diff >= 0 else f'worse by {100 * -t.diff:.1f} pts'}).")
    if not twins:
        return out + lines + ["", "No trace ran yet.", ""]
    nas = reading.group([t for t in twins if t.kind == "nas"])
    if "saving" in nas:
        lines.append(f"- NAS kind: compute saving {_pct(nas['saving'])} (target >= 65%: "
                     f"{_verdict(nas['saving'], 0.65, True)}), TC median {nas['tc_median']:.2f}x (target >= 3x: "
                     f"{_verdict(nas['tc_median'], 3.0, False)}).")
    for label, _, saving, tc, key in reading.PUBLISHED:
        g = reading.group(_select(twins, key)) if key else {}
        if "saving" not in g:
            continue
        lines.append(f"- {label} ({key[0]} {key[1]}): saving {_pct(g['saving'])} against {100 * saving:.1f}% "
                     f"({_verdict(g['saving'], saving, True)}), TC {g['tc_median']:.2f}x against {tc:.1f}x "
                     f"({_verdict(g['tc_median'], tc, False)}).")
    g = reading.group(twins)
    if "worse" in g:
        lines.append(f"- jobs worse than their cold twin: {g['worse']} (target 0; {g['worse_1pt']} by more than one "
                     f"point, worst {100 * g['worst_diff']:+.1f} pts).")
    return out + lines + [""]


def _write(out_dir: str, name: str, state: dict, markdown: bool = True) -> None:
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, f".{name}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, os.path.join(out_dir, f"{name}.json"))
    if markdown:
        with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
            f.write(_markdown(state))


def _print_summary(state: dict) -> None:
    twins = _trace_twins(state)
    if twins:
        print(_HEAD)
        for kind in KINDS:
            part = [t for t in twins if t.kind == kind]
            if part:
                print(_row(kind, reading.group(part)))
        print(_row("all", reading.group(twins)))
    for line in _zoo_start(state) + _capacity(state):
        print(line)


if __name__ == "__main__":
    raise SystemExit(main())
