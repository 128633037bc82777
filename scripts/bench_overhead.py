"""keeper's own overhead on the user's clock: ``warm_start`` and ``register`` of torch modules in a fresh process,
first call included, against a safetensors load of the module's weights into it (and a save, for register); and
keeper's share of Tune trials.

Fresh process. For each model (a 2-layer MLP, a 0.7M 1-D ResNet, 4.8M and 25M pre-LN transformer classifiers, a
~100M Hugging Face GPT-2, and GPT-2 small itself, 124M, from its default config; ``--large`` adds a ~1B GPT-2) a
setup process registers a related parent (narrower or one or two blocks shallower) into a zoo on local disk and
writes the child's initial weights as safetensors. Then every measurement runs in its own new Python process, timed
after the imports and after the module is built, on each device of ``--devices`` (``cuda`` where torch sees one;
"not measured: no GPU" otherwise):

* ``load``: the child's weights loaded into the built module on the device, ``load_state_dict(load_file(...))``
  (the yardstick of warm_start: what starting from a checkpoint of the same architecture costs; ``load_file``
  alone only maps the file);
* ``save``: ``safetensors.torch.save_model`` of the built child (the yardstick of register: keeper writes the
  same bytes into the zoo);
* ``warm``: ``keeper.torch_support.warm_start(child, x, zoo, noise=0)``, the first call of the process;
* ``register``: ``keeper.torch_support.register(child, x, zoo, 0.9)`` of a trained-like child into a zoo of its own.

Each is repeated ``--reps`` times (new processes) and the median is reported, for each front end: keeper's default
and torch's ONNX exporters (``KEEPER_EXPORTER=dynamo`` and ``torchscript``), and for two states of the disk
architecture cache (``KEEPER_ARCH_CACHE``): ``new``, an architecture no process traced before (an empty cache per
measurement), and ``known``, one another process already traced (a Tune trial of an architecture an earlier trial
ran; the cache filled by one unmeasured warm_start first).
``--models`` also takes Hugging Face language models of 3-209M parameters as users build them (``LANGUAGE``:
gpt2-3m, gpt2-25m, llama-3m, llama-25m, llama-100m, and gpt2-209m, GPT-2 small grown to 24 layers, warmed from GPT-2
small itself); ``scripts/check_gpu.py`` measures those on a GPU.
Targets: warm_start at most max(1 s, 3x load) for models up to 124M parameters, and 3x load for the 209M child and
at 1B; register at most max(1 s, 3x save) (3x save for those two). ``--measure register`` (or ``warm``) times only
that call.

Tune (``--tune``): a Tune experiment on a local 2-CPU Ray with the shipped defaults (``configs/default.yaml``):
``--trials`` trials of the 4.8M transformer, each training for ``--trial-s`` seconds after one ``warm_start`` line,
two at a time, with ``KeeperCallback`` registering each finished trial (in its registrar: the driver does not
wait). Reported per trial: warm_start seconds, the trial's wall time, the share; and each registration's seconds
from the hand-over to the driver seeing the record. Target: keeper's share below 5% for trials of 60 s.

Usage:
    python scripts/bench_overhead.py [--reps 3] [--models mlp,resnet,tf5m,tf25m,gpt2-100m,gpt2-124m] [--large]
        [--devices cpu,cuda] [--measure warm,register] [--tune]
    python scripts/bench_overhead.py --models gpt2-124m --fronts default --caches new --measure register --reps 5
    python scripts/bench_overhead.py --tune --trials 6 --trial-s 60

Writes ``reports/bench_overhead.md`` and ``.json`` (``--report NAME`` for a focused run's own file).
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
MODELS = ("mlp", "resnet", "tf5m", "tf25m", "gpt2-100m", "gpt2-124m")
# Hugging Face language models as users build them (``*LMHeadModel`` / ``*ForCausalLM``, logits out), by name:
# (family, width, layers, vocabulary, positions, attention). gpt2-124m is GPT-2 small's own config; gpt2-209m is it
# grown to 24 layers, its parent GPT-2 small itself. The rest: the sizes of a language-model NAS (3-100M).
LANGUAGE = {
    "gpt2-3m": ("gpt2", 192, 4, 8192, 128, "sdpa"), "gpt2-25m": ("gpt2", 512, 7, 8192, 128, "sdpa"),
    "gpt2-100m": ("gpt2", 768, 14, 8192, 128, "eager"), "gpt2-124m": ("gpt2", 768, 12, 50257, 1024, "eager"),
    "gpt2-209m": ("gpt2", 768, 24, 50257, 1024, "eager"), "gpt2-1b": ("gpt2", 2048, 20, 8192, 128, "eager"),
    "llama-3m": ("llama", 128, 4, 8192, 128, "sdpa"), "llama-25m": ("llama", 512, 5, 8192, 128, "sdpa"),
    "llama-100m": ("llama", 768, 12, 8192, 128, "sdpa"),
}
# a parent's layers where it is not the child's less two
PARENT_LAYERS = {"gpt2-209m": 12}
MORE = tuple(m for m in LANGUAGE if m not in MODELS and m != "gpt2-1b")
DEVICES = ("cpu", "cuda")
MEASURES = ("warm", "register")
NO_GPU = "not measured: no GPU"
LARGE = ("gpt2-1b",)
# models whose targets are 3x the yardstick, without the 1 s floor
STRICT = LARGE + ("gpt2-209m",)

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
    if name in LANGUAGE:
        family, d, layers, vocab, positions, attention = LANGUAGE[name]
        if role == "parent":
            layers = PARENT_LAYERS.get(name, layers - 2)
        if family == "gpt2":
            from transformers import GPT2Config as Config, GPT2LMHeadModel as LM
            cfg = Config(vocab_size=vocab, n_positions=positions, n_embd=d, n_layer=layers, n_head=d // 64,
                         attn_implementation=attention)
        else:
            from transformers import LlamaConfig as Config, LlamaForCausalLM as LM
            heads = max(2, d // 64)
            cfg = Config(vocab_size=vocab, max_position_embeddings=positions, hidden_size=d,
                         intermediate_size=8 * round(2.6875 * d / 8), num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads // 2, attn_implementation=attention)
        class Logits(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = LM(cfg)
            def forward(self, ids):
                return self.model(input_ids=ids).logits
        return Logits().eval(), torch.arange(16).reshape(1, 16)
    raise SystemExit(f"unknown model {name}")


def on_device(module, x):
    """``(module, x)`` on DEVICE, as a trial on it holds them."""
    return module.to(DEVICE), x.to(DEVICE)


def synced():
    """A clock reading once DEVICE has finished its queued work (cuda runs asynchronously)."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()
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
# the module is built on the device before the clock starts, as in the measured processes
child, x = on_device(*build(MODEL, "child"))
t0 = synced()
child.load_state_dict(load_file(WEIGHTS, device=DEVICE))
print(json.dumps({"seconds": synced() - t0}))
'''

SAVE = r'''
from safetensors.torch import save_model
child, x = on_device(*build(MODEL, "child"))
t0 = synced()
save_model(child, OUT)  # tied tensors written once, as keeper writes them
print(json.dumps({"seconds": time.perf_counter() - t0}))
'''

WARM = r'''
import keeper
from keeper.torch_support import warm_start
child, x = on_device(*build(MODEL, "child"))
zoo = keeper.Zoo(ZOO)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    t0 = synced()
    r = warm_start(child, x, zoo, noise=0.0)
    t = synced() - t0
