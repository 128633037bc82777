"""Any size: a warm whose child is past protobuf's 2 GiB, its weights memory-mapped from a safetensors file and
streamed, and torch ``warm_start`` of an ~86M model end to end; the "Any size" section of ``reports/bench_warm.md``.

The models are GPT-style decoders in plain torch (:func:`gpt`). Each step runs in its own process, so that memory
returns to the OS between steps and the timed warms run without torch: ``python -m keeper_bench.any_size
--large-setup DIR`` (export both large graphs, write the parent's weights), ``--large-measure DIR`` (the warms and
the baseline load), ``--large-check DIR`` (the large pair's function preservation), ``--e2e DIR`` (torch
``warm_start``), each printing its figures as JSON on the last line of stdout; :func:`run_large` runs the four and
writes the section. Needs about 8 GB of memory and 6 GB of disk.

Example:
    >>> with tempfile.TemporaryDirectory() as d:   # doctest: +SKIP
    ...     section = run_large(Path(d))
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from keeper.graph import graph_from_proto
from keeper.matching import align
from keeper.onnx_safety import load_model
from keeper_bench.footprint import AnonPeak, timed

__all__ = ["LARGE_PARENT", "LARGE_CHILD", "E2E_PARENT", "E2E_CHILD", "gpt", "tokens", "large_setup", "large_measure",
           "large_check", "e2e_case", "large_section", "run_large"]

# GPT-style decoders (pre-LN blocks: LayerNorm, torch's MultiheadAttention, GELU MLP; token and position
# embeddings, an untied head), plain torch: no transformers package needed.

LARGE_PARENT = dict(vocab=32000, ctx=1024, d=1536, heads=12, layers=12)   # 440M params, 1.76 GB float32
LARGE_CHILD = dict(LARGE_PARENT, layers=21)                               # 695M params, 2.78 GB: past 2 GiB
E2E_PARENT = dict(vocab=10240, ctx=256, d=768, heads=12, layers=9)        # 79.7M
E2E_CHILD = dict(E2E_PARENT, layers=10)                                   # 86.8M


def gpt(cfg: dict, seed: int):
    """The GPT-style decoder of ``cfg`` (vocab, ctx, d, heads, layers), eval mode, initialised from ``seed``, its
    norms away from their initial values as after training."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, d: int, h: int):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, h, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            y = self.ln1(x)
            x = x + self.attn(y, y, y, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(cfg["vocab"], cfg["d"]), nn.Embedding(cfg["ctx"], cfg["d"])
            self.blocks = nn.Sequential(*[Block(cfg["d"], cfg["heads"]) for _ in range(cfg["layers"])])
            self.ln = nn.LayerNorm(cfg["d"])
            self.head = nn.Linear(cfg["d"], cfg["vocab"], bias=False)

        def forward(self, t):
            # positions as a value computed from the input: keeper's graph takes a Gather whose indices are a
            # constant (or derive from shapes only) for a constant, not an embedding layer, and would not map it
            x = self.tok(t) + self.pos(t * 0 + torch.arange(t.shape[1], device=t.device))
            return self.head(self.ln(self.blocks(x)))

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = GPT().eval()
        with torch.no_grad():  # norms away from their init, as after training
            for m in model.modules():
                if isinstance(m, nn.LayerNorm):
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.3, 0.3)
    return model


def tokens(cfg: dict, n: int = 16):
    import torch

    return torch.randint(0, cfg["vocab"], (1, n), generator=torch.Generator().manual_seed(1))


def _load_by_keys(module, weights, exported) -> None:
    """Copy arrays keyed by ONNX initializer name into ``module`` (the export's key map)."""
    import torch

    from keeper.torch_support.tensors import as_tensor as _as_tensor

    state = module.state_dict()
    with torch.no_grad():
        for init, key in exported["apart"].items():
            sd_key, how = exported["keys"][key]
            arr = np.asarray(weights[init])
            arr = arr.T if how == "T" else arr
            state[sd_key].copy_(_as_tensor(arr.reshape(tuple(state[sd_key].shape))))


