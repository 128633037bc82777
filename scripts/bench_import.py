"""What a Tune trial's process pays to import keeper: ``from keeper.tune_integration import warm_start, warm_lr``
after torch and ``ray.tune``, which a trial has imported anyway, in fresh processes.

Each run is a new Python process that imports torch and ``ray.tune`` first, then times keeper's import (wall and
CPU), and lists which heavy modules that import left out (the service's actors, the clustering, scikit-learn) and
which it pulled in. Runs alternate with a process that imports only torch and ``ray.tune`` (their own time, for
scale). Target: at most 0.3 s on an idle core.

Usage:
    python scripts/bench_import.py            # 10 processes
    python scripts/bench_import.py --runs 20

Writes reports/bench_import.md. Run it on an otherwise idle machine: wall times are its figures (the report gives
the load beside them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

import numpy as np

TARGET_S = 0.3

_PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, ray.tune
base = time.perf_counter() - t0
w, c = time.perf_counter(), time.process_time()
from keeper.tune_integration import warm_start, warm_lr
wall, cpu = time.perf_counter() - w, time.process_time() - c
watch = ["keeper.actors.front", "keeper.actors.manager", "keeper.actors.clustering", "keeper.tune_integration.callback",
         "keeper.tune_integration.checkpoint", "keeper.matching", "keeper.transforms", "keeper.zoo", "kmedoids",
         "sklearn", "onnx", "pyarrow", "numba"]
print(json.dumps({"base_s": base, "wall_s": wall, "cpu_s": cpu, "loaded": [m for m in watch if m in sys.modules]}))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--out", default="reports")
    args = p.parse_args(argv)
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
    runs, loads = [], []
    for _ in range(args.runs):
        loads.append(os.getloadavg()[0])
        out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    wall = np.array([r["wall_s"] for r in runs])
    cpu = np.array([r["cpu_s"] for r in runs])
    base = np.array([r["base_s"] for r in runs])
    loaded = sorted({m for r in runs for m in r["loaded"]})
    import torch

    lines = ["# What a trial pays to import keeper (scripts/bench_import.py)", "",
             f"Command: `python scripts/bench_import.py --runs {args.runs}`. Machine: {platform.machine()}, "
             f"{os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}; 1-minute load "
             f"average {np.mean(loads):.2f} during the runs (0 is idle).", "",
             f"`from keeper.tune_integration import warm_start, warm_lr` in a fresh process that has imported torch "
             f"and ray.tune, {args.runs} processes:", "",
             "| figure | min | median | max | target |", "|---|---|---|---|---|",
             f"| keeper's import, wall (s) | {wall.min():.3f} | {np.median(wall):.3f} | {wall.max():.3f} | "
             f"<= {TARGET_S} ({'met' if np.median(wall) <= TARGET_S else 'missed'}, median) |",
             f"| keeper's import, CPU (s) | {cpu.min():.3f} | {np.median(cpu):.3f} | {cpu.max():.3f} | |",
             f"| torch + ray.tune beforehand, wall (s) | {base.min():.2f} | {np.median(base):.2f} | {base.max():.2f} "
             "| (for scale) |", "",
             "Pulled in of the modules watched (the service's actors and clustering, the checkpoint readers, "
             f"the aligner, the transforms, the embedded zoo, kmedoids, scikit-learn, onnx, pyarrow, numba): {', '.join(loaded) or 'none'}; the rest stay out of a "
             "trial's process."]
    text = "\n".join(lines) + "\n"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_import.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
