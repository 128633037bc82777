#!/usr/bin/env python
"""Benchmark: keeper's Ray service against zoos of 1,000, 2,500 and 10,000 models on this machine.

What it measures, per zoo size (2 Matcher actors, Ray on 127.0.0.1):

* scoring only, in one process: the two-stage search (medoids, then the closest clusters, early stop) with the
  compiled alignment on one core, and whole-zoo brute force for comparison;
* scoring only, through the service: ``Keeper.search`` (front door -> 2 matchers in parallel -> answer);
* end to end through the service: ``Keeper.warm`` with real ONNX children (parse, search, parent choice, the
  weight transfer in a Ray task that reads the parent from the store, the WarmResult back to the caller);
* recall@1 of the two-stage search against brute force (a query counts as a hit when the best score found
  equals the best score over the whole zoo).

The zoo: model specs of keeper_bench.families' five families (ResNet, VGG, MobileNetV2, transformer, MLP; 1-D
inputs as in the MNIST-1D workload) in groups of architectural neighbours (keeper_bench.families.neighbours), as a
NAS or AutoML workload leaves them. Scoring needs graphs, not weights, so all but a few of them are *graph-only
entries* (the service runs with ``keeper_bench.graph_only.GraphOnlyManager`` as its zoo manager): their match
arrays are synthesised from the spec's layer sequence (checked below against real exports: the same layer classes,
shapes and order), held in memory, scored and clustered like any model, never chosen as parents. A few real models
(exported with torch, registered with weights in a local store) are the parents the end-to-end queries warm from.
Queries are new neighbours of zoo members (80%) and fresh random architectures (20%).

Usage:
    python scripts/bench_scale.py            # 1,000 / 2,500 / 10,000 models; writes reports/bench_scale.md
    python scripts/bench_scale.py --quick    # 1,000 / 2,500, fewer queries; writes reports/bench_scale_quick.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from keeper.actors.indexing import fit_index  # noqa: E402
from keeper.actors.clustering import two_stage_search  # noqa: E402
from keeper_bench.families import FAMILIES, neighbours  # noqa: E402
from keeper.graph import Kind  # noqa: E402
from keeper.matching import (MatchArrays, PackedParents, level_classes, score_many, signature,  # noqa: E402
                             upper_bounds)

REPORT = Path(__file__).resolve().parents[1] / "reports" / "bench_scale.md"
COMMON = {"dim": 1, "in_channels": 1, "num_classes": 10, "input_length": 40}

# ---------------------------------------------------------------------------------------------- synthetic zoo


def random_spec(rng: np.random.Generator, family: str) -> dict:
    """A random small spec of ``family`` (the keys keeper_bench.families.build takes)."""
    s = {"family": family, **COMMON}
    stages = int(rng.integers(2, 5))
    base = int(rng.choice([8, 12, 16, 24, 32, 48]))
    growth = float(rng.choice([1.5, 2.0]))
    widths = [max(4, int(round(base * growth ** i))) for i in range(stages)]
    kernel = int(rng.choice([3, 5, 7]))
    if family == "resnet":
        return {**s, "widths": widths, "blocks": [int(x) for x in rng.integers(1, 3, stages)], "kernel": kernel}
    if family == "vgg":
        return {**s, "widths": widths, "depths": [int(x) for x in rng.integers(1, 4, stages)], "kernel": kernel}
    if family == "mobilenetv2":
        return {**s, "stem_width": max(4, base // 2), "widths": widths,
                "blocks": [int(x) for x in rng.integers(1, 4, stages)], "expansion": int(rng.choice([2, 4, 6])),
                "kernel": kernel, "head_width": 4 * widths[-1]}
    if family == "transformer":
        heads = int(rng.choice([1, 2, 4]))
        d = heads * int(rng.choice([8, 12, 16, 24]))
        return {**s, "d_model": d, "heads": heads, "ffn": int(rng.choice([2, 4])) * d,
                "layers": int(rng.integers(1, 5)), "patch": int(rng.choice([1, 2, 4, 5, 8])), "pre_ln": True}
    return {**s, "widths": [int(rng.choice([16, 32, 64, 128, 256])) for _ in range(int(rng.integers(1, 5)))],
            "norm": str(rng.choice(["none", "layernorm", "batchnorm"]))}


def layer_sequence(spec: dict) -> list[tuple[int, tuple[int, ...], int, int, int]]:
    """(kind, canonical shape, vectors, input level, output level) of every weighted layer, in keeper.graph's
    canonical order; levels count the strided convs and pools before the layer (keeper.graph)."""
    f, k, cin0 = spec["family"], spec.get("kernel"), spec["in_channels"]
    conv = lambda o, i, kk, a=0, b=None: (Kind.CONV, (o, i, kk), 0, a, a if b is None else b)  # noqa: E731
    bn = lambda c, a=0: (Kind.BATCHNORM, (c,), 1, a, a)  # noqa: E731
    lin = lambda o, i: (Kind.LINEAR, (o, i), 1, 0, 0)  # noqa: E731 - linear layers carry no level
    out: list[tuple[int, tuple[int, ...], int, int, int]] = []
    if f == "resnet":
        w = spec["widths"]
        out += [conv(w[0], cin0, k), bn(w[0])]
        cin = w[0]
        for i, (c, n) in enumerate(zip(w, spec["blocks"])):
            for j in range(n):
                a = i - 1 if i > 0 and j == 0 else i  # the first block of a later stage has stride 2
                if (i > 0 and j == 0) or cin != c:  # downsampling block: the 1x1 shortcut sits beside conv1
                    out += [conv(c, cin, k, a, i), conv(c, cin, 1, a, i), bn(c, i), bn(c, i)]
                else:
                    out += [conv(c, cin, k, i), bn(c, i)]
                out += [conv(c, c, k, i), bn(c, i)]
                cin = c
        out.append(lin(spec["num_classes"], cin))
    elif f == "vgg":
        cin = cin0
        for i, (c, n) in enumerate(zip(spec["widths"], spec["depths"])):  # a max pool before each later stage
            for _ in range(n):
                out += [conv(c, cin, k, i), bn(c, i)]
                cin = c
        out.append(lin(spec["num_classes"], cin))
    elif f == "mobilenetv2":
        cin = spec["stem_width"]
        out += [conv(cin, cin0, 3), bn(cin)]
        for i, (c, n) in enumerate(zip(spec["widths"], spec["blocks"])):
            for j in range(n):
                h, a = cin * spec["expansion"], i - 1 if i > 0 and j == 0 else i  # a strided depthwise conv
                out += [conv(h, cin, 1, a), bn(h, a), (Kind.DWCONV, (h, 1, k), 0, a, i), bn(h, i), conv(c, h, 1, i),
                        bn(c, i)]
                cin = c
        last = len(spec["widths"]) - 1
        out += [conv(spec["head_width"], cin, 1, last), bn(spec["head_width"], last),
                lin(spec["num_classes"], spec["head_width"])]
    elif f == "transformer":
        d, p = spec["d_model"], spec["patch"]
        ln = (Kind.LAYERNORM, (d,), 1, 0, 0)
        out += [lin(d, cin0 * p), (Kind.PARAM, (d, 1, spec["input_length"] // p), 0, 0, 0)]
        for _ in range(spec["layers"]):
            out += [ln, lin(3 * d, d), lin(d, d), ln, lin(spec["ffn"], d), lin(d, spec["ffn"])]
        out += [ln, lin(spec["num_classes"], d)]
    else:
        cin = cin0 * spec["input_length"]
        for c in spec["widths"]:
            out.append(lin(c, cin))
            if spec["norm"] == "layernorm":
                out.append((Kind.LAYERNORM, (c,), 1, 0, 0))
            elif spec["norm"] == "batchnorm":
                out.append(bn(c))
            cin = c
        out.append(lin(spec["num_classes"], cin))
    return out


def synth_arrays(spec: dict) -> MatchArrays:
    """MatchArrays of ``spec`` without building or exporting it (default node rule: kind, rank and, for convs and
    BatchNorms, resolution levels; keeper.matching.level_classes).

    The tie-break arrays of MatchArrays (``skip``, ``edge``, ``context``: read only by the mapping, never by
    scoring) are 0.
    """
    seq = layer_sequence(spec)
    n = len(seq)
    shape = np.ones((n, 5), np.int64)
    for i, (_, s, _, _, _) in enumerate(seq):
        shape[i, :len(s)] = s
    cls = level_classes(np.array([r[0] for r in seq]), np.array([len(r[1]) for r in seq]),
                        np.array([r[3] for r in seq]), np.array([r[4] for r in seq]))
    vectors = np.array([v for _, _, v, _, _ in seq], np.int64)
    total = int(sum(int(np.prod(s)) + v * s[0] for _, s, v, _, _ in seq))
    fields = {f.name: np.zeros(n, np.int64) for f in dataclasses.fields(MatchArrays)}
    fields.update(cls=cls, shape=shape, vectors=vectors, total=total)
    return MatchArrays(**fields)


def spec_key(spec: dict) -> str:
    return json.dumps(spec, sort_keys=True)


def neighbour(spec: dict, rng: np.random.Generator) -> dict | None:
    near = neighbours(spec, rng)
    return near[int(rng.integers(len(near)))] if near else None


def make_zoo(n: int, rng: np.random.Generator, group: int = 8) -> list[dict]:
    """``n`` distinct specs in groups of about ``group`` architectural neighbours."""
    specs: list[dict] = []
    seen: set[str] = set()
    while len(specs) < n:
        members = [random_spec(rng, str(rng.choice(FAMILIES)))]
        for _ in range(group * 3):
            if len(members) >= group:
                break
            v = neighbour(members[int(rng.integers(len(members)))], rng)
            if v is not None and spec_key(v) not in {spec_key(m) for m in members}:
                members.append(v)
        for m in members:
            if spec_key(m) not in seen and len(specs) < n:
                seen.add(spec_key(m))
                specs.append(m)
    return specs


def make_queries(zoo: list[dict], count: int, rng: np.random.Generator) -> list[dict]:
    keys = {spec_key(s) for s in zoo}
    out: list[dict] = []
    while len(out) < count:
        if rng.random() < 0.8:
            q = neighbour(zoo[int(rng.integers(len(zoo)))], rng)
        else:
            q = random_spec(rng, str(rng.choice(FAMILIES)))
        if q is not None and spec_key(q) not in keys:
            out.append(q)
    return out


# ---------------------------------------------------------------------------------------------- real models


def export_onnx(spec: dict, seed: int = 0) -> bytes:
    import torch

    from keeper_bench.families import build, example_input
    from keeper.torch_support import export

    torch.manual_seed(seed)
    return export(build(spec), example_input(spec), dynamo=False).onnx


def check_synthesis(rng: np.random.Generator, count: int) -> tuple[int, int]:
    """Synthesised arrays equal the arrays of real exports for ``count`` random specs."""
    from keeper.graph import load_graph
    from keeper.matching import match_arrays

    ok = 0
    for i in range(count):
        spec = random_spec(rng, FAMILIES[i % len(FAMILIES)])
        real, synth = match_arrays(load_graph(export_onnx(spec))), synth_arrays(spec)
        same = (np.array_equal(real.cls, synth.cls) and np.array_equal(real.shape, synth.shape)
                and np.array_equal(real.vectors, synth.vectors) and real.total == synth.total)
        ok += same
        if not same:
            print(f"  synthetic arrays differ from the export for {spec}", flush=True)
    return ok, count


# ---------------------------------------------------------------------------------------------- measuring


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q)) if xs else float("nan")


def measure(size: int, arrays: list[MatchArrays], handle, queries: list[dict], e2e_children: list[bytes],
            args) -> dict:
    import ray

    names = [f"z{i}" for i in range(size)]
    t0 = time.perf_counter()
    index = fit_index(names, dict(zip(names, arrays)), fit_sample=args.fit_sample)
    fit_s = time.perf_counter() - t0
    packed = PackedParents.pack(arrays)
    by_name = dict(zip(names, arrays))
    member_sigs = np.stack([signature(by_name[n]) for n in index.names])  # in index order, for the bounds
    local, brute, service, scored, local_hits, hits = [], [], [], [], 0, 0
    for q in queries:
        child = synth_arrays(q)
        t = time.perf_counter()
        best = float(np.max(score_many(packed, child)))
        brute.append(time.perf_counter() - t)
        t = time.perf_counter()
        _, s = two_stage_search(index, lambda ns: score_many([by_name[n] for n in ns], child),
                                clusters_to_probe=args.probe, early_stop=args.early_stop,
                                brute_force_below=64, bounds=upper_bounds(member_sigs, child))
        local.append(time.perf_counter() - t)
        local_hits += bool(np.max(s) >= best - 1e-12)
        t = time.perf_counter()
        found = ray.get(handle.search.remote(child), timeout=120)
        service.append(time.perf_counter() - t)
        scored.append(found["scored"])
        # the service also holds the real models; the best over the synthetic zoo is what recall compares
        synth = [sc for n, sc in zip(found["names"], found["scores"]) if n in by_name]
        hits += bool(synth and max(synth) >= best - 1e-12)
    e2e, parents = [], []
    for onnx_bytes in e2e_children:
        t = time.perf_counter()
        r = ray.get(handle.warm.remote(onnx_bytes), timeout=300)
        e2e.append(time.perf_counter() - t)
        parents.append(r.parent)
    stats = ray.get(handle.stats.remote(), timeout=60)
    return {"size": size, "clusters": len(index.medoid_names), "service_clusters": stats["clusters"],
            "fit_s": fit_s, "scored": float(np.mean(scored)), "local_p50": pct(local, 50), "local_p99": pct(local, 99),
            "brute_p50": pct(brute, 50), "service_p50": pct(service, 50), "service_p99": pct(service, 99),
            "e2e_p50": pct(e2e, 50), "e2e_p99": pct(e2e, 99), "recall": hits / len(queries),
            "local_recall": local_hits / len(queries), "queries": len(queries), "e2e_queries": len(e2e),
            "warmed": sum(p is not None for p in parents), "models": stats["models"]}


def table(rows: list[dict]) -> str:
    head = ("| zoo models | clusters | scored / query | service search p50 / p99 (2 matchers) "
            "| end-to-end warm p50 / p99 | two-stage p50 / p99 (1 process) | brute force p50 (1 process) "
            "| recall@1 (service / 1 process) |")
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        lines.append(f"| {r['size']:,} | {r['service_clusters']} | {r['scored']:.0f} | {r['service_p50'] * 1e3:.1f} / "
                     f"{r['service_p99'] * 1e3:.1f} ms | {r['e2e_p50'] * 1e3:.0f} / {r['e2e_p99'] * 1e3:.0f} ms | "
                     f"{r['local_p50'] * 1e3:.1f} / {r['local_p99'] * 1e3:.1f} ms | {r['brute_p50'] * 1e3:.1f} ms | "
                     f"{r['recall']:.3f} / {r['local_recall']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1,000 and 2,500 models, fewer queries")
    p.add_argument("--sizes", type=int, nargs="*", help="zoo sizes (default 1000 2500 10000)")
    p.add_argument("--queries", type=int, help="queries per size for recall and local latency (default 200; quick 40)")
    p.add_argument("--real", type=int, default=None, help="real (exported, registered) parents (default 12)")
    p.add_argument("--probe", type=int, default=5, help="clusters probed per query (the service default)")
    p.add_argument("--early-stop", type=float, default=1.0, help="medoid score that probes its cluster alone")
    p.add_argument("--fit-sample", type=int, default=1000, help="models FasterPAM runs on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", default=None,
                   help="report path (default reports/bench_scale.md; --quick: reports/bench_scale_quick.md)")
    args = p.parse_args(argv)
    args.report = args.report or str(REPORT.with_name("bench_scale_quick.md") if args.quick else REPORT)
    sizes = args.sizes or ([1000, 2500] if args.quick else [1000, 2500, 10000])
    args.queries = args.queries or (40 if args.quick else 200)
    n_real = args.real if args.real is not None else (4 if args.quick else 12)
    rng = np.random.default_rng(args.seed)

    import ray

    import keeper.actors as ka
    from keeper_bench import graph_only

    print("checking synthetic graphs against real exports ...", flush=True)
    ok, checked = check_synthesis(np.random.default_rng(args.seed + 1), 5 if args.quick else 15)
    print(f"  {ok} of {checked} synthetic layer sequences equal their real export", flush=True)

    zoo = make_zoo(max(sizes), rng)
    arrays = [synth_arrays(s) for s in zoo]
    queries = make_queries(zoo, args.queries, rng)
    # real parents with weights, and real children near them for the end-to-end warms
    real_specs = [s for s in zoo if s["family"] in ("vgg", "resnet", "mlp")][:n_real]
    print(f"exporting {n_real} real parents and {n_real} children ...", flush=True)
    parents = {f"real{i}": export_onnx(s, seed=i) for i, s in enumerate(real_specs)}
    kids = [export_onnx(neighbour(s, rng) or s, seed=100 + i) for i, s in enumerate(real_specs)]

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    zoo_dir = tempfile.mkdtemp(prefix="keeper-bench-zoo-")
    handle = graph_only.start(zoo=zoo_dir, matchers=2, namespace="keeper-bench",
                              clustering={"fit_sample": args.fit_sample, "clusters_to_probe": args.probe,
                                          "early_stop": args.early_stop},
                              timeouts={"start_s": 120.0})
    manager = ray.get_actor("keeper-zoo", namespace="keeper-bench")
    for i, (name, blob) in enumerate(parents.items()):
        ray.get(handle.register.remote(blob, 0.8 + 0.01 * i, name), timeout=120)
    for kid in kids[:2]:  # start the matcher and transfer workers
        ray.get(handle.warm.remote(kid), timeout=300)

    rows, have = [], 0
    for size in sizes:
        names = [f"z{i}" for i in range(have, size)]
        t = time.perf_counter()
        ray.get(manager.add_graph_only.remote(names, arrays[have:size]), timeout=600)
        ray.get(manager.wait_index.remote(600.0), timeout=660)
        print(f"zoo of {size:,} graph-only + {n_real} real models: index fitted in the manager in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
        have = size
        row = measure(size, arrays[:size], handle, queries, kids, args)
        rows.append(row)
        print(table([row]).splitlines()[-1], flush=True)
    ka.shutdown(namespace="keeper-bench")
    ray.shutdown()

    md = table(rows)
    print("\n" + md)
    cmd = "python scripts/bench_scale.py" + (" --quick" if args.quick else "")
    text = f"""# Zoo-scale search benchmark

