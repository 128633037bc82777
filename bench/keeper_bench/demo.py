"""``keeper demo``: a small NAS on MNIST-1D, once cold and once warm-started by keeper, on a local Ray.

Twelve 1-D CNN architectures (VGG-style and ResNet, varied width, depth and kernel) arrive one after another
and are trained through Ray Tune two at a time. The keeper run adds ``KeeperCallback`` and one ``warm_start``
line (see :mod:`keeper_bench.nas`), with a fresh zoo on local disk. Prints a table and the speedup, writes
``demo.png`` (accuracy against training steps, cold vs warm) and ``demo.json`` into the output directory.

Each trial trains until it stops improving, as a search that does not waste its budget runs it: early stopping
(:func:`keeper_bench.workload.train`'s ``patience``) after ``--patience`` evaluations without a gain of 0.2 points,
ending with its best evaluation's weights, in both runs alike. A warm start then ends its trial sooner, and the
whole search's wall time shows what it saved. ``--patience 0`` trains every trial its whole budget.

The command reaches ``keeper`` as a plugin (entry point group ``keeper.commands`` in bench/pyproject.toml): keeper's
CLI never imports keeper_bench; :func:`add_command` adds ``demo`` to its subcommands, and the workload and its
dependencies (keeper-bench's: mnist1d, matplotlib) are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from typing import Any

from keeper.errors import KeeperError

__all__ = ["run_demo", "add_command"]

#: What ``keeper demo`` needs beyond keeper itself: keeper-bench's dependencies.
_DEMO_MODULES = ("mnist1d", "matplotlib")
#: The fewest training steps of a trial: the workload evaluates every 20 steps (NasRun.eval_every).
_MIN_STEPS = 20


def add_command(sub: Any) -> None:
    """Add ``keeper demo`` to the ``keeper`` command's subparsers."""
    d = sub.add_parser("demo", help="small NAS on MNIST-1D, cold vs warm-started (local Ray, a few minutes)",
                       description="Twelve 1-D CNN architectures arrive one after another and are trained through "
                                   "Ray Tune,\nonce cold and once warm-started by keeper; prints the speedup and "
                                   "writes demo.png.\nFrom keeper-bench: pip install -e ./bench")
    d.add_argument("--out", default="keeper-demo", help="output directory (zoo, Tune results, demo.png)")
    d.add_argument("--archs", type=int, default=12, help="architectures to train, one after another (at least 2)")
    d.add_argument("--steps", type=int, default=300,
                   help=f"training steps per trial (at least {_MIN_STEPS}: one evaluation every {_MIN_STEPS} steps)")
    d.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray (also the trials run at once)")
    d.add_argument("--patience", type=int, default=5,
                   help="early stopping: end a trial after this many evaluations without a gain of 0.2 points "
                        "(both runs alike; 0: every trial trains its whole budget)")
    d.set_defaults(fn=_cmd_demo)


