"""The cluster, the service and the drivers of a trace.

* :func:`start_cluster`: a ``ray.cluster_utils.Cluster`` on 127.0.0.1, a head node and ``nodes - 1`` worker nodes
  of ``node_cpus`` logical CPUs each. Every node's CPUs share this machine's real cores (a loopback cluster measures
  the service's behaviour and its overheads, not a cluster's capacity). Every node gets a cache directory of its own
  (``KEEPER_ARCH_CACHE``, ``KEEPER_KERNEL_CACHE``), as separate machines have separate disks, so what keeper builds
  for trials is counted per node as a real cluster would pay it; the drivers run beside the head node, with its
  caches.
* :func:`serve`: the keeper service started as an operator starts it, ``keeper serve --config C --address A``
  (it returns once the service answers; the actors are detached and outlive the command).
* :func:`drive`: each job launched at its arrival as its own process (``python -m keeper_bench.cluster.job``), at
  most ``max_drivers`` at once per arm; a job that arrives while every driver slot of its arm is taken waits, and
  its time counts from its arrival. Each arm has its slots of its own: in one pool the twin listed first would take
  the first slot freed and its twin wait for the next, and what one arm's slower jobs hold would make the other
  wait. Several arms of one trace may run at once, each job's twins arriving together. While the trace runs, a
  sampler records the zoo's size (models and bytes in its catalog), the drivers running and the machine's load.

Invariants: a job whose result file exists is not run again (``drive`` resumes a trace; the remaining jobs keep
their gaps, the first of them arriving at once); every result is written whole by its job's process; a job whose
process dies without a result gets one saying so; a finished job's Tune directory is removed (its result holds
what the reading needs; its models are in the zoo).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from keeper_bench.cluster.job import dataset_file, experiment_name
from keeper_bench.cluster.trace import Job

__all__ = ["start_cluster", "needed_node_cpus", "serve", "service_stats", "stop_service", "drive", "ZooSampler",
           "service_config", "keeper_command"]


def _node_env(root: str, i: int) -> dict[str, str]:
    return {"KEEPER_ARCH_CACHE": os.path.join(root, f"node{i}", "architectures"),
            "KEEPER_KERNEL_CACHE": os.path.join(root, f"node{i}", "kernels")}


def needed_node_cpus(nodes: int, max_drivers: int, concurrency: int, arms: int) -> float:
    """Logical CPUs per node for every running job's trials at once (each trial asks for one): fewer, and Ray's
    queue of placement groups decides the TC from arrival, since it does not place waiting groups in the order they
    were asked for (a job could wait half an hour for its one trial while later arrivals ran)."""
    return float(-(-arms * max_drivers * concurrency // nodes))


def start_cluster(nodes: int, node_cpus: float, caches: str, store_mb: int = 150) -> tuple[Any, dict[str, int]]:
    """The loopback cluster (see the module docstring), Ray connected to it; returns it and node id -> node number
    (0 is the head)."""
    import ray
    from ray.cluster_utils import Cluster

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    shutil.rmtree(caches, ignore_errors=True)
    common = {"num_cpus": node_cpus, "object_store_memory": store_mb * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={**common, "include_dashboard": False,
                                                            "env_vars": _node_env(caches, 0)})
    for i in range(1, nodes):
        cluster.add_node(**common, env_vars=_node_env(caches, i))
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    numbers = {cluster.head_node.node_id: 0}
    numbers.update({w.node_id: i + 1 for i, w in enumerate(cluster.worker_nodes)})
    return cluster, numbers


def keeper_command() -> list[str]:
    """The ``keeper`` command as an operator runs it (the console script; ``python -c`` where it is not on PATH)."""
    exe = shutil.which("keeper")
    return [exe] if exe else [sys.executable, "-c", "import sys; from keeper.cli import main; sys.exit(main())"]


def service_config(zoo: str, namespace: str, capacity_bytes: int | None = None) -> dict:
    """The operator's settings: the shipped defaults but for the zoo's place, a namespace and the byte budget."""
    out: dict[str, Any] = {"zoo": zoo, "namespace": namespace}
    if capacity_bytes is not None:
        out["capacity_bytes"] = int(capacity_bytes)
    return out


def serve(address: str, config: dict, workdir: str) -> float:
    """``keeper serve --config <config as YAML> --address <address>``; returns its seconds. Raises on failure."""
    import yaml

    path = os.path.join(workdir, f"keeper-{config['namespace']}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    t0 = time.perf_counter()
    proc = subprocess.run([*keeper_command(), "serve", "--config", path, "--address", address], capture_output=True,
                          text=True, timeout=300)
    if proc.returncode:
        raise RuntimeError(f"keeper serve failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return time.perf_counter() - t0


def service_stats(address: str, config: dict, workdir: str) -> dict:
    """``keeper stats`` of the service of ``config`` (its JSON), or ``{"error": ...}``."""
    path = os.path.join(workdir, f"keeper-{config['namespace']}.yaml")
    proc = subprocess.run([*keeper_command(), "stats", "--config", path, "--address", address], capture_output=True,
                          text=True, timeout=120)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return {"error": (proc.stderr or proc.stdout)[-500:]}


def stop_service(address: str, config: dict, workdir: str) -> None:
    """``keeper stop`` on the service of ``config``."""
    path = os.path.join(workdir, f"keeper-{config['namespace']}.yaml")
    subprocess.run([*keeper_command(), "stop", "--config", path, "--address", address], capture_output=True,
                   text=True, timeout=120)


class ZooSampler:
    """The zoo's size over time, read from its catalog (one small JSON per model, each holding its ``nbytes``),
    with the drivers running and the 1-minute load, every ``every`` seconds in a daemon thread."""

    def __init__(self, zoo: str | None, running: Callable[[], int], every: float = 5.0):
        self.zoo, self.running, self.every = zoo, running, float(every)
        self.samples: list[dict] = []
        self._sizes: dict[str, tuple[float, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="zoo-sampler")
        self._thread.start()

    def _zoo(self) -> tuple[int, int]:
        catalog = os.path.join(self.zoo or "", "catalog")
        if not self.zoo or not os.path.isdir(catalog):
            return 0, 0
        total, seen = 0, set()
        for entry in os.scandir(catalog):
            if not entry.name.endswith(".json"):
                continue
            seen.add(entry.name)
            try:
                mtime = entry.stat().st_mtime
                if self._sizes.get(entry.name, (None,))[0] != mtime:
                    with open(entry.path) as f:
                        self._sizes[entry.name] = (mtime, int(json.load(f).get("nbytes", 0)))
            except (OSError, ValueError):
                continue
            total += self._sizes[entry.name][1]
        for gone in set(self._sizes) - seen:
            self._sizes.pop(gone)
        return len(seen), total

    def sample(self) -> None:
        models, nbytes = self._zoo()
        self.samples.append({"t": time.time(), "models": models, "bytes": nbytes, "drivers": self.running(),
                             "load": os.getloadavg()[0]})

    def _run(self) -> None:
        self.sample()
        while not self._stop.wait(self.every):
            self.sample()

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join(10)
        self.sample()
        return self.samples


@dataclass
class _Running:
    arm: str
    job: Job
    proc: subprocess.Popen
    arrived: float
    launched: float
    out: str
    log: Any = field(default=None)


def drive(jobs: list[Job], *, arms: list[tuple[str, dict | None]], address: str, workdir: str, max_drivers: int,
          node_env: dict[str, str], on_done: Callable[[str, Job, dict], None], sampler_every: float = 5.0) -> dict:
    """Run ``jobs`` once per arm of ``arms`` (name, service config or None), the arms' twins arriving together
    (see the module docstring); returns ``{"samples", "wall_s", "started"}``, the samples of the first arm with a
    service. ``max_drivers``: job processes at once per arm. ``on_done(arm, job, result)`` runs in this thread as
    each job ends (the script writes its report there). ``node_env``: the head node's cache settings, which the
    drivers take. Run together, the arms share the machine's load whatever it is, so a load that changes over the
    run moves both alike."""
    data_root = os.path.join(workdir, "data")
    roots = {arm: os.path.join(workdir, arm) for arm, _ in arms}
    services = dict(arms)
    for root in roots.values():
        os.makedirs(os.path.join(root, "results"), exist_ok=True)
        os.makedirs(os.path.join(root, "logs"), exist_ok=True)

    def result_of(arm: str, j: Job) -> str:
        return os.path.join(roots[arm], "results", f"{j.name}.json")

    done: dict[tuple[str, int], float] = {}
    for arm, _ in arms:
        for j in jobs:
            if os.path.exists(result_of(arm, j)):
                with open(result_of(arm, j)) as f:
                    done[(arm, j.index)] = float(json.load(f).get("ended", 0.0))
    # in arrival order, the arms' twins side by side
    waiting = [(arm, j) for j in jobs for arm, _ in arms if (arm, j.index) not in done]
    first = min((j.arrival_s for _, j in waiting if j.after is None), default=0.0)
    running: list[_Running] = []
    watched = next((svc["zoo"] for _, svc in arms if svc), None)
    sampler = ZooSampler(watched, lambda: len(running), sampler_every)
    t0 = time.time()
    env = {**os.environ, **node_env}

    def arrival(arm: str, j: Job) -> float | None:
        if j.after is None:
            return t0 + j.arrival_s - first
        if (arm, j.after) in done:
            return max(done[(arm, j.after)], t0) + j.arrival_s
        return None  # its predecessor has not ended yet

    try:
        while waiting or running:
            now = time.time()
            for r in [r for r in running if r.proc.poll() is not None]:
                running.remove(r)
                if r.log is not None:
                    r.log.close()
                result = _result(r)
                # the job's Tune directory (its checkpoints) served its run and its registrations: the result holds
                # what the reading needs, and 300 jobs' checkpoints would take gigabytes
                shutil.rmtree(os.path.join(roots[r.arm], "tune", experiment_name(r.job, services[r.arm] is not None)),
                              ignore_errors=True)
                done[(r.arm, r.job.index)] = float(result.get("ended", time.time()))
                on_done(r.arm, r.job, result)
            for arm, j in list(waiting):
                at = arrival(arm, j)
                if at is None or at > now or sum(r.arm == arm for r in running) >= max_drivers:
                    continue
                waiting.remove((arm, j))
                root = roots[arm]
                spec = {"job": j.as_dict(), "address": address, "storage": os.path.join(root, "tune"),
                        "data": dataset_file(data_root, j), "service": services[arm]}
                spec_path = os.path.join(root, "results", f".{j.name}.spec.json")
                with open(spec_path, "w") as f:
                    json.dump(spec, f)
                log = open(os.path.join(root, "logs", f"{j.name}.log"), "w")
                proc = subprocess.Popen([sys.executable, "-m", "keeper_bench.cluster.job", spec_path,
                                         result_of(arm, j)], stdout=log, stderr=subprocess.STDOUT, env=env)
                running.append(_Running(arm, j, proc, at, time.time(), result_of(arm, j), log))
            time.sleep(0.2)
    finally:
        for r in running:  # interrupted: the jobs still running end with this process
            r.proc.terminate()
    return {"samples": sampler.stop(), "wall_s": time.time() - t0, "started": t0}


def _result(r: _Running) -> dict:
    """The job's result with when it arrived and was launched (a process that died without writing one gets a
    result saying so, so the reading counts it as failed)."""
    try:
        with open(r.out) as f:
            result = json.load(f)
    except (OSError, ValueError):
        result = {"job": r.job.name, "failed": True, "error": f"the job's process exited {r.proc.returncode} "
                  "without a result", "ended": time.time()}
    result.update(arrived=r.arrived, launched=r.launched, returncode=r.proc.returncode)
    tmp = f"{r.out}.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, r.out)
    return result
