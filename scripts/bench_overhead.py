"""keeper's own overhead on the user's clock: ``warm_start`` and ``register`` of torch modules in a fresh process,
first call included, against one safetensors load of the module's weights; and keeper's share of Tune trials.

Fresh process. For each model (a 2-layer MLP, a 0.7M 1-D ResNet, 4.8M and 25M pre-LN transformer classifiers, a
~100M Hugging Face GPT-2; ``--large`` adds a ~1B GPT-2) a setup process registers a related parent (narrower or
one block shallower) into a zoo on local disk and writes the child's initial weights as safetensors. Then every
measurement runs in its own new Python process, timed after the imports and after the module is built:

* ``load``: ``safetensors.torch.load_file`` of the child's weights (the yardstick);
* ``warm``: ``keeper.torch_support.warm_start(child, x, zoo, noise=0)``, the first call of the process;
* ``register``: ``keeper.torch_support.register(child, x, zoo, 0.9)`` of a trained-like child into a zoo of its own.

Each is repeated ``--reps`` times (new processes) and the median is reported, for each front end: keeper's default
and torch's ONNX exporters (``KEEPER_EXPORTER=dynamo`` and ``torchscript``), and for two states of the disk
architecture cache (``KEEPER_ARCH_CACHE``): ``new``, an architecture no process traced before (an empty cache per
measurement), and ``known``, one another process already traced (a Tune trial of an architecture an earlier trial
ran; the cache filled by one unmeasured warm_start first).
Target: warm and register at most max(1 s, 3x load) for models up to 100M parameters, and 3x load at 1B.

Tune (``--tune``): a Tune experiment on a local 2-CPU Ray with the shipped defaults (``configs/default.yaml``):
``--trials`` trials of the 4.8M transformer, each training for ``--trial-s`` seconds after one ``warm_start`` line,
two at a time, with ``KeeperCallback`` registering each finished trial (the driver waits for it, as by default).
Reported per trial: warm_start seconds, the trial's wall time, the share; and the registration seconds the
experiment waited after each trial. Target: keeper's share below 5% for trials of 60 s.

Usage:
    python scripts/bench_overhead.py [--reps 3] [--models mlp,resnet,tf5m,tf25m,gpt2-100m] [--large] [--tune]
    python scripts/bench_overhead.py --tune --trials 6 --trial-s 60

Writes ``reports/bench_overhead.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRONT_ENDS = ("default", "dynamo", "torchscript")
CACHE_STATES = ("new", "known")
MODELS = ("mlp", "resnet", "tf5m", "tf25m", "gpt2-100m")
LARGE = ("gpt2-1b",)

# The models, written once: each measurement process runs this prelude, then its own lines.
PRELUDE = r'''
import os, sys, time, json, warnings
sys.path.insert(0, ROOT)
import torch
torch.manual_seed(SEED)

def build(name, role):
    """(module in eval mode, example input) of ``name``: the child, or its parent (narrower or shallower)."""
    if name == "mlp":
        w = 256 if role == "child" else 128
        m = torch.nn.Sequential(torch.nn.Linear(64, w), torch.nn.ReLU(), torch.nn.Linear(w, 10))
        return m.eval(), torch.randn(2, 64)
    if name in ("resnet", "tf5m", "tf25m"):
        from keeper_bench.families import build as fbuild, example_input, sized_spec
        family, size = {"resnet": ("resnet", 700_000), "tf5m": ("transformer", 4_800_000),
                        "tf25m": ("transformer", 25_000_000)}[name]
        spec = sized_spec(family, size)
        if role == "parent" and family == "resnet":
            spec = dict(spec, widths=[max(4, w * 2 // 3) for w in spec["widths"]])
        elif role == "parent":
            spec = dict(spec, layers=spec["layers"] - 1)
        return fbuild(spec).eval(), example_input(spec)
    if name.startswith("gpt2"):
        from transformers import GPT2Config, GPT2LMHeadModel
        d, layers = {"gpt2-100m": (768, 14), "gpt2-1b": (2048, 20)}[name]
        layers -= 2 if role == "parent" else 0
        cfg = GPT2Config(vocab_size=8192, n_positions=128, n_embd=d, n_layer=layers, n_head=d // 64,
                         attn_implementation="eager")
        class Logits(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = GPT2LMHeadModel(cfg)
            def forward(self, ids):
                return self.model(input_ids=ids).logits
        return Logits().eval(), torch.arange(16).reshape(1, 16)
    raise SystemExit(f"unknown model {name}")
'''

SETUP = r'''
import keeper
from keeper.torch_support import register
from safetensors.torch import save_file
parent, x = build(MODEL, "parent")
zoo = keeper.Zoo(ZOO)
register(parent, x, zoo, 0.9, name="parent")
child, _ = build(MODEL, "child")
save_file({k: v.detach().clone().contiguous() for k, v in child.state_dict().items()}, WEIGHTS)  # tied: apart
print(json.dumps({"params": sum(p.numel() for p in child.parameters()), "bytes": os.path.getsize(WEIGHTS)}))
'''

LOAD = r'''
from safetensors.torch import load_file
t0 = time.perf_counter()
sd = load_file(WEIGHTS)
print(json.dumps({"seconds": time.perf_counter() - t0}))
'''

WARM = r'''
import keeper
from keeper.torch_support import warm_start
child, x = build(MODEL, "child")
zoo = keeper.Zoo(ZOO)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    r = warm_start(child, x, zoo, noise=0.0)
    t = time.perf_counter() - t0
print(json.dumps({"seconds": t, "parent": r.parent, "preserved": bool(r.preserved), "score": float(r.score)}))
'''

REGISTER = r'''
import keeper
from keeper.torch_support import register
child, x = build(MODEL, "child")
zoo = keeper.Zoo(ZOO)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    rec = register(child, x, zoo, 0.9, name=f"run-{SEED}")
    t = time.perf_counter() - t0
print(json.dumps({"seconds": t, "name": rec.name}))
'''


def _run(code: str, env_extra: dict, **values) -> dict:
    """Run ``PRELUDE + code`` in a new Python process with ``values`` bound; its last stdout line as JSON."""
    binds = "".join(f"{k} = {v!r}\n" for k, v in dict(values, ROOT=ROOT).items())
    env = dict(os.environ, **env_extra)
    out = subprocess.run([sys.executable, "-c", binds + PRELUDE + code], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"measurement failed ({values.get('MODEL')}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _env(front: str, cache: str) -> dict:
    env = {"KEEPER_ARCH_CACHE": cache}
    if front != "default":
        env["KEEPER_EXPORTER"] = front
    return env


def measure_model(model: str, fronts: tuple[str, ...], states: tuple[str, ...], reps: int, work: str) -> dict:
    zoo, weights = os.path.join(work, f"zoo-{model}"), os.path.join(work, f"{model}.safetensors")
    info = _run(SETUP, {"KEEPER_ARCH_CACHE": "off"}, MODEL=model, ZOO=zoo, WEIGHTS=weights, SEED=0)
    row = {"model": model, **info, "load": [], "warm": {}, "register": {}}
    for rep in range(reps):
        row["load"].append(_run(LOAD, {}, MODEL=model, WEIGHTS=weights, SEED=rep)["seconds"])
    for front in fronts:
        for state in states:
            label, known = f"{front}, {state}", os.path.join(work, f"cache-{model}-{front}")
            if state == "known":  # one process traces the architecture; the measured ones find it on disk
                _run(WARM, _env(front, known), MODEL=model, ZOO=zoo, SEED=99)
            warms, regs = [], []
            for rep in range(reps):
                cache = known if state == "known" else os.path.join(work, f"cache-{model}-{front}-{rep}-w")
                warms.append(_run(WARM, _env(front, cache), MODEL=model, ZOO=zoo, SEED=rep))
                cache = known if state == "known" else os.path.join(work, f"cache-{model}-{front}-{rep}-r")
                regs.append(_run(REGISTER, _env(front, cache), MODEL=model, SEED=100 + rep,
                                 ZOO=os.path.join(work, f"reg-{model}-{front}-{state}")))
            row["warm"][label] = warms
            row["register"][label] = [r["seconds"] for r in regs]
            print(f"{model:10s} {label:22s} warm {statistics.median(w['seconds'] for w in warms):7.2f} s  register "
                  f"{statistics.median(row['register'][label]):7.2f} s  load {statistics.median(row['load']):.3f} s",
                  flush=True)
    return row


def _load_avg() -> float:
    return os.getloadavg()[0]


def report_rows(rows: list[dict], large: set[str]) -> list[str]:
    lines = ["| model | params | front end, architecture | warm_start s | register s | safetensors load s | target s | warm met | "
             "register met | parent (preserved) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        load = statistics.median(r["load"])
        target = 3 * load if r["model"] in large else max(1.0, 3 * load)
        for front, warms in r["warm"].items():
            w = statistics.median(x["seconds"] for x in warms)
            g = statistics.median(r["register"][front])
            first = warms[0]
            lines.append(f"| {r['model']} | {r['params'] / 1e6:.1f}M | {front} | {w:.2f} | {g:.2f} | {load:.3f} | "
                         f"{target:.2f} | {'yes' if w <= target else '**no**'} | {'yes' if g <= target else '**no**'} | "
                         f"{first['parent']} ({'yes' if first['preserved'] else 'no'}) |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--fronts", default=",".join(FRONT_ENDS))
    p.add_argument("--caches", default=",".join(CACHE_STATES),
                   help="architecture cache states to measure: new (never traced), known (traced by another process)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--large", action="store_true", help="add the ~1B GPT-2 (several GB of memory and disk)")
    p.add_argument("--tune", action="store_true", help="also run the Tune experiment")
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--trial-s", type=float, default=60.0)
    p.add_argument("--out", default=os.path.join(ROOT, "reports"))
    args = p.parse_args()
    models = [m for m in args.models.split(",") if m] + (list(LARGE) if args.large else [])
    fronts = tuple(f for f in args.fronts.split(",") if f)
    states = tuple(s for s in args.caches.split(",") if s)
    for name, given, known in (("--fronts", fronts, FRONT_ENDS), ("--caches", states, CACHE_STATES),
                               ("--models", models, MODELS + LARGE)):
        bad = [g for g in given if g not in known]
        if bad or not given:
            p.error(f"{name}: {', '.join(bad) or 'nothing given'}; expected some of {', '.join(known)}")
    started, loads = time.time(), [_load_avg()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="keeper-overhead-") as work:
        for model in models:
            rows.append(measure_model(model, fronts, states, args.reps, work))
            loads.append(_load_avg())
    tune = run_tune(args.trials, args.trial_s) if args.tune else None
    write_report(args, rows, tune, time.time() - started, loads)


def _tune_trainable(config: dict) -> None:
    """One trial: build its transformer, one warm_start line, train for ``trial_s`` seconds, report once."""
    import tempfile as tf

    import torch
    from ray import tune

    from keeper.tune_integration import warm_start
    from keeper_bench.families import build, example_input, sized_spec

    t0 = time.perf_counter()
    torch.set_num_threads(1)  # two trials share the two cores
    torch.manual_seed(config["index"])
    spec = dict(sized_spec("transformer", 4_800_000), layers=config["layers"])
    model = build(spec)
    w0 = time.perf_counter()
    result = warm_start(model, example_input(spec))
    warm_s = time.perf_counter() - w0
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(config["index"])
    x, y = torch.randn(512, 1, 40, generator=g), torch.randint(0, 10, (512,), generator=g)
    model.train()
    while time.perf_counter() - t0 < config["trial_s"]:
        i = torch.randint(0, 512, (64,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[i]), y[i]).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(x).argmax(1) == y).float().mean())
    with tf.TemporaryDirectory() as d:
        torch.save(model.state_dict(), os.path.join(d, "model.pt"))
        tune.report({"accuracy": accuracy, "warm_s": warm_s, "wall_s": time.perf_counter() - t0,
                     "parent": result.parent or "", "index": config["index"]},
                    checkpoint=tune.Checkpoint.from_directory(d))


def run_tune(trials: int, trial_s: float) -> dict:
    """The Tune experiment (see the module docstring); per trial: warm_start s, wall s; per registration: s."""
    import ray
    from ray import tune

    from keeper.tune_integration import KeeperCallback

    with tempfile.TemporaryDirectory(prefix="keeper-overhead-tune-") as work:
        # an empty architecture cache: the first trial of each architecture traces it, later ones read it
        os.environ["KEEPER_ARCH_CACHE"] = os.path.join(work, "arch-cache")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            callback = KeeperCallback(metric="accuracy", mode="max", zoo=os.path.join(work, "zoo"))
            layers = [5 + i % 4 for i in range(trials)]
            space = {"index": tune.grid_search(list(range(trials))), "trial_s": trial_s,
                     "layers": tune.sample_from(lambda spec: layers[spec.config["index"]])}
            grid = tune.Tuner(tune.with_resources(_tune_trainable, {"cpu": 1}), param_space=space,
                              tune_config=tune.TuneConfig(max_concurrent_trials=2),
                              run_config=tune.RunConfig(storage_path=work, callbacks=[callback])).fit()
            rows = sorted((dict(r.metrics, trial_id=r.metrics.get("trial_id", "")) for r in grid),
                          key=lambda m: m["index"])
            return {"trials": rows, "registration": dict(callback.registration_s)}
        finally:
            ray.shutdown()


def write_report(args, rows: list[dict], tune: dict | None, seconds: float, loads: list[float]) -> None:
    import torch

    lines = ["# keeper's overhead on the user's clock (scripts/bench_overhead.py)", "",
             f"Command: `python scripts/bench_overhead.py {' '.join(sys.argv[1:])}`; {len(rows)} models, "
             f"{args.reps} fresh processes per figure (median); {seconds / 60:.1f} min; 1-minute load average "
             f"{min(loads):.1f}-{max(loads):.1f} (2 is this machine's two cores busy); {platform.machine()}, "
             f"{os.cpu_count()} CPUs, torch {torch.__version__}.", "",
             "Every figure is a fresh process's first call, timed after its imports and after the module is built "
             "(see the script's docstring); 'new' is an architecture no process traced before, 'known' one another "
             "process traced (kept on disk). Target: warm_start and register at most max(1 s, 3x the safetensors "
             "load) up to 100M parameters, 3x the load at 1B.", ""]
    lines += report_rows(rows, set(LARGE))
    if tune is not None:
        lines += ["", "## Tune trials", "", f"{len(tune['trials'])} trials of the 4.8M transformer, each training "
                  f"{args.trial_s:.0f} s after its warm_start line, 2 at a time on a local 2-CPU Ray with "
                  "configs/default.yaml; the driver waits for each trial's registration (KeeperCallback's default).",
                  "", "| trial | parent | warm_start s | trial wall s | keeper's share | registration s (driver) |",
                  "|---|---|---|---|---|---|"]
        for t in tune["trials"]:
            reg = tune["registration"].get(t["trial_id"], float("nan"))
            lines.append(f"| {t['index']} | {t['parent'] or '-'} | {t['warm_s']:.2f} | {t['wall_s']:.1f} | "
                         f"{100 * t['warm_s'] / t['wall_s']:.1f}% | {reg:.2f} |")
        shares = [t["warm_s"] / t["wall_s"] for t in tune["trials"]]
        lines += ["", f"keeper's share of a trial's wall time: max {100 * max(shares):.1f}%, mean "
                  f"{100 * statistics.mean(shares):.1f}% (target below 5%)."]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_overhead.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "bench_overhead.json"), "w") as f:
        json.dump({"rows": rows, "tune": tune, "loads": loads}, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
