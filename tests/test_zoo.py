"""Tests of keeper.zoo.Zoo (embedded, no Ray): durability on reopen, admission, idempotence, the outlier filter,
eviction under a byte budget, warming (cold, function-preserving, accuracy-aware) and hit counting."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import nets
import ml_dtypes
from keeper.errors import AdmissionError, CorruptModelError, InvalidModelError, InvalidWeightsError, ModelNotFoundError
from keeper.matching import similarity
from keeper.onnx_weights import read_initializers, split_weights
from keeper.weights import SafeTensors, save_weights, weights_bytes
from keeper.zoo import Zoo, ZooConfig

mlp_onnx = nets.mlp_onnx

# ---------------------------------------------------------------------------------------------- test models




def conv2d_onnx(channels: int = 4, seed: int = 0) -> bytes:
    """One 2-D convolution: nothing in a zoo of 1-D MLPs can feed it."""
    w = np.random.default_rng(seed).standard_normal((channels, 3, 3, 3)).astype(np.float32)
    g = helper.make_graph([helper.make_node("Conv", ["x", "conv.weight"], ["y"], pads=[1] * 4, name="conv")], "c2d",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, channels, 8, 8])],
                          [numpy_helper.from_array(w, "conv.weight")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


PARENT = [24, 10]          # the zoo's architecture
WIDER = [40, 10]           # the same with a wider hidden layer: warming it preserves the parent's function


def files(root: Path) -> dict[str, bytes]:
    """Every stored file (temp files excluded) with its content: 'stored nothing' means this is unchanged."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and p.parts[len(root.parts)] != "tmp"}


def inits(blob: bytes) -> dict[str, np.ndarray]:
    return read_initializers(onnx.load_from_string(blob))


def run(model, x: np.ndarray) -> np.ndarray:
    """Run an ONNX model with ONNX's reference evaluator (no onnxruntime needed)."""
    return ReferenceEvaluator(model).run(None, {"x": x})[0]


def rel_dev(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(a).max())


@pytest.fixture
def zoo(tmp_path):
    return Zoo(str(tmp_path / "zoo"))


# ---------------------------------------------------------------------------------------------- durability


def test_reopening_restores_every_model(tmp_path):
    uri = str(tmp_path / "zoo")
    zoo = Zoo(uri)
    models = {"mlp-a": (mlp_onnx(PARENT, 1), 0.81), "mlp-b": (mlp_onnx([32, 16, 10], 2), 0.72),
              "conv": (conv2d_onnx(6), 0.55)}
    for name, (blob, acc) in models.items():
        zoo.register(blob, acc, name=name)
    probe = mlp_onnx(WIDER, 9)
    before = {c.name: c.score for c in zoo.candidates(probe)}

    again = Zoo(uri)
    assert len(again) == 3 and again.names() == sorted(models)
    assert {r.name: r.accuracy for r in again} == {n: a for n, (_, a) in models.items()}
    assert {r.name: r for r in again} == {r.name: r for r in zoo}
    # graphs come back from their stored arrays: they score exactly as the originals did
    assert {c.name: c.score for c in again.candidates(probe)} == before and before["mlp-a"] > 0.5
    for name, (blob, _) in models.items():
        assert similarity(again.graph(name), blob) == 1.0
        assert again.graph(name).to_arrays().keys() == zoo.graph(name).to_arrays().keys()
        assert all(np.array_equal(v, zoo.graph(name).to_arrays()[k]) for k, v in again.graph(name).to_arrays().items())
        assert again.store.get(name) == blob


def test_remove(tmp_path):
    uri = str(tmp_path / "zoo")
    zoo = Zoo(uri)
    zoo.register(mlp_onnx(PARENT, 1), 0.8, name="keep")
    zoo.register(mlp_onnx(PARENT, 2), 0.7, name="drop")
    with pytest.raises(ModelNotFoundError, match="'nope'"):
        zoo.remove("nope")
    assert len(zoo) == 2
    zoo.remove("drop")
    assert "drop" not in zoo and zoo.names() == ["keep"]
    again = Zoo(uri)
    assert again.names() == ["keep"] and "drop" not in again
    with pytest.raises(ModelNotFoundError):
        again.record("drop")
    # the removed model's blobs are gone too: only the kept model's files remain
    kept = again.record("keep")
    blobs = {p.name for p in (tmp_path / "zoo" / "blobs").iterdir()}
    assert blobs == {f"{kept.checksum}.onnx", f"{kept.extra_checksums['graph.npz']}.graph.npz"}


# ---------------------------------------------------------------------------------------------- admission


@pytest.mark.parametrize("accuracy", [float("nan"), float("inf"), float("-inf"), -0.1, 1.5, "0.9x", None],
                         ids=["nan", "inf", "-inf", "negative", "above-one", "string", "none"])
def test_bad_accuracy_is_refused_and_stores_nothing(zoo, tmp_path, accuracy):
    zoo.register(mlp_onnx(PARENT, 1), 0.8, name="present")
    before, records = files(tmp_path / "zoo"), list(zoo)
    with pytest.raises(AdmissionError, match="accuracy"):
        zoo.register(mlp_onnx(PARENT, 2), accuracy, name="newcomer")
    assert list(zoo) == records and files(tmp_path / "zoo") == before
    assert list(Zoo(zoo.uri)) == records


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "../up", "sp ace", "x" * 129, "é", 7],
                         ids=["empty", "dot", "slash", "parent", "space", "long", "non-ascii", "int"])
