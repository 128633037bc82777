"""Training saved by warm starts on a NAS workload (MNIST-1D, Ray Tune), against cold start and baselines.

Architectures (1-D VGG-style CNNs, ResNets, MLPs, small transformers) arrive in a fixed order and are trained
through Ray Tune, once per arm; see keeper_bench/nas.py for the arms and for how steps-to-target is defined.
Accuracy is read every 10 steps with BatchNorm statistics re-estimated for the weights of that step
(keeper_bench.workload.with_precise_bn): the running statistics average the last ~10-20 steps, as long as the
interval between two readings, so they would judge weights by their predecessors' statistics. The report reads the
same runs with the running statistics, and on a grid twice as coarse, too. Writes a markdown report, a JSON of
every trial, and two PNG plots.

Usage:
    python scripts/bench_training.py            # 40 archs, 5 seeds for cold/keeper, baselines on seed 0 (~30 min, 2 cores)
    python scripts/bench_training.py --quick    # 12 archs, 1 seed, cold/keeper/published (< 5 min)
    python scripts/bench_training.py --baseline-seeds 3   # every arm on every seed
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--archs", type=int, default=40)
    p.add_argument("--seeds", type=int, default=5, help="seeds for the cold and keeper arms")
    p.add_argument("--baseline-seeds", type=int, default=1, help="seeds for the baseline arms")
    p.add_argument("--steps", type=int, default=200, help="training steps per trial (the budget)")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=10,
                   help="evaluate test accuracy every N steps; the report also reads the runs on a grid twice "
                        "as coarse")
    p.add_argument("--running-bn", action="store_true",
                   help="count steps with the models' running BatchNorm statistics instead of statistics "
                        "re-estimated for the current weights (the report reads the runs both ways either way)")
    p.add_argument("--quick", action="store_true", help="12 archs, 1 seed, 150 steps, cold/keeper/published")
    p.add_argument("--out", default="reports", help="directory for bench_training.md/.json and figures/")
    args = p.parse_args(argv)
    if args.quick:
        args.archs, args.seeds, args.baseline_seeds, args.steps = 12, 1, 1, 150

    import ray
    import torch

    from keeper_bench.nas import ARMS, NasRun, arrivals, records_to_json, run_arm, summarize

    run = NasRun(steps=args.steps, concurrency=args.concurrency, eval_every=args.eval_every,
                 precise_bn=not args.running_bn)
    specs = arrivals(args.archs, seed=0)
    baselines = ["published"] if args.quick else [a for a in ARMS if a not in ("cold", "keeper")]
    ray.init(address="local", num_cpus=args.concurrency, include_dashboard=False, log_to_driver=False)
    workdir = tempfile.mkdtemp(prefix="keeper-bench-training-")
    results: dict[str, dict[int, list]] = {}
    t_all = time.perf_counter()
    for seed in range(max(args.seeds, args.baseline_seeds)):
        arms = (["cold", "keeper"] if seed < args.seeds else ["cold"]) + (baselines if seed < args.baseline_seeds else [])
        for arm in arms:
            t0 = time.perf_counter()

            def show(a, r):
                print(f"  seed {seed} {a:18s} #{r.index:02d} {r.arch:40s} parent {r.parent or '-':32s} "
                      f"sim {r.score:4.2f} final {r.final_accuracy:.3f}", flush=True)

            results.setdefault(arm, {})[seed] = run_arm(arm, specs, run, workdir, seed=seed, progress=show)
            print(f"seed {seed} {arm}: {time.perf_counter() - t0:.0f} s", flush=True)
    wall = time.perf_counter() - t_all
    ray.shutdown()

    os.makedirs(os.path.join(args.out, "figures"), exist_ok=True)
    # the headline reading, then the same runs read other ways (the report shows each)
    readings = {"summary": {}, "summary_coarse_grid": {"every": 2 * run.eval_every}}
    if run.precise_bn:
        readings["summary_running_bn"] = {"running_statistics": True}
    tables: dict[str, dict] = {name: {} for name in readings}
    for arm, by_seed in results.items():
        if arm == "cold":
            continue
        for name, how in readings.items():
            tables[name][arm] = {seed: summarize(results["cold"][seed], recs, run, **how)
                                 for seed, recs in by_seed.items()}
    rows = tables["summary"]
    report = _report(args, run, specs, results, tables, wall, torch.__version__, ray.__version__)
    with open(os.path.join(args.out, "bench_training.md"), "w") as f:
        f.write(report)
    with open(os.path.join(args.out, "bench_training.json"), "w") as f:
        json.dump({"settings": vars(args), "run": run.__dict__, "specs": specs,
                   "trials": {arm: {str(s): records_to_json(r) for s, r in by.items()} for arm, by in results.items()},
                   **{name: {arm: {str(s): v for s, v in by.items()} for arm, by in table.items()}
                      for name, table in tables.items()}}, f)
    _plots(args.out, results, rows, run)
    print(report)
    return 0


def _fmt(values: list[float], fmt: str) -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(float(np.mean(values)), fmt)} ± {format(float(np.std(values, ddof=1)), fmt)}"


def _report(args, run, specs, results, tables, wall, torch_version, ray_version) -> str:
    from keeper_bench.nas import arch_label

    rows = tables["summary"]
    bn = ("BatchNorm statistics re-estimated for the weights of that step (a copy of the model runs 4 training "
          "batches in train mode first; the training itself is untouched)" if run.precise_bn else
          "the models' running BatchNorm statistics")
    lines = ["# Training saved by warm starts (scripts/bench_training.py)", "",
             f"Command: `python scripts/bench_training.py{' --quick' if args.quick else ''}`"
             f"{'' if args.quick else f' (archs {args.archs}, seeds {args.seeds}, baseline seeds {args.baseline_seeds}, steps {args.steps}, eval every {args.eval_every})'}; "
             f"wall time {wall / 60:.1f} min on {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
             f"torch {torch_version}, ray {ray_version}.", "",
             f"Workload: {len(specs)} architectures (1-D VGG-style CNNs, ResNets, MLPs, transformers) arriving in a "
             f"fixed order, trained through Ray Tune {run.concurrency} at a time for {run.steps} Adam steps "
             f"(batch {run.batch_size}, lr {run.lr}, cosine decay) on MNIST-1D ({run.num_samples} generated samples). "
             f"Target of a trial: the final accuracy of the cold trial of the same architecture and seed minus "
             f"{run.margin * 100:.0f} point; steps to target are counted at evaluations every {run.eval_every} steps, "
             f"read with {bn}, "
             "and a trial that never reaches its target counts its whole budget. The first trials of each arm have "
             "no parent (the zoo starts empty) and count as they are.", "",
             "| arm | seeds | speedup (total cold steps / total steps) | training saved | trials warmed | speedup of the warmed trials | reached target | final accuracy vs cold (points) |",
             "|---|---|---|---|---|---|---|---|"]
    for arm, per_seed in rows.items():
        v = list(per_seed.values())
        lines.append(f"| {arm} | {len(v)} | {_fmt([x['speedup'] for x in v], '.2f')}x | "
                     f"{_fmt([100 * x['saved'] for x in v], '.1f')}% | {_fmt([x['warmed'] for x in v], '.0f')} of "
                     f"{v[0]['trials']} | {_fmt([x['warmed_speedup'] for x in v], '.2f')}x | "
                     f"{_fmt([x['reached'] for x in v], '.0f')} | "
                     f"{_fmt([100 * x['accuracy_delta'] for x in v], '+.2f')} |")
    other = {"summary_coarse_grid": f"The same runs read on a {2 * run.eval_every}-step grid (every other "
                                    "evaluation, for cold and the arm alike), which rounds every trial's steps to "
                                    "target up to a coarser step:",
             "summary_running_bn": "The same runs read with the models' running BatchNorm statistics (an average "
                                   "over the last ~10-20 steps' batches, momentum 0.1), for cold and the arm alike; "
                                   "targets are cold's final accuracy read that way:"}
    for name, table in tables.items():
        if name == "summary":
            continue
        lines += ["", other[name], "", "| arm | speedup | training saved | speedup of the warmed trials | "
                  "final accuracy vs cold (points) |", "|---|---|---|---|---|"]
        for arm, per_seed in table.items():
            v = list(per_seed.values())
            lines.append(f"| {arm} | {_fmt([x['speedup'] for x in v], '.2f')}x | "
                         f"{_fmt([100 * x['saved'] for x in v], '.1f')}% | "
                         f"{_fmt([x['warmed_speedup'] for x in v], '.2f')}x | "
                         f"{_fmt([100 * x['accuracy_delta'] for x in v], '+.2f')} |")
    lines += ["", "Mean ± sample std over seeds where there are several. The published system reports 2.9x faster "
              "completion and 65.5% GPU time saved on its NAS workload (NASBench, 1,000 models); this workload is "
              "smaller (the zoo holds at most "
              f"{len(specs) - 1} models when the last trial starts) and the figures are not directly comparable.", ""]
    lines += ["## Per family (keeper, seed 0)", "", "| family | trials | speedup | final accuracy vs cold (points) |",
              "|---|---|---|---|"]
    k, c = results["keeper"][0], results["cold"][0]
    s = rows["keeper"][0]
    for fam in sorted({r.family for r in k}):
        idx = [i for i, r in enumerate(k) if r.family == fam]
        cs = sum(s["cold_steps"][i] for i in idx)
        ws = sum(s["arm_steps"][i] for i in idx)
        d = np.mean([k[i].final_accuracy - c[i].final_accuracy for i in idx])
        lines.append(f"| {fam} | {len(idx)} | {cs / ws:.2f}x | {100 * d:+.2f} |")
    lines += ["", "## Per trial (seed 0)", "",
              "| # | architecture | params | keeper parent | similarity | steps to target cold / keeper | final cold / keeper |",
              "|---|---|---|---|---|---|---|"]
    for i, (cr, kr) in enumerate(zip(c, k)):
        lines.append(f"| {i} | {arch_label(specs[i])} | {kr.params} | {kr.parent or '-'} | {kr.score:.2f} | "
                     f"{s['cold_steps'][i]} / {s['arm_steps'][i]} | {cr.final_accuracy:.3f} / {kr.final_accuracy:.3f} |")
    lines += ["", "Figures: `figures/training_curves.png` (mean test accuracy against steps per family, cold vs "
              "keeper, seed 0), `figures/speedup_hist.png` (per-trial speedup of the warmed trials, every arm, "
              "seed 0). Every trial's history is in `bench_training.json`.", ""]
    return "\n".join(lines)


def _plots(out, results, rows, run) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cold, warm = results["cold"][0], results["keeper"][0]
    fams = sorted({r.family for r in cold})
    fig, axes = plt.subplots(1, len(fams), figsize=(4 * len(fams), 3.2), squeeze=False)
    for ax, fam in zip(axes[0], fams):
        for recs, label, colour in ((cold, "cold", "tab:gray"), (warm, "keeper", "tab:blue")):
            warmed = [i for i, r in enumerate(warm) if r.family == fam and r.parent]
            if not warmed:
                continue
            acc = np.mean([recs[i].accuracies for i in warmed], axis=0)
            ax.plot(recs[warmed[0]].steps, acc, label=f"{label} ({len(warmed)} warmed archs)", color=colour)
        ax.set_title(fam)
        ax.set_xlabel("training steps")
        ax.set_ylabel("test accuracy")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "figures", "training_curves.png"), dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bins = np.logspace(np.log10(0.1), np.log10(run.steps / run.eval_every + 1), 24)
    for arm, per_seed in rows.items():
        recs = results[arm][0]
        sp = [x for x, r in zip(per_seed[0]["per_trial_speedup"], recs) if r.parent]
        ax.hist(sp, bins=bins, histtype="step", label=arm, linewidth=1.5)
    ax.set_xscale("log")
    ax.axvline(1.0, color="k", linewidth=0.8)
    ax.set_xlabel("per-trial speedup in steps to target (warmed trials, seed 0)")
    ax.set_ylabel("trials")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "figures", "speedup_hist.png"), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
