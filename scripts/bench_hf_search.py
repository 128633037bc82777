"""The Hugging Face Trainer's own Ray search with and without keeper: what it registers and warms, and what it costs.

The search is docs/usage.md's (a BERT classifier, hidden 32/64 x layers 1/2, a grid of 4, 1 CPU per trial on a
local 2-CPU Ray, 2 epochs of 128 examples, ``eval_strategy`` and ``save_strategy`` ``"epoch"``, the shipped
defaults of ``configs/default.yaml``). Arms, each run in a fresh Python process with its own Ray and (for keeper)
a new zoo, alternating so that the machine's load falls on both alike:

* ``plain``: ``trainer.hyperparameter_search(backend="ray", ...)`` as the Trainer's documentation writes it;
* ``keeper``: the same, plus ``warm_start(model)`` in ``model_init`` and ``callbacks=[KeeperCallback(metric=
  "objective", mode="max")]``.

Reported per run: the wall time of ``hyperparameter_search`` (Ray already started; the Trainer built), each trial's
configuration and best objective, and for keeper each trial's zoo model and parent; the 1-minute load average
before and after the run (the machine is shared).

Usage:
    python scripts/bench_hf_search.py [--reps 2]

Writes ``reports/bench_hf_search.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUN = r'''
import json, os, sys, time
sys.path.insert(0, ROOT)
import ray
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
import torch
from ray import tune
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
import keeper
from keeper.tune_integration import KeeperCallback, warm_start

class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        self.x = torch.randint(1, 100, (n, 16), generator=torch.Generator().manual_seed(seed))
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": int(self.x[i, 0] > 50)}

def model_init(trial):
    hp = trial or {"hidden": 32, "layers": 1}
    model = BertForSequenceClassification(BertConfig(
        vocab_size=100, hidden_size=hp["hidden"], num_hidden_layers=hp["layers"], num_attention_heads=2,
        intermediate_size=2 * hp["hidden"], max_position_embeddings=32))
    if KEEPER:
        warm_start(model)
    return model

def accuracy(p):
    return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())}

args = TrainingArguments(output_dir="hf-out", num_train_epochs=2, per_device_train_batch_size=16, use_cpu=True,
                         eval_strategy="epoch", save_strategy="epoch", report_to=[], disable_tqdm=True)
trainer = Trainer(model_init=model_init, args=args, train_dataset=Tokens(128, 0), eval_dataset=Tokens(64, 1),
                  compute_metrics=accuracy)
callbacks = [KeeperCallback(metric="objective", mode="max")] if KEEPER else []
load = os.getloadavg()[0]
t0 = time.perf_counter()
best = trainer.hyperparameter_search(
    backend="ray", direction="maximize", n_trials=1, resources_per_trial={"cpu": 1}, callbacks=callbacks,
    hp_space=lambda _: {"hidden": tune.grid_search([32, 64]), "layers": tune.grid_search([1, 2])}, verbose=0)
wall = time.perf_counter() - t0
zoo = keeper.Zoo(callbacks[0].config.zoo_uri, mode="read") if KEEPER else None
names = {}
trials = []
for t in best.run_summary.trials:
    row = {"id": t.trial_id, "config": dict(t.config),
           "objective": t.metric_analysis.get("objective", {}).get("max")}
    if KEEPER:
        name = callbacks[0].models.get(t.trial_id)
        row["model"] = name
        row["parent"] = zoo.record(name).summary.get("lineage", {}).get("parent") if name else None
        row["outcome"] = callbacks[0].outcomes.get(t.trial_id)
    trials.append(row)
print("RESULT " + json.dumps({"wall_s": wall, "load_before": load, "load_after": os.getloadavg()[0],
                              "best": best.objective, "trials": trials}))
'''


def run(arm: str) -> dict:
    """One search of ``arm`` in a new process, in a new directory (its own zoo, results and $HOME)."""
    with tempfile.TemporaryDirectory(prefix=f"bench-hf-{arm}-") as d:
        env = {**os.environ, "HOME": d, "KEEPER_ZOO": os.path.join(d, "zoo"), "RAY_USAGE_STATS_ENABLED": "0",
               "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONPATH": ROOT}
        env.pop("RAY_ADDRESS", None)
        code = f"ROOT = {ROOT!r}\nKEEPER = {arm == 'keeper'}\n" + RUN
        out = subprocess.run([sys.executable, "-c", code], cwd=d, env=env, capture_output=True, text=True,
                             timeout=1800)
        lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        if out.returncode or not lines:
            raise SystemExit(f"the {arm} search failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
        return {"arm": arm, **json.loads(lines[-1][len("RESULT "):])}


def label(config: dict) -> str:
    return f"{config['hidden']}x{config['layers']}"


def report(runs: list[dict], reps: int) -> str:
    lines = ["# The Hugging Face Trainer's Ray search with and without keeper", "",
             f"`python scripts/bench_hf_search.py --reps {reps}`: docs/usage.md's search (BERT classifier, hidden "
             "32/64 x layers 1/2, a grid of 4, 1 CPU per trial, a local 2-CPU Ray, `save_strategy=\"epoch\"`), "
             "each run in a new process with a new zoo, the arms alternating. Wall time: "
             "`hyperparameter_search` alone. The machine is shared: the 1-minute load average is shown.", "",
             "| run | arm | wall (s) | load before / after | registered | warmed (trial <- parent) | best objective |",
             "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(runs, 1):
        by_id = {t["id"]: t for t in r["trials"]}
        model_of = {t.get("model"): label(t["config"]) for t in r["trials"]}
        warmed = [f"{label(t['config'])} <- {model_of.get(t['parent'], t['parent'])}" for t in r["trials"]
                  if t.get("parent")]
        registered = sum(1 for t in by_id.values() if t.get("model")) if r["arm"] == "keeper" else "-"
        lines.append(f"| {i} | {r['arm']} | {r['wall_s']:.1f} | {r['load_before']:.1f} / {r['load_after']:.1f} | "
                     f"{registered} | {', '.join(warmed) or '-'} | {r['best']:.4f} |")
    lines += ["", "| arm | runs | wall median (s) | per trial: best objective, median over runs |", "|---|---|---|---|"]
    for arm in ("plain", "keeper"):
        mine = [r for r in runs if r["arm"] == arm]
        per = {}
        for r in mine:
            for t in r["trials"]:
                per.setdefault(label(t["config"]), []).append(t["objective"])
        objectives = ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in sorted(per.items()))
        lines.append(f"| {arm} | {len(mine)} | {statistics.median(r['wall_s'] for r in mine):.1f} | {objectives} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2, help="runs of each arm (alternating)")
    args = parser.parse_args()
    runs = []
    for rep in range(args.reps):
        for arm in (("plain", "keeper") if rep % 2 == 0 else ("keeper", "plain")):
            runs.append(run(arm))
            r = runs[-1]
            print(f"{arm}: {r['wall_s']:.1f} s (load {r['load_before']:.1f} -> {r['load_after']:.1f})", flush=True)
    text = report(runs, args.reps)
    print(text)
    os.makedirs(os.path.join(ROOT, "reports"), exist_ok=True)
    with open(os.path.join(ROOT, "reports", "bench_hf_search.md"), "w") as f:
        f.write(text)
    with open(os.path.join(ROOT, "reports", "bench_hf_search.json"), "w") as f:
        json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