def test_bad_name_is_refused_and_stores_nothing(zoo, tmp_path, name):
    zoo.register(mlp_onnx(PARENT, 1), 0.8, name="present")
    before, records = files(tmp_path / "zoo"), list(zoo)
    with pytest.raises(AdmissionError, match="not allowed"):
        zoo.register(mlp_onnx(PARENT, 2), 0.8, name=name)
    # identical content under a bad name is refused as well, not silently matched to the stored record
    with pytest.raises(AdmissionError, match="not allowed"):
        zoo.register(mlp_onnx(PARENT, 1), 0.8, name=name)
    assert list(zoo) == records and files(tmp_path / "zoo") == before


def test_identical_content_is_idempotent_under_its_name_and_refused_under_another(zoo, tmp_path):
    blob = mlp_onnx(PARENT, 1)
    rec = zoo.register(blob, 0.8, name="first")
    before = files(tmp_path / "zoo")
    assert zoo.register(blob, 0.8, name="first") == rec
    assert zoo.register(blob, 0.8) == rec  # no name: the stored record
    with pytest.raises(AdmissionError, match="'second': this content is already stored as 'first'"):
        zoo.register(blob, 0.8, name="second")  # never a silent answer under a name that was not stored
    with pytest.raises(AdmissionError, match="'first': this content is already stored with accuracy 0.8000, not"):
        zoo.register(blob, 0.9)
    assert len(zoo) == 1 and zoo.names() == ["first"] and files(tmp_path / "zoo") == before
    assert zoo.register(blob, 0.9, update_accuracy=True).accuracy == 0.9 == Zoo(zoo.uri).record("first").accuracy
    twin = zoo.register(blob, 0.7, name="second", alias=True)
    assert twin.checksum == rec.checksum and {r.name for r in Zoo(zoo.uri)} == {"first", "second"}
    zoo.remove("first")
    assert Zoo(zoo.uri).store.get("second") == blob, "the alias keeps the shared blobs"
    unnamed = zoo.register(mlp_onnx(PARENT, 2), 0.7)
    assert unnamed.name.startswith("model-") and unnamed.name[len("model-"):] == unnamed.checksum[:12]


def test_content_trained_again_is_recorded_on_the_stored_model(zoo, tmp_path):
    """A Tune trial that trains the same weights again (a search repeated with the same seeds) is that model: its
    registration is recorded on the stored record (better accuracy kept, counted, listed), retries change nothing,
    and no second model or blob appears."""
    blob = mlp_onnx(PARENT, 1)
    zoo.register(blob, 0.8, name="exp1-t0", lineage={"parent": None})
    blobs = files(tmp_path / "zoo")
    rec = zoo.register(blob, 0.75, name="exp2-t0", lineage={"parent": "exp1-t0"}, record_again=True)
    assert rec.name == "exp1-t0" and rec.accuracy == 0.8 and rec.summary["trained"] == 2
    assert rec.summary["again"] == [{"name": "exp2-t0", "accuracy": 0.75, "parent": "exp1-t0"}]
    assert zoo.register(blob, 0.75, name="exp2-t0", record_again=True) == rec  # a retry
    better = zoo.register(blob, 0.9, name="exp3-t0", record_again=True)
    assert better.accuracy == 0.9 == Zoo(zoo.uri).record("exp1-t0").accuracy and better.summary["trained"] == 3
    assert zoo.names() == ["exp1-t0"] and {p for p in files(tmp_path / "zoo") if "blobs" in str(p)} == \
        {p for p in blobs if "blobs" in str(p)}


def test_a_name_taken_by_other_content_is_refused(zoo, tmp_path):
    rec = zoo.register(mlp_onnx(PARENT, 1), 0.8, name="taken")
    before = files(tmp_path / "zoo")
    with pytest.raises(AdmissionError, match="'taken' is taken by different content"):
        zoo.register(mlp_onnx(PARENT, 2), 0.9, name="taken")
    assert list(zoo) == [rec] and files(tmp_path / "zoo") == before
    assert zoo.store.get("taken") == mlp_onnx(PARENT, 1)


def test_invalid_onnx_is_refused_and_stores_nothing(zoo, tmp_path):
    zoo.register(mlp_onnx(PARENT, 1), 0.8, name="present")
    before, records = files(tmp_path / "zoo"), list(zoo)
    for bad in (b"", b"not an onnx model", mlp_onnx(PARENT, 2)[:-7], tmp_path / "missing.onnx"):
        with pytest.raises(InvalidModelError):
            zoo.register(bad, 0.8, name="bad")
        with pytest.raises(InvalidModelError):
            zoo.warm(bad)
    assert list(zoo) == records and files(tmp_path / "zoo") == before
    assert zoo.record("present").hits == 0.0  # a refused warm counts no hit


