#!/usr/bin/env python
"""Benchmark: keeper's Ray service against zoos of 1,000 to 100,000 models on this machine.

What it measures, per zoo size (2 Matcher actors, Ray on 127.0.0.1):

* scoring only, in one process: the two-stage search (medoids, then the closest clusters, then every model whose
  signature bound beats the best found: exact) with the compiled alignment on one core, and whole-zoo brute force
  for comparison;
* scoring only, through the service: ``Keeper.search`` (front door -> 2 matchers in parallel -> answer), with
  where each query's time went (``search``'s ``phases``: the median query and the slowest three are printed);
* end to end through the service: ``Keeper.warm`` with real ONNX children (parse, search, parent choice, the
  weight transfer in a Ray task that reads the parent from the store, the WarmResult back to the caller);
* recall@1 of the two-stage search against brute force (a query counts as a hit when the best score found
  equals the best score over the whole zoo; for the service, also when that best is below the selection floor,
  where the service aligns no model outside the medoids: none could be chosen; those are counted apart);
* the index: the manager's fit (k-medoids on a sample, the rest joining their nearest medoid), and how long
  until the front door serves the new zoo; the manager's and the front door's
  resident memory per model;
* arrivals: models registered into the full zoo one at a time (no refit), each searched for until it is found,
  and the searches meanwhile; then queries again against brute force over the zoo with the arrivals.

The zoo (keeper_bench.synth_zoo): model specs of keeper_bench.families' five families (ResNet, VGG, MobileNetV2,
transformer, MLP; 1-D inputs as in the MNIST-1D workload) in groups of architectural neighbours, as a NAS or AutoML
workload leaves them. Scoring needs graphs, not weights, so all but a few of them are *graph-only entries* (the
service runs with ``graph_only.GraphOnlyManager`` as its zoo manager): their match arrays are
synthesised from the spec's layer sequence (checked below against real exports), held in memory, scored and
clustered like any model, never chosen as parents. A few real models (exported with torch, registered with weights
in a local store) are the parents the end-to-end queries warm from. Queries are new neighbours of zoo members (80%)
and fresh random architectures (20%). The machine's 1-minute load average is recorded with every row.

Usage:
    python scripts/bench_scale.py            # 1,000 / 2,500 / 10,000 models; writes reports/bench_scale.md
    python scripts/bench_scale.py --sizes 1000 10000 30000 100000 --queries 40
    python scripts/bench_scale.py --quick    # 1,000 / 2,500, fewer queries; writes reports/bench_scale_quick.md
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # graph_only, the service tests' loader too

from keeper.actors.clustering import ClusterIndex, two_stage_search  # noqa: E402
from keeper.graph import load_graph  # noqa: E402
from keeper.matching import MatchArrays, PackedParents, match_arrays, score_many, upper_bounds  # noqa: E402
from keeper_bench.scale_out import scale_out, scale_section, scale_table, start_cluster  # noqa: E402
from keeper_bench.synth_zoo import (check_synthesis, export_onnx, make_queries, make_zoo, neighbour,  # noqa: E402
                                    random_spec, spec_key, synth_arrays)

REPORT = Path(__file__).resolve().parents[1] / "reports" / "bench_scale.md"

# ---------------------------------------------------------------------------------------------- measuring


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q)) if xs else float("nan")


def load1() -> float:
    """The machine's 1-minute load average (2 cores shared with other work: read figures next to it)."""
    return float(os.getloadavg()[0])


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def wait_served(handle, manager, models: int, timeout_s: float = 900.0) -> float:
    """Seconds until the front door serves the manager's current view of ``models`` models (its refresher takes
    views in the background)."""
    import ray

    t0 = time.perf_counter()
    key = ray.get(manager.stats.remote(), timeout=60)["view"]
    while (s := ray.get(handle.stats.remote(), timeout=60))["models"] != models or s["view"] != key:
        if time.perf_counter() - t0 > timeout_s:
            raise RuntimeError(f"the front door did not serve {models} models within {timeout_s:.0f} s")
        time.sleep(0.02)
    return time.perf_counter() - t0


