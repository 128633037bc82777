"""Coverage of real architectures: does keeper read every learned tensor, and is a same-architecture warm exact?

For every model of :data:`hf_catalogue.CATALOGUE` (Hugging Face transformers built from small configs,
random init, nothing downloaded), plus torchvision / timm models when those import, and for both torch exporters
(TorchScript and dynamo), it measures: whether the export parses; the layers keeper finds and the learned
elements it sees against the module's own parameters (tied parameters counted once); the self-similarity; the
relative output deviation of a same-architecture warm (parent and child of one architecture, different inits,
noise 0: it must be ~1e-6); and the module tensors the warm leaves at the child's init. It writes
``reports/coverage.md`` and prints the totals.

Where torchvision imports, the CNN growth pairs of :func:`vision_catalogue.growth_pairs` (ResNet-18 ->
34, VGG-11 -> 13 with and without BatchNorm, MobileNetV2 0.5 -> 1.0, MobileNetV3-Large 0.75 -> 1.0, EfficientNet
B0 -> B1, ConvNeXt deepening) are warmed from a trained-like parent too: the child's deviation from the parent's
function after the warm, beside the child's own init (:func:`hf_growth.warm_deviation`).

torchvision and timm are optional (:mod:`vision_libs`): without them their rows are left out and the
report says why. To include them beside a CPU torch, in a separate environment (a torchvision that fails at import
breaks ``import transformers``)::

    python -m venv --system-site-packages /tmp/tvenv
    /tmp/tvenv/bin/pip install --no-deps torchvision==0.28.0 timm   # --no-deps: else pip pulls a CUDA torch
    PYTHONPATH=. /tmp/tvenv/bin/python scripts/bench_coverage.py

Every model also gets the column "read by the front end, no fallback": whether keeper's torch front end (the
default path of ``export_graph``, one eager forward) reads it, or why it would fall back to the dynamo exporter.

Run: ``PYTHONPATH=. python scripts/bench_coverage.py`` (``--quick``: TorchScript only; ``--models gpt2,llama``;
``--no-growth``: no growth pairs; ``--front-end-only``: only the front-end column, printed in seconds, no report).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from keeper.errors import PartialWarmWarning
from keeper.graph import load_graph
from keeper.matching import similarity
from keeper.torch_support import export_graph, register, warm_start
from keeper.zoo import Zoo

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' catalogue of real architectures

from hf_catalogue import CATALOGUE, Builder, build, optional_catalogue  # noqa: E402
from hf_growth import GrowthResult, warm_deviation  # noqa: E402
from trace_check import front_end_graph  # noqa: E402
from vision_catalogue import GAPS, SIZES, growth_pairs  # noqa: E402

EXACT = 1e-5  # a same-architecture warm deviating less than this is exact (float32 round-off is ~1e-7)


@dataclass
class Row:
    model: str
    exporter: str
    parses: bool = False
    layers: int = 0
    seen: int = 0           # learned elements keeper's graph counts, those no layer holds included
    unread: int = 0         # of which no layer holds (``LayerGraph.unread``): a warm cannot transfer them
    learned: int = 0        # the module's trainable elements, each shared tensor once
    self_score: float = float("nan")
    deviation: float = float("nan")
    cold: float = float("nan")    # the child's deviation before the warm (its own init): what exactness is against
    similarity: float = float("nan")
    left: list[str] = field(default_factory=list)
    warned: bool = False
    seconds: float = 0.0
    error: str = ""
    front: str = ""         # "yes" when the torch front end reads the model (no fallback), else why it cannot

    @property
    def exact(self) -> bool:
        return self.parses and self.deviation < EXACT and not self.left


def learned_elements(module: torch.nn.Module) -> int:
    """Trainable elements of ``module``; ``parameters()`` yields a tied parameter once."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def rel_dev(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max().clamp_min(1e-12))


def front_end(name: str, builders: dict[str, Builder]) -> str:
    """"yes (N ms)" when the torch front end reads the model, so ``export_graph``'s default path writes its graph
    with no exporter; else "no: " and why it falls back (:func:`trace_check.front_end_graph`)."""
    module, args = build(name, 1, builders)
    t0 = time.perf_counter()
    got = front_end_graph(module, args)
    if isinstance(got, str):
        return f"no: {got}"
    return f"yes ({(time.perf_counter() - t0) * 1e3:.0f} ms)"