def large_setup(workdir: Path) -> dict:
    """Export both large models' graphs (no weights serialised) and write the parent's weights as safetensors."""
    import torch

    from keeper.torch_support import export_graph, module_weights
    from keeper.weights import save_weights

    out = {}
    for role, cfg, seed in (("parent", LARGE_PARENT, 1), ("child", LARGE_CHILD, 2)):
        start = time.perf_counter()
        model = gpt(cfg, seed)
        g = export_graph(model, tokens(cfg))
        (workdir / f"{role}.onnx").write_bytes(g.onnx)
        (workdir / f"{role}.json").write_text(json.dumps({"keys": g.keys, "apart": g.apart}))
        if role == "parent":
            save_weights(module_weights(model, g), workdir / "parent.safetensors")
        out[role] = {"params": sum(p.numel() for p in model.parameters()), "graph_bytes": len(g.onnx),
                     "setup_s": time.perf_counter() - start}
        del model, g
        gc.collect()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return out


def large_measure(workdir: Path) -> dict:
    """Warm the large child from the parent's memory-mapped safetensors: streamed to a file, then in memory;
    against one safetensors load of the child's weights. No torch in the timed calls."""
    from keeper.warm import inherit
    from keeper.weights import SafeTensors

    pgraph, cgraph = (workdir / "parent.onnx").read_bytes(), (workdir / "child.onnx").read_bytes()
    out = workdir / "child.safetensors"
    pg, cg = graph_from_proto(load_model(pgraph, weights_apart=True)), graph_from_proto(load_model(cgraph))
    start = time.perf_counter()
    al = align(pg, cg)
    align_s = time.perf_counter() - start
    res = {"align_s": align_s, "score": float(al.score)}
    with AnonPeak() as mem:
        start = time.perf_counter()
        r = inherit(pgraph, cgraph, parent_weights=workdir / "parent.safetensors", parent_graph=pg,
                             child_graph=cg, alignment=al, noise=0.0, out=out)
        res["stream_s"] = time.perf_counter() - start
    res["stream_anon"] = mem.extra
    res["operators"] = dict(sorted(r.summary()["operators"].items()))
    res["unset"] = len(r.unset)
    (workdir / "unset.json").write_text(json.dumps(r.unset))
    res["child_bytes"] = SafeTensors(out).nbytes
    res["parent_bytes"] = SafeTensors(workdir / "parent.safetensors").nbytes
    del r
    gc.collect()
    from safetensors.numpy import load_file

    loads = []
    for _ in range(2):
        with AnonPeak() as mem:
            start = time.perf_counter()
            loaded = load_file(str(out))
            loads.append(time.perf_counter() - start)
        res["load_anon"] = mem.extra
        del loaded
        gc.collect()
    res["load_s"] = loads
    res["memory_runs"], res["memory_anon"] = [], 0
    for _ in range(2):  # best of two, as the load it is compared with
        with AnonPeak() as mem:
            start = time.perf_counter()
            r = inherit(pgraph, cgraph, parent_weights=workdir / "parent.safetensors", parent_graph=pg,
                                 child_graph=cg, alignment=al, noise=0.0)
            # copied tensors are views of the parent's mapped file, read when first used: copy them into memory,
            # so that the figure covers reading every byte into private memory, as a load does
            held = {k: v if v.flags.owndata else np.array(v) for k, v in r.weights.items()}
            res["memory_runs"].append(time.perf_counter() - start)
        res["memory_anon"] = max(res["memory_anon"], mem.extra)
        res["memory_held"] = sum(v.nbytes for v in held.values())
        del r, held
        gc.collect()
    res["memory_s"] = min(res["memory_runs"])
    return res


def large_check(workdir: Path) -> dict:
    """Function preservation of the large depth-growth pair: parent logits against the warmed child's."""
    import torch

    from keeper.weights import SafeTensors

    res = {}
    with torch.no_grad():
        parent = gpt(LARGE_PARENT, 1)
        pw = SafeTensors(workdir / "parent.safetensors")
        _load_by_keys(parent, pw, json.loads((workdir / "parent.json").read_text()))
        x = tokens(LARGE_PARENT)
        want = parent(x)
        del parent
        gc.collect()
        child = gpt(LARGE_CHILD, 3)
        cw = SafeTensors(workdir / "child.safetensors")
        meta = json.loads((workdir / "child.json").read_text())
        # tensors the parent does not supply are zeros in the file (the child came as a graph): the child keeps
        # its own init there (they sit inside new blocks whose residual branch ends in zeros)
        unset = set(json.loads((workdir / "unset.json").read_text()))
        meta_warm = {"keys": meta["keys"], "apart": {k: v for k, v in meta["apart"].items() if k not in unset}}
        _load_by_keys(child, cw, meta_warm)
        got = child(x)
    res["deviation"] = float((want - got).abs().max() / want.abs().max())
    return res


