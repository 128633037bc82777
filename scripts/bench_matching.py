"""Benchmark graph extraction and alignment on one core.

Builds a zoo of exported torch models (>= 50, five families, varied widths, depths and kernels, about 120
weighted layers each on average), then measures:

* parse: ``keeper.load_graph`` on the ONNX bytes, ms per model;
* all-pairs scoring: every child against every parent with one ``score_many`` call per child (the Matcher's
  batch path), in pairs/s and DP cells/s;
* per-pair calls: ``similarity`` on precomputed MatchArrays, on LayerGraphs (which adds the per-call
  ``match_arrays``), and ``align`` (score plus layer mapping), in pairs/s;
* 600 x 600: DP cells/s of ``score_many`` on pairs of ~600-layer models of one family (two 100-layer
  transformer encoders, two 150-block ResNets, exported), the costly case where many layers share a class.

Numba and torch are pinned to one thread and the JIT is warmed before timing. Prints a markdown table and
writes it to ``reports/bench_matching.md``.

Usage:
    python scripts/bench_matching.py [--models 60] [--seed 0] [--seconds 2]
"""

from __future__ import annotations

import os

os.environ["NUMBA_NUM_THREADS"] = "1"  # before numba is imported
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from keeper_bench import families  # noqa: E402
from keeper.graph import load_graph  # noqa: E402
from keeper.matching import PackedParents, align, match_arrays, score_many, similarity  # noqa: E402

torch.set_num_threads(1)
REPORT = Path(__file__).resolve().parent.parent / "reports" / "bench_matching.md"
PAIRS_TARGET = 5_000  # pairs/s at ~120 layers, one core
CELLS_TARGET = 100e6  # DP cells/s at 600 x 600, one core
CPP_BASELINE = "ModelKeeper's C++ matcher (-O2): ~100 pairs/s, 1.4 M cells/s"


def _export(model: torch.nn.Module, x: torch.Tensor, dynamo: bool) -> bytes:
    f = io.BytesIO()
    logging.getLogger("torch").setLevel(logging.ERROR)
    model.train()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        if dynamo:  # keeper's settings: BatchNorm kept
            torch.onnx.export(model, (x,), f, dynamo=True, optimize=False)
        else:
            torch.onnx.export(model, (x,), f, dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=False)
    return f.getvalue()


def _spec(rng: np.random.Generator, family: str) -> dict:
    """A random spec of ``family`` with about 120 weighted layers (BatchNorm kept), varied width/depth/kernel."""
    k = int(rng.choice([3, 5, 7]))
    base = {"dim": 2, "in_channels": 3, "num_classes": int(rng.choice([10, 100])), "input_length": 16}
    if family == "resnet":  # 4 layers per block (2 conv + 2 BN)
        stages = int(rng.integers(2, 5))
        blocks = [int(b) for b in rng.multinomial(int(rng.integers(18, 40)) - stages, [1 / stages] * stages) + 1]
        w0 = int(rng.choice([8, 12, 16, 24]))
        return {**base, "family": family, "widths": [w0 * 2 ** i for i in range(stages)], "blocks": blocks,
                "kernel": k}
    if family == "vgg":  # 2 layers per conv
        stages = int(rng.integers(2, 5))
        depths = [int(d) for d in rng.multinomial(int(rng.integers(40, 80)) - stages, [1 / stages] * stages) + 1]
        w0 = int(rng.choice([8, 16, 24]))
        return {**base, "family": family, "widths": [w0 * 2 ** i for i in range(stages)], "depths": depths,
                "kernel": k}
    if family == "mobilenetv2":  # 6 layers per block
        stages = int(rng.integers(2, 5))
        blocks = [int(b) for b in rng.multinomial(int(rng.integers(13, 27)) - stages, [1 / stages] * stages) + 1]
        w0 = int(rng.choice([8, 16]))
        return {**base, "family": family, "stem_width": w0, "widths": [w0 * (i + 1) for i in range(stages)],
                "blocks": blocks, "expansion": int(rng.choice([2, 4, 6])), "kernel": k,
                "head_width": int(rng.choice([64, 128]))}
    if family == "transformer":  # 6 layers per encoder layer
        heads = int(rng.choice([2, 4]))
        d = heads * int(rng.choice([8, 16]))
        return {**base, "family": family, "dim": 1, "in_channels": 1, "input_length": 32,
                "d_model": d, "heads": heads, "ffn": d * int(rng.choice([2, 4])), "layers": int(rng.integers(13, 27)),
                "patch": int(rng.choice([2, 4])), "pre_ln": bool(rng.random() < 0.7)}
    # mlp with LayerNorm: 2 layers per hidden layer
    n = int(rng.integers(40, 80))
    return {**base, "family": family, "dim": 1, "in_channels": 1, "input_length": 32, "norm": "layernorm",
            "widths": [int(w) for w in rng.choice([32, 48, 64], n)]}


