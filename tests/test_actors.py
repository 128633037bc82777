"""Tests of keeper.actors: the plain classes without Ray, then the service on a 3-node loopback Ray cluster
(matchers spread over nodes, a node removed mid-query, a SIGKILLed ZooManager, 50 concurrent registers and
warms, live scaling). Ray starts once for the module."""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import nets
from keeper.actors.clustering import two_stage_search
from keeper.actors.config import DEFAULT_CONFIG_PATH, ConfigError, ServiceConfig, load_config
from keeper.actors.indexing import fit_index
from keeper.actors.manager import ZooManager
from keeper.actors.matcher import Matcher
from keeper.actors.snapshot import Shard
from keeper.errors import AdmissionError
from keeper.graph import load_graph
from keeper.matching import MatchArrays, match_arrays, score_many

pytestmark = pytest.mark.ray  # starts Ray on loopback; `-m "not ray"` leaves these out

# ---------------------------------------------------------------------------------------------- test models


# weights of std 0.1: the service tests' models
mlp_onnx = functools.partial(nets.mlp_onnx, scale=0.1)


def cnn_onnx(widths: list[int], kernel: int = 3, seed: int = 0, classes: int = 10) -> bytes:
    """Conv1d/BatchNorm/Relu stages, global pooling, a linear head."""
    rng = np.random.default_rng(seed)
    nodes, inits, x, c = [], [], "x", 1

    def init(name: str, arr: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(arr.astype(np.float32), name))
        return name

    for i, w in enumerate(widths):
        wt = init(f"conv{i}.weight", rng.standard_normal((w, c, kernel)) * 0.1)
        nodes.append(helper.make_node("Conv", [x, wt], [f"c{i}"], pads=[kernel // 2] * 2, name=f"conv{i}"))
        bn = [init(f"bn{i}.{r}", v) for r, v in (("weight", np.ones(w)), ("bias", np.zeros(w)),
                                                  ("mean", np.zeros(w)), ("var", np.ones(w)))]
        nodes.append(helper.make_node("BatchNormalization", [f"c{i}"] + bn, [f"b{i}"], name=f"bn{i}"))
        nodes.append(helper.make_node("Relu", [f"b{i}"], [f"r{i}"], name=f"relu{i}"))
        x, c = f"r{i}", w
    nodes += [helper.make_node("GlobalAveragePool", [x], ["gap"]), helper.make_node("Flatten", ["gap"], ["flat"])]
    nodes.append(helper.make_node("Gemm", ["flat", init("fc.weight", rng.standard_normal((classes, c)) * 0.1),
                                           init("fc.bias", np.zeros(classes))], ["y"], transB=1, name="fc"))
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 1, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, classes])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def conv2d_onnx(channels: int = 4) -> bytes:
    """One 2-D convolution: nothing 1-D or linear in a zoo can feed it."""
    w = numpy_helper.from_array(np.ones((channels, 3, 3, 3), np.float32), "conv.weight")
    g = helper.make_graph([helper.make_node("Conv", ["x", "conv.weight"], ["y"], pads=[1] * 4, name="conv")], "c2d",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, channels, 8, 8])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def random_model(rng: np.random.Generator, seed: int) -> bytes:
    if rng.random() < 0.5:
        return mlp_onnx([int(rng.choice([16, 24, 32, 48, 64, 96, 128])) for _ in range(int(rng.integers(1, 6)))],
                        seed=seed)
    return cnn_onnx([int(rng.choice([8, 16, 24, 32, 48, 64])) for _ in range(int(rng.integers(1, 7)))],
                    kernel=int(rng.choice([3, 5, 7])), seed=seed)


def catalog_names(zoo_dir: Path) -> list[str]:
    return sorted(p.stem for p in (zoo_dir / "catalog").glob("*.json"))


# ---------------------------------------------------------------------------------------------- without Ray


def test_default_yaml_is_the_builtin_default():
    assert load_config(DEFAULT_CONFIG_PATH).to_dict() == ServiceConfig().to_dict() == load_config().to_dict()


