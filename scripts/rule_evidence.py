"""The evidence behind the search rule (keeper/choice/inheritance.py): in searches where every trial inherited
whatever its best parent gave, how the warmed trials ended, split by what their parent's learning curve said.

Reads a ``bench_search.json`` whose keeper arms ran before the rule (every same-architecture parent gave its whole
function): the FIFO keeper arms, where every trial trains its full budget. For each warmed trial: whether its
parent is of its own architecture (a restart) or another (a head start), the verdict of keeper's curve reading on
the parent's reports (:func:`keeper.choice.inheritance.training_of`: still improving, converged, too few reports),
and the trial's final test accuracy against its parent's and against its cold twin's (the same draw trained cold
in the FIFO arm).

Usage (the runs of the search benchmark before the rule, kept in the repository's history):
    git show 8f4687c:reports/bench_search.json > /tmp/bench_search_before_rule.json
    python scripts/rule_evidence.py /tmp/bench_search_before_rule.json

Writes reports/rule_evidence.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os

import numpy as np

from keeper.choice.inheritance import training_of


def warmed_trials(state: dict, workload: str, arm: str) -> list[dict]:
    """One row per warmed trial of ``arm`` on ``workload``, every seed: kind, verdict, child - parent,
    child - cold twin."""
    out = []
    for seed in range(10):
        run, cold = state["runs"].get(f"{workload}/{arm}/{seed}"), state["runs"].get(f"{workload}/fifo/{seed}")
        if run is None or cold is None:
            continue
        by = collections.defaultdict(list)
        for e in sorted(run["events"], key=lambda e: (e["trial"], e["member_steps"])):
            by[e["trial"]].append(e)
        cold_final = {}
        for tid, t in cold["trials"].items():
            evs = sorted((e for e in cold["events"] if e["trial"] == tid), key=lambda e: e["member_steps"])
            cold_final[t["index"]] = evs[-1]["test_accuracy"]
        for tid, evs in by.items():
            parent = evs[0]["parent"]
            ptid = next((p for p in by if parent and parent.endswith(p)), None)
            if ptid is None:
                continue
            verdict = training_of([e["val_accuracy"] for e in by[ptid]]).improving
            out.append({"restart": bool(evs[0]["same_arch"]),
                        "verdict": {True: "still improving", False: "converged", None: "too few reports"}[verdict],
                        "vs_parent": evs[-1]["test_accuracy"] - by[ptid][-1]["test_accuracy"],
                        "vs_twin": evs[-1]["test_accuracy"] - cold_final[run["trials"][tid]["index"]]})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", help="a bench_search.json of runs before the rule")
    p.add_argument("--arm", default="fifo+keeper")
    p.add_argument("--out", default="reports")
    args = p.parse_args(argv)
    with open(args.json) as f:
        state = json.load(f)
    lines = ["# The evidence behind the search rule (scripts/rule_evidence.py)", "",
             f"Command: `python scripts/rule_evidence.py {os.path.basename(args.json)} --arm {args.arm}` on the "
             "search benchmark's runs before the rule (`git show 8f4687c:reports/bench_search.json`: every trial "
             "inherited whatever its best parent gave). Every warmed trial of the FIFO keeper arm (each trains its "
             "full budget), 3 seeds, by its parent's kind and by what keeper's reading of the parent's learning "
             "curve says (`keeper.choice.inheritance.training_of` on the parent's validation reports). A trial's "
             "final test accuracy against its parent's, and against its cold twin's (the same draw, cold).", "",
             "| workload | parent | parent's curve | trials | child - parent, mean | child - cold twin, mean | "
             "below their cold twin |", "|---|---|---|---|---|---|---|"]
    for workload in state["settings"]:
        rows = warmed_trials(state, workload, args.arm)
        for restart in (True, False):
            for verdict in ("converged", "still improving", "too few reports"):
                sel = [r for r in rows if r["restart"] == restart and r["verdict"] == verdict]
                if not sel:
                    continue
                lines.append(f"| {workload} | {'own architecture (a restart)' if restart else 'another architecture'}"
                             f" | {verdict} | {len(sel)} | {np.mean([r['vs_parent'] for r in sel]):+.3f} | "
                             f"{np.mean([r['vs_twin'] for r in sel]):+.3f} | "
                             f"{sum(r['vs_twin'] < 0 for r in sel)} |")
    text = "\n".join(lines) + "\n"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "rule_evidence.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