def test_outlier_filter(tmp_path):
    accs = [0.80, 0.82, 0.84, 0.86, 0.88]
    zoo = Zoo(str(tmp_path / "zoo"))
    assert zoo.config.outlier_min_models == len(accs)
    for i, a in enumerate(accs[:-1]):
        zoo.register(mlp_onnx(PARENT, i), a, name=f"m{i}")
    # under outlier_min_models models the filter is off: a poor model is admitted (and removed again)
    zoo.register(mlp_onnx(PARENT, 90), 0.1, name="early")
    zoo.remove("early")
    zoo.register(mlp_onnx(PARENT, 4), accs[-1], name="m4")
    before = files(tmp_path / "zoo")
    with pytest.raises(AdmissionError, match="std below the zoo mean"):
        zoo.register(mlp_onnx(PARENT, 91), 0.1, name="poor")
    assert "poor" not in zoo and len(zoo) == 5 and files(tmp_path / "zoo") == before
    zoo.register(mlp_onnx(PARENT, 92), 0.79, name="fair")  # within the spread: admitted
    assert "fair" in zoo


def test_accuracies_are_compared_within_a_task_interface(tmp_path):
    """A zoo several teams share holds tasks whose accuracies live on other scales (a language model's next-token
    accuracy beside image classifiers'): a model is an outlier only among models of its own inputs and outputs."""
    zoo = Zoo(str(tmp_path / "zoo"))
    for i, a in enumerate([0.80, 0.82, 0.84, 0.86, 0.88]):
        zoo.register(mlp_onnx(PARENT, i), a, name=f"m{i}")
    assert zoo.register(conv2d_onnx(8, 1), 0.3, name="other-task").accuracy == 0.3
    assert zoo.register(mlp_onnx([24, 4], 2), 0.3, name="other-outputs").accuracy == 0.3  # 4 classes, not 10
    with pytest.raises(AdmissionError, match="std below the zoo mean"):
        zoo.register(mlp_onnx(PARENT, 91), 0.1, name="poor")
    assert "poor" not in zoo
    assert len({r.summary["interface"] for r in zoo}) == 3


def test_a_tight_zoo_does_not_refuse_a_model_a_little_below_it(tmp_path):
    # std 0.002: 0.94 is 15 std below the mean but only 2 points; 0.80 is both far in std and in points
    zoo = Zoo(str(tmp_path / "zoo"))
    for i, a in enumerate([0.958, 0.960, 0.962, 0.960, 0.960]):
        zoo.register(mlp_onnx(PARENT, i), a, name=f"m{i}")
    assert zoo.register(mlp_onnx(PARENT, 50), 0.94, name="close").accuracy == 0.94
    with pytest.raises(AdmissionError, match="std"):
        zoo.register(mlp_onnx(PARENT, 51), 0.80, name="poor")
    assert "poor" not in zoo
    strict = Zoo(str(tmp_path / "zoo"), ZooConfig(outlier_min_gap=0.0))
    with pytest.raises(AdmissionError):
        strict.register(mlp_onnx(PARENT, 52), 0.93, name="strict")

    lax = Zoo(str(tmp_path / "zoo"), ZooConfig(outlier_z=None))
    assert lax.register(mlp_onnx(PARENT, 91), 0.1, name="poor").accuracy == 0.1
    assert "poor" in Zoo(str(tmp_path / "zoo"))


# ---------------------------------------------------------------------------------------------- eviction


def stored_bytes(zoo: Zoo) -> int:
    return sum(r.nbytes for r in zoo)


def test_capacity_evicts_to_budget_and_keeps_the_newcomer(tmp_path):
    blobs = [mlp_onnx(PARENT, 0), mlp_onnx([32, 10], 1), conv2d_onnx(8, 2), mlp_onnx([16, 16, 10], 3),
             conv2d_onnx(12, 4), mlp_onnx(PARENT, 5)]
    cap = sum(sorted(len(b) for b in blobs)[-3:])  # room for about three models
    zoo = Zoo(str(tmp_path / "zoo"), ZooConfig(capacity_bytes=cap))
    evicted = 0
    for i, blob in enumerate(blobs):
        n_before = len(zoo)
        rec = zoo.register(blob, 0.5 + 0.05 * i, name=f"m{i}")
        assert rec.name in zoo, "the newcomer is never its own eviction victim"
        assert stored_bytes(zoo) <= cap
        evicted += n_before + 1 - len(zoo)
    assert evicted >= 2
    # the store agrees with the in-memory view
    again = Zoo(str(tmp_path / "zoo"))
    assert again.names() == zoo.names() and stored_bytes(again) <= cap

    with pytest.raises(AdmissionError, match="exceeds the zoo capacity"):
        Zoo(str(tmp_path / "small"), ZooConfig(capacity_bytes=len(blobs[0]) - 1)).register(blobs[0], 0.9, name="big")
    assert len(Zoo(str(tmp_path / "small"))) == 0


def test_near_duplicate_of_a_better_newcomer_is_evicted_first(tmp_path):
    unrelated, twin, newcomer = conv2d_onnx(32, 0), mlp_onnx(PARENT, 1), mlp_onnx(PARENT, 2)
    accs = {"unrelated": 0.5, "twin": 0.8, "newcomer": 0.9}
    # by value per byte alone the unrelated model would go first: the near-duplicate rule must override that
    assert accs["unrelated"] / len(unrelated) < accs["twin"] / len(twin)
    cap = len(unrelated) + len(twin) + len(newcomer) - 1
    zoo = Zoo(str(tmp_path / "zoo"), ZooConfig(capacity_bytes=cap))
    zoo.register(unrelated, accs["unrelated"], name="unrelated")
    zoo.register(twin, accs["twin"], name="twin")
    zoo.register(newcomer, accs["newcomer"], name="newcomer")
    assert zoo.names() == ["newcomer", "unrelated"] and stored_bytes(zoo) <= cap