def build_zoo(n_models: int, seed: int) -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    out = []
    for i in range(n_models):
        family = families.FAMILIES[i % len(families.FAMILIES)]
        spec = _spec(rng, family)
        model = families.build(spec)
        # every tenth model goes through the dynamo exporter, the rest through TorchScript (seconds vs ms)
        out.append((family, _export(model, families.example_input(spec), dynamo=(i % 10 == 9))))
    return out


def deep_pair() -> list[bytes]:
    """Two ~600-layer models of each of two families (a transformer encoder, a ResNet)."""
    specs = [
        {"family": "transformer", "dim": 1, "in_channels": 1, "num_classes": 10, "input_length": 16, "d_model": 16,
         "heads": 2, "ffn": 32, "layers": 100, "patch": 4},
        {"family": "transformer", "dim": 1, "in_channels": 1, "num_classes": 10, "input_length": 16, "d_model": 24,
         "heads": 2, "ffn": 48, "layers": 99, "patch": 4},
        {"family": "resnet", "dim": 2, "in_channels": 3, "num_classes": 10, "input_length": 8, "widths": [8, 16, 32],
         "blocks": [50, 50, 49], "kernel": 3},
        {"family": "resnet", "dim": 2, "in_channels": 3, "num_classes": 10, "input_length": 8, "widths": [8, 16, 32],
         "blocks": [60, 45, 44], "kernel": 5},
    ]
    return [_export(families.build(s), families.example_input(s), dynamo=False) for s in specs]


