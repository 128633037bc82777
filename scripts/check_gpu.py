"""keeper on a GPU, checked in one run of a few minutes: the torch front end reads every catalogue model on cuda
as on the CPU, the first warm_start and register of 3-209M-parameter language models on cuda cost what a
safetensors load / save costs, and the README's Tune example runs with GPU shares.

Steps (``--steps``, all by default), each a group of rows of one table:

* ``trace``: every catalogue model (hf_catalogue, keeper_bench.families, torchvision / timm where
  they import, and GPT-2 / Llama built as users build them, ``*LMHeadModel`` / ``*ForCausalLM`` with their default
  attention) traced by the torch front end (``keeper.torch_support.trace``) on the CPU, then on the device in
  float32 and with bfloat16 weights: the device's LayerGraphs must equal the CPU's array by array
  (``trace_check.compare_graphs``), and a model the front end cannot read on either is a failure (it
  would fall back to the exporter, seconds in every trial);
* ``kernels``: which alignment kernels this install runs; where they are numba's (no ``keeper._dpcore``), two
  fresh processes load them (``keeper doctor --load-kernels``): the first on this machine compiles, the second
  must not, and the timings below then pay what every later trial pays;
* ``first``: the first ``warm_start`` and ``register`` in a fresh process with the module on the device
  (``scripts/bench_overhead.py``'s measurement: a parent one or two blocks shallower registered first, the
  architecture new to the machine), against a safetensors load into the module (``warm_start``) and a save
  (``register``) of the same weights; targets max(1 s, 3x), and 3x for the 209M GPT-2 grown from GPT-2 small;
* ``tune``: the README's Tune example as written (4 trials, a quarter GPU each on cuda, ``KeeperCallback``) on a
  local Ray; skipped, saying so, where Ray cannot be imported.

It needs torch, transformers, onnx, numba, pyarrow and safetensors; not Ray (but for ``tune``), not the C
extension (the numba kernels are measured then), not onnxscript (the exporter is never called: a fallback is
reported, not run). ``--device cuda`` (the default) on a machine without a GPU says so and exits 0;
``--device cpu`` runs every step on the CPU, for the code path and CPU figures.

Usage:
    python scripts/check_gpu.py                      # on a GPU machine: reports/check_gpu.md and .json
    python scripts/check_gpu.py --device cpu --sizes small   # here: reports/check_gpu_cpu.md and .json
    python scripts/check_gpu.py --steps trace --only gpt2,llama

Exit status: 0 when every row passed or was skipped, 1 when one failed.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))  # the tests' catalogue of real architectures

import bench_overhead  # noqa: E402  (the fresh-process measurement, one code path for both scripts)

STEPS = ("trace", "kernels", "first", "tune")
SIZES = {"small": ("gpt2-3m", "llama-3m"),
         "all": ("gpt2-3m", "llama-3m", "gpt2-25m", "llama-25m", "llama-100m", "gpt2-124m", "gpt2-209m")}


def _row(step: str, item: str, cpu: str, device: str, result: str, ok: bool | None, detail: str = "") -> dict:
    """One table row; ``ok`` None: skipped; ``detail`` goes to the JSON only."""
    return {"step": step, "item": item, "cpu": cpu, "device": device, "result": result, "ok": ok, "detail": detail}


# ------------------------------------------------------------------------------------------------------ trace
def _user_lms() -> dict:
    """GPT-2 and Llama as a user builds them: the LM classes with their default attention, logits out."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self, lm: torch.nn.Module):
            super().__init__()
            self.model = lm

        def forward(self, ids):
            return self.model(input_ids=ids).logits

    def gpt2():
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4, bos_token_id=0,
                         eos_token_id=0)
        return Logits(GPT2LMHeadModel(cfg)).eval(), (torch.arange(16).reshape(1, 16),)

    def llama():
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        return Logits(LlamaForCausalLM(cfg)).eval(), (torch.arange(16).reshape(1, 16),)

    return {"user/gpt2-lm-head": gpt2, "user/llama-causal-lm": llama}