def test_without_near_duplicates_the_lowest_value_per_byte_goes(tmp_path):
    low, high, newcomer = mlp_onnx([64, 10], 0), mlp_onnx(PARENT, 1), mlp_onnx([32, 16, 10], 2)  # one task
    assert 0.5 / len(low) < 0.8 / len(high)
    zoo = Zoo(str(tmp_path / "zoo"), ZooConfig(capacity_bytes=len(low) + len(high) + len(newcomer) - 1))
    zoo.register(low, 0.5, name="low")
    zoo.register(high, 0.8, name="high")
    zoo.register(newcomer, 0.6, name="newcomer")
    assert zoo.names() == ["high", "newcomer"]


def test_eviction_weighs_a_models_accuracy_against_its_own_tasks(tmp_path):
    """The only model of a task measured on a lower scale is its task's best: it is not the first to go because its
    accuracy is below another task's, while a model well below the best of its own task is."""
    best, worse, other, newcomer = (mlp_onnx(PARENT, 0), mlp_onnx([20, 10], 1), mlp_onnx([24, 4], 2),
                                    mlp_onnx([32, 16, 10], 3))
    assert 0.3 / len(other) < 0.5 / len(worse), "by raw accuracy per byte the other task's model would go"
    zoo = Zoo(str(tmp_path / "zoo"), ZooConfig(capacity_bytes=sum(map(len, (best, worse, other, newcomer))) - 1))
    for blob, acc, name in ((best, 0.9, "best"), (worse, 0.5, "worse"), (other, 0.3, "other"),
                            (newcomer, 0.85, "newcomer")):
        zoo.register(blob, acc, name=name)
    assert zoo.names() == ["best", "newcomer", "other"]


# ---------------------------------------------------------------------------------------------- warm


def test_unrelated_child_keeps_its_own_weights(zoo):
    for i in range(3):
        zoo.register(mlp_onnx(PARENT, i), 0.8 + 0.01 * i, name=f"mlp{i}")
    child = conv2d_onnx(4, seed=7)
    result = zoo.warm(child, noise=0.0)
    assert result.parent is None and result.score == 0.0
    own = inits(child)
    assert result.weights.keys() == own.keys()
    for k, v in own.items():
        assert np.array_equal(result.weights[k], v) and result.weights[k].dtype == v.dtype
    assert {op for _, op in result.mapping.values()} == {"init"}
    assert all(r.hits == 0.0 for r in zoo)  # no parent, no hit


def test_wider_child_computes_the_parents_function(zoo):
    parent = mlp_onnx(PARENT, 1)
    zoo.register(parent, 0.9, name="parent")
    zoo.register(conv2d_onnx(8, 2), 0.95, name="conv")  # more accurate but unrelated: never chosen
    child = mlp_onnx(WIDER, 3)
    result = zoo.warm(child, noise=0.0)
    assert result.parent == "parent" and 0.5 < result.score < 1.0
    assert result.weights["fc0.weight"].shape == (40, 16) and result.weights["fc1.weight"].shape == (10, 40)
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    warmed = result.to_onnx()
    assert rel_dev(run(parent, x), run(warmed, x)) <= 1e-4
    assert rel_dev(run(parent, x), run(child, x)) > 0.1  # the child's own weights compute something else
    # noise breaks the symmetry of the replicated units, so the function moves (a little)
    noisy = zoo.warm(child, noise=0.05)
    assert noisy.parent == "parent" and 0.0 < rel_dev(run(parent, x), run(noisy.to_onnx(), x)) < 0.5


def test_of_equally_similar_parents_the_more_accurate_is_chosen(tmp_path):
    child = mlp_onnx(WIDER, 9)
    for first_better in (True, False):
        zoo = Zoo(str(tmp_path / f"zoo-{first_better}"))
        # names sort against the better model, so a tie-break by name would pick the worse one
        better, worse = "b-better", "a-worse"
        order = [(better, 0.9, 1), (worse, 0.6, 2)]
        for name, acc, seed in (order if first_better else order[::-1]):
            zoo.register(mlp_onnx(PARENT, seed), acc, name=name)
        scores = {c.name: c.score for c in zoo.candidates(child)}
        assert scores[better] == scores[worse] > 0.0
        result = zoo.warm(child, noise=0.0)
        assert result.parent == better
        np.testing.assert_array_equal(result.weights["fc1.bias"], inits(mlp_onnx(PARENT, 1))["fc1.bias"])


def test_warm_counts_hits_durably(zoo):
    zoo.register(mlp_onnx(PARENT, 1), 0.9, name="parent")
    zoo.register(conv2d_onnx(8, 2), 0.9, name="other")
    child = mlp_onnx(WIDER, 3)
    assert zoo.record("parent").hits == 0.0
    zoo.warm(child, noise=0.0)
    assert zoo.record("parent").hits == pytest.approx(1.0)
    zoo.warm(child, noise=0.0)
    # hits decay with a half-life of days: two warms within a second count as two
    assert zoo.record("parent").hits == pytest.approx(2.0, abs=1e-4)
    assert zoo.record("other").hits == 0.0
    again = Zoo(zoo.uri)
    assert again.record("parent").hits == pytest.approx(2.0, abs=1e-4)
    assert "hit_time" in again.record("parent").summary