def test_overrides_merge_and_typos_are_refused():
    cfg = load_config(DEFAULT_CONFIG_PATH, matchers=5, actors={"matcher": {"num_cpus": 0.5}},
                      clustering={"k": 7})
    assert cfg.matchers == 5 and cfg.clustering.k == 7 and cfg.clustering.early_stop == 1.0
    assert cfg.actor_options("matcher") == {"num_cpus": 0.5, "max_restarts": 0, "max_task_retries": 0,
                                            "max_concurrency": 1, "scheduling_strategy": "SPREAD"}
    for bad in ({"matcher": 3}, {"clustering": {"kk": 1}}, {"actors": {"matcher": {"cpus": 1}}},
                {"selection": {"floor": 2.0}}, {"timeouts": {"query_s": -1}}, {"matchers": -1}):
        with pytest.raises(ConfigError):
            load_config(**bad)


def test_shard_rows_score_like_each_parent_alone():
    rng = np.random.default_rng(0)
    parents = [match_arrays(load_graph(random_model(rng, i))) for i in range(12)]
    shard = Shard.build("s", parents)
    child = match_arrays(load_graph(random_model(rng, 99)))
    alone = np.array([score_many([p], child)[0] for p in parents])
    rows = np.array([7, 0, 11, 3, 3])
    assert np.array_equal(score_many(shard.pack(rows), child), alone[rows])
    assert np.array_equal(score_many(shard.pack(np.arange(12)), child), alone)
    got = Matcher().score(child, [("s", shard, rows), ("s", shard, np.arange(12))])
    assert np.array_equal(got, np.concatenate([alone[rows], alone]))
    # the cheap bound skips parents that cannot reach the floor: those score 0, the others exactly
    floored = Matcher().score(child, [("s", shard, np.arange(12))], floor=0.5)
    high = alone >= 0.5
    assert np.array_equal(floored[high], alone[high]) and np.all(floored[~high] <= alone[~high])


def test_manager_register_is_idempotent_and_survives_a_restart(tmp_path):
    cfg = load_config(zoo=str(tmp_path), clustering={"brute_force_below": 4})
    mgr = ZooManager(cfg)
    a = mlp_onnx([32, 10])
    first = mgr.register(a, 0.8, "a")
    assert mgr.register(a, 0.8, "a") == first  # a retry stores nothing twice
    with pytest.raises(AdmissionError, match="already stored as 'a'"):
        mgr.register(a, 0.8, "a-again")
    for i in range(5):
        mgr.register(mlp_onnx([16 + 8 * i, 10], seed=i + 1), 0.8, f"m{i}")
    assert catalog_names(tmp_path) == ["a", "m0", "m1", "m2", "m3", "m4"]
    assert mgr.wait_index(30)
    view = mgr.view()
    assert view.names.tolist() == ["a", "m0", "m1", "m2", "m3", "m4"] and view.weighted.all()
    assert mgr.view(view.key) is None  # unchanged: nothing to ship
    again = ZooManager(cfg)  # what a restart does
    assert again.view().names.tolist() == view.names.tolist() and again.wait_index(30)
    assert again.stats()["clusters"] >= 1 and again.view().key != view.key


def test_manager_shows_an_accuracy_recorded_again_in_its_next_view(tmp_path):
    mgr = ZooManager(load_config(zoo=str(tmp_path)))
    a = mlp_onnx([32, 10])
    mgr.register(a, 0.8, "a")
    mgr.register(mlp_onnx([24, 10], seed=3), 0.7, "b")
    assert mgr.register(a, 0.9, "a-again", record_again=True)["name"] == "a"
    view = mgr.view()
    assert view.names.tolist() == ["a", "b"] and view.accuracy.tolist() == pytest.approx([0.9, 0.7])