def catalogue() -> tuple[dict, dict[str, str]]:
    """``(name -> builder of (module, args), {library: why it is left out})``: the Hugging Face catalogue, the
    benchmark families, torchvision / timm where they import, and the user-built language models."""
    import hf_catalogue
    from keeper_bench import families

    builders = {f"hf/{n}": (lambda n=n: hf_catalogue.build(n, seed=1)) for n in hf_catalogue.CATALOGUE}
    for fam in families.FAMILIES:
        spec = families.sized_spec(fam, 200_000)
        builders[f"family/{fam}"] = lambda spec=spec: (families.build(spec).eval(), (families.example_input(spec),))
    vision, skipped = hf_catalogue.optional_catalogue()
    for n in vision:
        builders[f"vision/{n}"] = lambda n=n: hf_catalogue.build(n, seed=1, builders=vision)
    builders.update(_user_lms())
    return builders, skipped


def _moved(args: tuple, device: str, dtype=None) -> tuple:
    import torch

    def one(a):
        if not isinstance(a, torch.Tensor):
            return a
        a = a.to(device)
        return a.to(dtype) if dtype is not None and a.is_floating_point() else a
    return tuple(one(a) for a in args)


def _trace(module, args) -> tuple[object, float]:
    """``((graph, keys) or the reason it cannot be read, seconds)`` of the torch front end on ``module``."""
    from keeper.errors import TraceUnsupported
    from keeper.torch_support.tensors import drop_eval_caches
    from keeper.torch_support.trace import trace_graph

    t0 = time.perf_counter()
    try:
        traced = trace_graph(module, args)
        keys, graph = traced.keys, traced.graph
        found = (graph, keys)
    except TraceUnsupported as exc:
        found = f"falls back: {exc}"
    except Exception as exc:  # noqa: BLE001 - export_graph falls back on any error: a finding, not a crash
        found = f"falls back: {type(exc).__name__}: {exc}"
    finally:
        drop_eval_caches(module)
    return found, time.perf_counter() - t0


def _differing(diff: list[str], a, b) -> str:
    """What :func:`compare_graphs` found, in a few words: the arrays that differ, with the node and layer counts."""
    arrays = sorted({d.split(":", 1)[0] for d in diff if not d.startswith(("layer ", "attrs", "unread"))})
    layers = sum(d.startswith("layer ") for d in diff)
    parts = [f"arrays {', '.join(arrays)}"] if arrays else []
    parts += [f"tensors of {layers} layers"] if layers else []
    parts += [d.split(":", 1)[0] for d in diff if d.startswith(("attrs", "unread"))]
    return (f"{', '.join(parts)} ({a.num_nodes} nodes / {a.num_layers} layers on the CPU, {b.num_nodes} / "
            f"{b.num_layers} here)")


def trace_rows(device: str, only: list[str] | None) -> list[dict]:
    import torch

    from trace_check import compare_graphs

    builders, skipped = catalogue()
    rows = [_row("trace", f"{lib} models", "-", "-", f"skipped: {why}", None) for lib, why in skipped.items()]
    for name, build in builders.items():
        if only and not any(s in name for s in only):
            continue
        module, args = build()
        cpu, t_cpu = _trace(module, args)
        dev, t_dev = _trace(copy.deepcopy(module).to(device), _moved(args, device))
        bf, t_bf = _trace(copy.deepcopy(module).to(device, torch.bfloat16), _moved(args, device, torch.bfloat16))
        found, detail = [], []
        for label, got in (("cpu", cpu), (device, dev), (f"{device} bf16", bf)):
            if isinstance(got, str):
                found.append(f"{label} {got}")
            elif label != "cpu" and not isinstance(cpu, str):
                diff = compare_graphs(cpu[0], cpu[1], got[0], got[1])
                found += [f"{label} differs: {_differing(diff, cpu[0], got[0])}"] if diff else []
                detail += diff
        result = "same LayerGraph" if not found else "; ".join(found)[:400]
        rows.append(_row("trace", name, f"{t_cpu * 1e3:.0f} ms",
                         f"{t_dev * 1e3:.0f} ms, bf16 {t_bf * 1e3:.0f} ms", result, not found, "\n".join(detail)))
        print(f"trace {name:34s} {result[:100]}", flush=True)
    return rows