#: The service's selection floor (configs/default.yaml): outside the medoid stage it does not align a model whose
#: signature bound is below it, since no such model is ever chosen as a parent.
FLOOR = 0.3


def hit(scores: list[float], best: float, args, query: int) -> bool:
    """Recall@1 of one query: the service found the brute-force best, or that best is below the selection floor
    (no model qualifies as a parent, and the service aligns none below it); the latter are counted apart."""
    found = max(scores) if scores else -1.0
    if found >= best - 1e-12:
        return True
    if best < FLOOR:
        args.below_floor = getattr(args, "below_floor", 0) + 1
        return True
    print(f"    miss: query {query}, brute force {best:.4f}, service {found:.4f}", flush=True)
    return False


def measure(size: int, by_name: dict[str, MatchArrays], handle, manager, queries: list[dict],
            e2e_children: list[bytes], args) -> dict:
    """The queries through the service, and in one process over the index the service uses (the manager's, read
    from its view: the same clusters, so the two columns differ by the service's overheads only); ``by_name``:
    every model the service holds, graph-only and real."""
    import ray

    view = ray.get(manager.view.remote(), timeout=600)
    names = view.names.tolist()
    assert set(names) == set(by_name) and view.labels is not None and bool(np.all(view.labels >= 0))
    index = ClusterIndex(names, view.medoids.tolist(), view.labels.tolist())
    fit_s = ray.get(manager.stats.remote(), timeout=60)["last_fit"]["seconds"]
    packed = PackedParents.pack([by_name[n] for n in names])
    member_sigs = view.sigs  # in view order, which is the index's
    local, brute, service, scored, local_hits, hits, splits, loads = [], [], [], [], 0, 0, [], [load1()]
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
        splits.append({**found["phases"], "driver_s": service[-1], "query": len(splits)})
        scored.append(found["scored"])
        hits += hit(found["scores"], best, args, len(splits))
    loads.append(load1())
    e2e, parents = [], []
    for onnx_bytes in e2e_children:
        t = time.perf_counter()
        r = ray.get(handle.warm.remote(onnx_bytes), timeout=300)
        e2e.append(time.perf_counter() - t)
        parents.append(r.parent)
    stats = ray.get(handle.stats.remote(), timeout=60)
    print_splits(splits)
    return {"size": size, "clusters": len(index.medoid_names), "service_clusters": stats["clusters"],
            "fit_s": fit_s, "scored": float(np.mean(scored)), "local_p50": pct(local, 50), "local_p99": pct(local, 99),
            "brute_p50": pct(brute, 50), "service_p50": pct(service, 50), "service_p99": pct(service, 99),
            "e2e_p50": pct(e2e, 50), "e2e_p99": pct(e2e, 99), "recall": hits / len(queries),
            "local_recall": local_hits / len(queries), "queries": len(queries), "e2e_queries": len(e2e),
            "warmed": sum(p is not None for p in parents), "models": stats["models"], "load": float(np.mean(loads))}


