"""The scale-out measurement of keeper's service: a ``ray.cluster_utils.Cluster`` of 4 nodes on loopback,
concurrent clients searching through the front door while the matcher pool is resized, and a worker node removed
mid-run (``scripts/bench_scale.py --scale-out``).

Invariant: a row counts every search its clients sent, answered (latency, throughput) or failed.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np

from keeper_bench.synth_zoo import synth_arrays

__all__ = ["start_cluster", "scale_out", "scale_table", "scale_section"]


def start_cluster(store_bytes: int = 2 * 2**30) -> tuple[Any, dict]:
    """A head node (4 CPUs, resource ``head``) and 3 worker nodes (2 CPUs each) on 127.0.0.1, Ray connected to it;
    returns the cluster and the service options that keep the front door, the manager and the transfer task on the
    head node (a removed node then takes matchers only)."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 4, "resources": {"head": 1}, "object_store_memory": store_bytes, "include_dashboard": False})
    for _ in range(3):
        cluster.add_node(num_cpus=2, object_store_memory=store_bytes)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    pin = {"resources": {"head": 0.01}}
    return cluster, {"actors": {"keeper": pin, "zoo_manager": pin, "transfer": pin}}


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q)) if xs else float("nan")


def scale_out(handle, queries: list[dict], cluster: Any, args: Any) -> list[dict]:
    """Search latency and throughput with ``args.clients`` concurrent clients for each pool size of
    ``args.matchers`` on the multi-node cluster; with the largest pool, a worker node holding matchers is removed
    while the clients run, and queries that failed are counted."""
    import ray

    children = [synth_arrays(q) for q in queries]
    rows = []
    for i, m in enumerate(args.matchers):
        ray.get(handle.scale.remote(matchers=m), timeout=60)
        t0 = time.perf_counter()
        while len(placement := ray.get(handle.placement.remote(), timeout=60)) != m:
            if time.perf_counter() - t0 > 120:
                raise RuntimeError(f"{m} matchers not placed within 120 s")
            time.sleep(0.2)
        for c in children[:2 * m]:  # every matcher has fetched its shards
            ray.get(handle.search.remote(c), timeout=120)
        victim = None
        if i == len(args.matchers) - 1 and args.node_loss:
            nodes = {p["node"] for p in placement}
            victim = next((w for w in cluster.worker_nodes if w.node_id in nodes), None)
        row = run_clients(handle, children, args, victim, cluster)
        row.update(matchers=m, nodes=len({p["node"] for p in placement}), lost_node=victim is not None)
        rows.append(row)
        print(f"  {m} matchers on {row['nodes']} nodes: p50 {row['p50'] * 1e3:.0f} / p99 {row['p99'] * 1e3:.0f} ms, "
              f"{row['qps']:.1f} queries/s, {row['failed']} failed" + (" (a node removed mid-run)" if victim else ""),
              flush=True)
    return rows


def run_clients(handle, children: list, args: Any, victim: Any = None, cluster: Any = None) -> dict:
    """``args.clients`` threads, each sending ``args.client_queries`` searches one after another."""
    import ray

    lat: list[float] = []
    failed = [0]
    started = threading.Event()

    def client(k: int) -> None:
        for j in range(args.client_queries):
            t = time.perf_counter()
            try:
                ray.get(handle.search.remote(children[(k * args.client_queries + j) % len(children)]), timeout=300)
                lat.append(time.perf_counter() - t)
            except Exception:  # counted: a lost query is what the node-loss row must show none of
                failed[0] += 1
            started.set()

    loads = [os.getloadavg()[0]]
    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    if victim is not None:
        started.wait(120)
        cluster.remove_node(victim)
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    loads.append(os.getloadavg()[0])
    return {"p50": _pct(lat, 50), "p99": _pct(lat, 99), "qps": len(lat) / wall, "failed": failed[0],
            "done": len(lat), "load": float(np.mean(loads))}


def scale_table(rows: list[dict], size: int, clients: int) -> str:
    lines = [f"| matchers | nodes they run on | search p50 / p99 ({clients} clients) | queries / s | failed "
             "| load (1 min) |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['matchers']} | {r['nodes']} | {r['p50'] * 1e3:.0f} / {r['p99'] * 1e3:.0f} ms | "
                     f"{r['qps']:.1f} | {r['failed']} of {r['failed'] + r['done']}"
                     f"{' (a worker node removed mid-run)' if r['lost_node'] else ''} | {r['load']:.1f} |")
    return f"{size:,} models, a `ray.cluster_utils.Cluster` of 4 nodes on 127.0.0.1:\n\n" + "\n".join(lines)


def scale_section(md_scale: str, args: Any) -> str:
    if not md_scale:
        return ""
    return f"""
## Matchers scale out

{md_scale}

- {args.clients} client threads in the benchmark's process each send {args.client_queries} searches one after
  another (the queries above); **queries / s**: searches answered over the wall time of the row. Matchers are
  placed by Ray's SPREAD strategy; the front door, the manager and the transfer task are pinned to the head node.
  The 4 nodes share this machine's {os.cpu_count()} cores, so the rows show the service's overheads and its
  spreading, not a cluster's capacity.
- The last row removes a worker node holding matchers once the first search is back; **failed** counts searches
  that raised (the pool redoes a lost batch on another matcher).
"""
