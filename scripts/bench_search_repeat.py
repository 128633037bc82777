"""The noise floor of the search benchmark: the same cold arm run twice, compared as keeper's arm is compared.

Reads two ``bench_search.json`` files (``scripts/bench_search.py`` runs of the same workload, arm and seeds, for
example the cold ASHA arm run again with ``--out`` elsewhere) and prints, per seed, the second run's time to the
first run's target and the ratio "sooner" as the benchmark computes it for keeper (first run's time over the
second's), the whole searches' ratio and both final models. A ratio away from 1 here is the machine's and the
scheduler's, not keeper's: read keeper's rows against it.

Run: ``python scripts/bench_search_repeat.py reports/bench_search.json reports/search_kv/asha_again/bench_search.json --arm digits/asha``
"""

from __future__ import annotations

import argparse
import json
import statistics

from keeper_bench.search import summarize, target_of, wall_to_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", help="bench_search.json of the first run (its targets are used)")
    parser.add_argument("again", help="bench_search.json of the same arm run again")
    parser.add_argument("--arm", default="digits/asha", help="workload/arm, e.g. digits/asha")
    args = parser.parse_args()
    first, again = (json.load(open(p))["runs"] for p in (args.first, args.again))
    seeds = sorted(int(k.rsplit("/", 1)[1]) for k in again if k.rsplit("/", 1)[0] == args.arm)
    if not seeds:
        raise SystemExit(f"{args.again} holds no run of {args.arm!r}")
    sooner, whole = [], []
    print("| seed | target | first run: wall to target (s) | again (s) | sooner (x) | whole search (x) | final, first / again |")
    print("|---|---|---|---|---|---|---|")
    for seed in seeds:
        a, b = first.get(f"{args.arm}/{seed}"), again[f"{args.arm}/{seed}"]
        if a is None:
            raise SystemExit(f"{args.first} holds no run of {args.arm}/{seed}")
        target = target_of(a["events"])
        sa, sb = summarize(a, target), summarize(b, target)
        sooner.append(wall_to_target(sa) / wall_to_target(sb))
        whole.append(a["wall_s"] / b["wall_s"])
        print(f"| {seed} | {target:.3f} | {wall_to_target(sa):.1f} | {wall_to_target(sb):.1f} | {sooner[-1]:.2f} | "
              f"{whole[-1]:.2f} | {sa['best_test']:.3f} / {sb['best_test']:.3f} |")
    print(f"\n{args.arm}, {len(seeds)} seeds: sooner {statistics.mean(sooner):.2f}x, whole search "
          f"{statistics.mean(whole):.2f}x (1.00 where the two runs agree)")


if __name__ == "__main__":
    main()