# ---------------------------------------------------------------------------------------------------- kernels
def kernel_rows(device: str) -> list[dict]:
    """The kernels in use; for numba, a first and a second fresh process loading them (the second must load)."""
    from keeper.matching import core as alignment_core

    if alignment_core.IMPLEMENTATION == "c":
        return [_row("kernels", "alignment kernels", "C extension (keeper._dpcore)", "-", "no compile anywhere", True)]
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-m", "keeper.cli", "doctor", "--load-kernels", "--json"], cwd=ROOT,
                             capture_output=True, text=True, timeout=600,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
                                 "PYTHONPATH", "")])})
        if out.returncode != 0:
            return [_row("kernels", "numba kernels", "-", "-", f"keeper doctor failed: {out.stderr[-300:]}", False)]
        runs.append(json.loads(out.stdout)["kernels"])
    first, second = (r["load"] for r in runs)
    ok = not second["compiled"]
    what = "compiled" if first["compiled"] else "loaded (compiled on this machine before)"
    return [_row("kernels", f"numba kernels ({alignment_core.MISSING_REASON})",
                 f"1st process: {what} in {first['seconds']:.2f} s",
                 f"2nd process: {'loaded' if ok else 'COMPILED AGAIN'} in {second['seconds']:.2f} s",
                 f"cached in {runs[1]['cache']}" if ok else "the compile is not cached per machine", ok)]


# ------------------------------------------------------------------------------------------------------ first
def first_rows(device: str, models: tuple[str, ...], reps: int) -> list[dict]:
    plan = {"devices": (device,), "fronts": ("default",), "states": ("new",), "measure": ("warm", "register"),
            "reps": reps}
    rows = []
    with tempfile.TemporaryDirectory(prefix="keeper-check-gpu-") as work:
        for model in models:
            try:
                got = bench_overhead.measure_model(model, plan, work)
            except SystemExit as exc:  # a measurement process failed: its stderr is the finding
                rows.append(_row("first", model, "-", "-", f"FAILED: {str(exc)[-300:]}", False))
                continue
            c = bench_overhead._cells(got[device], "default, new", model in bench_overhead.STRICT)
            first = c["first"] or {}
            on = first.get("on_device", False)
            ok = bool(c["warm_met"] and c["register_met"] and on and first.get("preserved"))
            rows.append(_row("first", f"{model} ({got['params'] / 1e6:.1f}M)",
                             f"load {c['load']:.3f} s, save {c['save']:.3f} s",
                             f"warm_start {c['warm']:.2f} s (target {c['warm_target']:.2f}), register "
                             f"{c['register']:.2f} s (target {c['register_target']:.2f})",
                             f"parent {first.get('parent')}, preserved {first.get('preserved')}, stays on {device}: "
                             f"{on}; {'met' if c['warm_met'] and c['register_met'] else 'NOT met'}", ok))
    return rows


# ------------------------------------------------------------------------------------------------------- tune
def tune_rows(device: str) -> list[dict]:
    """The README's Tune example as written, on a local Ray with this machine's CPUs and GPUs."""
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        return [_row("tune", "README Tune example", "-", "-", f"skipped: Ray cannot be imported here ({exc}); the "
                     "Tune integration needs it (pip install 'ray[tune]')", None)]
    import torch

    block = re.search(r"<!-- readme-test: tune -->\s*\n```python\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S)
    gpus = torch.cuda.device_count()
    prelude = f"import ray\nray.init(num_cpus={min(8, os.cpu_count() or 2)}, num_gpus={gpus}, include_dashboard=False)\n"
    with tempfile.TemporaryDirectory(prefix="keeper-check-tune-") as tmp:
        script = Path(tmp) / "readme_tune.py"
        script.write_text(prelude + block.group(1) + "\n")
        env = {**os.environ, "KEEPER_ZOO": str(Path(tmp) / "zoo"), "HOME": tmp, "RAY_USAGE_STATS_ENABLED": "0",
               "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
                   "PYTHONPATH", "")])}
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, str(script)], cwd=tmp, env=env, capture_output=True, text=True,
                             timeout=600)
        seconds = time.perf_counter() - t0
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    found = re.fullmatch(r"(cpu|cuda) (True|False) (\[.*\]) (\d+) registered", last)
    if out.returncode != 0 or not found:
        return [_row("tune", "README Tune example", "-", f"{seconds:.0f} s", f"FAILED: {out.stderr[-300:]}", False)]
    parents = [p for p in eval(found.group(3), {}) if p]  # noqa: S307 - the example's own printed list
    ran_on = found.group(1)
    ok = found.group(2) == "True" and int(found.group(4)) == 4 and len(parents) >= 1 and (
        ran_on == "cuda" or device == "cpu")
    share = " (a quarter GPU per trial)" if ran_on == "cuda" else ""
    return [_row("tune", "README Tune example", "-", f"{seconds:.0f} s on {ran_on}{share}",
                 f"trials on {ran_on}, modules stayed there: {found.group(2)}; {len(parents)} of 4 warmed; "
                 f"{found.group(4)} registered", ok)]