def test_a_graph_stored_by_an_older_version_is_extracted_again_and_stored_back(tmp_path, monkeypatch, caplog):
    # graphs stored before packed projections were recorded lack attrs["packed"]; the zoo re-reads the model
    # rather than warm attention layers without it
    import io

    from keeper.graph import load_graph
    from keeper.graph import LayerGraph
    from keeper.store.stored import GRAPH_EXTRA, graph_blob, graph_format, graph_from_blob

    blob = nets.extra_onnx("tokens")
    current = load_graph(blob)
    assert any("packed" in a for a in current.attrs)
    arrays = current.to_arrays()
    del arrays["format"]
    old = current.__class__.from_arrays(arrays)
    old.attrs = [{k: v for k, v in a.items() if k != "packed"} for a in old.attrs]
    buf = io.BytesIO()
    np.savez(buf, **{k: v for k, v in old.to_arrays().items() if k != "format"})
    assert graph_from_blob(buf.getvalue(), lambda: blob).attrs == current.attrs
    assert not any("packed" in a for a in graph_from_blob(buf.getvalue()).attrs)  # no model: as stored
    assert graph_from_blob(graph_blob(current)).attrs == current.attrs

    zoo = Zoo(str(tmp_path / "zoo"))  # a zoo written by the older version
    zoo.store.put("tokens", blob, accuracy=0.9, num_params=current.total_params, summary=current.summary(),
                  extras={GRAPH_EXTRA: buf.getvalue()})
    before = zoo.store.record("tokens")
    assert graph_format(zoo.store.get_extra("tokens", GRAPH_EXTRA)) < LayerGraph.FORMAT
    reopened = Zoo(str(tmp_path / "zoo"))
    assert reopened.graph("tokens").attrs == current.attrs
    # the graph extracted again is stored back once; the model, its accuracy and name are as they were
    after = Zoo(str(tmp_path / "zoo")).store.record("tokens")
    assert graph_format(reopened.store.get_extra("tokens", GRAPH_EXTRA)) == LayerGraph.FORMAT
    assert after.extra_checksums != before.extra_checksums
    assert (after.checksum, after.accuracy, after.name) == (before.checksum, before.accuracy, before.name)
    assert reopened.store.get("tokens") == blob
    import keeper.zoo as zoo_module
    from keeper.errors import StoreError
    from keeper.store import ModelStore

    class ReadOnly(ModelStore):
        def replace_extra(self, *a, **k):
            raise StoreError("the store is read-only")

    zoo.store.replace_extra("tokens", GRAPH_EXTRA, buf.getvalue())  # the old graph again
    with caplog.at_level("WARNING", logger="keeper.zoo"):
        assert Zoo(ReadOnly(str(tmp_path / "zoo"))).graph("tokens").attrs == current.attrs
    assert "could not be stored" in caplog.text  # a store it cannot write keeps the old graph, and says so
    assert graph_format(zoo.store.get_extra("tokens", GRAPH_EXTRA)) < LayerGraph.FORMAT
    Zoo(str(tmp_path / "zoo"))

    calls: list = []  # a later load reads the stored graph: no model is parsed
    monkeypatch.setattr(zoo_module, "load_graph", lambda *a, **k: calls.append(a) or load_graph(*a, **k))
    assert Zoo(str(tmp_path / "zoo")).graph("tokens").attrs == current.attrs and calls == []


# ---------------------------------------------------------------------------------- weights apart (any size)

def split(blob: bytes, dtype=None) -> tuple[bytes, dict[str, np.ndarray]]:
    """The graph of ``blob`` without its float weights, and those weights (cast to ``dtype``, the graph's
    initializers retyped to match, when given)."""
    graph, weights = split_weights(onnx.load_from_string(blob), min_elements=1)
    if dtype is not None:
        weights = {k: v.astype(dtype) for k, v in weights.items()}
        code = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        for t in graph.graph.initializer:
            if t.name in weights:
                t.data_type = code
    return graph.SerializeToString(), weights


def mlp_forward(weights: dict, x: np.ndarray, layers: int) -> np.ndarray:
    """The Gemm/Relu chain of nets.mlp_onnx in float64, from weights of any dtype."""
    h = x.astype(np.float64)
    for i in range(layers):
        h = h @ np.asarray(weights[f"fc{i}.weight"], np.float64).T + np.asarray(weights[f"fc{i}.bias"], np.float64)
        h = np.maximum(h, 0) if i < layers - 1 else h
    return h


