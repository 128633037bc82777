"""What keeper's actors cost in CPU: their boot, one parent choice, one registration, and a second of idling.

Starts the service on a local Ray of 2 CPUs with an empty zoo in a temporary directory (the shipped defaults),
then warm-starts and registers the search benchmark's digits models (widths 8/16/32, depths 1-3, twice over) one
after the other, reading the CPU seconds of each actor class's processes (psutil, 10 ms resolution) around each
call. It prints a line per model and the totals; nothing else should run meanwhile.

Run: ``python scripts/bench_actor_cost.py [--idle-s 5]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle-s", type=float, default=5.0, help="seconds of idling measured at the end")
    args = parser.parse_args()

    import ray
    import torch

    import keeper
    from keeper.actors import start
    from keeper_bench.pbt import PbtRun, _build, member_spec
    from keeper_bench.search import keeper_actor_cpu

    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False)
    run = PbtRun.digits()
    t0 = time.perf_counter()
    handle = start(zoo=tempfile.mkdtemp(prefix="keeper-actor-cost-"))
    boot = keeper_actor_cpu()
    print(f"start: {time.perf_counter() - t0:.2f} s wall; boot CPU per actor class (s): "
          + ", ".join(f"{k} {v:.2f}" for k, v in boot.items()))
    before = boot
    choose: dict[str, list[float]] = {k: [] for k in boot}
    register: dict[str, list[float]] = {k: [] for k in boot}
    archs = [(w, b) for w in (8, 16, 32) for b in (1, 2, 3)] * 2
    for i, (width, blocks) in enumerate(archs):
        torch.manual_seed(i)
        model, example = _build(run, member_spec(run, width, blocks))
        result = keeper.warm_start(model, example, handle)
        chosen = keeper_actor_cpu()
        keeper.register(model, example, handle, accuracy=0.9 + 0.001 * i, name=f"digits-{i}")
        registered = keeper_actor_cpu()
        for k in boot:
            choose[k].append(chosen[k] - before[k])
            register[k].append(registered[k] - chosen[k])
        print(f"{i:2d} w{width}/b{blocks}: parent {result.parent or '-':10s} choice CPU "
              + ", ".join(f"{k} {choose[k][-1]:.2f}" for k in boot) + "; registration CPU "
              + ", ".join(f"{k} {register[k][-1]:.2f}" for k in boot))
        before = registered
    time.sleep(args.idle_s)
    idle = keeper_actor_cpu()
    for k in boot:
        print(f"{k}: choice mean {statistics.mean(choose[k]) * 1e3:.0f} ms (max {max(choose[k]) * 1e3:.0f}), "
              f"registration mean {statistics.mean(register[k]) * 1e3:.0f} ms (max {max(register[k]) * 1e3:.0f}), "
              f"idle {(idle[k] - before[k]) / args.idle_s * 1e3:.1f} ms per s")
    ray.shutdown()


if __name__ == "__main__":
    main()