def test_manager_follows_evictions(tmp_path):
    models = [mlp_onnx([32 + 8 * i, 10], seed=i) for i in range(6)]
    cap = sum(len(m) for m in models[:3]) + 16
    mgr = ZooManager(load_config(zoo=str(tmp_path), capacity_bytes=cap, clustering={"brute_force_below": 2}))
    for i, m in enumerate(models):
        mgr.register(m, 0.8 + 0.01 * i, f"m{i}")
    stored = catalog_names(tmp_path)
    assert 0 < len(stored) < 6 and "m5" in stored
    assert mgr.view().names.tolist() == stored and mgr.stats()["models"] == len(stored)
    assert mgr.wait_index(30)
    view = mgr.view()
    assert sorted(view.names[view.labels >= 0].tolist()) == stored  # evicted models left the clusters too


def test_two_stage_search_recall_against_brute_force():
    rng = np.random.default_rng(2)
    zoo = {f"z{i}": match_arrays(load_graph(random_model(rng, i))) for i in range(240)}
    c = ServiceConfig().clustering  # the service's defaults for the probe
    index = fit_index(list(zoo), zoo, fit_sample=120)
    assert len(index) == 240 and len(index.medoid_names) == 15
    packed_names = list(zoo)
    hits = 0
    queries = 40
    for q in range(queries):
        child = match_arrays(load_graph(random_model(rng, 1000 + q)))
        brute = score_many([zoo[n] for n in packed_names], child)
        names, scores = two_stage_search(index, lambda ns: score_many([zoo[n] for n in ns], child),
                                         clusters_to_probe=c.clusters_to_probe, early_stop=c.early_stop,
                                         # a zoo this small is scored whole by default: ask for both stages
                                         brute_force_below=min(c.brute_force_below, 64))
        hits += bool(np.max(scores) >= np.max(brute) - 1e-12)
        assert len(names) < len(zoo)
    assert hits / queries >= 0.95


# ---------------------------------------------------------------------------------------------- on Ray

NAMESPACE = "keeper-test"


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    store_mem = 150 * 2**20
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "resources": {"head": 1},
                                                      "object_store_memory": store_mem,
                                                      "include_dashboard": False})
    workers = [c.add_node(num_cpus=2, object_store_memory=store_mem) for _ in range(2)]
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    yield c, workers
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def service(cluster, tmp_path_factory):
    import keeper.actors as ka
    import graph_only
    zoo = tmp_path_factory.mktemp("zoo")
    on_head = {"resources": {"head": 0.01}}  # the node-removal test takes a worker node away
    # the zoo manager also holds graph-only entries: the node-removal test loads the matchers with them
    handle = graph_only.start(zoo=str(zoo), namespace=NAMESPACE, matchers=3,
                      actors={"keeper": on_head, "zoo_manager": on_head, "matcher": {"num_cpus": 0.5},
                              "transfer": {"num_cpus": 1.0, **on_head}},
                      # these tests are about the matchers: every stage goes to them (local_below 0), so they
                      # start with the service, not once the zoo outgrows what the front door scores itself
                      clustering={"brute_force_below": 8, "local_below": 0},
                      timeouts={"batch_s": 15.0, "query_s": 60.0, "start_s": 90.0})
    yield handle, zoo
    ka.shutdown(namespace=NAMESPACE)


def get(ref, timeout: float = 60.0):
    import ray

    return ray.get(ref, timeout=timeout)


def test_start_returns_the_running_instance(service):
    import keeper.actors as ka

    handle, zoo = service
    again = ka.start(zoo="/somewhere/else", namespace=NAMESPACE)
    assert again._actor_id == handle._actor_id
    s = get(handle.stats.remote())
    assert {"models", "matchers", "clusters", "queries", "p50", "p99"} <= set(s) and s["matchers"] == 3
    assert s["uri"] == str(zoo)


def test_matchers_spread_over_nodes(service, cluster):
    handle, _ = service
    placement = get(handle.placement.remote())
    assert len(placement) == 3 and len({p["node"] for p in placement}) >= 2


