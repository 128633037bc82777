"""Faults on the smallest cluster a user has: two nodes of 1 CPU each (``ray.cluster_utils.Cluster`` on loopback),
the shipped defaults (only the zoo's place and a namespace are set), and a Tune run that asks for every CPU.
Removing the worker node mid-run (with whatever keeper actors and trials it held) loses nothing."""

from __future__ import annotations

import os
import tempfile
import threading
import time
import uuid

import pytest
import torch

from keeper.tune_integration import KeeperCallback, warm_start
from keeper.zoo import Zoo

pytestmark = pytest.mark.ray  # starts Ray on loopback; `-m "not ray"` leaves these out

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    import sys

    from ray.cluster_utils import Cluster

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    worker = c.add_node(num_cpus=1)
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    yield c, worker
    ray.shutdown()
    c.shutdown()


def _mlp(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 4))


def _trainable(service: dict):
    def trainable(config: dict) -> None:
        torch.set_num_threads(1)
        model = _mlp(config["width"])
        warm = warm_start(model, torch.randn(1, 16), config=service)
        x, y = torch.randn(256, 16, generator=torch.Generator().manual_seed(0)), torch.arange(256) % 4
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(30):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        accuracy = (model(x).argmax(1) == y).float().mean().item()
        with tempfile.TemporaryDirectory() as d:
            torch.save(model.state_dict(), os.path.join(d, "model.pt"))
            from ray import tune

            tune.report({"accuracy": accuracy, "parent": warm.parent or ""},
                        checkpoint=tune.Checkpoint.from_directory(d))
    return trainable


def _remove_after_first_registration(cluster, catalog, done: threading.Event, removed: list) -> None:
    """Removes the worker node once a first model is in the zoo, while the other trials are in flight."""
    c, worker = cluster
    deadline = time.monotonic() + 300
    while not done.is_set() and time.monotonic() < deadline:
        if any(catalog.glob("*.json")):
            c.remove_node(worker)
            removed.append(worker)
            return
        time.sleep(0.2)


@pytest.mark.slow  # > 20 s on two idle cores
def test_removing_a_node_mid_tune_run_loses_nothing(cluster, tmp_path):
    from ray import tune

    service = {"zoo": str(tmp_path / "zoo"), "namespace": f"small-{uuid.uuid4().hex[:8]}"}
    cb = KeeperCallback(metric="accuracy", mode="max", config=service)
    done, removed = threading.Event(), []
    remover = threading.Thread(target=_remove_after_first_registration,
                               args=(cluster, tmp_path / "zoo" / "catalog", done, removed))
    remover.start()
    try:
        grid = tune.Tuner(_trainable(service), param_space={"width": tune.grid_search([32, 48, 64, 96])},
                          run_config=tune.RunConfig(name="small", storage_path=str(tmp_path / "results"),
                                                    callbacks=[cb], failure_config=tune.FailureConfig(max_failures=3),
                                                    verbose=0)).fit()
    finally:
        done.set()
        remover.join(60)
    assert removed, "the worker node was removed while the run was in flight"
    assert not grid.errors, "trials on the removed node are retried on the one left"
    assert len(cb.registered) == 4 and len(Zoo(service["zoo"])) == 4, cb.outcomes
    # the service still answers, on the node that remains
    from keeper.actors.launcher import find
    from keeper.torch_support import export

    handle = find(service)
    result = ray.get(handle.warm.remote(export(_mlp(80), torch.randn(1, 16)).onnx), timeout=120)
    assert result.parent is not None
