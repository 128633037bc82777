"""The weight transform's cost: a parent of the model families and its grown child (about 1/8 wider, one layer or
block per stage deeper), exported once, then measured in a fresh process that does not import torch.

What is measured, per pair (:func:`measure`): graph extraction and alignment; one plain copy of the parent's
weights, the baseline; ``keeper.transforms.transfer`` alone (graphs and alignment precomputed), its first call
in the process and the median of interleaved repetitions; the peak memory of one call, by tracemalloc and by the
resident high-water mark. :func:`cost_tables` writes the time and memory tables of ``reports/bench_warm.md``.

Run as ``python -m keeper_bench.transform_cost PARENT.onnx CHILD.onnx [--reps N]``: one pair's figures as JSON on
the last line of stdout (what :func:`cost_case` starts for each pair). Pin torch, numba and BLAS threads before
keeper is imported (the caller's environment is the subprocess's).

Example:
    >>> r = cost_case("resnet", 1_000_000, reps=7, seed=0, workdir=Path("/tmp"))  # doctest: +SKIP
    >>> statistics.median(r["transform_s"]) / statistics.median(r["copy_s"])     # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import statistics
import subprocess
import sys
import time
import tracemalloc
import warnings
from pathlib import Path

from keeper.graph import graph_from_proto
from keeper.matching import align
from keeper.onnx_safety import load_model
from keeper.onnx_weights import read_initializers
from keeper.transforms import transfer
from keeper_bench.footprint import proc_status, timed

__all__ = ["SIZES", "COST_FAMILIES", "TIME_TARGET", "MEMORY_TARGET", "grown", "measure", "cost_case", "cost_tables",
           "mib", "ms"]

SIZES = (1_000_000, 10_000_000, 100_000_000)
COST_FAMILIES = ("transformer", "resnet")
TIME_TARGET = 3.0  # transform time / one plain copy of the parent's weights
MEMORY_TARGET = 3.0  # transform peak extra bytes / the child's weight bytes


def grown(spec: dict) -> dict:
    """The child of the cost benchmark: about 1/8 wider, and deeper by one layer (transformer) or one block per
    stage (ResNet)."""
    if spec["family"] == "transformer":
        h, d = spec["heads"], spec["d_model"]
        return {**spec, "d_model": d + h * max(1, round(d / h / 8)), "ffn": round(spec["ffn"] * 1.125),
                "layers": spec["layers"] + 1}
    return {**spec, "widths": [round(w * 1.125) for w in spec["widths"]], "blocks": [b + 1 for b in spec["blocks"]]}


def _export_torchscript(model, x) -> bytes:
    """TorchScript export in keeper's settings (eval mode, BatchNorm kept), which takes seconds at 100M. The
    weights are the models' fresh initial values, which do not change the transform's cost."""
    import torch

    f = io.BytesIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (x,), f, dynamo=False, do_constant_folding=False)
    return f.getvalue()


def measure(parent_path: str, child_path: str, reps: int) -> dict:
    """Cost figures of one parent/child pair; runs in its own process (see the module docstring)."""
    pproto = load_model(parent_path, what="parent")
    cproto = load_model(child_path, what="child")
    start = time.perf_counter()
    pg, cg = graph_from_proto(pproto), graph_from_proto(cproto)
    graph_s = time.perf_counter() - start
    pinits, cinits = read_initializers(pproto), read_initializers(cproto)
    parent_bytes = sum(a.nbytes for a in pinits.values())
    child_bytes = sum(a.nbytes for a in cinits.values())

    align(pg, cg)  # loads (or compiles) the numba loop
    align_s = timed(lambda: align(pg, cg), reps)
    al = align(pg, cg)

    def run():
        return transfer(pg, pinits, cg, cinits, al, noise=0.0)

    # the process's first transform call: resident high-water mark reset just before it
    gc.collect()
    rss_before = proc_status("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    start = time.perf_counter()
    out = run()
    first_s = time.perf_counter() - start
    rss_extra = proc_status("VmHWM") - rss_before
    ops = sorted({op for _, op in out.provenance.values()})
    del out

    def copy():
        return {k: v.copy() for k, v in pinits.items()}

    copy()  # warm-up, as the transform's first call above
    # interleaved, so that both see the same allocator state (whether freed buffers are reused or fresh pages
    # are faulted in changes a large copy's time by up to 2x)
    copy_s, transform_s = [], []
    for _ in range(reps):
        copy_s += timed(copy, 1)
        transform_s += timed(run, 1)

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    out = run()
    traced_peak = tracemalloc.get_traced_memory()[1] - before
    tracemalloc.stop()
    return {"parent_params": int(pg.total_params), "child_params": int(cg.total_params),
            "parent_layers": int(pg.num_layers), "child_layers": int(cg.num_layers),
            "parent_bytes": parent_bytes, "child_bytes": child_bytes, "score": float(al.score),
            "graph_s": graph_s, "align_s": align_s, "first_s": first_s, "copy_s": copy_s,
            "transform_s": transform_s, "traced_peak": traced_peak, "rss_extra": rss_extra, "operators": ops,
            "tensors": len(out.weights)}


def cost_case(family: str, size: int, reps: int, seed: int, workdir: Path) -> dict:
    """Export the pair, then measure it in a fresh subprocess."""
    import torch

    from keeper_bench import families

    spec = families.sized_spec(family, size)
    child = grown(spec)
    start = time.perf_counter()
    paths = []
    for name, s in (("parent", spec), ("child", child)):
        torch.manual_seed(seed)
        model = families.build(s)
        path = workdir / f"{family}-{size}-{name}.onnx"
        path.write_bytes(_export_torchscript(model, families.example_input(s, batch=1)))
        paths.append(str(path))
        del model
    export_s = time.perf_counter() - start
    proc = subprocess.run([sys.executable, "-m", __name__, *paths, "--reps", str(reps)],
                          capture_output=True, text=True, check=False)
    for p in paths:
        Path(p).unlink()
    if proc.returncode != 0:
        raise RuntimeError(f"measuring {family} {size}: {proc.stderr[-2000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    keys = ("d_model", "heads", "ffn", "layers") if family == "transformer" else ("widths", "blocks", "kernel")
    res.update(family=family, size=size, export_s=export_s,
               parent_spec={k: spec[k] for k in keys}, child_spec={k: child[k] for k in keys})
    return res


def mib(n: float) -> str:
    """Bytes as MiB (KiB under one MiB), as the report writes them."""
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n / 2**10:,.0f} KiB"


def ms(s: float) -> str:
    """Seconds as milliseconds, one decimal under 10 s."""
    return f"{s * 1e3:,.1f}" if s < 10 else f"{s * 1e3:,.0f}"


def cost_tables(rows: list[dict]) -> tuple[list[str], bool]:
    """Markdown: a time table, a memory table and a note per missed target; and whether every target was met."""
    ok_all = True
    time_lines = ["| model | params, parent -> child | weights, parent -> child | graphs, ms | align, ms "
                  "| copy (parent), ms | transform, first call, ms | transform, ms | transform / copy | time target |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
    mem_lines = ["| model | child weights | peak traced (tracemalloc) | peak / child weights | peak RSS extra "
                 "| memory target |", "|---|---|---|---|---|---|"]
    notes = []
    for r in rows:
        name = f"{r['family']} {r['size'] / 1e6:g}M"
        copy, tr = statistics.median(r["copy_s"]), statistics.median(r["transform_s"])
        grow = r["child_bytes"] / r["parent_bytes"]
        time_ratio, mem_ratio = tr / copy, r["traced_peak"] / r["child_bytes"]
        ok_t, ok_m = time_ratio <= TIME_TARGET, mem_ratio <= MEMORY_TARGET
        ok_all &= ok_t and ok_m
        time_lines.append(
            f"| {name} | {r['parent_params'] / 1e6:.2f}M -> {r['child_params'] / 1e6:.2f}M "
            f"| {mib(r['parent_bytes'])} -> {mib(r['child_bytes'])} ({grow:.2f}x) | {ms(r['graph_s'])} "
            f"| {ms(statistics.median(r['align_s']))} | {ms(copy)} | {ms(r['first_s'])} "
            f"| {ms(tr)} (min {ms(min(r['transform_s']))}) | {time_ratio:.2f}x "
            f"| <= {TIME_TARGET:g}x: {'met' if ok_t else 'NOT MET'} |")
        mem_lines.append(
            f"| {name} | {mib(r['child_bytes'])} | {mib(r['traced_peak'])} | {mem_ratio:.2f}x | {mib(r['rss_extra'])} "
            f"| <= {MEMORY_TARGET:g}x: {'met' if ok_m else 'NOT MET'} |")
        if not ok_t:
            notes.append(
                f"- {name}, time target not met: {r['tensors']} child tensors in {ms(tr)} ms "
                f"({tr / r['tensors'] * 1e6:,.0f} us per tensor) against one copy of the parent's "
                f"{mib(r['parent_bytes'])} in {ms(copy)} ms. The child's weights are {grow:.2f}x the parent's; "
                f"against a copy scaled to the child's size (about {ms(copy * grow)} ms) the transform takes "
                f"{tr / (copy * grow):.2f}x.")
        if not ok_m:
            notes.append(f"- {name}, memory target not met: peak {mib(r['traced_peak'])} for "
                         f"{mib(r['child_bytes'])} of child weights.")
    return time_lines + [""] + mem_lines + ([""] + notes if notes else []), ok_all


def main(argv: list[str] | None = None) -> int:
    """One pair's figures as JSON (the subprocess of :func:`cost_case`)."""
    ap = argparse.ArgumentParser(description="measure one parent/child pair's transform cost")
    ap.add_argument("parent")
    ap.add_argument("child")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.parent, args.child, reps=args.reps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