def test_warm_through_the_service_equals_the_embedded_warm(service):
    from keeper.actors import ServiceClient
    from keeper.warm import inherit, warm

    handle, zoo = service
    parent = cnn_onnx([16, 32, 32], kernel=3, seed=1)
    rec = get(handle.register.remote(parent, 0.9, "cnn-parent"))
    assert rec["name"] == "cnn-parent" and rec["accuracy"] == 0.9
    child = cnn_onnx([24, 32, 32, 32], kernel=5, seed=2)
    result = get(handle.warm.remote(child, noise=0.0))
    assert result.parent == "cnn-parent" and result.score > 0.3
    local = inherit(parent, child, parent_name="cnn-parent", noise=0.0)
    assert result.weights.keys() == local.weights.keys()
    assert all(np.array_equal(result.weights[k], local.weights[k]) for k in local.weights)
    # choose() lets the caller warm in its own process, along the alignment the service's choice carries
    choice = get(handle.choose.remote(child))
    assert choice.parent == "cnn-parent" and choice.uri == str(zoo)
    assert choice.assessment_of("cnn-parent").alignment is not None
    here = warm(ServiceClient(handle), child, load_graph(child), noise=0.0)
    assert here.parent == "cnn-parent" and all(np.array_equal(here.weights[k], local.weights[k]) for k in local.weights)
    # nothing similar enough: the child keeps its own weights
    assert get(handle.warm.remote(conv2d_onnx())).parent is None


def linear_arrays(layers: int, width: int) -> MatchArrays:
    """Match arrays of a plain stack of ``layers`` width x width linear layers (no ONNX needed)."""
    cls = match_arrays(load_graph(mlp_onnx([4]))).cls[0]
    fields = {f.name: np.zeros(layers, np.int64) for f in dataclasses.fields(MatchArrays)}
    shape = np.ones((layers, 5), np.int64)
    shape[:, :2] = width
    fields.update(cls=np.full(layers, cls, np.int32), shape=shape, vectors=np.ones(layers, np.int64),
                  total=layers * (width * width + width))
    return MatchArrays(**fields)


def test_removing_a_node_with_matchers_mid_query(service, cluster):
    import ray

    handle, _ = service
    c, workers = cluster
    placement = get(handle.placement.remote())
    victim = next(w for w in workers if w.node_id in {p["node"] for p in placement})
    # slow whole-zoo searches keep every matcher busy with queued batches when the node goes
    manager = ray.get_actor("keeper-zoo", namespace=NAMESPACE)
    parents = [linear_arrays(20, 8 + i % 50) for i in range(600)]
    before = get(handle.stats.remote())["models"]
    get(manager.add_graph_only.remote([f"slow{i}" for i in range(600)], parents))
    deadline = time.time() + 10  # the front door's refresher takes the manager's new view in (within a second)
    while get(handle.stats.remote())["models"] < before + 600 and time.time() < deadline:
        time.sleep(0.05)
    child = linear_arrays(3000, 32)
    # far more queued searches than finish before the node goes: once the first is back the matchers are
    # warm and busy, and the searches still queued must meet the dead matcher (no fixed sleep to race)
    refs = [handle.search.remote(child, two_stage=False) for _ in range(150)]
    ray.wait(refs, num_returns=1, timeout=60)
    c.remove_node(victim)
    results = get(refs, timeout=180)
    assert all(len(r["names"]) == len(results[0]["names"]) >= 600 for r in results)
    s = get(handle.stats.remote())
    assert s["matcher_deaths"] >= 1 and s["batches_redone"] >= 1
    assert get(manager.remove_graph_only.remote()) == 600
    # the pool is back to its size, on the nodes that remain
    deadline = time.time() + 60
    while time.time() < deadline:
        placement = get(handle.placement.remote())
        if len(placement) == 3:
            break
        time.sleep(0.5)
    assert len(placement) == 3 and victim.node_id not in {p["node"] for p in placement}