on = {str(p.device.type) for p in child.parameters()} == {DEVICE}
print(json.dumps({"seconds": t, "parent": r.parent, "preserved": bool(r.preserved), "score": float(r.score),
                  "on_device": on}))
'''

REGISTER = r'''
import keeper
from keeper.torch_support import register
child, x = on_device(*build(MODEL, "child"))
zoo = keeper.Zoo(ZOO)

def file_traffic():
    """(bytes read, bytes written) by this process's read/write calls so far; None off Linux."""
    try:
        with open("/proc/self/io") as f:
            io = dict(line.split(": ") for line in f.read().splitlines())
        return int(io["rchar"]), int(io["wchar"])
    except (OSError, KeyError, ValueError):
        return None
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    io0 = file_traffic()
    t0 = synced()
    rec = register(child, x, zoo, 0.9, name=f"run-{SEED}")
    t = time.perf_counter() - t0
    io1 = file_traffic()
traffic = {} if io0 is None or io1 is None else {"read_mb": (io1[0] - io0[0]) / 1e6, "written_mb": (io1[1] - io0[1]) / 1e6}
print(json.dumps({"seconds": t, "name": rec.name, "stored_mb": rec.nbytes / 1e6, **traffic}))
'''


def _run(code: str, env_extra: dict, **values) -> dict:
    """Run ``PRELUDE + code`` in a new Python process with ``values`` bound; its last stdout line as JSON."""
    values = dict({"DEVICE": "cpu"}, **values, ROOT=ROOT, LANGUAGE=LANGUAGE, PARENT_LAYERS=PARENT_LAYERS)
    binds = "".join(f"{k} = {v!r}\n" for k, v in values.items())
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


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (asked in a child process: this one never imports torch for it)."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                         capture_output=True, text=True, timeout=600)
    return out.stdout.strip().endswith("True")


def measure_model(model: str, plan: dict, work: str) -> dict:
    """One model's figures: ``row[device]`` holds the load and save yardsticks and, per front end and cache state,
    the warm_start and register runs (each ``plan['reps']`` fresh processes)."""
    zoo, weights = os.path.join(work, f"zoo-{model}"), os.path.join(work, f"{model}.safetensors")
    info = _run(SETUP, {"KEEPER_ARCH_CACHE": "off"}, MODEL=model, ZOO=zoo, WEIGHTS=weights, SEED=0)
    row = {"model": model, **info}
    for device in plan["devices"]:
        row[device] = fig = {"load": [], "save": [], "warm": {}, "register": {}}
        for rep in range(plan["reps"]):
            fig["load"].append(_run(LOAD, {}, MODEL=model, WEIGHTS=weights, SEED=rep, DEVICE=device)["seconds"])
            fig["save"].append(_run(SAVE, {}, MODEL=model, OUT=os.path.join(work, f"save-{model}.safetensors"),
                                    SEED=rep, DEVICE=device)["seconds"])
        for front in plan["fronts"]:
            for state in plan["states"]:
                _measure_calls(fig, model, device, front, state, plan, work, zoo)
    return row


def _measure_calls(fig: dict, model: str, device: str, front: str, state: str, plan: dict, work: str,
                   zoo: str) -> None:
    """The warm_start and register runs of one front end and cache state on ``device``, into ``fig``."""
    label, known = f"{front}, {state}", os.path.join(work, f"cache-{model}-{front}-{device}")
    if state == "known":  # one process traces the architecture; the measured ones find it on disk
        _run(WARM, _env(front, known), MODEL=model, ZOO=zoo, SEED=99, DEVICE=device)
    warms, regs = [], []
    for rep in range(plan["reps"]):
        if "warm" in plan["measure"]:
            cache = known if state == "known" else os.path.join(work, f"cache-{model}-{front}-{device}-{rep}-w")
            warms.append(_run(WARM, _env(front, cache), MODEL=model, ZOO=zoo, SEED=rep, DEVICE=device))
        if "register" in plan["measure"]:
            cache = known if state == "known" else os.path.join(work, f"cache-{model}-{front}-{device}-{rep}-r")
            reg = _run(REGISTER, _env(front, cache), MODEL=model, SEED=100 + rep, DEVICE=device,
                       ZOO=os.path.join(work, f"reg-{model}-{front}-{state}-{device}"))
            regs.append(reg["seconds"])
            fig.setdefault("register_traffic", {}).setdefault(label, []).append(
                {k: reg[k] for k in ("read_mb", "written_mb", "stored_mb") if k in reg})
    fig["warm"][label], fig["register"][label] = warms, regs
    med = {k: f"{statistics.median(v):7.2f} s" if v else "      -" for k, v in
           (("warm", [w["seconds"] for w in warms]), ("register", regs))}
    print(f"{model:10s} {device:4s} {label:22s} warm {med['warm']}  register {med['register']}  load "
          f"{statistics.median(fig['load']):.3f} s  save {statistics.median(fig['save']):.3f} s", flush=True)


def _load_avg() -> float:
    return os.getloadavg()[0]


def _cells(fig: dict, front: str, large: bool) -> dict:
    """One device's figures of one front end and cache state: medians, targets and whether each is met."""
    load, save = statistics.median(fig["load"]), statistics.median(fig["save"])
    warms, regs = fig["warm"].get(front, []), fig["register"].get(front, [])
    out = {"load": load, "save": save, "warm_target": 3 * load if large else max(1.0, 3 * load),
           "register_target": 3 * save if large else max(1.0, 3 * save),
           "warm": statistics.median(w["seconds"] for w in warms) if warms else None,
           "register": statistics.median(regs) if regs else None, "first": warms[0] if warms else None}
    for k in ("warm", "register"):
        out[f"{k}_met"] = None if out[k] is None else out[k] <= out[f"{k}_target"]
    return out


def _met(value: float | None, met: bool | None) -> str:
    return "-" if value is None else f"{value:.2f} {'yes' if met else '**no**'}"


def _cuda_cell(g: dict) -> str:
    figures = " / ".join("-" if g[k] is None else f"{g[k]:.2f}" for k in ("warm", "register"))
    met = g["warm_met"] is not False and g["register_met"] is not False
    return f"{figures} ({g['load']:.3f} / {g['save']:.3f}; {'yes' if met else '**no**'})"


def report_rows(rows: list[dict], large: set[str], devices: tuple[str, ...]) -> list[str]:
    """The table: the cpu figures in columns of their own, cuda's in one column (or why it was not measured)."""
    lines = ["| model | params | front end, architecture | warm_start s, met | register s, met | load s | save s | "
             "target warm / register s | cuda: warm_start / register s (load / save s; met) | parent (preserved) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        big = r["model"] in large
        for front in r["cpu"]["warm"] if "cpu" in r else r["cuda"]["warm"]:
            c = _cells(r["cpu"], front, big) if "cpu" in r else None
            cpu = ("| - | - | - | - | - " if c is None else
                   f"| {_met(c['warm'], c['warm_met'])} | {_met(c['register'], c['register_met'])} | "
                   f"{c['load']:.3f} | {c['save']:.3f} | {c['warm_target']:.2f} / {c['register_target']:.2f} ")
            g = _cells(r["cuda"], front, big) if "cuda" in r else None
            cuda = (NO_GPU if "cuda" in devices else "not asked") if g is None else _cuda_cell(g)
            first = (c or g)["first"]
            parent = "-" if first is None else f"{first['parent']} ({'yes' if first['preserved'] else 'no'})"
            lines.append(f"| {r['model']} | {r['params'] / 1e6:.1f}M | {front} {cpu}| {cuda} | {parent} |")
    return lines


def traffic_rows(rows: list[dict]) -> list[str]:
    """What each register call read and wrote through files (``/proc/self/io``: every read and write call of the
    process, page cache or not), against what the zoo stored: the number of passes over the weights, whatever
    the machine's load."""
    out = []
    for r in rows:
        for device in DEVICES:
            for label, runs in r.get(device, {}).get("register_traffic", {}).items():
                runs = [t for t in runs if "written_mb" in t]
                if runs:
                    out.append(f"| {r['model']} | {device} | {label} | {runs[0]['stored_mb']:.0f} | "
                               f"{statistics.median(t['written_mb'] for t in runs):.0f} | "
                               f"{statistics.median(t['read_mb'] for t in runs):.0f} |")
    if not out:
        return []
    return ["", "register's file traffic (median per call, against the bytes the zoo stored):", "",
            "| model | device | front end, architecture | stored MB | written MB | read MB |", "|---|---|---|---|---|---|",
            *out]


def _plan(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """The checked choices of what to measure (a usage error names what is unknown)."""
    plan = {"models": [m for m in args.models.split(",") if m] + (list(LARGE) if args.large else []),
            "fronts": tuple(f for f in args.fronts.split(",") if f),
            "states": tuple(s for s in args.caches.split(",") if s),
            "devices": tuple(d for d in args.devices.split(",") if d),
            "measure": tuple(m for m in args.measure.split(",") if m), "reps": args.reps}
    for name, key, known in (("--fronts", "fronts", FRONT_ENDS), ("--caches", "states", CACHE_STATES),
                             ("--models", "models", MODELS + MORE + LARGE), ("--devices", "devices", DEVICES),
                             ("--measure", "measure", MEASURES)):
        bad = [g for g in plan[key] if g not in known]
        if bad or not plan[key]:
            p.error(f"{name}: {', '.join(bad) or 'nothing given'}; expected some of {', '.join(known)}")
    return plan


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--fronts", default=",".join(FRONT_ENDS))
    p.add_argument("--caches", default=",".join(CACHE_STATES),
                   help="architecture cache states to measure: new (never traced), known (traced by another process)")
    p.add_argument("--devices", default=",".join(DEVICES), help="cuda is measured where torch sees a GPU")
    p.add_argument("--measure", default=",".join(MEASURES), help="which calls to time: warm, register")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--large", action="store_true", help="add the ~1B GPT-2 (several GB of memory and disk)")
    p.add_argument("--tune", action="store_true", help="also run the Tune experiment")
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--trial-s", type=float, default=60.0)
    p.add_argument("--out", default=os.path.join(ROOT, "reports"))
    p.add_argument("--report", default="bench_overhead", help="the report's file name, without .md / .json")
    args = p.parse_args()
    plan = _plan(p, args)
    measured = dict(plan, devices=tuple(d for d in plan["devices"] if d != "cuda" or cuda_available()))
    if "cuda" in plan["devices"] and "cuda" not in measured["devices"]:
        print(f"cuda: {NO_GPU} (torch sees no CUDA device here)", flush=True)
    started, loads = time.time(), [_load_avg()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="keeper-overhead-") as work:
        for model in plan["models"]:
            rows.append(measure_model(model, measured, work))
            loads.append(_load_avg())
    tune = run_tune(args.trials, args.trial_s) if args.tune else None
    write_report(args, plan, rows, tune, time.time() - started, loads)


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


def write_report(args, plan: dict, rows: list[dict], tune: dict | None, seconds: float, loads: list[float]) -> None:
    import torch

    lines = ["# keeper's overhead on the user's clock (scripts/bench_overhead.py)", "",
             f"Command: `python scripts/bench_overhead.py {' '.join(sys.argv[1:])}`; {len(rows)} models, "
             f"{args.reps} fresh processes per figure (median); {seconds / 60:.1f} min; 1-minute load average "
             f"{min(loads):.1f}-{max(loads):.1f} (2 is this machine's two cores busy); {platform.machine()}, "
             f"{os.cpu_count()} CPUs, torch {torch.__version__}"
             f"{f', {torch.cuda.get_device_name(0)}' if torch.cuda.is_available() else ', no GPU'}.", "",
             "Every figure is a fresh process's first call, timed after its imports and after the module is built "
             "(see the script's docstring); 'new' is an architecture no process traced before, 'known' one another "
             "process traced (kept on disk). Targets: warm_start at most max(1 s, 3x the safetensors load of the "
             "weights into the module), "
             "register at most max(1 s, 3x the safetensors save of the same module), up to 124M parameters; 3x "
             "the load / save for the 209M child and at 1B. The cuda column holds the same figures for the module and input "
             "on cuda.", ""]
    lines += report_rows(rows, set(STRICT), plan["devices"])
    lines += traffic_rows(rows)
    if tune is not None:
        lines += ["", "## Tune trials", "", f"{len(tune['trials'])} trials of the 4.8M transformer, each training "
                  f"{args.trial_s:.0f} s after its warm_start line, 2 at a time on a local 2-CPU Ray with "
                  "configs/default.yaml; each finished trial is registered by keeper's registrar while the driver goes "
                  "on (registration s: from the hand-over to the driver seeing the record, an upper bound).",
                  "", "| trial | parent | warm_start s | trial wall s | keeper's share | registration s |",
                  "|---|---|---|---|---|---|"]
        for t in tune["trials"]:
            reg = tune["registration"].get(t["trial_id"], float("nan"))
            lines.append(f"| {t['index']} | {t['parent'] or '-'} | {t['warm_s']:.2f} | {t['wall_s']:.1f} | "
                         f"{100 * t['warm_s'] / t['wall_s']:.1f}% | {reg:.2f} |")
        shares = [t["warm_s"] / t["wall_s"] for t in tune["trials"]]
        lines += ["", f"keeper's share of a trial's wall time: max {100 * max(shares):.1f}%, mean "
                  f"{100 * statistics.mean(shares):.1f}% (target below 5%)."]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{args.report}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, f"{args.report}.json"), "w") as f:
        json.dump({"rows": rows, "tune": tune, "loads": loads}, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
