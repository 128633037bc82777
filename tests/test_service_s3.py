"""The keeper service on an S3-compatible object store: a moto server on loopback, reached through the pyarrow
URI form. Register, restart, reload, and a server that stops in the middle of a commit (bounded retry, then a
clear error, the catalog intact). Ray starts once for the module."""

from __future__ import annotations

import time

import numpy as np
import pytest
from s3server import CREDENTIALS, MotoS3, running
from onnx import TensorProto, helper, numpy_helper

pytestmark = pytest.mark.ray  # starts Ray on loopback; `-m "not ray"` leaves these out

pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

BUCKET = "keeper-service"
NAMESPACE = "keeper-s3-test"


def mlp_onnx(widths: list[int], seed: int = 0, in_dim: int = 16) -> bytes:
    rng = np.random.default_rng(seed)
    nodes, inits, x, d = [], [], "x", in_dim
    for i, w in enumerate(widths):
        inits += [numpy_helper.from_array((rng.standard_normal((w, d)) * 0.1).astype(np.float32), f"fc{i}.weight"),
                  numpy_helper.from_array(np.zeros(w, np.float32), f"fc{i}.bias")]
        nodes.append(helper.make_node("Gemm", [x, f"fc{i}.weight", f"fc{i}.bias"], [f"h{i}"], transB=1, name=f"fc{i}"))
        x, d = f"h{i}", w
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, in_dim])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [None, d])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


class Moto(MotoS3):
    """The shared server with the service tests' zoo place and catalog listing."""

    @property
    def uri(self) -> str:
        return MotoS3.uri(self)

    def catalog(self) -> list[str]:
        out = self.client().list_objects_v2(Bucket=BUCKET, Prefix="zoo/catalog/").get("Contents", [])
        return sorted(o["Key"].rsplit("/", 1)[-1][: -len(".json")] for o in out)


@pytest.fixture(scope="module")
def moto():
    with running(BUCKET, Moto) as server:
        yield server


@pytest.fixture(scope="module")
def ray_session(moto):
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": dict(CREDENTIALS)})  # every actor and task reads the store
    yield
    ray.shutdown()


def start(moto, **kw):
    import keeper.actors as ka

    # the shipped defaults but for the store's place, and shorter bounds so a fault shows within the test
    return ka.start(zoo=moto.uri, namespace=NAMESPACE, timeouts={"register_s": 60.0, "start_s": 90.0}, **kw)


def get(ref, timeout: float = 60.0):
    import ray

    return ray.get(ref, timeout=timeout)


def test_register_warm_and_restart_on_s3(moto, ray_session):
    import keeper.actors as ka

    handle = start(moto)
    for i in range(3):
        rec = get(handle.register.remote(mlp_onnx([24 + 8 * i, 10], seed=i), 0.8 + 0.01 * i, f"s3-{i}"))
        assert rec["name"] == f"s3-{i}"
    assert moto.catalog() == ["s3-0", "s3-1", "s3-2"]
    # the transfer task reads the parent straight from the bucket
    result = get(handle.warm.remote(mlp_onnx([30, 10], seed=9), noise=0.0))
    # the 30-wide child grows from the 24-wide s3-0 without losing its function: it beats slicing the wider
    # ones (similarity 1.0), as in the embedded zoo
    assert result.parent == "s3-0" and result.preserved and result.score < 1.0
    # a restart of the whole service reloads every model from the bucket
    assert ka.shutdown(namespace=NAMESPACE) == ["keeper", "keeper-zoo"]
    time.sleep(1.0)
    handle = start(moto)
    s = get(handle.stats.remote())
    assert s["models"] == 3 and s["uri"].startswith(f"s3://{BUCKET}/zoo")
    assert get(handle.warm.remote(mlp_onnx([30, 10], seed=9), noise=0.0)).parent == result.parent


@pytest.mark.slow  # > 20 s on two idle cores
def test_server_stopped_mid_commit(moto, ray_session):
    import ray

    from keeper.errors import StoreError

    handle = start(moto)
    before = moto.catalog()
    moto.trip = "/catalog/crash.json"  # the blobs land; the server dies on the commit
    t0 = time.monotonic()
    with pytest.raises(StoreError, match=r"catalog/crash\.json.*failed after .*models stored before are intact"):
        get(handle.register.remote(mlp_onnx([56, 10], seed=40), 0.8, "crash"), timeout=60)
    assert time.monotonic() - t0 < 30  # bounded retries, then the error
    assert moto.server is None
    # while the store is down, queries still answer from the graphs the manager holds
    assert get(handle.search.remote(mlp_onnx([30, 10], seed=9)))["names"]
    moto.start()
    assert moto.catalog() == before  # nothing half-listed
    manager = ray.get_actor("keeper-zoo", namespace=NAMESPACE)
    assert get(manager.reload.remote()) == len(before)
    assert get(handle.stats.remote())["models"] == len(before)
    # the store is back: the same registration goes through once
    rec = get(handle.register.remote(mlp_onnx([56, 10], seed=40), 0.8, "crash"))
    assert rec["name"] == "crash" and moto.catalog() == sorted(before + ["crash"])
    assert get(handle.warm.remote(mlp_onnx([56, 10], seed=41), noise=0.0)).parent == "crash"


def test_the_service_sees_models_others_register_and_stops(moto, ray_session, capsys):
    from keeper.actors.manager import CATALOG_POLL_S
    from keeper.cli import main
    from keeper.store import ModelStore
    from keeper.zoo import Zoo

    handle = start(moto)
    before = get(handle.stats.remote())["models"]

    def served_within_poll(count: int) -> float:
        t0 = time.monotonic()
        while get(handle.stats.remote())["models"] != count:
            assert time.monotonic() - t0 < CATALOG_POLL_S + 10, f"the service still does not serve {count} models"
            time.sleep(0.2)
        return time.monotonic() - t0

    other = Zoo(moto.uri)  # another writer into the service's store (the shell's `keeper register`)
    other.register(mlp_onnx([40, 20, 10], seed=70), 0.9, "by-another")
    served_within_poll(before + 1)
    result = get(handle.warm.remote(mlp_onnx([48, 20, 10], seed=71), noise=0.0))
    assert result.parent == "by-another" and result.preserved
    t0 = time.monotonic()  # the service counts its hit in the background: let it land before removing the model
    while ModelStore(moto.uri, mode="read").record("by-another").hits < 1:
        assert time.monotonic() - t0 < 30
        time.sleep(0.2)
    other.remove("by-another")
    served_within_poll(before)
    # `keeper reload` takes in what others changed at once, accuracies included
    other.register(mlp_onnx([40, 20, 10], seed=72), 0.8, "by-another-2")
    other.register(mlp_onnx([40, 20, 10], seed=72), 0.95, "by-another-2", update_accuracy=True)
    assert main(["reload", "--namespace", NAMESPACE]) == 0
    assert capsys.readouterr().out.strip() == f"keeper service 'keeper' serves {before + 1} models"
    assert get(handle.stats.remote())["models"] == before + 1
    assert main(["stop", "--namespace", NAMESPACE]) == 0
    assert "stopped the keeper service 'keeper'" in capsys.readouterr().out
    assert main(["stats", "--namespace", NAMESPACE]) == 1
    assert "no service named 'keeper' is running" in capsys.readouterr().err
    assert main(["stop", "--namespace", NAMESPACE]) == 0 and "no keeper service" in capsys.readouterr().out