def test_fifty_concurrent_registers_and_warms_lose_nothing(service):
    handle, zoo = service
    before = set(catalog_names(zoo))
    models = [mlp_onnx([32 + 4 * i, 16, 10], seed=100 + i) for i in range(25)]
    # each content twice at once, as a retried call sends it: one stored record (another name would be refused)
    regs = [handle.register.remote(m, 0.8 + 0.001 * i, f"c{i}") for i, m in enumerate(models) for _ in range(2)]
    warms = [handle.warm.remote(mlp_onnx([40 + 2 * i, 16, 10], seed=500 + i)) for i in range(50)]
    recs = get(regs, timeout=120)
    results = get(warms, timeout=120)
    assert len(results) == 50 and all(r.weights for r in results)
    for i in range(25):  # both calls of one content return the one stored record
        assert recs[2 * i]["checksum"] == recs[2 * i + 1]["checksum"]
        assert recs[2 * i]["name"] == recs[2 * i + 1]["name"]
    added = set(catalog_names(zoo)) - before
    assert len(added) == 25 and len(list((zoo / "blobs").glob("*.onnx"))) == len(catalog_names(zoo))
    assert get(handle.stats.remote())["models"] == len(catalog_names(zoo))
    assert sum(r.parent is not None for r in results) > 0


def test_scale_up_and_down_under_load(service):
    handle, _ = service
    child = mlp_onnx([44, 16, 10], seed=7)
    errors: list[BaseException] = []
    done = threading.Event()
    answered = [0]

    def load():
        while not done.is_set():
            try:
                get(handle.warm.remote(child), timeout=60)
                answered[0] += 1
            except BaseException as exc:  # noqa: BLE001 - any failure fails the test
                errors.append(exc)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for n in (1, 4, 2):
            assert get(handle.scale.remote(matchers=n))["matchers"] == n
            time.sleep(1.5)
    finally:
        done.set()
        for t in threads:
            t.join(60)
    assert not errors and answered[0] > 0
    assert get(handle.stats.remote())["matchers"] == 2
    assert len(get(handle.placement.remote())) == 2
    get(handle.scale.remote(matchers=3))


def test_matchers_hold_the_zoo_before_a_query_needs_it(service):
    """Shards reach every matcher when they appear, and a matcher that starts later gets them all: a query on a
    large zoo does not wait for a matcher's first fetch (hundreds of milliseconds at 100,000 models)."""
    handle, _ = service
    get(handle.register.remote(mlp_onnx([40, 16, 10], seed=11), 0.82, "prefetched"))  # near the others: admitted
    n = get(handle.stats.remote())["matchers"]
    try:
        get(handle.scale.remote(matchers=n + 1))
        placement = get(handle.placement.remote())  # each matcher answers after the fetches sent before it
        assert len(placement) == n + 1 and all(p["shards"] >= 1 for p in placement), placement
        newest = [p for p in placement if p["batches"] == 0]
        assert newest and all(p["shards"] >= 1 for p in newest), "a matcher that never scored holds the shards"
    finally:
        get(handle.scale.remote(matchers=n))


def test_sigkilled_manager_comes_back_with_every_model(service):
    handle, zoo = service
    models_before = get(handle.stats.remote())["models"]
    pid = get(handle.manager_pid.remote())
    late = mlp_onnx([30, 20, 10], seed=900)
    os.kill(pid, signal.SIGKILL)
    rec = get(handle.register.remote(late, 0.85, "after-kill"), timeout=120)  # retried on the new instance
    assert rec["name"] == "after-kill"
    assert get(handle.manager_pid.remote(), timeout=60) != pid
    s = get(handle.stats.remote())
    assert s["models"] == models_before + 1 == len(catalog_names(zoo))
    assert get(handle.warm.remote(mlp_onnx([30, 20, 10], seed=901), noise=0.0)).parent == "after-kill"


