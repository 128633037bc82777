"""The service under a shared cluster's load: four drivers (each its own process and Ray driver, as the jobs of a
shared cluster are) register and warm at once through one service on a 3-node loopback cluster. No registration
is lost or duplicated and no warm times out; killing the ZooManager (Ray restarts it) or removing a node that
holds matchers while they run fails no call and loses no registration that had returned. And what keeper builds
for trials is built once per node: every node has a cache directory of its own, as separate machines have
separate disks, and a trial process on a node reads the architecture another process on that node traced."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # a loopback cluster and four driver processes: ~40 s

ray = pytest.importorskip("ray")

DRIVERS = 4
STEPS = 6  # registrations (and warms) per driver and phase


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    store = 100 * 2**20
    caches = Path(tempfile.mkdtemp(prefix="keeper-node-caches-"))

    def disk(i: int) -> dict:  # each node's own architecture cache, as each machine has its own disk
        return {"env_vars": {"KEEPER_ARCH_CACHE": str(caches / f"node{i}")}}

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"head": 1},
                                                      "object_store_memory": store, "include_dashboard": False,
                                                      **disk(0)})
    workers = [c.add_node(num_cpus=1, resources={"worker": 1}, object_store_memory=store, **disk(i + 1))
               for i in range(2)]
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    yield c, workers
    ray.shutdown()
    c.shutdown()
    shutil.rmtree(caches, ignore_errors=True)


@pytest.fixture(scope="module")
def service(cluster, tmp_path_factory):
    import keeper.actors as ka

    zoo = tmp_path_factory.mktemp("zoo")
    on_head = {"resources": {"head": 0.01}}  # the front door and the manager stay; a worker node goes
    config = {"zoo": str(zoo), "namespace": f"load-{uuid.uuid4().hex[:8]}", "matchers": 2,
              "actors": {"keeper": on_head, "zoo_manager": on_head, "matcher": {"resources": {"worker": 0.01}}},
              # every search stage goes to the matchers (they start with the service), so a node holding them
              # matters to every warm
              "clustering": {"local_below": 0, "brute_force_below": 8}}
    handle = ka.start(config)
    yield handle, zoo, config
    ka.shutdown(config)


@pytest.fixture(scope="module")
def drivers(cluster, service):
    c, _ = cluster
    _, _, config = service
    script = Path(__file__).with_name("cluster_driver.py")
    procs = [subprocess.Popen([sys.executable, str(script), c.address, json.dumps(config), str(k)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
             for k in range(DRIVERS)]
    try:
        for p in procs:
            assert json.loads(p.stdout.readline()) == {"ready": True}
        yield procs
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(30)


def _send(drivers, phase: str) -> None:
    for p in drivers:
        p.stdin.write(json.dumps({"phase": phase, "n": STEPS}) + "\n")
        p.stdin.flush()


def _answers(drivers) -> list[dict]:
    return [json.loads(p.stdout.readline()) for p in drivers]


def _catalog(zoo: Path) -> dict[str, str]:
    """name -> checksum of every model the store's catalog holds."""
    out = {}
    for path in (zoo / "catalog").glob("*.json"):
        rec = json.loads(path.read_text())
        out[rec["name"]] = rec["checksum"]
    return out


def _wait_for(zoo: Path, phase: str, count: int, timeout_s: float = 120.0) -> None:
    """Until the catalog holds ``count`` models of ``phase``: the fault comes with registrations in flight."""
    deadline = time.monotonic() + timeout_s
    while sum(n.startswith(phase + "-") for n in _catalog(zoo)) < count:
        assert time.monotonic() < deadline, f"no {count} registrations of {phase} within {timeout_s} s"
        time.sleep(0.05)