def arrivals(size: int, handle, manager, zoo: list[dict], by_name: dict[str, MatchArrays], queries: list[dict],
             rng: np.random.Generator, args) -> dict:
    """Register ``args.arrivals`` new models into the zoo one at a time (through the manager, as another
    process's registration arrives) and search for each until the search returns it first; then queries against
    brute force over the zoo with the arrivals. An arrival is an architecture no zoo model covers whole (brute
    force over the zoo scores it below 1.0), so it is the only right top-1 of a search for itself. The arrivals
    are removed again afterwards."""
    import ray

    keys = {spec_key(s) for s in zoo}
    arrays = list(by_name.values())
    zoo_packed = PackedParents.pack(arrays)
    fits = ray.get(manager.stats.remote(), timeout=60)["fits"]
    found_s, during, extra = [], [], {}
    while len(extra) < args.arrivals:
        # wider than any zoo model (widths up to 384), so that no zoo model covers it whole: at 100,000 models
        # nearly every random spec of the zoo's ranges is covered, and drawing them until one is not stalls
        spec = random_spec(rng, "mlp")
        spec["widths"] = [int(w) for w in rng.choice([512, 768, 1024, 1536], len(spec["widths"]))]
        if spec_key(spec) in keys:
            continue
        keys.add(spec_key(spec))
        name, arr = f"arrival{size}-{len(extra)}", synth_arrays(spec)
        if float(np.max(score_many(zoo_packed, arr))) >= 1.0 - 1e-12 or (
                extra and float(np.max(score_many(list(extra.values()), arr))) >= 1.0 - 1e-12):
            continue
        t0 = time.perf_counter()
        ray.get(manager.add_graph_only.remote([name], [arr]), timeout=60)
        while True:
            t = time.perf_counter()
            r = ray.get(handle.search.remote(arr), timeout=60)
            during.append(time.perf_counter() - t)
            if r["names"][0] == name:
                break
            if time.perf_counter() - t0 > 60:
                raise RuntimeError(f"arrival {name} not found within 60 s")
        found_s.append(time.perf_counter() - t0)
        extra[name] = arr
        time.sleep(args.arrival_gap)
    refits = ray.get(manager.stats.remote(), timeout=60)["fits"] - fits
    packed = PackedParents.pack(arrays + list(extra.values()))
    checked = queries[:args.arrival_checks]
    hits = 0
    for q in checked:
        child = synth_arrays(q)
        best = float(np.max(score_many(packed, child)))
        r = ray.get(handle.search.remote(child), timeout=60)
        hits += hit(r["scores"], best, args, -1)
    ray.get(manager.remove_graph_only.remote(list(extra)), timeout=60)
    print(f"  arrivals: searchable after {pct(found_s, 50) * 1e3:.0f} ms (median), {max(found_s) * 1e3:.0f} ms "
          f"(max) of {len(found_s)}; refits meanwhile {refits}; searches meanwhile p50 {pct(during, 50) * 1e3:.1f} "
          f"/ p99 {pct(during, 99) * 1e3:.1f} ms; recall@1 after them {hits}/{len(checked)}", flush=True)
    return {"arrival_p50": pct(found_s, 50), "arrival_max": max(found_s), "arrival_refits": refits,
            "during_p50": pct(during, 50), "during_p99": pct(during, 99), "during_n": len(during),
            "arrival_recall": hits / max(1, len(checked)), "arrival_checked": len(checked)}


def print_splits(splits: list[dict]) -> None:
    """Where the service's search time went: the median query and the slowest three."""
    keys = sorted({k for s in splits for k in s if k != "query"})
    med = {k: float(np.median([s.get(k, 0.0) for s in splits])) for k in keys}
    print("  search time split (ms; driver_s: as the caller waited, total_s: inside the front door)", flush=True)
    print("    median " + " ".join(f"{k}={v * (1 if k.endswith('_n') else 1e3):.1f}" for k, v in med.items()))
    for s in sorted(splits, key=lambda s: -s["driver_s"])[:3]:
        print(f"    q{s['query']:<4d} " + " ".join(f"{k}={s.get(k, 0.0) * (1 if k.endswith('_n') else 1e3):.1f}"
                                          for k in keys), flush=True)


def table(rows: list[dict]) -> str:
    head = ("| zoo models | clusters | scored / query | service search p50 / p99 (2 matchers) "
            "| end-to-end warm p50 / p99 | two-stage p50 / p99 (1 process) | brute force p50 (1 process) "
            "| recall@1 (service / 1 process) | load (1 min) |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(f"| {r['size']:,} | {r['service_clusters']} | {r['scored']:.0f} | {r['service_p50'] * 1e3:.1f} / "
                     f"{r['service_p99'] * 1e3:.1f} ms | {r['e2e_p50'] * 1e3:.0f} / {r['e2e_p99'] * 1e3:.0f} ms | "
                     f"{r['local_p50'] * 1e3:.1f} / {r['local_p99'] * 1e3:.1f} ms | {r['brute_p50'] * 1e3:.1f} ms | "
                     f"{r['recall']:.3f} / {r['local_recall']:.3f} | {r['load']:.1f} |")
    return "\n".join(lines)


