"""A driver of the service-under-load tests (``tests/test_cluster_load.py``): its own process and Ray driver,
connected to the test's loopback cluster, registering and warming models through the running keeper service on
command, as the jobs of a shared cluster do.

Protocol: ``python cluster_driver.py ADDRESS CONFIG_JSON DRIVER_ID``; it prints ``{"ready": true}`` once connected,
then answers each command line on stdin (``{"phase": str, "n": int}``) with one JSON line:
``{"phase", "registered": {name: checksum}, "warmed": int, "parents": int, "failures": [str], "slowest_s"}``.
For each of the ``n`` steps it sends a registration of a model of its own (unique content, its own name) and a warm
of a child at once, then waits for both, each within the service's bounds; any exception (a timeout included) is a
failure, named. Torch is not imported (the models are built with ``onnx.helper``, in :mod:`onnx_mlp`), so a driver
starts in about a second.
"""

from __future__ import annotations

import json
import sys
import time
import zlib

from onnx_mlp import mlp_onnx


def mlp(widths: list[int], seed: int, in_dim: int = 16) -> bytes:
    """A Gemm/Relu chain with weights of std 0.1 drawn with ``seed``."""
    return mlp_onnx(widths, seed, in_dim, scale=0.1)


def phase(handle, config, driver: int, name: str, n: int) -> dict:
    import ray

    registered, failures, warmed, parents, slowest = {}, [], 0, 0, 0.0
    for i in range(n):
        label = f"{name}-d{driver}-{i}"
        seed = zlib.crc32(label.encode())  # stable across processes, unlike hash()
        model = mlp([32 + 4 * (i % 5), 16, 10], seed)
        child = mlp([40 + 2 * ((i + driver) % 6), 16, 10], seed + 1)
        t0 = time.perf_counter()
        reg = handle.register.remote(model, 0.80 + 0.01 * (i % 5), label)
        warm = handle.warm.remote(child)
        try:
            rec = ray.get(reg, timeout=config.timeouts.register_s)
            registered[rec["name"]] = rec["checksum"]
        except Exception as exc:  # named in the answer: the test fails on any
            failures.append(f"register {label}: {type(exc).__name__}: {exc}"[:500])
        try:
            result = ray.get(warm, timeout=config.timeouts.query_s)
            warmed += 1
            parents += result.parent is not None
        except Exception as exc:
            failures.append(f"warm {label}: {type(exc).__name__}: {exc}"[:500])
        slowest = max(slowest, time.perf_counter() - t0)
    return {"phase": name, "registered": registered, "warmed": warmed, "parents": parents, "failures": failures,
            "slowest_s": slowest}


def main() -> int:
    address, config_json, driver = sys.argv[1], sys.argv[2], int(sys.argv[3])
    import ray

    from keeper.actors import connect
    from keeper.actors.config import load_config

    config = load_config(json.loads(config_json))
    ray.init(address=address, log_to_driver=False)
    handle = connect(config)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        print(json.dumps(phase(handle, config, driver, command["phase"], int(command["n"]))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