def e2e_case(workdir: Path) -> dict:
    """torch warm_start of an ~86M model (export, choice, transfer, load) against loading its state_dict from disk;
    warming through ONNX with weights (export, warm from ONNX bytes) for reference."""
    import torch
    from safetensors.torch import load_file, save_file

    from keeper.torch_support import cache as export_cache
    from keeper import torch_support as ts
    from keeper.zoo import Zoo

    torch.set_num_threads(1)
    zoo = Zoo(str(workdir / "zoo"))
    parent = gpt(E2E_PARENT, 1)
    x = tokens(E2E_PARENT)
    start = time.perf_counter()
    ts.register(parent, x, zoo, 0.9, name="parent")
    res = {"register_s": time.perf_counter() - start,
           "parent_params": sum(p.numel() for p in parent.parameters())}
    want = parent(x).detach()
    child = gpt(E2E_CHILD, 2)
    res["child_params"] = sum(p.numel() for p in child.parameters())
    torch.save(child.state_dict(), workdir / "child.pt")
    save_file(child.state_dict(), str(workdir / "child.safetensors"))

    def load_pt():
        child.load_state_dict(torch.load(workdir / "child.pt", weights_only=True))

    def load_st():
        child.load_state_dict(load_file(str(workdir / "child.safetensors")))

    res["load_pt_s"] = timed(load_pt, 3)
    res["load_st_s"] = timed(load_st, 3)
    def timed_warm(module, dynamo):
        start = time.perf_counter()
        g = ts.export_graph(module, x, dynamo=dynamo)
        mid = time.perf_counter()
        r = ts.warm_exported(module, g, zoo, noise=0.0)
        return (time.perf_counter() - start, mid - start, time.perf_counter() - mid), r

    for label, dynamo in (("dynamo", True), ("torchscript", False)):
        export_cache.clear()  # the first call traces the architecture; later calls reuse that export
        runs = []
        for _ in range(3):
            t, r = timed_warm(child, dynamo)
            runs.append(t)
        res[label] = runs
        res[f"{label}_dev"] = float((want - child(x).detach()).abs().max() / want.abs().max())
        res[f"{label}_parent"] = r.parent
        # another module of the child's architecture (another init), as the next trial of a search builds it
        twin = gpt(E2E_CHILD, 3)
        t, r = timed_warm(twin, dynamo)
        res[f"{label}_twin"] = t
        res[f"{label}_twin_dev"] = float((want - twin(x).detach()).abs().max() / want.abs().max())
    res["cache"] = export_cache.stats()
    start = time.perf_counter()
    e = ts.export(child, x)
    mid = time.perf_counter()
    r = zoo.warm(e.onnx, noise=0.0)
    ts.load_result(child, r, e.keys)
    res["old_s"] = (time.perf_counter() - start, mid - start)
    return res