def index_table(rows: list[dict]) -> str:
    head = ("| zoo models | index fit | manager: models in, fitted, first view | front door serves it after "
            "| manager / front door memory per model | arrival searchable p50 / max | searches meanwhile p50 / p99 "
            "| refits meanwhile | recall@1 after arrivals |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(f"| {r['size']:,} | {r['fit_s']:.1f} s | {r['manager_fit_s']:.1f} s | {r['served_s']:.2f} s | "
                     f"{r['manager_kb']:.1f} / {r['front_kb']:.1f} kB | {r['arrival_p50'] * 1e3:.0f} / "
                     f"{r['arrival_max'] * 1e3:.0f} ms | {r['during_p50'] * 1e3:.1f} / {r['during_p99'] * 1e3:.1f} ms "
                     f"| {r['arrival_refits']} | {r['arrival_recall']:.3f} ({r['arrival_checked']}) |")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1,000 and 2,500 models, fewer queries")
    p.add_argument("--sizes", type=int, nargs="*", help="zoo sizes (default 1000 2500 10000)")
    p.add_argument("--queries", type=int, help="queries per size for recall and local latency (default 200; quick 40)")
    p.add_argument("--real", type=int, default=None, help="real (exported, registered) parents (default 12)")
    p.add_argument("--probe", type=int, default=5, help="clusters probed per query (the service default)")
    p.add_argument("--early-stop", type=float, default=1.0, help="medoid score that probes its cluster alone")
    p.add_argument("--fit-sample", type=int, default=1000, help="models FasterPAM runs on")
    p.add_argument("--arrivals", type=int, default=10, help="models registered one at a time into each zoo")
    p.add_argument("--arrival-gap", type=float, default=0.3, help="seconds between two arrivals")
    p.add_argument("--arrival-checks", type=int, default=10, help="queries checked against brute force after them")
    p.add_argument("--scale-out", action="store_true",
                   help="run on a 4-node loopback Cluster and add the scale-out table at the largest size")
    p.add_argument("--matchers", type=int, nargs="*", default=[1, 2, 4, 8], help="pool sizes of the scale-out table")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients of the scale-out table")
    p.add_argument("--client-queries", type=int, default=10, help="searches per client per pool size")
    p.add_argument("--no-node-loss", dest="node_loss", action="store_false",
                   help="keep every node in the scale-out table's last row")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", default=None,
                   help="report path (default reports/bench_scale.md; --quick: reports/bench_scale_quick.md)")
    args = p.parse_args(argv)
    args.report = args.report or str(REPORT.with_name("bench_scale_quick.md") if args.quick else REPORT)
    args.sizes = args.sizes or ([1000, 2500] if args.quick else [1000, 2500, 10000])
    args.queries = args.queries or (40 if args.quick else 200)
    args.real = args.real if args.real is not None else (4 if args.quick else 12)
    return args


def start_service(args: argparse.Namespace, parents: dict[str, bytes], kids: list[bytes]) -> tuple:
    """Ray (local, or the loopback cluster with ``--scale-out``) and the service with a graph-only manager, its
    real parents registered and its workers started; returns (cluster or None, front door, manager)."""
    import ray

    import graph_only
    cluster, on_head = None, {}
    if args.scale_out:
        cluster, on_head = start_cluster()
    else:
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    zoo_dir = tempfile.mkdtemp(prefix="keeper-bench-zoo-")
    handle = graph_only.start(zoo=zoo_dir, matchers=2, namespace="keeper-bench",
                              clustering={"fit_sample": args.fit_sample, "clusters_to_probe": args.probe,
                                          "early_stop": args.early_stop},
                              timeouts={"start_s": 120.0}, **on_head)
    manager = ray.get_actor("keeper-zoo", namespace="keeper-bench")
    for i, (name, blob) in enumerate(parents.items()):
        ray.get(handle.register.remote(blob, 0.8 + 0.01 * i, name), timeout=120)
    for kid in kids[:2]:  # start the matcher and transfer workers
        ray.get(handle.warm.remote(kid), timeout=300)
    return cluster, handle, manager