Command: `{cmd}` (machine: {os.cpu_count()} cores; Ray local on 127.0.0.1, 2 Matcher actors).

{md}

- **two-stage (1 process)**: medoids, then the {args.probe} closest clusters (only the best one when a medoid
  scores >= {args.early_stop}), then every other model whose signature bound exceeds the best score found (this
  makes the search exact), scored in one process on an index fitted the same way; **brute force**: every
  zoo model scored in one process (the reference of recall@1). {args.queries} queries per size: 80% new
  neighbours of zoo members, 20% fresh random architectures.
- **service search**: `Keeper.search` through the front door and 2 Matcher actors (one batch per matcher per
  stage), the same queries, sequential; **scored / query**: models aligned per query by the service.
- **end-to-end warm**: `Keeper.warm(onnx_bytes)` with {n_real} real exported children: parse, two-stage search over
  the whole zoo, parent choice, weight transfer in a Ray task reading the parent from the (local) store, result
  back to the caller.
- Zoo: specs of keeper_bench.families' five families in groups of ~8 neighbours; graph-only entries
  (`keeper_bench.graph_only`, synthesised match arrays; {ok} of {checked} checked sequences equal their real
  export) plus {n_real} real registered models. k = round(sqrt(N)); k-medoids (FasterPAM) on a sample of at most
  {args.fit_sample} models, the rest assigned to their nearest medoid.
- Reference: ModelKeeper reports 8 s per request for 2,500 models on a cluster.
"""
    out = Path(args.report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
