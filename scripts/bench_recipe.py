"""The learning-rate recipe of a warm start, measured on MNIST-1D against the copy bound.

Per family (VGG, ResNet, MobileNetV2, MLP, transformer; one sampled architecture each, per seed):

1. **cold**: the architecture trained from its own init for its plateau budget (Adam at the peak rate 3e-3,
   cosine decay, as ``bench_training.py``); target = its final accuracy - 0.01;
2. **copy**: the same architecture restarted from cold's final weights (fresh Adam moments), under each recipe:
   the copy bound of ``bench_training.py`` is the ``none`` row;
3. **grown**: a one-block-deeper child (an exact growth: keeper flags it preserved) warmed by keeper from the cold
   model registered in an embedded zoo; its own cold run gives its target; then trained under each recipe.

Recipes (a factor multiplied into the schedule, step 0-based; ``keeper.recipe``):
``none`` (1 at every step: the schedule as is), ``keeper`` (the shipped rule: ``WarmResult.recipe``), ``published``
(the published system's: max(0.3, 1 - matched share) over the ramp, then 1), and variants of the ramp's start and
length (``start=a,ramp=r``).

Reported per run: steps to target (first evaluation at or above it, accuracy read in eval mode with running
BatchNorm statistics, every 25 steps = one epoch), the speedup over the run's cold twin, the final accuracy
against cold's, and the accuracy at the first evaluation (what the first epoch costs).

Usage:
    python scripts/bench_recipe.py [--seeds 1] [--families vgg,resnet,mobilenetv2,mlp,transformer]
        [--recipes none,keeper,published,start=0.1;ramp=0.25] [--scale 1.0]

Writes ``reports/bench_recipe.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from keeper import Zoo  # noqa: E402
from keeper.recipe import Recipe  # noqa: E402
from keeper.torch_support import register, warm_start  # noqa: E402
from keeper_bench.families import build, example_input, sample_spec  # noqa: E402
from keeper_bench.workload import mnist1d_dataset, train  # noqa: E402

BUDGETS = {"vgg": 400, "resnet": 800, "mobilenetv2": 800, "mlp": 2400, "transformer": 1000}
EVAL_EVERY = 25
MARGIN = 0.01


def deeper(spec: dict) -> dict:
    """One more block (transformer: one more layer) in the first stage: an exact growth of ``spec``."""
    if spec["family"] == "transformer":
        return {**spec, "layers": spec["layers"] + 1}
    if spec["family"] == "mlp":
        return {**spec, "widths": spec["widths"][:1] + spec["widths"]}
    key = {"resnet": "blocks", "vgg": "depths", "mobilenetv2": "blocks"}[spec["family"]]
    return {**spec, key: [spec[key][0] + 1] + list(spec[key][1:])}


def factor_of(name: str, warm, budget: int):
    """The step -> factor function of recipe ``name`` for warm result ``warm``."""
    if name == "none":
        return None
    if name == "keeper":
        return warm.recipe(budget).factor
    if name == "published":  # the published rule: max(0.3, 1 - matched share) during the ramp
        share = warm.score
        rec = Recipe(max(0.3, 1.0 - share), max(1, round(Recipe.RAMP * budget)), "published")
        return lambda s: rec.start if s < rec.ramp_steps else 1.0
    parts = dict(item.split("=") for item in name.split(";"))
    rec = Recipe(float(parts["start"]), max(1, round(float(parts["ramp"]) * budget)), name)
    return rec.factor


def run(model, data, budget, seed, target=None, factor=None) -> dict:
    h = train(model, data, steps=budget, eval_every=EVAL_EVERY, lr=3e-3, seed=seed, target=target,
              lr_factor=factor)
    return {"steps_to_target": h.steps_to_target, "final": h.final_accuracy, "first": h.accuracies[0],
            "seconds": h.seconds, "curve": list(zip(h.steps, h.accuracies))}


def measure_family(family: str, seed: int, recipes: list[str], data, scale: float, work: str) -> list[dict]:
    rng = np.random.default_rng(1000 * seed + hash(family) % 1000)
    spec = sample_spec(rng, family)
    budget = max(EVAL_EVERY, int(BUDGETS[family] * scale))
    torch.manual_seed(seed)
    model = build(spec)
    cold = run(model, data, budget, seed)
    trained = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rows = [{"family": family, "seed": seed, "setting": "cold", "recipe": "-", "budget": budget, **cold,
             "target": cold["final"] - MARGIN}]
    x = example_input(spec)
    zoo = Zoo(os.path.join(work, f"zoo-{family}-{seed}"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        register(model.eval(), x, zoo, max(0.01, cold["final"]), name="parent")
    # the copy: the same architecture from the trained weights (its warm result: itself, preserved)
    for name in recipes:
        copy = build(spec)
        copy.load_state_dict(trained)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warm = warm_start(build(spec), x, zoo, noise=0.0)  # what keeper says of an exact copy
        r = run(copy, data, budget, seed, cold["final"] - MARGIN, factor_of(name, warm, budget))
        rows.append({"family": family, "seed": seed, "setting": "copy", "recipe": name, "budget": budget, **r,
                     "cold_final": cold["final"], "preserved": bool(warm.preserved)})
        print(_line(rows[-1], budget), flush=True)
    child_spec = deeper(spec)
    torch.manual_seed(seed + 1)
    child_cold = run(build(child_spec), data, budget, seed)
    target = child_cold["final"] - MARGIN
    rows.append({"family": family, "seed": seed, "setting": "grown cold", "recipe": "-", "budget": budget,
                 **child_cold, "target": target})
    for name in recipes:
        torch.manual_seed(seed + 1)
        child = build(child_spec)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warm = warm_start(child, example_input(child_spec), zoo)
        r = run(child, data, budget, seed, target, factor_of(name, warm, budget))
        rows.append({"family": family, "seed": seed, "setting": "grown", "recipe": name, "budget": budget, **r,
                     "cold_final": child_cold["final"], "preserved": bool(warm.preserved), "parent": warm.parent})
        print(_line(rows[-1], budget), flush=True)
    return rows


def _line(r: dict, budget: int) -> str:
    s = r["steps_to_target"]
    return (f"{r['family']:12s} seed {r['seed']} {r['setting']:6s} {r['recipe']:22s} steps {s if s else '>' + str(budget):>6} "
            f"/ {budget}  first {r['first']:.3f}  final {r['final']:.3f} (cold {r.get('cold_final', 0):.3f})")


def summary(rows: list[dict], recipes: list[str]) -> list[str]:
    lines = ["| setting | recipe | steps / cold steps (median over families and seeds) | worst | reached | "
             "first-epoch accuracy - cold final (median) | final - cold final (min) |", "|---|---|---|---|---|---|---|"]
    for setting in ("copy", "grown"):
        for name in recipes:
            rs = [r for r in rows if r["setting"] == setting and r["recipe"] == name]
            if not rs:
                continue
            cold_steps = {(r["family"], r["seed"]): _cold_steps(rows, r, setting) for r in rs}
            ratios = [(r["steps_to_target"] or r["budget"]) / cold_steps[(r["family"], r["seed"])] for r in rs]
            lines.append(f"| {setting} | {name} | {statistics.median(ratios):.2f} | {max(ratios):.2f} | "
                         f"{sum(r['steps_to_target'] is not None for r in rs)}/{len(rs)} | "
                         f"{statistics.median(r['first'] - r['cold_final'] for r in rs):+.3f} | "
                         f"{min(r['final'] - r['cold_final'] for r in rs):+.3f} |")
    return lines


def _cold_steps(rows: list[dict], r: dict, setting: str) -> int:
    """Steps the cold twin took to its own target (the first evaluation at or above final - margin)."""
    name = "cold" if setting == "copy" else "grown cold"
    c = next(c for c in rows if c["setting"] == name and c["family"] == r["family"] and c["seed"] == r["seed"])
    return c.get("cold_steps") or c["budget"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--families", default="vgg,resnet,mobilenetv2,mlp,transformer")
    p.add_argument("--recipes", default="none,keeper,published,start=0.1;ramp=0.25,start=0.3;ramp=0.1")
    p.add_argument("--scale", type=float, default=1.0, help="budgets x this (0.5 for a quick look)")
    p.add_argument("--out", default=os.path.join(ROOT, "reports"))
    args = p.parse_args()
    torch.set_num_threads(1)
    recipes = [r for r in args.recipes.split(",") if r]
    families = [f for f in args.families.split(",") if f]
    bad = [f for f in families if f not in BUDGETS]
    if bad:
        p.error(f"--families: {', '.join(bad)}; expected some of {', '.join(BUDGETS)}")
    data = mnist1d_dataset(0, 4000)
    started, rows = time.time(), []
    with tempfile.TemporaryDirectory(prefix="keeper-recipe-") as work:
        for seed in range(args.seeds):
            for family in families:
                rows += measure_family(family, seed, recipes, data, args.scale, work)
    _cold_step_counts(rows)
    lines = ["# The learning-rate recipe of a warm start (scripts/bench_recipe.py)", "",
             f"Command: `python scripts/bench_recipe.py {' '.join(sys.argv[1:])}`; {args.seeds} seed(s), "
             f"families {', '.join(families)}; {(time.time() - started) / 60:.1f} min on {os.cpu_count()} CPUs "
             f"(1 torch thread), torch {torch.__version__}. Steps to target: first evaluation (every {EVAL_EVERY} "
             f"steps, eval mode, running statistics) at or above the cold twin's final accuracy - {MARGIN}; "
             "a run that never gets there counts its whole budget.", ""]
    lines += summary(rows, recipes)
    lines += ["", "| family | seed | setting | recipe | steps to target | budget | first eval | final | cold final |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['family']} | {r['seed']} | {r['setting']} | {r['recipe']} | {r['steps_to_target']} | "
                     f"{r['budget']} | {r['first']:.3f} | {r['final']:.3f} | {r.get('cold_final', r['final']):.3f} |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_recipe.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "bench_recipe.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("\n".join(lines))


def _cold_step_counts(rows: list[dict]) -> None:
    """Each cold row's own steps to its target (its final accuracy - margin, known only at its end), read from its
    curve."""
    for r in rows:
        if r["setting"] in ("cold", "grown cold"):
            r["cold_steps"] = next(s for s, a in r["curve"] if a >= r["target"])


if __name__ == "__main__":
    main()