def _check_args(args: argparse.Namespace) -> None:
    """Every argument checked before Ray starts or anything trains."""
    for flag, value, low in (("--archs", args.archs, 2), ("--steps", args.steps, _MIN_STEPS), ("--cpus", args.cpus, 1),
                             ("--patience", args.patience, 0)):
        if value < low:
            raise KeeperError(f"demo: {flag} {value} is too small; give at least {low}")
    out = os.path.abspath(args.out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise KeeperError(f"demo: --out {args.out!r} is a file; give a directory")


def _cmd_demo(args: argparse.Namespace) -> int:
    _check_args(args)
    missing = [m for m in _DEMO_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise KeeperError(f"demo: the benchmark workload's dependencies are not installed (missing: "
                          f"{', '.join(missing)}); install keeper-bench with its dependencies: pip install -e ./bench")
    run_demo(args.out, archs=args.archs, steps=args.steps, cpus=args.cpus, patience=args.patience)
    return 0


def run_demo(out: str = "keeper-demo", *, archs: int = 12, steps: int = 300, cpus: int = 2,
             patience: int = 5) -> dict:
    """Run the demo; returns the summary (speedup, saved share, accuracy delta) it prints. ``patience``: early
    stopping's evaluations without a gain (0: every trial trains ``steps``)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # keep Tune's own tables out of the demo's output
    import ray

    from keeper_bench.nas import NasRun, arch_label, arrivals, records_to_json, run_arm, steps_to_target, summarize

    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, "zoo-keeper-probe-s0")):
        import shutil

        shutil.rmtree(os.path.join(out, "zoo-keeper-probe-s0"))  # every demo starts from an empty zoo
    run = NasRun(steps=steps, concurrency=cpus, eval_at_start=True, patience=patience or None)
    specs = arrivals(archs, seed=0, families=("resnet", "vgg"))
    stopping = (f"until {patience} evaluations ({patience * run.eval_every} steps) bring no gain of "
                f"{100 * run.min_delta:.1f} points" if patience else "its whole budget")
    print(f"keeper demo: {len(specs)} architectures, each trained {stopping}, at most {steps} steps; {cpus} at a time; "
          f"output in {out}", flush=True)
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")
    records, timelines, walls = {}, {}, {}
    try:
        for arm, runs in (("cold", "cold"), ("keeper", "keeper-probe")):
            t0 = time.perf_counter()
            print(f"\n[{arm}] training {len(specs)} trials" + (" with KeeperCallback + warm_start" if arm == "keeper"
                                                              else " from scratch"), flush=True)

            def show(a, r, n=len(specs)):
                parent = f" <- {r.parent} (similarity {r.score:.2f})" if r.parent else ""
                print(f"  [{a}] trial {r.index + 1:2d}/{n} {r.arch:36s} final accuracy {r.final_accuracy:.3f}"
                      f"{parent}", flush=True)

            timelines[arm] = []
            records[arm] = run_arm(runs, specs, run, out, seed=0, progress=show, timeline=timelines[arm])
            walls[arm] = time.perf_counter() - t0
            print(f"[{arm}] done in {walls[arm]:.0f} s", flush=True)
    finally:
        if started_here:
            ray.shutdown()
    cold, warm = records["cold"], records["keeper"]
    s = summarize(cold, warm, run)
    print(f"\n{'trial':>5s}  {'architecture':36s} {'parent':44s} {'sim':>5s} {'steps to target':>17s} "
          f"{'steps trained':>15s} {'final accuracy':>15s}")
    print(f"{'':5s}  {'':36s} {'':44s} {'':5s} {'cold / warm':>17s} {'cold / warm':>15s} {'cold / warm':>15s}")
    for i, (c, w) in enumerate(zip(cold, warm)):
        target = c.final_accuracy - run.margin
        cs, _ = steps_to_target(c, target, run.budget(c.family))
        ws, ok = steps_to_target(w, target, run.budget(c.family))
        flag = ("" if ok else " *") + (" SLOWER" if w.parent and ws > cs else "")
        print(f"{i + 1:5d}  {arch_label(specs[i]):36s} {parent_label(w.parent, specs):44s} {w.score:5.2f} "
              f"{f'{cs} / {ws}':>17s} {f'{c.trained_steps} / {w.trained_steps}':>15s} "
              f"{f'{c.final_accuracy:.3f} / {w.final_accuracy:.3f}':>15s}{flag}")
    print(f"\ntarget = the cold trial's final accuracy - {run.margin:.2f}; * = not reached (counts the full budget); "
          "SLOWER = a warmed trial that needed more steps than its cold twin\nsim = share of the child's weights "
          "inherited: 1.00 also when a parent of another architecture has a weight for every layer (it may still "
          "train slower: see the steps)" + ("\nsteps trained: until early stopping ended the trial (its final "
                                           "accuracy is its best evaluation's)" if patience else ""))
    print(f"steps to target, all trials: cold {sum(s['cold_steps'])}, keeper {sum(s['arm_steps'])}: "
          f"{s['speedup']:.2f}x faster, {100 * s['saved']:.0f}% of training saved; "
          f"{s['warmed']} of {s['trials']} trials warmed; mean final accuracy {100 * s['accuracy_delta']:+.2f} "
          "points vs cold")
    print(f"steps trained, all trials: cold {sum(c.trained_steps for c in cold)}, keeper "
          f"{sum(w.trained_steps for w in warm)}")
    search = whole_search(timelines, walls, cold, warm, run.margin)
    print(f"the whole search: cold {search['cold_wall_s']:.0f} s, keeper {search['keeper_wall_s']:.0f} s "
          f"({search['wall_ratio']:.2f}x); the cold search's best ({search['cold_best']:.3f}, within "
          f"{run.margin:.2f}) held after {search['cold_to_best_s']:.0f} s cold, "
          + (f"{search['keeper_to_best_s']:.0f} s with keeper ({search['sooner']:.2f}x sooner)"
             if search["keeper_to_best_s"] is not None else "never with keeper")
          + f"; best model cold {search['cold_best']:.3f}, keeper {search['keeper_best']:.3f}")
    s = {**s, "search": search}
    png = os.path.join(out, "demo.png")
    _plot(png, cold, warm, run.margin)
    with open(os.path.join(out, "demo.json"), "w") as f:
        json.dump({"specs": specs, "cold": records_to_json(cold), "keeper": records_to_json(warm),
                   "summary": {k: v for k, v in s.items()}}, f)
    print(f"wrote {png}")
    return s


def whole_search(timelines: dict[str, list], walls: dict[str, float], cold: list, warm: list,
                 margin: float) -> dict:
    """The whole search cold and with keeper: each one's wall time, when it first held a model within ``margin``
    of the cold search's best (its reports' timeline), and the best model each ends with."""
    cold_best = max(r.final_accuracy for r in cold)

    def first(arm: str) -> float | None:
        return next((t for t, a in sorted(timelines[arm]) if a >= cold_best - margin), None)

    to_cold, to_keeper = first("cold"), first("keeper")
    return {"cold_wall_s": walls["cold"], "keeper_wall_s": walls["keeper"],
            "wall_ratio": walls["cold"] / walls["keeper"], "cold_best": cold_best,
            "keeper_best": max(r.final_accuracy for r in warm), "cold_to_best_s": to_cold,
            "keeper_to_best_s": to_keeper,
            "sooner": (to_cold / to_keeper) if to_cold and to_keeper else None}


def parent_label(parent: str | None, specs: list[dict]) -> str:
    """A parent named as the demo's trial it came from (the zoo names a Tune trial by its id, whose last number is
    the trial's index in the experiment) with its architecture; other names as they are."""
    from keeper_bench.nas import arch_label

    if not parent:
        return "-"
    tail = parent.rsplit("_", 1)[-1]
    if tail.isdigit() and int(tail) < len(specs):
        return f"trial {int(tail) + 1} ({arch_label(specs[int(tail)])})"[:44]
    return parent[-44:]


def _plot(path: str, cold, warm, margin: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    def held(r, grid):
        """The accuracy ``r`` holds at each step of ``grid``: its evaluations, then after an early stop the best
        evaluation's, whose weights it ended with."""
        return [r.accuracies[r.steps.index(s)] if s in r.steps else r.final_accuracy for s in grid]

    fig, ax = plt.subplots(figsize=(6.4, 4))
    warmed = [i for i, w in enumerate(warm) if w.parent]
    for i in warmed:
        ax.plot(cold[i].steps, cold[i].accuracies, color="tab:gray", alpha=0.25, linewidth=0.8)
        ax.plot(warm[i].steps, warm[i].accuracies, color="tab:blue", alpha=0.25, linewidth=0.8)
    if warmed:
        # trials stopped early end at different steps: the mean is over what each holds at every step
        grid = sorted({s for i in warmed for r in (cold[i], warm[i]) for s in r.steps})
        ax.plot(grid, np.mean([held(cold[i], grid) for i in warmed], axis=0), color="tab:gray",
                linewidth=2.2, label=f"cold (mean of {len(warmed)} archs)")
        ax.plot(grid, np.mean([held(warm[i], grid) for i in warmed], axis=0), color="tab:blue",
                linewidth=2.2, label="keeper warm start (mean)")
        target = float(np.mean([cold[i].final_accuracy for i in warmed])) - margin
        ax.axhline(target, color="tab:red", linestyle="--", linewidth=1, label="target (cold final - margin, mean)")
    ax.set_xlim(left=0)
    ax.set_xlabel("training steps")
    ax.set_ylabel("MNIST-1D test accuracy")
    ax.set_title("Trials that had a parent: cold vs warm (step 0: where each starts)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