def measure(name: str, builders: dict[str, Builder], dynamo: bool) -> Row:
    row = Row(name, "dynamo" if dynamo else "torchscript")
    t0 = time.perf_counter()
    try:
        parent, args = build(name, 1, builders)
        child, _ = build(name, 2, builders)
        row.learned = learned_elements(parent)
        with torch.no_grad():
            row.cold = rel_dev(parent(*args), child(*args))
        exported = export_graph(parent, args, dynamo=dynamo)
        graph = load_graph(exported.onnx)
        row.parses, row.layers, row.seen = True, graph.num_layers, graph.total_params
        row.unread = sum(graph.unread.values())
        row.self_score = similarity(graph, graph)
        with tempfile.TemporaryDirectory() as tmp:
            zoo = Zoo(str(Path(tmp) / "zoo"))
            register(parent, args, zoo, 0.9, name="parent", config={"dynamo": dynamo})
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", PartialWarmWarning)
                result = warm_start(child, args, zoo, noise=0.0, config={"dynamo": dynamo})
            row.warned = any(issubclass(w.category, PartialWarmWarning) for w in caught)
        row.left = list(result.missing)
        row.similarity = float(result.score)
        with torch.no_grad():
            row.deviation = rel_dev(parent(*args), child(*args))
    except Exception as exc:  # a benchmark reports every failure in its table and goes on
        row.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    row.seconds = time.perf_counter() - t0
    return row


@dataclass
class GrowthRow:
    growth: str
    parent: str
    child: str
    exporter: str
    result: GrowthResult | None = None
    error: str = ""


def measure_growth(growth: str, parent_name: str, child_name: str, builders: dict[str, Builder],
                   dynamo: bool) -> GrowthRow:
    row = GrowthRow(growth, parent_name, child_name, "dynamo" if dynamo else "torchscript")
    try:
        parent, args = build(parent_name, 1, builders)
        child, _ = build(child_name, 2, builders)
        row.result = warm_deviation(parent, child, args, dynamo=dynamo, seed=1)
    except Exception as exc:  # a benchmark reports every failure in its table and goes on
        row.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    return row


def _fmt(v: float) -> str:
    return "-" if v != v else f"{v:.2g}"


def _score(v: float) -> str:
    return "-" if v != v else "1" if v == 1.0 else f"{v:.4f}"  # 0.9996 must not print as 1


def _totals(rows: list[Row]) -> str:
    n = len(rows)
    parsed = sum(r.parses for r in rows)
    self_one = sum(abs(r.self_score - 1.0) < 1e-9 for r in rows)
    complete = sum(r.parses and r.seen == r.learned and not r.unread for r in rows)
    exact = sum(r.exact for r in rows)
    read = sum(r.front.startswith("yes") for r in rows)
    models = {r.model for r in rows}
    models_read = {r.model for r in rows if r.front.startswith("yes")}
    return (f"{parsed}/{n} parse, {self_one}/{n} score 1.0 against themselves, {complete}/{n} have every learned "
            "element held by a layer and nothing else counted as learned (tied tensors once), "
            f"{exact}/{n} warm exactly from a parent of their own architecture (relative deviation < {EXACT:g}, no "
            f"tensor left behind), {read}/{n} are read by the torch front end with no fallback to the exporter "
            f"({len(models_read)}/{len(models)} models; target: all)")


def _machine() -> tuple[str, list[tuple[str, str]]]:
    """The machine and library versions, and the optional vision libraries that imported."""
    import os
    import platform

    import transformers

    from vision_libs import import_timm, import_torchvision

    libs = [(lib, mod.__version__) for lib, (mod, _) in (("torchvision", import_torchvision()),
                                                         ("timm", import_timm())) if mod is not None]
    machine = (f"{platform.machine()}, {os.cpu_count()} CPU cores visible, Python {platform.python_version()}, "
               f"torch {torch.__version__}, transformers {transformers.__version__}"
               + "".join(f", {lib} {v}" for lib, v in libs))
    return machine, libs