def grow(handle, manager, names: list[str], arrays: list[MatchArrays], served: int) -> tuple[float, float]:
    """Hand ``names`` to the manager; seconds until it has fitted and built its first view, and then until the
    front door serves ``served`` models."""
    import ray

    t = time.perf_counter()
    ray.get(manager.add_graph_only.remote(names, arrays), timeout=600)
    ray.get(manager.wait_index.remote(900.0), timeout=960)
    ray.get(manager.view.remote(), timeout=600)  # the first view of the new zoo, built by the manager
    return time.perf_counter() - t, wait_served(handle, manager, served)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    rng = np.random.default_rng(args.seed)

    import ray

    import keeper.actors as ka

    print("checking synthetic graphs against real exports ...", flush=True)
    ok, checked = check_synthesis(np.random.default_rng(args.seed + 1), 5 if args.quick else 15)
    print(f"  {ok} of {checked} synthetic layer sequences equal their real export", flush=True)
    t = time.perf_counter()
    zoo = make_zoo(max(args.sizes), rng)
    arrays = [synth_arrays(s) for s in zoo]
    names = [f"z{i}" for i in range(len(zoo))]
    queries = make_queries(zoo, args.queries, rng)
    print(f"synthesised {len(zoo):,} specs and their arrays in {time.perf_counter() - t:.0f} s", flush=True)
    # real parents with weights, and real children near them for the end-to-end warms
    real_specs = [s for s in zoo if s["family"] in ("vgg", "resnet", "mlp")][:args.real]
    parents = {f"real{i}": export_onnx(s, seed=i) for i, s in enumerate(real_specs)}
    real_arrays = {name: match_arrays(load_graph(blob)) for name, blob in parents.items()}
    kids = [export_onnx(neighbour(s, rng) or s, seed=100 + i) for i, s in enumerate(real_specs)]

    cluster, handle, manager = start_service(args, parents, kids)
    pids = ray.get(manager.pid.remote(), timeout=60), ray.get(handle.pid.remote(), timeout=60)
    base = [rss_mb(pid) for pid in pids]
    rows, have = [], 0
    for size in args.sizes:
        fit_s, served_s = grow(handle, manager, names[have:size], arrays[have:size], size + args.real)
        print(f"zoo of {size:,} graph-only + {args.real} real models: index fitted and first view built in the "
              f"manager in {fit_s:.1f} s, served by the front door {served_s:.2f} s later", flush=True)
        have = size
        by_name = {**dict(zip(names[:size], arrays[:size])), **real_arrays}
        row = measure(size, by_name, handle, manager, queries, kids, args)
        mem = [(rss_mb(pid) - b) * 1024 / size for pid, b in zip(pids, base)]  # after queries touched the view
        print(f"  memory per model: manager {mem[0]:.1f} kB, front door {mem[1]:.1f} kB", flush=True)
        row.update(arrivals(size, handle, manager, zoo, by_name, queries, rng, args))
        row.update(manager_fit_s=fit_s, served_s=served_s, manager_kb=mem[0], front_kb=mem[1])
        rows.append(row)
        print(table([row]).splitlines()[-1] + "\n" + index_table([row]).splitlines()[-1], flush=True)
    md_scale = ""
    if args.scale_out:
        print(f"scale-out at {args.sizes[-1]:,} models, {args.clients} concurrent clients ...", flush=True)
        md_scale = scale_table(scale_out(handle, queries, cluster, args), args.sizes[-1], args.clients)
    ka.shutdown(namespace="keeper-bench")
    ray.shutdown()
    if cluster is not None:
        cluster.shutdown()

    md, md_index = table(rows), index_table(rows)
    print("\n" + md + "\n\n" + md_index + ("\n\n" + md_scale if md_scale else ""))
    cmd = " ".join(["python scripts/bench_scale.py", *(argv if argv is not None else sys.argv[1:])])
    out = Path(args.report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report(cmd, md, md_index, args, args.real, ok, checked) + scale_section(md_scale, args))
    print(f"\nwrote {out}")
    return 0