def test_a_graph_with_weights_apart_registers_and_warms_like_onnx_with_weights(tmp_path):
    parent = mlp_onnx(PARENT, 1)
    graph, weights = split(parent)
    assert len(graph) < len(parent) / 4  # the graph alone is small
    wfile = tmp_path / "parent.safetensors"
    save_weights(weights, wfile)
    zoo = Zoo(str(tmp_path / "zoo"))
    rec = zoo.register(graph, 0.9, name="apart", weights=wfile)
    assert rec.extras == ("graph.npz", "weights.safetensors") and rec.nbytes == len(graph) + wfile.stat().st_size
    assert zoo.register(graph, 0.9, name="apart", weights=wfile) == rec  # identical content: idempotent
    child = mlp_onnx(WIDER, 3)
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    for z in (zoo, Zoo(str(tmp_path / "zoo"))):  # and after reopening
        result = z.warm(child, noise=0.0)
        assert result.parent == "apart"
        assert rel_dev(run(parent, x), run(result.to_onnx(), x)) <= 1e-4
    # the child as a graph with its weights apart, warmed straight into a safetensors file
    cgraph, cweights = split(child)
    out = tmp_path / "warm.safetensors"
    result = zoo.warm(cgraph, noise=0.0, weights=cweights, out=out)
    assert set(SafeTensors(out)) == set(inits(child)) and result.unset == []
    assert not result.weights["fc0.weight"].flags.writeable  # a view of the file written, not a copy in memory
    assert rel_dev(run(parent, x), run(result.to_onnx(), x)) <= 1e-4
    # ...or without any weights of its own: what the parent supplies is written, the rest is unset
    bare = zoo.warm(cgraph, noise=0.0, out=tmp_path / "bare.safetensors")
    assert bare.unset == [] and set(SafeTensors(tmp_path / "bare.safetensors")) == set(cweights)


def test_weights_given_as_arrays_are_stored_with_the_checksum_of_their_bytes_and_leave_no_temp_file(tmp_path):
    """Arrays are written once, beside the blobs, hashed as they are written, then renamed into their
    content-addressed key: the key is the sha256 of the stored bytes, and neither a stored nor a refused
    registration leaves a temp file or a blob behind."""
    from keeper.store.files import sha256

    root = tmp_path / "zoo"
    zoo = Zoo(str(root))
    graph, weights = split(mlp_onnx(PARENT, 1))
    rec = zoo.register(graph, 0.9, name="p", weights=weights)
    key = rec.extra_checksums["weights.safetensors"]
    blob = root / "blobs" / f"{key}.weights.safetensors"
    assert sha256(blob) == key and {k: v.tolist() for k, v in SafeTensors(blob).items()} == {
        k: v.tolist() for k, v in weights.items()}
    assert list((root / "tmp").iterdir()) == []
    stored = files(root)
    with pytest.raises(AdmissionError, match="accuracy"):
        zoo.register(graph, 1.5, name="q", weights={k: v * 2 for k, v in weights.items()})
    assert files(root) == stored
    assert zoo.register(graph, 0.9, name="p", weights=dict(weights)) == rec  # the same arrays again: idempotent
    assert Zoo(str(root)).warm(mlp_onnx(WIDER, 3), noise=0.0).parent == "p"


def test_old_and_new_records_live_in_one_zoo(tmp_path):
    root = tmp_path / "zoo"
    zoo = Zoo(str(root))
    zoo.register(mlp_onnx(PARENT, 1), 0.9, name="old")  # ONNX with weights inside: the format of every record so far
    graph, weights = split(mlp_onnx(PARENT, 2))
    zoo.register(graph, 0.8, name="new", weights=weights_bytes(weights))
    assert "weights.safetensors" not in zoo.record("old").extras
    zoo = Zoo(str(root))
    assert sorted(zoo.names()) == ["new", "old"]
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    for name, blob in (("old", mlp_onnx(PARENT, 1)), ("new", None)):
        result = zoo.inherit(None, name, mlp_onnx(WIDER, 3), noise=0.0)
        parent = blob if blob is not None else zoo.store.get(name)
        pweights = inits(parent) if blob is not None else weights
        assert result.parent == name
        want = mlp_forward(pweights, x, 2)
        got = mlp_forward(result.weights, x, 2)
        assert float(np.abs(got - want).max() / np.abs(want).max()) <= 1e-5


def test_bad_weights_are_refused_naming_the_tensor_and_store_nothing(tmp_path):
    root = tmp_path / "zoo"
    zoo = Zoo(str(root))
    zoo.register(mlp_onnx(PARENT, 1), 0.9, name="kept")
    before = files(root)
    graph, weights = split(mlp_onnx(WIDER, 2))
    good = weights_bytes(weights)
    cases = {
        "truncated": (good[: len(good) - 10], "truncated"),
        "missing": (weights_bytes({k: v for k, v in weights.items() if k != "fc1.bias"}), "'fc1.bias'.*missing"),
        "shape": (weights_bytes({**weights, "fc0.weight": weights["fc0.weight"].T.copy()}),
                  r"'fc0.weight' is float32 \[16, 40\], the graph says float32 \[40, 16\]"),
        "dtype": (weights_bytes({**weights, "fc0.bias": weights["fc0.bias"].astype(np.float16)}),
                  "'fc0.bias' is float16"),
    }
    for name, (blob, match) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(blob)
        for w in (blob, path):
            with pytest.raises(InvalidWeightsError, match=match):
                zoo.register(graph, 0.8, name=name, weights=w)
        with pytest.raises(InvalidWeightsError, match=match):
            zoo.warm(graph, weights=path)
    with pytest.raises(InvalidWeightsError, match="'fc0.weight'.*has no data.*weights"):
        zoo.register(graph, 0.8, name="no-weights")
    assert files(root) == before and zoo.names() == ["kept"]
    assert Zoo(str(root)).warm(mlp_onnx(WIDER, 3), noise=0.0).parent == "kept"  # what was stored still serves