def _check(answers: list[dict], zoo: Path, phase: str, handle) -> None:
    """Nothing failed or timed out; every registration that returned is in the store once, under its name, and
    served; no content is stored twice."""
    failures = [f for a in answers for f in a["failures"]]
    assert not failures, failures
    assert all(a["warmed"] == STEPS for a in answers)
    acknowledged = {n: c for a in answers for n, c in a["registered"].items()}
    assert len(acknowledged) == DRIVERS * STEPS
    stored = _catalog(zoo)
    assert {n: stored.get(n) for n in acknowledged} == acknowledged
    assert len(set(stored.values())) == len(stored), "one content stored under two names"
    assert len(list((zoo / "blobs").glob("*.onnx"))) == len(stored)
    deadline = time.monotonic() + 30  # the front door's view takes the restarted manager's in
    while ray.get(handle.stats.remote(), timeout=30)["models"] != len(stored):
        assert time.monotonic() < deadline, "the service does not serve every stored model"
        time.sleep(0.2)


def test_four_drivers_registering_and_warming_at_once_lose_nothing(service, drivers):
    handle, zoo, _ = service
    _send(drivers, "calm")
    answers = _answers(drivers)
    _check(answers, zoo, "calm", handle)
    assert sum(a["parents"] for a in answers) > 0, "warms found the models registered beside them"


def test_killing_the_zoo_manager_mid_load_fails_nothing(service, drivers):
    handle, zoo, config = service
    manager = ray.get_actor(f"{config.get('name', 'keeper')}-zoo", namespace=config["namespace"])
    pid = ray.get(manager.pid.remote(), timeout=30)
    _send(drivers, "kill")
    _wait_for(zoo, "kill", 2)
    ray.kill(manager, no_restart=False)  # Ray restarts it (max_restarts -1); calls in flight are retried
    at_kill = sum(n.startswith("kill-") for n in _catalog(zoo))
    answers = _answers(drivers)
    assert at_kill < DRIVERS * STEPS, "the manager died with registrations still to come"
    _check(answers, zoo, "kill", handle)
    assert ray.get(manager.pid.remote(), timeout=60) != pid, "the manager was restarted"


def test_trial_processes_trace_an_architecture_once_per_node(cluster):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    _, workers = cluster

    @ray.remote(num_cpus=1, max_calls=1)  # a fresh process per call, as Tune starts a trial's
    def trial_process():
        import torch

        from keeper.torch_support import cache
        from keeper.torch_support.export import export_graph

        model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.ReLU(), torch.nn.Linear(24, 4))
        export_graph(model, torch.zeros(1, 16))
        return cache.stats()

    def on(worker):
        return trial_process.options(scheduling_strategy=NodeAffinitySchedulingStrategy(worker.node_id, soft=False))

    first, second = workers
    # one CPU per node: the two processes on the first node run one after the other
    stats = ray.get([on(first).remote(), on(first).remote(), on(second).remote()], timeout=300)
    counts = [(s["misses"], s["disk_hits"]) for s in stats]
    assert sorted(counts[:2]) == [(0, 1), (1, 0)], stats  # traced once on the node, read there by the other
    assert counts[2] == (1, 0), stats  # another node, another disk: traced there once


def test_removing_a_node_with_matchers_mid_load_fails_nothing(cluster, service, drivers):
    c, workers = cluster
    handle, zoo, _ = service
    placement = ray.get(handle.placement.remote(), timeout=60)
    victim = next(w for w in workers if w.node_id in {p["node"] for p in placement})
    _send(drivers, "node")
    _wait_for(zoo, "node", 2)
    c.remove_node(victim)
    at_removal = sum(n.startswith("node-") for n in _catalog(zoo))
    answers = _answers(drivers)
    assert at_removal < DRIVERS * STEPS, "the node went with registrations and warms still to come"
    _check(answers, zoo, "node", handle)
    assert ray.get(handle.stats.remote(), timeout=30)["matcher_deaths"] >= 1, "the warms met the lost matchers"
    placement = ray.get(handle.placement.remote(), timeout=60)
    assert victim.node_id not in {p["node"] for p in placement}