# ----------------------------------------------------------------------------------------------------- report
def table(rows: list[dict], device: str) -> list[str]:
    lines = [f"| step | item | the CPU (reference) | {'cuda' if device == 'cuda' else 'the CPU (as the device)'} | result |",
             "|---|---|---|---|---|"]
    for r in rows:
        mark = "" if r["ok"] is not False else "**FAIL** "
        lines.append(f"| {r['step']} | {r['item']} | {r['cpu']} | {r['device']} | {mark}{r['result']} |")
    return lines


def write(rows: list[dict], args: argparse.Namespace, device_name: str, seconds: float, quiet: bool = False) -> None:
    import torch

    failed = sum(r["ok"] is False for r in rows)
    passed = sum(r["ok"] is True for r in rows)
    head = [f"# keeper on a GPU: {device_name} (scripts/check_gpu.py)", "",
            f"Command: `python scripts/check_gpu.py {' '.join(sys.argv[1:])}`; {seconds / 60:.1f} min; "
            f"{platform.machine()}, {os.cpu_count()} CPUs, 1-minute load average {os.getloadavg()[0]:.1f}; torch "
            f"{torch.__version__}; Ray {'present' if _has('ray') else 'absent'}.", "",
            f"{passed} passed, {failed} failed, {len(rows) - passed - failed} skipped. See the script's docstring for "
            "what each step checks.", ""]
    lines = head + table(rows, args.device)
    name = args.report or ("check_gpu" if args.device == "cuda" else f"check_gpu_{args.device}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    (out / f"{name}.json").write_text(json.dumps({"device": device_name, "rows": rows}, indent=1))
    if not quiet:
        print("\n".join(lines))


def _has(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a package that is present but broken counts as absent
        return False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--steps", default=",".join(STEPS), help=f"some of {', '.join(STEPS)}")
    p.add_argument("--sizes", default=None, choices=tuple(SIZES),
                   help="language models of the first step (default: all on cuda, small on cpu)")
    p.add_argument("--only", default="", help="trace step: comma-separated substrings of the model names")
    p.add_argument("--reps", type=int, default=1, help="fresh processes per figure of the first step (median)")
    p.add_argument("--out", default=str(ROOT / "reports"))
    p.add_argument("--report", default=None, help="report name (default: check_gpu, or check_gpu_cpu)")
    args = p.parse_args()
    steps = [s for s in args.steps.split(",") if s]
    if not steps or any(s not in STEPS for s in steps):
        p.error(f"--steps {args.steps!r}: expected some of {', '.join(STEPS)}")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"no GPU here: torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False), "
              "so there is nothing to check on cuda. Run this on a GPU machine, or `--device cpu` to run the same "
              "steps on the CPU.")
        return 0
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU ({platform.processor() or 'cpu'})"
    warnings.simplefilter("ignore")  # each row says what went wrong; the exporter's chatter is not a finding
    t0 = time.time()
    run = {"trace": lambda: trace_rows(args.device, [s for s in args.only.split(",") if s] or None),
           "kernels": lambda: kernel_rows(args.device),
           "first": lambda: first_rows(args.device, SIZES[args.sizes or ("all" if args.device == "cuda" else "small")],
                                       args.reps),
           "tune": lambda: tune_rows(args.device)}
    rows: list[dict] = []
    chosen = [s for s in STEPS if s in steps]
    for step in chosen:
        rows += run[step]()
        # written after every step: a run stopped by a time limit keeps what it measured
        write(rows, args, device_name, time.time() - t0, quiet=step != chosen[-1])
    return 1 if any(r["ok"] is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