def large_section(setup: dict, m: dict, check: dict, e2e: dict, load: float) -> str:
    gb = 1e9
    child_w, parent_w = m["child_bytes"], m["parent_bytes"]
    load_s = min(m["load_s"])
    rows = [
        f"| streamed into a safetensors file (`out=`) | {m['stream_s']:.1f} | {m['stream_s'] / load_s:.2f}x | "
        f"{m['stream_anon'] / gb:.2f} | {m['stream_anon'] / child_w:.2f}x |",
        f"| in memory (`weights` dict; copied tensors are views of the parent's mapped file; best of two) | "
        f"{m['memory_s']:.1f} | {m['memory_s'] / load_s:.2f}x | {m['memory_anon'] / gb:.2f} | {m['memory_anon'] / child_w:.2f}x |",
        f"| baseline: `safetensors.numpy.load_file` of the child's weights | {load_s:.1f} | 1.00x | "
        f"{m['load_anon'] / gb:.2f} | {m['load_anon'] / child_w:.2f}x |"]
    def verdict(ratio: float, target: float) -> str:
        return f"{ratio:.2f}x, target <= {target:g}x {'met' if ratio <= target else 'NOT MET'}"

    verdicts = (f"Streamed: time {verdict(m['stream_s'] / load_s, 3)}, memory "
                f"{verdict(m['stream_anon'] / child_w, 1.5)}. In memory: time {verdict(m['memory_s'] / load_s, 3)}, "
                f"memory {verdict(m['memory_anon'] / child_w, 1.5)}.")
    d_rows = []
    pt, st = min(e2e["load_pt_s"]), min(e2e["load_st_s"])

    def row(label: str, t: tuple) -> str:
        return (f"| {label} | {t[0]:.2f} | {t[1]:.2f} | {t[2]:.2f} | {t[0] / pt:.1f}x | {t[0] / st:.1f}x |")

    for label in ("dynamo", "torchscript"):
        runs = e2e[label]
        d_rows.append(row(f"`warm_start`, {label} exporter, first call (the architecture is traced)", runs[0]))
        d_rows.append(row(f"`warm_start`, {label} exporter, later calls, same module (median of "
                          f"{len(runs) - 1})", sorted(runs[1:])[len(runs[1:]) // 2]))
        d_rows.append(row(f"`warm_start`, {label} exporter, another module of the architecture", e2e[f"{label}_twin"]))
    d_rows.append(f"| ONNX with weights: `export`, `Zoo.warm(onnx bytes)`, load | {e2e['old_s'][0]:.2f} | "
                  f"{e2e['old_s'][1]:.2f} | {e2e['old_s'][0] - e2e['old_s'][1]:.2f} | {e2e['old_s'][0] / pt:.1f}x | "
                  f"{e2e['old_s'][0] / st:.1f}x |")
    first, twin = e2e["dynamo"][0], e2e["dynamo_twin"]
    e2e_verdict = (
        f"Target <= 3x a plain `load_state_dict` from disk (`torch.load`): {verdict(twin[0] / pt, 3)} for a module "
        f"whose architecture this process has exported before (dynamo, another module of the architecture; "
        f"{twin[0] / st:.1f}x a safetensors load); {verdict(first[0] / pt, 3)} for the first call, whose "
        f"{first[1]:.1f} s of {first[0]:.1f} s is torch's trace of the module (keeper serialises no weight; "
        f"dynamo's tracing costs seconds whatever the size, TorchScript's less). The trace depends on the "
        f"architecture, not on the values, so keeper remembers it per process (`keeper.torch_support.cache`: fingerprint "
        f"of the module's classes, attributes, tensor shapes and the input; cache {e2e['cache']}): a Tune trial "
        f"exports once for its warm start and again for its checkpoint, and a search meets an architecture "
        f"again. Keeper's own part (choice + transfer + load) is {twin[2]:.2f} s. Function preserved by the "
        f"other module too: dynamo {e2e['dynamo_twin_dev']:.1e}, TorchScript {e2e['torchscript_twin_dev']:.1e}. "
        f"Against warming through ONNX with weights ({e2e['old_s'][0]:.1f} s) the first call is "
        f"{e2e['old_s'][0] / first[0]:.1f}x faster.")
    return f"""## Any size: weights apart, memory-mapped, streamed

Command: `python scripts/bench_warm.py --large` (only these cases; the full run keeps this section). 1-minute load
average {load:.1f} at the start; the machine's 2 cores and disk are shared with other jobs, so times vary run to run.

**A child past protobuf's 2 GiB.** GPT-style pre-LN decoders in plain torch (token and position embeddings,
torch's `MultiheadAttention`, GELU MLP, untied head; vocabulary {LARGE_PARENT['vocab']}, d_model {LARGE_PARENT['d']},
{LARGE_PARENT['heads']} heads): parent {LARGE_PARENT['layers']} blocks, {setup['parent']['params'] / 1e6:.0f}M float32
parameters ({parent_w / gb:.2f} GB); child {LARGE_CHILD['layers']} blocks, {setup['child']['params'] / 1e6:.0f}M
({child_w / gb:.2f} GB, past the 2.15 GB a protobuf can hold). Both graphs come from `export_graph` (dynamo; {setup['parent']['graph_bytes'] / 1e6:.1f} MB
and {setup['child']['graph_bytes'] / 1e6:.1f} MB of ONNX, no weight serialised); the parent's weights are a safetensors
file, memory-mapped by the warm. The child comes as its graph alone, so the tensors its parent does not supply
({m['unset']}, inside the new blocks) are left as zeros. Similarity {m['score']:.3f}; operators
{m['operators']}; alignment {m['align_s'] * 1e3:.0f} ms (not in the times below). Each warm is `keeper.warm.inherit(noise=0)`
in a process without torch; memory is the peak of the process's private resident memory (RssAnon, sampled every
2 ms) above its level before the call: file pages mapped or written are the page cache's, not the process's. The
baseline is one load of the child's weights (the file the streamed warm wrote, {child_w / gb:.2f} GB) into memory,
best of two.

| warm of the {setup['child']['params'] / 1e6:.0f}M child | wall, s | / one load | peak private memory, GB | / child's weights |
|---|---|---|---|---|
{chr(10).join(rows)}

{verdicts} The in-memory row copies every tensor that is a view of the parent's file into private memory inside
the timed call (as a load reads every byte); without that copy the call returns views at once and reads pages
when they are used.

Targets: wall <= 3x one load, peak memory <= 1.5x the child's weights. Function preservation of this depth-growth
pair (parent logits against the warmed child's, eval mode, 16 tokens; a separate process with torch):
max relative deviation {check['deviation']:.2e} (target <= 1e-4).

**torch `warm_start`, end to end.** Parent {E2E_PARENT['layers']} blocks ({e2e['parent_params'] / 1e6:.1f}M, registered with
`keeper.torch_support.register`: graph plus safetensors, {e2e['register_s']:.1f} s), child {E2E_CHILD['layers']} blocks
({e2e['child_params'] / 1e6:.1f}M; vocabulary {E2E_PARENT['vocab']}, d_model {E2E_PARENT['d']}), one thread. Baselines: the
child's `load_state_dict` from `torch.load` of a `.pt` file (best {min(e2e['load_pt_s']):.2f} s) or from a safetensors file
(best {min(e2e['load_st_s']):.2f} s). Function preserved (logits, max relative deviation):
dynamo {e2e['dynamo_dev']:.1e}, TorchScript {e2e['torchscript_dev']:.1e}.

| call | total, s | export, s | choice + transfer + load, s | / `torch.load` + `load_state_dict` | / safetensors load |
|---|---|---|---|---|---|
{chr(10).join(d_rows)}

{e2e_verdict}
"""


def run_large(workdir: Path) -> str:
    """The any-size cases, each step in its own subprocess (memory returns to the OS between steps)."""
    load = os.getloadavg()[0]

    def step(flag: str) -> dict:
        proc = subprocess.run([sys.executable, "-m", __name__, flag, str(workdir)], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"{flag} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    setup = step("--large-setup")
    print("large setup:", setup, flush=True)
    m = step("--large-measure")
    print("large measure:", m, flush=True)
    check = step("--large-check")
    print("large check:", check, flush=True)
    e2e = step("--e2e")
    print("end to end:", e2e, flush=True)
    return large_section(setup, m, check, e2e, load)


_STEPS = {"--large-setup": large_setup, "--large-measure": large_measure, "--large-check": large_check,
          "--e2e": e2e_case}


def main(argv: list[str] | None = None) -> int:
    """One step of :func:`run_large` in this process: its figures as JSON on the last line of stdout."""
    ap = argparse.ArgumentParser(description="one step of the any-size warm benchmark")
    steps = ap.add_mutually_exclusive_group(required=True)
    for flag in _STEPS:
        steps.add_argument(flag, metavar="DIR", type=Path)
    args = ap.parse_args(argv)
    flag, workdir = next((f, getattr(args, f[2:].replace("-", "_"))) for f in _STEPS
                         if getattr(args, f[2:].replace("-", "_")) is not None)
    logging.getLogger("torch").setLevel(logging.ERROR)
    with contextlib.redirect_stdout(sys.stderr):
        res = _STEPS[flag](workdir)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
