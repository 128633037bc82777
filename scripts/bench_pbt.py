"""Population-based training across architectures against three other ways to spend one budget (MNIST-1D and a
byte-level language model, through Tune).

Arms (keeper_bench.pbt): random search, cold; ASHA with KeeperCallback and warm_start; Tune's
PopulationBasedTraining over the learning rate of one architecture (the middle of the space); KeeperPBT over the
learning rate, the width and the depth of a 1-D ResNet. Every arm spends the same budget, population x steps
per member, in rounds that end with one evaluation in eval mode (validation split: what schedulers rank by; test
split: what the target reads).

Target, per seed, fixed before the other arms are read: the best final test accuracy of the random-search members
minus a margin (1 point). Time to target: the first reported round, of any member, whose test accuracy reaches it;
counted as the training steps the whole experiment had consumed by then (rounds in the order the driver received
them: load-independent, the primary figure) and as wall seconds from the experiment's start (secondary, with the
1-minute load average: the machine's cores may be shared). An arm that never reaches it counts its whole budget.

Usage:
    python scripts/bench_pbt.py                  # MNIST-1D: 3 seeds, population 8 x 800 steps, rounds of 100
    python scripts/bench_pbt.py --workload lm    # GPT-2 on bytes, the same settings
    python scripts/bench_pbt.py --quick          # 1 seed, population 4 x 200 steps, rounds of 50 (a smoke run)

Writes reports/bench_pbt.md (``--workload lm``: bench_pbt_lm.md) and .json, rewritten after every arm run and
marked incomplete until the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np

from keeper_bench.pbt import ARMS, PbtRun
from keeper_bench.reporting import LoadSampler, spread


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=("mnist1d", "lm"), default="mnist1d")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--population", type=int, default=8)
    p.add_argument("--steps", type=int, help="training steps per member (default 800)")
    p.add_argument("--round-steps", type=int, default=100, help="steps between evaluations (a PBT round)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {','.join(ARMS)}")
    p.add_argument("--quick", action="store_true", help="1 seed, population 4 x 200 steps, rounds of 50")
    p.add_argument("--workdir", help="zoos and Tune results (default: a new temporary directory)")
    p.add_argument("--out", default="reports")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.population, args.steps, args.round_steps = 1, 4, 200, 50
    arms = [a for a in args.arms.split(",") if a]
    if "random" not in arms:
        p.error("the random arm defines the target: keep it in --arms")
    settings = {"population": args.population, "round_steps": args.round_steps,
                **({"steps": args.steps} if args.steps else {})}
    run = PbtRun.language(**settings) if args.workload == "lm" else PbtRun(**settings)
    name = ("bench_pbt_lm" if args.workload == "lm" else "bench_pbt") + ("_quick" if args.quick else "")
    command = "python scripts/bench_pbt.py" + (" " + " ".join(sys.argv[1:]) if argv is None and sys.argv[1:] else "")

    import ray
    import torch

    from keeper_bench.pbt import run_arm

    workdir = args.workdir or tempfile.mkdtemp(prefix="bench_pbt-")
    load = LoadSampler(every=15.0)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    t0 = time.perf_counter()
    results: dict[str, dict[int, dict]] = {a: {} for a in arms}
    try:
        for seed in range(args.seeds):
            for arm in arms:
                arm_load = LoadSampler(every=10.0)
                out = run_arm(arm, run, seed, workdir)
                arm_load.stop()
                out["load"] = arm_load.summary()
                results[arm][seed] = out
                print(f"{arm} seed {seed}: {out['wall_s']:.0f} s, {len(out['errors'])} errors, "
                      f"load {out['load']['mean']:.1f}", flush=True)
                _write(args, run, arms, results, command, load, time.perf_counter() - t0, name, done=False)
    finally:
        ray.shutdown()
        load.stop()
    _write(args, run, arms, results, command, load, time.perf_counter() - t0, name, done=True,
           versions=f"torch {torch.__version__}, ray {ray.__version__}")
    return 0


def summarize(run: PbtRun, events: list[dict], target: float) -> dict:
    """One arm run's figures against ``target`` (see the module docstring)."""
    hit = next((e for e in events if e["test_accuracy"] >= target), None)
    last: dict[str, dict] = {}
    for e in events:
        last[e["trial"]] = e
    best = max(last.values(), key=lambda e: e["val_accuracy"])
    restores = [e for e in events if e["source_arch"]]
    exploits = [e for e in restores if e["exploit"]]
    across = [e for e in exploits if json.loads(e["source_arch"]) != [e["width"], e["blocks"]]]
    return {"reached": hit is not None,
            "steps_to_target": hit["population_steps"] if hit else run.budget,
            "wall_to_target_s": hit["wall_s"] if hit else None,
            "load_at_target": hit["load"] if hit else None,
            "steps": events[-1]["population_steps"] if events else 0,
            "cpu_s": float(sum(e["round_cpu_s"] + e["setup_cpu_s"] for e in events)),
            "setup_s": float(sum(e["setup_s"] for e in events)),
            "best_val": best["val_accuracy"], "best_test": best["test_accuracy"],
            "best_arch": f"w{best['width']}/b{best['blocks']}",
            "max_test": max(e["test_accuracy"] for e in events),
            "trials": len(last), "restores": len(restores), "exploits": len(exploits), "across": len(across),
            "across_preserved": sum(bool(e["preserved"]) for e in across),
            "warmed": sum(1 for e in events if e["parent"] and not e["source_arch"])}