def _cache_state() -> str:
    from keeper.torch_support import cache_files

    where = cache_files.directory()
    if where is None:
        return "off (every export cold)"
    return (f"at `{where}` as earlier runs on this machine left it (an export found there is a file read; "
            "`KEEPER_ARCH_CACHE=off` for cold exports)")


def _model_lines(rows: list[Row]) -> list[str]:
    lines = ["| model | exporter | parses | layers | elements keeper counts (of which no layer holds) / learned | "
             "self | warm similarity | same-arch deviation (child's own init) | tensors left behind | warning | "
             "read by the front end, no fallback | time (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        left = ", ".join(f"`{k}`" for k in r.left[:4]) + (f" +{len(r.left) - 4}" if len(r.left) > 4 else "")
        lines.append(f"| {r.model} | {r.exporter} | {'yes' if r.parses else 'no: ' + r.error} | {r.layers} | "
                     f"{r.seen}{f' ({r.unread})' if r.unread else ''} / {r.learned} | {_score(r.self_score)} | "
                     f"{_score(r.similarity)} | {_fmt(r.deviation)} ({_fmt(r.cold)}) | "
                     f"{left or '-'} | {'yes' if r.warned else '-'} | {r.front or '-'} | {r.seconds:.1f} |")
        if r.parses and r.error:
            lines.append(f"| | | error: {r.error} | | | | | | | | | |")
    return lines + ["", "The front-end column: the model's architecture read by keeper's torch front end alone (one "
                    "eager forward, `trace_check.front_end_graph`; no cache, no exporter), which is "
                    "what `export_graph` and `warm_start` use by default; \"no\" gives the reason it would fall back "
                    "to the dynamo exporter (seconds instead of milliseconds). The time is that one trace's, on the "
                    "loaded machine. It is the model's, the same on both of its rows; `scripts/check_trace.py` shows "
                    "the graph is the exporter's.", ""]


def _growth_lines(growth: list[GrowthRow]) -> list[str]:
    lines = ["## Growth pairs (torchvision CNNs)", "",
             "Parent made trained-like, child warmed with noise 0; deviation = max |parent(x) - child(x)| / "
             "max |parent(x)|, after the warm and at the child's own init.", "",
             "| growth | parent -> child | exporter | deviation after warm | child's own init | score | "
             "tensors not inherited | time (s) |", "|---|---|---|---|---|---|---|---|"]
    for g in growth:
        if g.result is None:
            lines.append(f"| {g.growth} | {g.parent} -> {g.child} | {g.exporter} | error: {g.error} | | | | |")
            continue
        r = g.result
        miss = ", ".join(f"`{k}`" for k in r.missing[:4]) + (f" +{len(r.missing) - 4}" if len(r.missing) > 4 else "")
        lines.append(f"| {g.growth} | {g.parent} -> {g.child} | {g.exporter} | {r.warm:.2g} | {r.init:.2g} | "
                     f"{r.score:.3f} | {miss or '-'} | {r.seconds:.1f} |")
    return lines + [""]


def report(rows: list[Row], growth: list[GrowthRow], skipped: dict[str, str], path: Path, command: str) -> str:
    totals = _totals(rows)
    machine, libs = _machine()
    lines = ["# Coverage of real architectures", "",
             f"Command: `{command}`", "", f"Machine: {machine}. Times are wall-clock per row (three exports, one "
             "register, one warm) on a shared machine, with keeper's architecture cache "
             f"{_cache_state()}.", "",
             f"Totals (model x exporter): {totals}.", ""] + _model_lines(rows)
    gaps = {r.model: GAPS[r.model] for r in rows if r.model in GAPS and not r.exact}
    if gaps:
        lines += ["Why the rows above that are not exact are not (read from the ONNX graphs):", ""]
        lines += [f"- {m}: {why}" for m, why in gaps.items()] + [""]
    if libs:
        lines += [f"torchvision / timm sizes: {SIZES}.", "",
                  "torchvision and timm ran in a separate environment beside the CPU torch: `python -m venv "
                  "--system-site-packages /tmp/tvenv && /tmp/tvenv/bin/pip install --no-deps torchvision==0.28.0 "
                  "timm` (`--no-deps`: torchvision has no CPU-only wheel on the package index, and without it pip "
                  "pulls a CUDA torch); torchvision 0.28's compiled ops do not load into this torch, so "
                  "`vision_libs` defines the `torchvision::nms` / `qnms` schemas its import needs.", ""]
    if growth:
        lines += _growth_lines(growth)
    if skipped:
        lines.append("Left out: " + "; ".join(f"{lib}: {why}" for lib, why in skipped.items()) + ". They are "
                     "optional (no CPU-only torchvision wheel on the package index; timm needs torchvision); to "
                     "include them: `python -m venv --system-site-packages /tmp/tvenv && /tmp/tvenv/bin/pip "
                     "install --no-deps torchvision==0.28.0 timm`, then run the command with /tmp/tvenv/bin/python.")
        lines.append("")
    lines.append("Learned elements are the module's trainable parameters, a tied tensor (GPT-2's `wte` = `lm_head`) "
                 "once; constant tables (rotary cos/sin, masks, position ids) are no layer and count for nothing. "
                 "keeper counts what the ONNX graph reads as learned: more than the module's parameters where a "
                 "floating-point buffer looks like one (a precomputed rotary table, a zero key bias).")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="TorchScript exporter only (dynamo export is slow)")
    ap.add_argument("--models", default="", help="comma-separated names (default: all)")
    ap.add_argument("--no-growth", action="store_true", help="leave out the torchvision growth pairs")
    ap.add_argument("--front-end-only", action="store_true",
                    help="only the front-end column: print which models the torch front end reads (seconds; no "
                         "report written)")
    ap.add_argument("--out", default="reports/coverage.md")
    a = ap.parse_args()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # the dynamo exporter logs every op it skips
    models: dict[str, Builder] = dict(CATALOGUE)
    extra, skipped = optional_catalogue()
    models.update(extra)
    if a.models:
        wanted = a.models.split(",")
        unknown = [m for m in wanted if m not in models]
        if unknown:
            raise SystemExit(f"unknown model(s) {unknown}; choose from {sorted(models)}")
        models = {m: models[m] for m in wanted}
    if a.front_end_only:
        read = 0
        for name in models:
            got = front_end(name, models)
            read += got.startswith("yes")
            print(f"{name:28s} {got}", flush=True)
        print(f"read by the front end with no fallback: {read}/{len(models)} models")
        return
    exporters = [False] if a.quick else [False, True]
    rows = []
    for name in models:
        front = front_end(name, models)
        for dynamo in exporters:
            r = measure(name, models, dynamo)
            r.front = front
            rows.append(r)
            print(f"{name:24s} {r.exporter:11s} front end: {front:.40s} layers={r.layers:4d} "
                  f"read={r.seen}({r.unread} unread)/{r.learned} self={_fmt(r.self_score)} sim={_fmt(r.similarity)} dev={_fmt(r.deviation)} (cold {_fmt(r.cold)}) "
                  f"left={len(r.left)} "
                  f"{r.seconds:.1f}s {r.error}", flush=True)
    growth = []
    for kind, parent, child in ([] if a.no_growth else growth_pairs(models)):
        for dynamo in exporters:
            g = measure_growth(kind, parent, child, models, dynamo)
            growth.append(g)
            r = g.result
            print(f"{parent} -> {child} ({kind}) {g.exporter:11s} " + (
                f"warm={r.warm:.2g} init={r.init:.2g} missing={len(r.missing)} {r.seconds:.1f}s" if r else g.error),
                flush=True)
    python = "/tmp/tvenv/bin/python" if extra else "python"  # the environment of the module docstring's recipe
    command = f"PYTHONPATH=. {python} scripts/bench_coverage.py" + (" --quick" if a.quick else "") + \
        (f" --models {a.models}" if a.models else "") + (" --no-growth" if a.no_growth else "")
    totals = report(rows, growth, skipped, Path(a.out), command)
    for lib, why in skipped.items():
        print(f"skipped {lib}: {why}")
    print("totals:", totals)


if __name__ == "__main__":
    main()