def test_cli_stats_and_scale(service, capsys):
    import json

    from keeper.cli import main

    handle, zoo = service
    assert main(["serve", "--detach", "--namespace", NAMESPACE, "--zoo", str(zoo)]) == 0
    assert "keeper serving" in capsys.readouterr().out
    assert main(["scale", "2", "--namespace", NAMESPACE]) == 0
    assert "matchers: 2" in capsys.readouterr().out
    assert main(["stats", "--namespace", NAMESPACE]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["matchers"] == 2 and {"models", "clusters", "queries", "p50", "p99"} <= set(s)


def test_a_request_no_node_can_hold_fails_at_start_naming_the_key(cluster, tmp_path):
    import keeper.actors as ka
    from keeper.errors import ConfigError

    with pytest.raises(ConfigError, match=r"actors\.matcher.*64 CPU"):
        ka.start(zoo=str(tmp_path / "zoo"), namespace="too-big", actors={"matcher": {"num_cpus": 64}})
    from keeper.actors.launcher import find

    assert find(namespace="too-big") is None, "nothing was started"


def test_unplaced_matchers_never_hold_a_query(service, tmp_path):
    """Matchers asking for a resource that is all taken stay pending; queries are scored in the front door,
    answer at once, and stats() says what the matchers wait for."""
    import keeper.actors as ka

    on_head = {"resources": {"head": 0.01}}
    handle = ka.start(zoo=str(tmp_path / "zoo"), namespace="pending-matchers", matchers=2,
                      actors={"keeper": on_head, "zoo_manager": on_head, "matcher": {"resources": {"head": 1.0}}},
                      clustering={"local_below": 0})  # every stage goes to the pool, which must not wait
    try:
        get(handle.register.remote(mlp_onnx([32, 16, 10], seed=1), 0.9, "p"))
        t0 = time.monotonic()
        result = get(handle.warm.remote(mlp_onnx([40, 16, 10], seed=2), noise=0.0))
        assert result.parent == "p" and time.monotonic() - t0 < 15.0
        s = get(handle.stats.remote())
        assert s["matchers_pending"] == 2 and s["local_batches"] >= 1
        assert "1 head" in s["matchers_pending_why"]
    finally:
        ka.shutdown(namespace="pending-matchers")


def test_a_wait_that_runs_out_names_the_resource_and_the_key(cluster):
    import ray

    from keeper.actors.remote import demand_of, get as bounded_get
    from keeper.errors import ServiceError

    blocker = ray.remote(lambda: 1).options(resources={"head": 1.0})
    ref = blocker.remote()  # the service's actors hold part of the only "head", so this never runs
    try:
        need = demand_of("the weight-transfer task", "transfer", {"num_cpus": 0, "resources": {"head": 1.0}})
        with pytest.raises(ServiceError, match=r"weight-transfer task was not back within 2 s.*asks for 1 head.*"
                                               r"lower actors\.transfer"):
            bounded_get(ref, 2.0, need)
    finally:
        ray.cancel(ref, force=True)


def test_the_service_chooses_a_narrower_same_family_parent_like_the_embedded_zoo(cluster, tmp_path):
    """A ResNet child whose only relative is 2x narrower (similarity ~0.25, under the floor) grows from it
    without losing its function; a 2x-wider VGG scores higher by slicing. The front door assesses both like
    ``Zoo.candidates`` and picks the ResNet, preserved, as the embedded zoo does."""
    import keeper.actors as ka
    from test_preservation import RESNET, VGG, _onnx, _wide

    on_head = {"resources": {"head": 0.01}}
    handle = ka.start(zoo=str(tmp_path / "zoo"), namespace="preserving-choice", matchers=1,
                      actors={"keeper": on_head, "zoo_manager": on_head, "matcher": {"num_cpus": 0.5},
                              "transfer": {"num_cpus": 1.0, **on_head}})
    try:
        get(handle.register.remote(_onnx(RESNET, seed=6), 0.8, "narrow"))
        get(handle.register.remote(_onnx(_wide(VGG), seed=3), 0.9, "vgg"))
        child = _onnx(_wide(RESNET))
        choice = get(handle.choose.remote(child))
        cands = {c.name: c for c in choice.candidates}
        # similarity alone (and the floor) would take the VGG: it clears the floor, the ResNet does not
        assert cands["vgg"].score > 0.3 > cands["narrow"].score
        assert choice.parent == "narrow" and cands["narrow"].preserved and cands["narrow"].structure == 1.0
        assert not cands["vgg"].preserved and cands["vgg"].structure < 1.0
        result = get(handle.warm.remote(child, noise=0.0))
        assert result.parent == "narrow"
    finally:
        ka.shutdown(namespace="preserving-choice")