def _target(run: PbtRun, random_events: list[dict]) -> float:
    last: dict[str, dict] = {}
    for e in random_events:
        last[e["trial"]] = e
    return max(e["test_accuracy"] for e in last.values()) - run.margin


def _write(args, run: PbtRun, arms: list[str], results: dict, command: str, load: LoadSampler, wall: float,
           name: str, done: bool, versions: str = "") -> None:
    rows: dict[str, dict[int, dict]] = {a: {} for a in arms}
    targets: dict[int, float] = {}
    for seed, rnd in results["random"].items():
        targets[seed] = _target(run, rnd["events"])
        for arm in arms:
            if seed in results[arm]:
                r = results[arm][seed]
                rows[arm][seed] = {**summarize(run, r["events"], targets[seed]), "wall_s": r["wall_s"],
                                   "load": r["load"]["mean"], "errors": len(r["errors"])}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump({"command": command, "settings": asdict(run), "seeds": args.seeds, "complete": done,
                   "targets": targets, "rows": rows, "results": results}, f, indent=1)
    with open(os.path.join(args.out, f"{name}.md"), "w") as f:
        f.write(_markdown(run, arms, rows, targets, command, load, wall, done, versions, args.seeds))


def _markdown(run: PbtRun, arms: list[str], rows: dict, targets: dict, command: str, load: LoadSampler,
              wall: float, done: bool, versions: str, seeds: int) -> str:
    ls = load.summary()
    w, b = run.middle
    title = "a byte-level language model" if run.workload == "lm" else "MNIST-1D"
    out = [f"# Population-based training across architectures, {title} (scripts/bench_pbt.py)", ""]
    if not done:
        out += ["**Incomplete**: the run is still going or was stopped; the tables hold the arm runs that finished.",
                ""]
    out += [(f"Command: `{command}`; wall time {wall / 60:.1f} min on 2 CPUs shared with other work: 1-minute load "
            f"average {ls['mean']:.1f} on average over the run (min {ls['min']:.1f}, max {ls['max']:.1f}; 2 is a "
            f"full load from this benchmark alone), {platform.machine()}{', ' + versions if versions else ''}."), "",
            _workload(run) +
            (f"Adam at a constant learning rate, log-uniform in {list(run.lr_range)}, batch {run.batch_size}. "
            f"Budget per arm: population {run.population} x {run.steps} steps = {run.budget} training steps, in "
            f"rounds of {run.round_steps} steps, each ending in one evaluation (eval mode). Ray with 2 CPUs, one "
            "per trial, torch on one thread per trial."), "",
            ("Arms: **random**: the population's draws, cold. **asha-keeper**: ASHA (rungs at 1 and 3 rounds, "
            f"reduction factor 3, at most {run.rounds} rounds) over up to {run.asha_factor * run.population} draws, "
            "stopped when the budget is spent; KeeperCallback + warm_start, each trial warm from the trials finished "
            f"before it. **pbt**: Tune's PopulationBasedTraining over the learning rate, every member w{w}/b{b} "
            "(the middle of the space), an exploit loads the clone's state_dict. **keeper-pbt**: KeeperPBT over "
            "the learning rate, w and b (listed values mutate to a neighbour or are redrawn), warm_start restoring "
            "the clone onto the member's architecture. Both PBTs: synchronous, a perturbation every round, "
            "quantile 0.25. Draw i (architecture, learning rate, initial weights, data order) is the same in every "
            "arm that uses it."), "",
            (f"Target, per seed: the best final test accuracy of the random-search members minus {run.margin:g}. "
            "Steps to target: the training steps the whole experiment had consumed when a member's round first "
            "reached it (primary, load-independent); an arm that never reaches it counts its budget. Wall to "
            "target: seconds from the experiment's start, with the 1-minute load average then. Best model: the "
            "member with the best validation accuracy at its last round, read on the test split."), ""]
    out += ["## Mean over seeds", "",
            ("| arm | seeds | reached | steps to target | wall to target (s) | best model's test acc | "
            "steps run | trainable CPU (s) | wall (s) | load |"), "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        rs = [rows[arm][s] for s in sorted(rows[arm])]
        if not rs:
            continue
        walls = [r["wall_to_target_s"] for r in rs if r["wall_to_target_s"] is not None]
        out.append(f"| {arm} | {len(rs)} | {sum(r['reached'] for r in rs)} | "
                   f"{spread([r['steps_to_target'] for r in rs], '.0f')} | "
                   f"{spread(walls, '.0f') if walls else '-'} | {spread([r['best_test'] for r in rs], '.3f')} | "
                   f"{spread([r['steps'] for r in rs], '.0f')} | {spread([r['cpu_s'] for r in rs], '.0f')} | "
                   f"{spread([r['wall_s'] for r in rs], '.0f')} | {np.mean([r['load'] for r in rs]):.1f} |")
    out += ["", ("Mean ± sample std over seeds. Steps run: the training steps the arm consumed in all (its budget, "
            "ASHA a round over at most). Trainable CPU: the trials' thread CPU time for training, evaluation and "
            "their start (warm_start or the state_dict load included), which other work on the machine does not "
            "inflate."), "", "## Per seed", "",
            ("| seed | target | arm | reached | steps to target | wall to target (s) | load then | best model "
            "(arch, test acc) | highest test acc | restores / exploits / across archs (preserved) | "
            "warmed from the zoo | "
            "wall (s) | errors |"), "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for seed in sorted(targets):
        for arm in arms:
            r = rows[arm].get(seed)
            if r is None:
                continue
            wall_t = f"{r['wall_to_target_s']:.0f}" if r["reached"] else "-"
            load_t = f"{r['load_at_target']:.1f}" if r["reached"] else "-"
            out.append(f"| {seed} | {targets[seed]:.3f} | {arm} | {'yes' if r['reached'] else 'no'} | "
                       f"{r['steps_to_target']} | {wall_t} | {load_t} | {r['best_arch']}, {r['best_test']:.3f} | "
                       f"{r['max_test']:.3f} | {r['restores']} / {r['exploits']} / {r['across']} "
                       f"({r['across_preserved']}) | "
                       f"{r['warmed']} | {r['wall_s']:.0f} | {r['errors']} |")
    out += ["", "## Where KeeperPBT wins and where it does not", "", _verdict(arms, rows, seeds), ""]
    return "\n".join(out)


def _workload(run: PbtRun) -> str:
    """The report's sentence on the workload and its search space."""
    if run.workload == "lm":
        return (f"Workload: byte-level GPT-2s (Hugging Face config, random initialisation) of width w in "
                f"{list(run.widths)} (heads of 16 channels, FFN 4w) and b in {list(run.blocks)} layers, on the Python "
                f"standard library's source (keeper_bench.lm's corpus); windows of {run.context} bytes; quality is "
                f"next-token accuracy on {run.eval_windows} fixed windows of the held-out text's first half "
                f"(validation) and second half (test); gradients clipped to norm 1; ")
    return (f"Workload: MNIST-1D ({run.num_samples} generated samples: {int(run.num_samples * 0.8) - run.val_size} "
            f"train, {run.val_size} validation, {run.num_samples // 5} test); 1-D ResNets with stages [w, 2w, 4w], "
            f"w in {list(run.widths)}, b in {list(run.blocks)} blocks per stage, kernel {run.kernel}; ")


def _verdict(arms: list[str], rows: dict, seeds: int) -> str:
    """Per other arm, on how many seeds KeeperPBT was faster to target (steps, wall) and had the better best model."""
    if "keeper-pbt" not in arms or not rows["keeper-pbt"]:
        return "KeeperPBT has not run yet."
    k = rows["keeper-pbt"]
    parts = []
    for arm in arms:
        if arm == "keeper-pbt":
            continue
        common = sorted(set(k) & set(rows[arm]))
        if not common:
            continue
        steps = sum(k[s]["steps_to_target"] < rows[arm][s]["steps_to_target"] for s in common)
        ties = sum(k[s]["steps_to_target"] == rows[arm][s]["steps_to_target"] for s in common)
        wall = sum((k[s]["wall_to_target_s"] or float("inf")) < (rows[arm][s]["wall_to_target_s"] or float("inf"))
                   for s in common)
        acc = sum(k[s]["best_test"] > rows[arm][s]["best_test"] for s in common)
        parts.append(f"against {arm}, KeeperPBT reached the target in fewer training steps on {steps} of "
                     f"{len(common)} seeds ({ties} ties), sooner in wall time on {wall}, and ended with a better "
                     f"best model on {acc}")
    return "Per seed: " + "; ".join(parts) + "."


if __name__ == "__main__":
    raise SystemExit(main())
