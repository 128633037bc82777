"""A whole search with and without keeper, under FIFO, ASHA and PBT, on MNIST-1D and byte-level language models:
how much sooner the search holds a model as good as the cold search's best, and whether it ends as well.

Arms (keeper_bench.search), on each workload and seed, at the same budget of trials x steps training steps, two
trials at a time on a 2-CPU Ray with keeper's shipped defaults: fifo / fifo+keeper (every draw trained for its
steps), asha / asha+keeper (ASHA, grace one round, reduction 3, up to 3x the draws, stopped at the budget),
keeperasha (asha+keeper under KeeperASHA: warmed trials compared with warmed ones, cold with cold), pbt
(Tune's PBT over the learning rate; an exploit takes the clone's whole config) / pbt+keeper (KeeperPBT over the
learning rate, width and depth). The keeper arms add exactly what a user adds: KeeperCallback and one warm_start
line (with warm_lr over the schedule); draw i (architecture, learning rate, initial weights, data order) is the
same in every arm.

Target, per workload and seed: the test accuracy of the cold FIFO search's best model (the trial with the best
final validation accuracy; trials tied at it count the mean of their test accuracies) minus 1% of it. Time to
target: the first reported round of any trial at or above it, as wall seconds from the search's start (the headline: keeper's start, registrations and warm starts included)
and as training steps the search had consumed by then. Best model: each search's own choice at its end (best final
validation accuracy), read on the test split. keeper's overhead: the driver's time in KeeperCallback's hooks, plus
the trials' time in warm_start and the CPU time of keeper's actors, each halved (two slots share the machine),
against the search's wall time. Per trial: each warmed FIFO trial against its cold twin (same draw, same steps).

Usage:
    python scripts/bench_search.py                       # both workloads, 3 seeds, every arm (a few hours)
    python scripts/bench_search.py --workload lm --arms asha,asha+keeper --seeds 1
    python scripts/bench_search.py --resume reports/bench_search.json --rerun fifo+keeper   # add or redo arms
    python scripts/bench_search.py --resume reports/bench_search.json --report   # the report again, no runs
    python scripts/bench_search.py --quick               # 1 seed, 8 trials of 100 steps: a smoke run

Trials train on the GPU where torch sees one (``--device``; two at a time, half the GPU each), else on the CPU.
Writes reports/bench_search.md and .json, rewritten after every arm run (marked incomplete until the end). Run it
on an otherwise idle machine: wall times are its figures (the report gives the load beside them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np

from keeper_bench.pbt import PbtRun
from keeper_bench.reporting import LoadSampler, spread
from keeper_bench.search import (ARMS, cost_line, scheduler_of, summarize, target_of, twins, uses_keeper,
                                 wall_to_target)

WORKLOADS = ("mnist1d", "lm", "digits")
SCHEDULERS = ("fifo", "asha", "pbt")
#: (cold arm, keeper arm) read against each other
PAIRS = (("fifo", "fifo+keeper"), ("fifo", "fifo+keeper-shrink"), ("asha", "asha+keeper"), ("asha", "keeperasha"),
         ("pbt", "pbt+keeper"), ("pbt", "keeperpbt"))
#: warm_start's phases (WarmResult.seconds)
PHASES = ("connect", "trace", "choose", "inherit", "load", "save")


def settings(workload: str, args: argparse.Namespace) -> PbtRun:
    """The workload's settings, with the command's --trials / --steps / --round-steps where it gives them."""
    given = {"population": args.trials, "steps": args.steps, "round_steps": args.round_steps}
    base = {"device": args.device, **{k: v for k, v in given.items() if v is not None}}
    if workload == "lm":
        return PbtRun.language(**{"population": 32, "steps": 400, "round_steps": 50, **base})
    if workload == "digits":
        return PbtRun.digits(**base)
    return PbtRun(**{"population": 32, "steps": 400, "round_steps": 50, **base})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=(*WORKLOADS, "both"), default="both")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--trials", type=int, help="FIFO trials, ASHA's budget unit, PBT's population (default: 32; "
                   "digits 16)")
    p.add_argument("--steps", type=int, help="training steps of a FIFO trial (default: 400; digits 320)")
    p.add_argument("--round-steps", type=int, help="steps between evaluations, a rung, a PBT round (default: 50; "
                   "digits 40)")
    p.add_argument("--pbt-interval", type=int, default=2, help="rounds between PBT perturbations")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the trials train (auto: cuda where torch sees a GPU, two trials sharing it, else cpu)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {','.join(ARMS)}")
    p.add_argument("--shrink", type=float, help="warm_start's shrink in the keeper arms (default: keeper's)")
    p.add_argument("--resume", help="a bench_search.json to add to (its settings are kept)")
    p.add_argument("--rerun", default="", help="with --resume: arms to run again even where they have results")
    p.add_argument("--report", action="store_true", help="with --resume: only write the report again from its runs")
    p.add_argument("--quick", action="store_true", help="1 seed, 8 trials of 100 steps in rounds of 25")
    p.add_argument("--workdir", help="zoos, Tune results and the cold FIFO arm's final weights (default: "
                   "OUT/tmp/bench_search, kept between runs so a resumed run's copy arm finds them)")
    p.add_argument("--out", default="reports")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.trials, args.steps, args.round_steps = 1, 8, 100, 25
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        p.error(f"unknown arms {unknown}; expected a subset of {','.join(ARMS)}")
    workloads = list(WORKLOADS) if args.workload == "both" else [args.workload]
    name = "bench_search" + ("_quick" if args.quick else "")
    command = "python scripts/bench_search.py" + (" " + " ".join(sys.argv[1:]) if argv is None and sys.argv[1:] else "")
    state = {"commands": [], "runs": {}, "settings": {}}
    if args.resume:
        with open(args.resume) as f:
            state = json.load(f)
    if args.report:
        if not args.resume:
            p.error("--report rewrites the report of a run: give its json with --resume")
        _write(args.out, name, state, done=bool(state.get("complete")))
        return 0
    state["commands"].append(command)
    rerun = {a for a in args.rerun.split(",") if a}

    import ray
    import torch

    from keeper_bench.search import run_arm

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    elif args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here; use --device cpu (or auto)")

    workdir = os.path.abspath(args.workdir or os.path.join(args.out, "tmp", "bench_search"))
    t0 = time.perf_counter()
    for seed in range(args.seeds):
        for workload in workloads:
            known = state["settings"].get(workload)
            run = PbtRun(**known) if known is not None else settings(workload, args)
            state["settings"][workload] = asdict(run)
            for arm in arms:
                key = f"{workload}/{arm}/{seed}"
                if key in state["runs"] and arm not in rerun:
                    continue
                # a fresh Ray per arm: nothing one arm leaves (a worker, a held CPU) reaches the next
                ray.init(address="local", num_cpus=2, num_gpus=1 if args.device == "cuda" else 0,
                         include_dashboard=False, log_to_driver=False)
                try:
                    load = LoadSampler(every=10.0)
                    out = run_arm(arm, run, seed, workdir, pbt_interval=args.pbt_interval,
                                  shrink=args.shrink if uses_keeper(arm) else None)
                    load.stop()
                finally:
                    ray.shutdown()
                out["load"] = load.summary()
                out["shrink_arg"] = args.shrink
                out["commit"] = _commit()
                state["runs"][key] = out
                print(f"{key}: {out['wall_s']:.0f} s, {len(out['errors'])} errors, load {out['load']['mean']:.1f}",
                      flush=True)
                _write(args.out, name, state, done=False)
    state["versions"] = f"torch {torch.__version__}, ray {ray.__version__}"
    state["wall_min"] = state.get("wall_min", 0.0) + (time.perf_counter() - t0) / 60
    _write(args.out, name, state, done=True)
    return 0


# --------------------------------------------------------------------------------------------------- report
def cold_arm(arm: str) -> str:
    """The arm an arm is compared with: the same scheduler without keeper (fifo for the copy bound, pbt for
    keeperpbt)."""
    return scheduler_of(arm)


def rows(state: dict) -> tuple[dict, dict]:
    """Per (workload, arm, seed) the summary against the best of the same scheduler's cold search on that workload
    and seed (its model's test accuracy minus 1% of it); and those targets, per (workload, cold arm, seed)."""
    targets: dict[tuple[str, str, int], float] = {}
    for key, run in state["runs"].items():
        workload, arm, seed = key.split("/")
        if arm in SCHEDULERS:
            targets[(workload, arm, int(seed))] = target_of(run["events"])
    out: dict[tuple[str, str, int], dict] = {}
    for key, run in state["runs"].items():
        workload, arm, seed = key.split("/")
        target = targets.get((workload, cold_arm(arm), int(seed)))
        if target is not None:
            out[(workload, arm, int(seed))] = summarize(run, target)
    return out, targets


def _mean(values: list[float], fmt: str) -> str:
    return spread(values, fmt) if values else "-"


def _markdown(state: dict, done: bool) -> str:
    table, targets = rows(state)
    out = ["# A whole search with and without keeper (scripts/bench_search.py)", ""]
    if not done:
        out += ["**Incomplete**: the run is still going or was stopped; the tables hold the arm runs that finished.",
                ""]
    loads = [r["load"]["mean"] for r in state["runs"].values() if "load" in r]
    out += [f"Commands: {'; '.join(f'`{c}`' for c in state['commands'])}. Machine: {platform.machine()}, "
            f"{os.cpu_count()} cores, Ray with 2 CPUs (two trials at a time, one thread each), keeper's shipped "
            f"defaults; {state.get('versions', '')}; 1-minute load average over the arm runs "
            f"{np.mean(loads) if loads else 0:.1f} (2 is this benchmark alone).", ""]
    for workload, s in state["settings"].items():
        out.append(f"- **{workload}** (trials on {s.get('device', 'cpu')}): {s['population']} trials x {s['steps']} "
                   f"steps = {s['population'] * s['steps']} "
                   f"training steps per arm, rounds of {s['round_steps']}; widths {s['widths']}, depths {s['blocks']}, "
                   f"learning rate log-uniform in {s['lr_range']}, batch {s['batch_size']}.")
    out += ["", ("Target: the best model of the same search without keeper (same scheduler, same draws; its best "
            "final validation accuracy), its test accuracy minus 1% of it. **Sooner**: the cold search's wall time "
            "to the target over the keeper search's; a search that never reaches it counts its whole wall time. "
            "**Search wall**: the cold search's whole wall time over the keeper search's (below 1: keeper's took "
            "longer). Best model: the search's own choice at its end (best final validation accuracy), on the test split; "
            "where several trials tie at that validation accuracy, the mean of their test accuracies (the pick "
            "among them is arbitrary: one validation example would decide it). First report: when the "
            "search's first trial first reported (s from the search's start)."), ""]
    out += ["## Time to the cold search's best, per scheduler", "",
            "| workload | arm | cold: wall to target (s) | keeper: wall to target (s) | sooner (x, per seed) | "
            "search wall, cold / keeper (x, per seed) | first report, cold / keeper (s) | best model, cold | "
            "best model, keeper | keeper's share of the wall time | errors |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for workload in state["settings"]:
        for cold, keep in PAIRS:
            seeds = sorted({s for (w, a, s) in table if w == workload and a in (cold, keep)})
            pairs = [(table.get((workload, cold, s)), table.get((workload, keep, s))) for s in seeds]
            pairs = [(c, k) for c, k in pairs if c and k]
            if not pairs:
                continue
            wall = wall_to_target
            ratios = [wall(c) / wall(k) for c, k in pairs]
            whole = [c["wall_s"] / k["wall_s"] for c, k in pairs]
            out.append(
                f"| {workload} | {keep} | {_mean([wall(c) for c, _ in pairs], '.0f')} | "
                f"{_mean([wall(k) for _, k in pairs], '.0f')} | **{np.mean(ratios):.2f}x** "
                f"({' / '.join(f'{r:.2f}' for r in ratios)}) | **{np.mean(whole):.2f}x** "
                f"({' / '.join(f'{r:.2f}' for r in whole)}) | "
                f"{_mean([c['first_report_s'] for c, _ in pairs], '.1f')} / "
                f"{_mean([k['first_report_s'] for _, k in pairs], '.1f')} | "
                f"{_mean([c['best_test'] for c, _ in pairs], '.3f')} | "
                f"{_mean([k['best_test'] for _, k in pairs], '.3f')} | "
                f"{100 * np.mean([k['overhead_share'] for _, k in pairs]):.1f}% | "
                f"{sum(c['errors'] for c, _ in pairs)} / {sum(k['errors'] for _, k in pairs)} |")
    out += ["", ("Mean ± sample std over seeds. keeper's share: its wall-equivalent seconds (below) over the keeper "
            "search's wall time. Errors: cold / keeper. keeperpbt is another search than pbt (KeeperPBT mutates "
            "width and depth as well as the learning rate), read against pbt."), ""]
    out += _parts(table, state)
    out += ["## Per arm and seed", "",
            "| workload | seed | target | arm | reached | wall to target (s) | steps to target | best model (arch, lr, "
            "test acc) | trials (warmed / same arch) | wall (s) | slot idle after a trial ends, median (s) | driver "
            "hooks (s) | warm_start (s) | actors' CPU (s) | load |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (workload, arm, seed), r in sorted(table.items(), key=lambda kv: (kv[0][0], kv[0][2], ARMS.index(kv[0][1]))):
        run = state["runs"][f"{workload}/{arm}/{seed}"]
        reached = (f"yes | {r['wall_to_target_s']:.0f} | {r['steps_to_target']}" if r["reached"] else "no | - | -")
        out.append(f"| {workload} | {seed} | {targets[(workload, cold_arm(arm), seed)]:.3f} | {arm} | {reached} | "
                   f"{r['best_arch']}, {r['best_lr']:.4f}, {r['best_test']:.3f}"
                   f"{f' ({tied} tied)' if (tied := r.get('best_tied', 1)) > 1 else ''} | {r['trials']} ({r['warmed']} / "
                   f"{r['same_arch']}) | {r['wall_s']:.0f} | {r['gap_median_s']:.2f} | {r['hook_s']:.1f} | "
                   f"{r['warm_s']:.1f} | {r['actor_cpu_s']:.1f} | {run.get('load', {}).get('mean', 0):.1f} |")
    out += _cost(table, state) + _copy_bound(table, targets, state) + _honesty(state)
    out += ["", "## Warmed trials against their cold twins (FIFO)", "",
            ("Each warmed FIFO trial against the same draw trained cold for the same steps: fifo+keeper with keeper's "
             "default (a same-architecture parent's whole function), fifo+keeper-shrink with warm_start(shrink=0.5) "
             "(shrink and perturb). Training CPU: the CPU seconds of every draw's training rounds (the same steps of "
             "the same architectures in both arms), keeper's arm over the cold arm: how fast the machine ran the same "
             "work in each, keeper's own processes and calls apart (above 1: the keeper arm's training ran slower)."),
            "",
            "| workload | seed | arm | warmed trials | ended below their cold twin | by more than 1 point | mean final "
            "difference | worst | training CPU, keeper / cold | search wall, cold / keeper |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for key, run in sorted(state["runs"].items()):
        workload, arm, seed = key.split("/")
        cold = state["runs"].get(f"{workload}/fifo/{seed}")
        if scheduler_of(arm) != "fifo" or not uses_keeper(arm) or cold is None:
            continue
        t, t1 = twins(cold, run), twins(cold, run, margin=0.01)
        out.append(f"| {workload} | {seed} | {arm} | {t['warmed']} | {t['below']} | {t1['below']} | "
                   f"{t['mean_diff']:+.3f} | {t['worst_diff']:+.3f} | {t['training_cpu_ratio']:.2f} | "
                   f"{cold['wall_s'] / run['wall_s']:.2f}x |")
    return "\n".join(out) + "\n"


def _parts(table: dict, state: dict, concurrency: int = 2) -> list[str]:
    """keeper's share of a search's wall time, split into its parts, per workload and keeper arm (means over
    seeds)."""
    out = ["## Where keeper's time goes", "",
           (f"Wall-equivalent seconds per search: the driver's time in KeeperCallback's hooks (Tune's loop waits for "
            f"them), and, divided by the {concurrency} slots the trials share, the trials' time in warm_start (by "
            "phase: the config and finding the service, trace, parent choice with its wait for registrations in "
            "flight, inherit, load, the files a trial leaves), the driver's registration thread's CPU (reading "
            "checkpoints, filling templates) and the CPU of keeper's actors (by class, boot and imports included). "
            "keeper boots no process for a search on an empty zoo until its first trial ends; a trial that finds "
            "the service running loads the front door's module, which Ray needs to make the actor's handle, within "
            "its connect phase."), "",
           "| workload | arm | seeds | hooks | warm_start (connect / trace / choose / inherit / load / save) | "
           "registration thread | actors' CPU | total | share of the wall time |", "|---|---|---|---|---|---|---|---|---|"]
    for workload in state["settings"]:
        for arm in ARMS:
            rs = [r for (w, a, _), r in table.items() if w == workload and a == arm]
            if not rs or not uses_keeper(arm):
                continue
            # a phase the runs did not record (``connect``, before warm_start timed it) reads "-", not 0
            ph = {k: (f"{np.mean([r['warm_phases'].get(k, 0.0) for r in rs]):.2f}"
                      if any(k in r["warm_phases"] for r in rs) else "-") for k in PHASES}
            actors: dict[str, list[float]] = {}
            for r in rs:
                for k, v in r["actor_cpu"].items():
                    actors.setdefault(k, []).append(v)
            shown = ", ".join(f"{k} {np.sum(v) / len(rs):.1f}" for k, v in sorted(actors.items())) or "0"
            out.append(f"| {workload} | {arm} | {len(rs)} | {np.mean([r['hook_s'] for r in rs]):.2f} | "
                       f"{np.mean([r['warm_s'] for r in rs]):.2f} ({' / '.join(ph[k] for k in PHASES)}) | "
                       f"{np.mean([r['register_cpu_s'] for r in rs]):.2f} | {shown} | "
                       f"{np.mean([r['overhead_s'] for r in rs]):.1f} | "
                       f"{100 * np.mean([r['overhead_share'] for r in rs]):.1f}% |")
    return out


def _cost(table: dict, state: dict, concurrency: int = 2) -> list[str]:
    """keeper's overhead split into a part per search and a part per trial: a least-squares line through the keeper
    arm runs' overhead (wall-equivalent seconds, as in the tables above) against the trials each started, per
    workload; and the trial length at which the per-trial part is 2% of a trial's time."""
    out = ["", "## What keeper costs a search, per search and per trial", "",
           ("A least-squares line through every keeper arm run's overhead (s, as above) against the trials it "
            f"started: once per search (the actors' start and imports, idle time) plus per trial (warm_start in the "
            f"trial, the front door's parent choice and transform, the registration). On a search of n trials of T "
            f"s, {concurrency} at a time, the share is (fixed + n x per trial) / (n T / {concurrency}): at most 2% "
            f"once T >= {concurrency} x per trial / 0.02, ignoring the fixed part. A projection from this "
            "benchmark's runs, not a run of longer trials."), "",
           "| workload | keeper arm runs | fixed (s) | per trial (s) | trial length here, mean (s) | share here, mean "
           "| trial length for 2% (s) |", "|---|---|---|---|---|---|---|"]
    for workload in state["settings"]:
        rows = [(r, state["runs"][f"{w}/{a}/{s}"]) for (w, a, s), r in table.items()
                if w == workload and uses_keeper(a) and scheduler_of(a) != "pbt"]
        if len(rows) < 2:
            continue
        fixed, per_trial = cost_line([r["trials"] for r, _ in rows], [r["overhead_s"] for r, _ in rows])
        lengths = [e - s for _, run in rows for t in run["trials"].values() for s, e in zip(t["starts"], t["ends"])]
        out.append(f"| {workload} | {len(rows)} | {fixed:.1f} | {per_trial:.3f} | {np.mean(lengths):.1f} | "
                   f"{100 * np.mean([r['overhead_share'] for r, _ in rows]):.1f}% | "
                   f"{concurrency * per_trial / 0.02:.0f} |")
    return out


def _copy_bound(table: dict, targets: dict, state: dict) -> list[str]:
    """ASHA with each draw restarted from its own cold-trained weights, against ASHA cold and ASHA with keeper."""
    out = ["", "## The copy bound under ASHA", "",
           ("asha+copy restarts every draw the cold FIFO arm trained from its own final weights there (keeper's "
            "restart recipe), the later draws cold: what a perfect warm start could give this search. Share: "
            "keeper's saving over the copy's, (cold - keeper) / (cold - copy), in wall time to the target."), "",
           "| workload | seed | asha (s) | asha+keeper (s) | asha+copy (s) | keeper's share of the copy's saving |",
           "|---|---|---|---|---|---|"]
    wall = wall_to_target
    for (workload, seed) in sorted({(w, s) for (w, _, s) in targets}):
        c, k, b = (table.get((workload, a, seed)) for a in ("asha", "asha+keeper", "asha+copy"))
        if not (c and k and b):
            continue
        share = (wall(c) - wall(k)) / (wall(c) - wall(b)) if wall(c) > wall(b) else float("nan")
        out.append(f"| {workload} | {seed} | {wall(c):.0f} | {wall(k):.0f} | {wall(b):.0f} | {100 * share:.0f}% |")
    return out


def _honesty(state: dict) -> list[str]:
    """Whether a search still finds the configuration that trains best: the draw each search ends with, and how that
    draw's configuration trains from scratch (its cold FIFO run), ranked among the cold FIFO runs."""
    from keeper_bench.search import best_model, final_by_trial

    out = ["", "## Does the search still pick the configuration that trains best?", "",
           ("The draw each search ends with (its best model's trial) and how that draw's configuration did trained "
            "cold for the full run (the cold FIFO arm; draws past the FIFO trials have none), ranked among the cold "
            "FIFO runs (1: the configuration that trains best)."), "",
           "| workload | seed | arm | chosen draw | its config | its cold final test acc | rank of its config |",
           "|---|---|---|---|---|---|---|"]
    for key, run in sorted(state["runs"].items()):
        workload, arm, seed = key.split("/")
        cold = state["runs"].get(f"{workload}/fifo/{seed}")
        if cold is None or scheduler_of(arm) == "pbt":
            continue
        index = {tid: t["index"] for tid, t in cold["trials"].items()}
        finals = {index[tid]: e["test_accuracy"] for tid, e in final_by_trial(cold["events"]).items()}
        ranked = sorted(finals, key=lambda i: -finals[i])
        best = best_model(run["events"])
        draw = run["trials"][best["trial"]]["index"]
        config = f"w{best['width']}/b{best['blocks']}, lr {best['lr']:.4f}"
        if draw in finals:
            out.append(f"| {workload} | {seed} | {arm} | {draw} | {config} | {finals[draw]:.3f} | "
                       f"{ranked.index(draw) + 1} of {len(ranked)} |")
        else:
            out.append(f"| {workload} | {seed} | {arm} | {draw} | {config} | - | - |")
    return out


def _commit() -> str:
    """The checkout's commit (each arm run records the code it ran), or '' outside git."""
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _write(out_dir: str, name: str, state: dict, done: bool) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump({**state, "complete": done}, f)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(_markdown(state, done))


if __name__ == "__main__":
    raise SystemExit(main())