def _rate(fn, work: float, seconds: float) -> float:
    """work units per second of ``fn`` (repeated for at least ``seconds``; best of three rounds)."""
    fn()
    best = 0.0
    for _ in range(3):
        reps, start = 0, time.perf_counter()
        while True:
            fn()
            reps += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds / 3:
                break
        best = max(best, reps * work / elapsed)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=2.0, help="timing budget per measurement")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    zoo = build_zoo(args.models, args.seed)
    built_s = time.perf_counter() - t0

    # parse: each model a few times, ms per model
    parse_ms = []
    graphs = []
    for _, data in zoo:
        load_graph(data)
        start = time.perf_counter()
        for _ in range(3):
            g = load_graph(data)
        parse_ms.append((time.perf_counter() - start) / 3 * 1e3)
        graphs.append(g)
    arrays = [match_arrays(g) for g in graphs]
    layers = np.array([a.n for a in arrays])
    packed = PackedParents.pack(arrays)

    # warm the JIT (compiles or loads the on-disk cache) before timing
    score_many(packed, arrays[0])
    similarity(arrays[0], arrays[1])
    align(arrays[0], arrays[1])

    n = len(arrays)
    cells = float(layers.sum()) * float(layers.sum())  # sum over (child, parent) of m * n

    def all_pairs():
        for c in arrays:
            score_many(packed, c)

    batch_pairs = _rate(all_pairs, n * n, args.seconds)
    batch_cells = batch_pairs * cells / (n * n)

    sample = [(arrays[i], arrays[j]) for i in range(0, n, 3) for j in range(0, n, 2)]
    sample_g = [(graphs[i], graphs[j]) for i in range(0, n, 6) for j in range(0, n, 4)]
    sample_a = sample[:200]

    def per_pair():
        for p, c in sample:
            similarity(p, c)

    def per_pair_graphs():
        for p, c in sample_g:
            similarity(p, c)

    def per_align():
        for p, c in sample_a:
            align(p, c)

    single_pairs = _rate(per_pair, len(sample), args.seconds)
    single_graph_pairs = _rate(per_pair_graphs, len(sample_g), args.seconds)
    align_pairs = _rate(per_align, len(sample_a), args.seconds)

    # 600 x 600, within each family only (across families almost no class matches: the cheap case)
    deep = [match_arrays(load_graph(d)) for d in deep_pair()]
    groups = [deep[:2], deep[2:]]
    deep_packed = [PackedParents.pack(g) for g in groups]
    deep_cells = float(sum(sum(a.n for a in g) ** 2 for g in groups))
    deep_n = sum(len(g) ** 2 for g in groups)

    def deep_all():
        for g, packed_g in zip(groups, deep_packed):
            for c in g:
                score_many(packed_g, c)

    deep_rate = _rate(deep_all, deep_cells, args.seconds)
    deep_pairs = deep_rate * deep_n / deep_cells
    deep_align = _rate(lambda: (align(deep[0], deep[1]), align(deep[2], deep[3])), 2, args.seconds / 2)

    fam_count = {f: sum(1 for fam, _ in zoo if fam == f) for f in families.FAMILIES}
    ok_pairs = batch_pairs >= PAIRS_TARGET
    ok_cells = deep_rate >= CELLS_TARGET
    rows = [
        ("models (families)", f"{n} ({', '.join(f'{f} {c}' for f, c in fam_count.items())})", ""),
        ("weighted layers per model", f"mean {layers.mean():.0f}, min {layers.min()}, max {layers.max()}", ""),
        ("parse (`load_graph`), ms/model", f"median {statistics.median(parse_ms):.1f}, "
                                          f"mean {statistics.mean(parse_ms):.1f}", ""),
        ("all pairs, `score_many` batch, pairs/s", f"{batch_pairs:,.0f}",
         f">= {PAIRS_TARGET:,}: {'met' if ok_pairs else 'MISSED'}"),
        ("all pairs, `score_many` batch, DP cells/s", f"{batch_cells / 1e6:,.0f} M", ""),
        ("per pair, `similarity` on MatchArrays, pairs/s", f"{single_pairs:,.0f}", ""),
        ("per pair, `similarity` on LayerGraphs, pairs/s", f"{single_graph_pairs:,.0f}",
         "reads each LayerGraph per call"),
        ("per pair, `align` (score + mapping), pairs/s", f"{align_pairs:,.0f}", ""),
        ("600 x 600 layers: layers of the 4 models", ", ".join(str(a.n) for a in deep), ""),
        ("600 x 600 (same-family pairs): `score_many` DP cells/s", f"{deep_rate / 1e6:,.0f} M",
         f">= {CELLS_TARGET / 1e6:.0f} M: {'met' if ok_cells else 'MISSED'}"),
        ("600 x 600: pairs/s (`score_many`), `align` pairs/s", f"{deep_pairs:,.0f}, {deep_align:,.1f}", ""),
        ("baseline (published figures, not rerun here)", CPP_BASELINE, "10 ms/pair"),
    ]
    lines = ["| measure | value | note |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    header = (f"# Matching benchmark\n\nCommand: `python scripts/bench_matching.py --models {args.models} --seed "
              f"{args.seed} --seconds {args.seconds:g}`; one core (NUMBA_NUM_THREADS=1, torch 1 thread), "
              f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
              f"torch {torch.__version__}; building and exporting the zoo took {built_s:.0f} s.\n\n")
    text = header + "\n".join(lines) + "\n"
    print(text)
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(text)
    print(f"written to {REPORT}")
    return 0 if ok_pairs and ok_cells else 1


if __name__ == "__main__":
    sys.exit(main())