def report(cmd: str, md: str, md_index: str, args, n_real: int, ok: int, checked: int) -> str:
    return f"""# Zoo-scale search benchmark

Command: `{cmd}` (machine: {os.cpu_count()} cores shared with other work; Ray local on 127.0.0.1, 2 Matcher
actors; **load**: the 1-minute load average during the row's queries; compare rows under similar load).

{md}

- **two-stage (1 process)**: medoids, then the {args.probe} closest clusters (only the best one when a medoid
  scores >= {args.early_stop}), then every other model whose signature bound exceeds the best score found (this
  makes the search exact), scored in one process on the service's index (read from the manager's view);
  **brute force**: every zoo model scored in one process (the reference of recall@1). {args.queries} queries
  per size: 80% new neighbours of zoo members, 20% fresh random architectures.
- **recall@1**: a query is a hit when the best score found equals brute force's best; for the service also when
  brute force's best is below the selection floor ({FLOOR}: no model qualifies as a parent, and outside the medoid
  stage the service does not align a model whose bound is below the floor): {getattr(args, "below_floor", 0)}
  such queries over this run (all sizes, arrivals included).
- **service search**: `Keeper.search` through the front door and 2 Matcher actors (one batch per matcher per
  stage; stages of at most `clustering.local_below` = 512 alignments, the medoids and the few models the bounds
  add, are scored in the front door itself), the same queries, sequential; **scored / query**: models aligned
  per query by the service (those under the selection floor outside the medoid stage are skipped by their
  bound).
- **end-to-end warm**: `Keeper.warm(onnx_bytes)` with {n_real} real exported children: parse, two-stage search over
  the whole zoo, parent choice, weight transfer in a Ray task reading the parent from the (local) store, result
  back to the caller.
- Zoo: specs of keeper_bench.families' five families in groups of ~8 neighbours; graph-only entries
  (`graph_only`, synthesised match arrays; {ok} of {checked} checked sequences equal their real
  export) plus {n_real} real registered models. k = round(sqrt(N)); k-medoids (FasterPAM) on a sample of at most
  {args.fit_sample} models, the rest assigned to their nearest medoid.
- Reference: ModelKeeper reports 8 s per request for 2,500 models on a cluster.

## The index, memory and arrivals

{md_index}

- **index fit**: the manager's `fit_index` of the whole zoo in its background thread (FasterPAM on
  {args.fit_sample} models, the others joined to their nearest medoid: 2k alignments each, one core);
  **manager: models in, fitted, first view**: from handing the zoo's models to the manager until its index is
  fitted and its first view of them is built (shard packing included); **front door serves it after**: until
  the front door's refresher has taken that view in.
- **memory per model**: growth of the resident memory of the manager's and the front door's processes since
  before the graph-only entries, divided by the zoo size (graph-only entries: match arrays, shards, the view and
  the index; stored models add their catalog records).
- **arrivals**: {args.arrivals} new architectures registered one at a time into the full zoo, {args.arrival_gap} s
  apart, through the manager (as another process's registration arrives; a registration through the front door
  takes its view in before it returns); **searchable**: from the registration call until a search through the
  front door finds it (nearest-medoid assignment, no refit); **searches meanwhile**: those searches;
  **recall@1 after arrivals**: queries against brute force over the zoo with the arrivals (how many in brackets).
"""


if __name__ == "__main__":
    sys.exit(main())