def test_damaged_stored_weights_are_detected(tmp_path):
    root = tmp_path / "zoo"
    zoo = Zoo(str(root))
    graph, weights = split(mlp_onnx(PARENT, 1))
    rec = zoo.register(graph, 0.9, name="p", weights=weights)
    blob = root / "blobs" / f"{rec.extra_checksums['weights.safetensors']}.weights.safetensors"
    data = bytearray(blob.read_bytes())
    data[-3] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(CorruptModelError, match="'p'.*weights.safetensors.*sha256"):
        Zoo(str(root)).warm(mlp_onnx(WIDER, 3), noise=0.0)


@pytest.mark.parametrize("pdtype, cdtype, tol", [
    (np.float32, ml_dtypes.bfloat16, 2e-2), (ml_dtypes.bfloat16, np.float32, 1e-5),
    (np.float16, np.float16, 3e-3), (ml_dtypes.bfloat16, ml_dtypes.bfloat16, 2e-2), (np.float32, np.float16, 3e-3)])
def test_dtypes_are_kept_and_mixed_pairs_preserve_the_function(tmp_path, pdtype, cdtype, tol):
    """Parent and child in any of float32 / float16 / bfloat16: the child's tensors have the child's dtype (on
    disk too), and the widened child computes the parent's function to the child precision's rounding."""
    zoo = Zoo(str(tmp_path / "zoo"))
    pgraph, pweights = split(mlp_onnx(PARENT, 1), pdtype)
    zoo.register(pgraph, 0.9, name="p", weights=pweights)
    cgraph, cweights = split(mlp_onnx([40, 10], 3), cdtype)  # widened 24 -> 40: units copied, inputs divided
    out = tmp_path / "child.safetensors"
    result = zoo.warm(cgraph, noise=0.0, weights=cweights, out=out)
    assert result.parent == "p"
    assert all(SafeTensors(out).spec(k)[0] == np.dtype(cdtype) for k in cweights)
    assert all(result.weights[k].dtype == np.dtype(cdtype) for k in cweights)
    x = np.random.default_rng(0).standard_normal((16, 16))
    want = mlp_forward(pweights, x, 2)
    got = mlp_forward(result.weights, x, 2)
    assert float(np.abs(got - want).max() / np.abs(want).max()) <= tol


def embedding_graph(vocab: int, dim: int, classes: int, extra: bool = False) -> bytes:
    """ids -> Gather(table) [-> MatMul(square, identity-able)] -> MatMul(head): a tiny graph over a large table,
    every float initializer without data (the weights travel apart)."""
    def w(name: str, *dims: int) -> TensorProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims)) and TensorProto(
            name=name, data_type=TensorProto.FLOAT, dims=list(dims))
    inits = [w("table", vocab, dim), w("head", dim, classes)]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed")]
    x = "e"
    if extra:
        inits.append(w("mix", dim, dim))
        nodes.append(helper.make_node("MatMul", [x, "mix"], ["m"], name="mix"))
        x = "m"
    nodes.append(helper.make_node("MatMul", [x, "head"], ["y"], name="head"))
    g = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("ids", TensorProto.INT64, [None])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, classes])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_model_past_two_gib_registers_and_warms_memory_mapped(tmp_path):
    """A 2.15 GB embedding table (past protobuf's limit) with a tiny graph: registered from a safetensors file and
    warmed into a deeper child streamed to a file, the table never materialised (numpy allocates a few MB)."""
    import tracemalloc

    from keeper.weights import SafeTensorsWriter

    vocab, dim, classes = 2**19 + 1024, 1024, 8
    assert vocab * dim * 4 > 2**31
    rng = np.random.default_rng(0)
    chunk = rng.standard_normal((4096, dim)).astype(np.float32)  # written again and again: the file, not RAM
    head = rng.standard_normal((dim, classes)).astype(np.float32)
    wfile = tmp_path / "parent.safetensors"
    with SafeTensorsWriter(wfile, {"table": (np.float32, (vocab, dim)), "head": (np.float32, (dim, classes))}) as wr:
        for start in range(0, vocab, len(chunk)):
            wr.write("table", chunk[: vocab - start], start)
        wr.write("head", head)
    zoo = Zoo(str(tmp_path / "zoo"))
    tracemalloc.start()
    try:
        rec = zoo.register(embedding_graph(vocab, dim, classes), 0.9, name="big", weights=wfile)
        out = tmp_path / "child.safetensors"
        result = zoo.warm(embedding_graph(vocab, dim, classes, extra=True), noise=0.0, out=out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rec.nbytes > 2**31 and result.parent == "big"
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB allocated: a large tensor was copied into memory"
    assert result.mapping["table"] == ("table", "copy") and result.mapping["mix"] == (None, "identity")
    assert result.unset == []
    child = SafeTensors(out)
    ids = np.array([0, 4095, 4096, vocab - 1])
    want = chunk[ids % 4096] @ head
    got = np.asarray(child["table"][ids], np.float64) @ child["mix"] @ child["head"]
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_a_parent_graph_without_its_weights_is_refused(tmp_path):
    from keeper.warm import inherit

    graph, weights = split(mlp_onnx(PARENT, 1))
    with pytest.raises(InvalidWeightsError, match="parent model: initializer 'fc0.weight'.*has no data"):
        inherit(graph, mlp_onnx(WIDER, 3), noise=0.0)
    r = inherit(graph, mlp_onnx(WIDER, 3), parent_weights=weights, noise=0.0)
    assert r.score > 0.5


def test_weights_on_a_store_without_local_files_are_streamed_to_a_verified_copy(tmp_path):
    """A filesystem keeper cannot memory-map in place (an object store; here a SubTreeFileSystem over a
    directory): the weights are streamed into a local copy, checked against their sha256, and mapped from there."""
    import pyarrow.fs as pafs

    from keeper.store import ModelStore

    (tmp_path / "remote").mkdir()

    def store():
        return ModelStore.from_filesystem(pafs.SubTreeFileSystem(str(tmp_path / "remote"), pafs.LocalFileSystem()),
                                          "zoo")
    graph, weights = split(mlp_onnx(PARENT, 1))
    rec = Zoo(store()).register(graph, 0.9, name="p", weights=weights)
    path = store().extra_path("p", "weights.safetensors")
    assert not path.startswith(str(tmp_path / "remote")) and set(SafeTensors(path)) == set(weights)
    x = np.random.default_rng(0).standard_normal((4, 16))
    result = Zoo(store()).warm(mlp_onnx(WIDER, 3), noise=0.0)
    assert result.parent == "p"
    want = mlp_forward(weights, x, 2)
    assert np.abs(mlp_forward(result.weights, x, 2) - want).max() <= 1e-5 * np.abs(want).max()
    blob = tmp_path / "remote" / "zoo" / "blobs" / f"{rec.extra_checksums['weights.safetensors']}.weights.safetensors"
    damaged = bytearray(blob.read_bytes())
    damaged[-1] ^= 1
    blob.write_bytes(bytes(damaged))
    os.remove(path)  # the verified copy of this process: the next read streams the damaged blob again
    with pytest.raises(CorruptModelError, match="sha256"):
        store().extra_path("p", "weights.safetensors")
    assert not os.path.exists(path)  # the damaged copy is not kept


def test_a_pair_is_assessed_once_per_architecture_and_again_when_the_model_under_its_name_changes(tmp_path,
                                                                                                  monkeypatch):
    # a search's trials share a few architectures: each (child architecture, stored model) pair is assessed once,
    # not once per query; a model registered again under a removed model's name is assessed afresh
    import keeper.choice.candidates as candidates

    calls = []
    real = candidates.assess_candidate
    monkeypatch.setattr(candidates, "assess_candidate", lambda name, *a: calls.append(name) or real(name, *a))
    zoo = Zoo(str(tmp_path / "zoo"))
    zoo.register(mlp_onnx(PARENT, seed=0), accuracy=0.8, name="a")
    zoo.register(mlp_onnx([24, 24, 10], seed=1), accuracy=0.7, name="b")
    first = zoo.candidates(mlp_onnx(WIDER, seed=5))
    n = len(calls)
    assert n >= 1
    again = zoo.candidates(mlp_onnx(WIDER, seed=6))  # the same architecture, other weights
    assert len(calls) == n and again == first, "the same pairs: nothing assessed again, the same answer"
    zoo.remove("a")
    zoo.register(mlp_onnx([8, 10], seed=2), accuracy=0.9, name="a")  # another model under the name
    fresh = {c.name: c for c in zoo.candidates(mlp_onnx(WIDER, seed=5))}
    assert "a" in calls[n:], "the new 'a' was assessed, not served from the old one's entry"
    assert fresh["a"].accuracy == 0.9 and fresh["a"].score != {c.name: c for c in first}["a"].score


def test_a_warm_aligns_its_pair_once_and_warms_as_the_explicit_transfer_does(tmp_path, monkeypatch):
    # the choice aligns and assesses each candidate; the transfer from the chosen one reads that alignment (through
    # the choice's candidate) instead of aligning the pair again, and warms exactly as inherit() does from scratch
    import keeper.choice.candidates as candidates
    import keeper.matching as matching  # the transfer imports its aligner from here when it runs
    from keeper.warm import inherit

    zoo = Zoo(str(tmp_path / "zoo"))
    parent = mlp_onnx(PARENT, seed=0)
    zoo.register(parent, accuracy=0.8, name="a")
    child = mlp_onnx(WIDER, seed=5)
    want = inherit(parent, child, parent_name="a", noise=0.0)
    aligned = []
    for module in (candidates, matching):
        real = module.align
        monkeypatch.setattr(module, "align", lambda p, c, *a, real=real, **k: aligned.append(1) or real(p, c, *a, **k))
    result = zoo.warm(child, noise=0.0)
    assert result.parent == "a" and len(aligned) == 1, f"{len(aligned)} alignments for one warm"
    assert result.score == want.score and result.preserved == want.preserved and result.mapping == want.mapping
    assert all(np.array_equal(result.weights[k], want.weights[k]) for k in want.weights)
    # the result is frozen: its report is written once, by the warm path
    with pytest.raises(AttributeError):
        result.reason = "patched"
