"""Safe loading of untrusted ONNX: every bad input raises InvalidModelError naming the problem, quickly, and no
file a model names is ever opened."""

from __future__ import annotations

import builtins
import io
import os
import random
import time

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import keeper
from keeper import onnx_safety
from keeper.errors import InvalidModelError, InvalidWeightsError
from keeper.graph import load_graph
from keeper.onnx_safety import load_model
from keeper.onnx_weights import model_weights

import nets


def _tiny(extra_nodes=(), initializers=(), sparse=(), functions=(), opset=17) -> onnx.ModelProto:
    """Relu(x) plus whatever a test adds (all valid apart from what the test breaks)."""
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")] + list(extra_nodes)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              initializer=list(initializers), sparse_initializer=list(sparse))
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid("local", 1)]
    return helper.make_model(graph, opset_imports=opsets, functions=list(functions))


def _external(name: str, location: str = "weights.bin") -> onnx.TensorProto:
    t = numpy_helper.from_array(np.zeros(4, dtype=np.float32), name)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", "16")):
        entry = t.external_data.add()
        entry.key, entry.value = k, v
    return t


@pytest.fixture
def opened(monkeypatch):
    """Every path opened through Python while the test runs."""
    seen: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def spy_open(file, *args, **kwargs):
        seen.append(str(file))
        return real_open(file, *args, **kwargs)

    def spy_os_open(path, *args, **kwargs):
        seen.append(str(path))
        return real_os_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(io, "open", spy_open)
    monkeypatch.setattr(os, "open", spy_os_open)
    return seen


# ------------------------------------------------------------------------------------------ plain bad input

@pytest.mark.parametrize("data", [b"", bytearray(), memoryview(b"")])
def test_empty_input_is_refused(data):
    with pytest.raises(InvalidModelError, match="empty"):
        load_graph(data)


@pytest.mark.parametrize("value", [None, 3, 1.5, ["x"], {"a": 1}])
def test_wrong_type_is_refused(value):
    with pytest.raises(InvalidModelError, match="expected ONNX bytes"):
        load_graph(value)


def test_missing_path_is_refused(tmp_path):
    with pytest.raises(InvalidModelError, match="no file"):
        load_graph(tmp_path / "absent.onnx")
    with pytest.raises(InvalidModelError, match="no file"):
        load_graph(str(tmp_path))  # a directory is not a model file


@pytest.mark.parametrize("data", [b"hello world, not onnx", b"\x08\x07\x12", b"\xff" * 64, bytes(range(256))])
def test_garbage_bytes_are_refused(data):
    with pytest.raises(InvalidModelError):
        load_graph(data)


def test_model_without_nodes_or_opset_is_refused():
    empty = helper.make_model(helper.make_graph([], "g", [], []))
    with pytest.raises(InvalidModelError, match="no graph nodes"):
        load_graph(empty.SerializeToString())
    no_opset = _tiny()
    del no_opset.opset_import[:]
    with pytest.raises(InvalidModelError, match="operator set"):
        load_graph(no_opset)


def test_size_cap_applies_to_bytes_paths_and_protos(tmp_path, monkeypatch):
    model = _tiny()
    data = model.SerializeToString()
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    monkeypatch.setattr(onnx_safety, "MAX_MODEL_BYTES", len(data) - 1)
    for item in (data, path, str(path), model):
        with pytest.raises(InvalidModelError, match="cap"):
            load_graph(item)
    monkeypatch.setattr(onnx_safety, "MAX_MODEL_BYTES", len(data))
    assert load_graph(data).num_nodes == 1


def test_valid_inputs_of_every_kind_load(tmp_path):
    model = _tiny()
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    for item in (model, model.SerializeToString(), bytearray(model.SerializeToString()),
                 memoryview(model.SerializeToString()), path, str(path)):
        assert load_graph(item).num_nodes == 1


# ------------------------------------------------------------------------------------------ external data

def _with_external_initializer():
    return _tiny([helper.make_node("Add", ["y", "w"], ["z"])], initializers=[_external("w")])


def _with_external_sparse_initializer():
    values = _external("sv")
    indices = numpy_helper.from_array(np.array([0], dtype=np.int64), "si")
    return _tiny(sparse=[helper.make_sparse_tensor(values, indices, [4])])


def _with_external_constant():
    return _tiny([helper.make_node("Constant", [], ["c"], value=_external("c"))])


def _with_external_sparse_constant():
    sp = helper.make_sparse_tensor(_external("cv"), numpy_helper.from_array(np.array([1], np.int64), "ci"), [4])
    return _tiny([helper.make_node("Constant", [], ["c"], sparse_value=sp)])


def _with_external_tensor_list_attribute():
    return _tiny([helper.make_node("Custom", ["y"], ["z"], domain="local", tensors=[_external("t")])])


def _subgraph(inner_nodes, inits=()):
    return helper.make_graph(inner_nodes, "sub", [], [helper.make_tensor_value_info("o", TensorProto.FLOAT, [4])],
                             initializer=list(inits))


def _with_external_in_subgraph_initializer():
    sub = _subgraph([helper.make_node("Identity", ["w"], ["o"])], [_external("w")])
    return _tiny([helper.make_node("Constant", [], ["cond"], value=helper.make_tensor("b", TensorProto.BOOL, [], [1])),
                  helper.make_node("If", ["cond"], ["z"], then_branch=sub, else_branch=sub)])


def _with_external_in_nested_subgraph_constant():
    inner = _subgraph([helper.make_node("Constant", [], ["o"], value=_external("deep"))])
    middle = _subgraph([helper.make_node("If", ["cond"], ["o"], then_branch=inner, else_branch=inner)])
    return _tiny([helper.make_node("If", ["cond"], ["z"], then_branch=middle, else_branch=middle)])


def _with_external_in_function():
    fn = helper.make_function("local", "F", ["a"], ["b"],
                              [helper.make_node("Constant", [], ["k"], value=_external("fk")),
                               helper.make_node("Add", ["a", "k"], ["b"])],
                              opset_imports=[helper.make_opsetid("", 17)])
    return _tiny([helper.make_node("F", ["y"], ["z"], domain="local")], functions=[fn])


def _with_external_in_function_subgraph():
    sub = _subgraph([helper.make_node("Identity", ["w"], ["o"])], [_external("fw")])
    fn = helper.make_function("local", "G", ["a"], ["b"],
                              [helper.make_node("If", ["a"], ["b"], then_branch=sub, else_branch=sub)],
                              opset_imports=[helper.make_opsetid("", 17)])
    return _tiny([helper.make_node("G", ["y"], ["z"], domain="local")], functions=[fn])


def _with_external_in_training_info():
    model = _tiny()
    info = model.training_info.add()
    info.initialization.CopyFrom(_subgraph([helper.make_node("Identity", ["w"], ["o"])], [_external("tw")]))
    return model


def _with_location_flag_only():
    t = numpy_helper.from_array(np.zeros(4, dtype=np.float32), "w")
    t.data_location = TensorProto.EXTERNAL  # no external_data entries: still external
    return _tiny([helper.make_node("Add", ["y", "w"], ["z"])], initializers=[t])


def _with_entries_only():
    t = _external("w")
    t.data_location = TensorProto.DEFAULT  # entries without the flag: still refused
    return _tiny([helper.make_node("Add", ["y", "w"], ["z"])], initializers=[t])


EXTERNAL_CASES = {
    "initializer": _with_external_initializer,
    "sparse initializer": _with_external_sparse_initializer,
    "constant attribute": _with_external_constant,
    "sparse constant attribute": _with_external_sparse_constant,
    "tensor list attribute": _with_external_tensor_list_attribute,
    "subgraph initializer": _with_external_in_subgraph_initializer,
    "nested subgraph constant": _with_external_in_nested_subgraph_constant,
    "function constant": _with_external_in_function,
    "function subgraph": _with_external_in_function_subgraph,
    "training info": _with_external_in_training_info,
    "location flag only": _with_location_flag_only,
    "entries only": _with_entries_only,
}


@pytest.mark.parametrize("case", sorted(EXTERNAL_CASES))
def test_external_data_anywhere_is_refused_without_opening_it(case, tmp_path, opened, monkeypatch):
    (tmp_path / "weights.bin").write_bytes(b"\0" * 64)
    monkeypatch.chdir(tmp_path)  # a relative location would resolve here
    model = EXTERNAL_CASES[case]()
    path = tmp_path / "model.onnx"
    with builtins.open(path, "wb") as f:  # the spy records it; it is the model, not the sidecar
        f.write(model.SerializeToString())
    opened.clear()
    for item in (model, model.SerializeToString(), path):
        with pytest.raises(InvalidModelError, match="external data") as err:
            load_graph(item)
        assert "inline" in str(err.value)  # the message says how to fix it
    assert not any("weights.bin" in p for p in opened)


def test_external_data_saved_by_onnx_is_refused_from_a_path(tmp_path, opened):
    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    model = _tiny([helper.make_node("MatMul", ["x", "w"], ["z"])], initializers=[w])
    path = tmp_path / "big.onnx"
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="side.bin",
                    size_threshold=0)
    opened.clear()
    with pytest.raises(InvalidModelError, match="'w' refers to external data"):
        load_graph(path)
    assert not any(p.endswith("side.bin") for p in opened)


def test_external_data_path_escape_is_never_followed(tmp_path, opened):
    t = _external("w", location="../../../../etc/passwd")
    model = _tiny([helper.make_node("Add", ["y", "w"], ["z"])], initializers=[t])
    with pytest.raises(InvalidModelError, match="external data"):
        load_graph(model.SerializeToString())
    assert not any("passwd" in p for p in opened)


# ------------------------------------------------------------------------------------------ absurd sizes

def test_negative_and_huge_dims_are_refused():
    neg = numpy_helper.from_array(np.zeros(4, dtype=np.float32), "w")
    neg.dims[0] = -4
    with pytest.raises(InvalidModelError, match="negative dimension -4"):
        load_graph(_tiny([helper.make_node("Add", ["y", "w"], ["z"])], initializers=[neg]))
    huge = TensorProto(name="h", data_type=TensorProto.FLOAT, dims=[2**20, 2**20])
    with pytest.raises(InvalidModelError, match=r"'h' claims dims \[1048576, 1048576\]"):
        load_graph(_tiny([helper.make_node("Add", ["y", "h"], ["z"])], initializers=[huge]))


def test_dims_must_match_the_stored_data():
    # 10^10 elements claimed by a main-graph initializer that holds no data: a graph whose weights travel apart;
    # it parses, and reading its weights without a weights file is refused, naming the tensor
    claim = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[100_000, 100_000])
    apart = _tiny([helper.make_node("MatMul", ["y", "w"], ["z"])], initializers=[claim])
    assert load_graph(apart).num_layers == 1
    with pytest.raises(InvalidWeightsError, match="'w'.*no data"):
        model_weights(load_model(apart))
    # ...but a tensor inside a node attribute holds its data or is refused
    attr = TensorProto(name="k", data_type=TensorProto.FLOAT, dims=[100_000, 100_000])
    with pytest.raises(InvalidModelError, match="'k' holds 0 float_data entries but its dims"):
        load_graph(_tiny([helper.make_node("Constant", [], ["k"], value=attr)]))
    cut = numpy_helper.from_array(np.ones((8, 8), dtype=np.float32), "w")
    cut.raw_data = cut.raw_data[:100]  # truncated tensor data
    with pytest.raises(InvalidModelError, match="holds 100 bytes but its dims \\[8, 8\\] need 256"):
        load_graph(_tiny([helper.make_node("MatMul", ["y", "w"], ["z"])], initializers=[cut]))
    const = helper.make_tensor("c", TensorProto.INT64, [3], [1, 2, 3])
    const.dims[0] = 5
    with pytest.raises(InvalidModelError, match="'c' holds 3 int64_data entries"):
        load_graph(_tiny([helper.make_node("Constant", [], ["c"], value=const)]))
    # every storage that is consistent still loads: typed fields, raw bytes, packed 4-bit, complex, empty
    ok = [helper.make_tensor("a", TensorProto.FLOAT16, [3], np.ones(3, np.float16)),
          helper.make_tensor("b", TensorProto.INT4, [3], [1, 2, 3]),
          helper.make_tensor("d", TensorProto.COMPLEX64, [2], [1 + 2j, 3j]),
          helper.make_tensor("e", TensorProto.FLOAT, [0, 4], []),
          numpy_helper.from_array(np.ones((2, 3), dtype=np.float64), "f"),
          helper.make_tensor("s", TensorProto.STRING, [2], [b"x", b"y"])]
    assert load_graph(_tiny(initializers=ok)).num_nodes == 1


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def test_millions_of_nodes_are_refused_quickly():
    node = helper.make_node("Relu", ["a"], ["a"]).SerializeToString()
    graph = (b"\x0a" + _varint(len(node)) + node) * (onnx_safety.MAX_NODES + 1)  # GraphProto.node = 1
    head = _tiny().SerializeToString()  # a valid model; the extra graph bytes merge into its graph
    data = head + b"\x3a" + _varint(len(graph)) + graph  # ModelProto.graph = 7
    start = time.perf_counter()
    with pytest.raises(InvalidModelError, match="more than 1000000 nodes"):
        load_graph(data)
    assert time.perf_counter() - start < 30


def test_node_cap_counts_subgraphs_and_functions(monkeypatch):
    monkeypatch.setattr(onnx_safety, "MAX_NODES", 3)
    sub = _subgraph([helper.make_node("Relu", ["a"], ["b"]), helper.make_node("Relu", ["b"], ["o"])])
    with pytest.raises(InvalidModelError, match="more than 3 nodes"):
        load_graph(_tiny([helper.make_node("If", ["c"], ["z"], then_branch=sub, else_branch=sub)]))
    fn = helper.make_function("local", "F", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["t"]),
                                                            helper.make_node("Relu", ["t"], ["b"])],
                              opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InvalidModelError, match="including functions"):
        load_graph(_tiny([helper.make_node("F", ["y"], ["z"], domain="local")], functions=[fn]))


def test_deeply_nested_subgraphs_are_refused():
    inner = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [], []).SerializeToString()
    for _ in range(300):  # If -> then_branch -> If -> ... far past protobuf's nesting limit
        attr = b"\x0a\x0bthen_branch" + b"\x32" + _varint(len(inner)) + inner + b"\xa0\x01\x05"
        node = b"\x22\x02If" + b"\x2a" + _varint(len(attr)) + attr
        inner = b"\x0a" + _varint(len(node)) + node
    data = _tiny().SerializeToString() + b"\x3a" + _varint(len(inner)) + inner
    with pytest.raises(InvalidModelError, match="not a readable ONNX model"):
        load_graph(data)


def test_a_cycle_is_refused():
    model = _tiny([helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])])
    with pytest.raises(InvalidModelError, match="cycle"):
        load_graph(model)


# ------------------------------------------------------------------------------------------ real models, damaged

@pytest.fixture(scope="module")
def real_models() -> list[bytes]:
    return [nets.family_onnx(nets.spec("resnet"), "torchscript", "eval"),
            nets.family_onnx(nets.spec("transformer"), "torchscript", "keep"),
            nets.family_onnx(nets.spec("mobilenetv2"), "torchscript", "keep")]


def test_every_truncation_of_a_real_model_is_refused(real_models):
    for data in real_models:
        cuts = sorted(set(range(0, len(data), max(1, len(data) // 400))) | set(range(len(data) - 64, len(data))))
        start = time.perf_counter()
        for cut in cuts:
            with pytest.raises(InvalidModelError):
                load_graph(data[:cut])
        assert time.perf_counter() - start < 20


def _damage(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    how = rng.randrange(3)
    if how == 0:  # bit flips
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif how == 1:  # overwritten bytes
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    else:  # a spliced run of garbage
        at = rng.randrange(len(b))
        b[at:at + rng.randint(1, 16)] = bytes(rng.randrange(256) for _ in range(rng.randint(0, 16)))
    return bytes(b)


def test_damaged_real_models_give_a_graph_or_invalid_model_error_fast(real_models):
    rng = random.Random(1234)
    outcomes = {"graph": 0, "refused": 0}
    for i in range(200):
        data = _damage(real_models[i % len(real_models)], rng)
        start = time.perf_counter()
        try:
            g = load_graph(data)
            outcomes["graph"] += 1
            assert 0.0 <= keeper.similarity(g, g) <= 1.0  # a damaged but readable model still matches
        except InvalidModelError as exc:
            assert str(exc)
            outcomes["refused"] += 1
        assert time.perf_counter() - start < 5
    assert outcomes["refused"] > 0


def _mutate_structure(proto: onnx.ModelProto, rng: random.Random) -> None:
    """Edits that keep the protobuf readable but break the model's meaning."""
    g = proto.graph
    ops = ["Conv", "Gemm", "MatMul", "Add", "Concat", "Split", "Gather", "Reshape", "Transpose", "Identity",
           "BatchNormalization", "LayerNormalization", "ConvTranspose", "CastLike", "If", "Nope"]
    for _ in range(rng.randint(1, 3)):
        r = rng.randrange(7)
        node = g.node[rng.randrange(len(g.node))] if len(g.node) else None
        if r == 0 and node is not None:
            node.op_type = rng.choice(ops)
        elif r == 1 and node is not None and node.input:
            names = [o for n in g.node for o in n.output] + [t.name for t in g.initializer] + ["", "missing"]
            node.input[rng.randrange(len(node.input))] = rng.choice(names)
        elif r == 2 and node is not None and node.attribute:
            a = node.attribute[rng.randrange(len(node.attribute))]
            name = rng.choice(["group", "perm", "axis", "transB", "pads", "epsilon", "kernel_shape"])
            a.CopyFrom(rng.choice([helper.make_attribute(name, rng.choice([0, -1, 2**40, 3])),
                                   helper.make_attribute(name, [rng.choice([-5, 0, 1, 99]) for _ in range(3)]),
                                   helper.make_attribute(name, b"\xff\xfe"),
                                   helper.make_attribute(name, float("nan"))]))
        elif r == 3 and len(g.initializer):
            t = g.initializer[rng.randrange(len(g.initializer))]
            if len(t.dims):
                t.dims[rng.randrange(len(t.dims))] = rng.choice([0, 1, 7, 10**6])
        elif r == 4 and node is not None:
            g.node.append(onnx.NodeProto())
            g.node[-1].CopyFrom(node)  # duplicate outputs
        elif r == 5 and len(g.node):
            del g.node[rng.randrange(len(g.node))]
        elif r == 6 and len(g.input):
            for d in g.input[0].type.tensor_type.shape.dim:
                d.dim_value = rng.choice([0, 1, 2**40])


def test_structurally_broken_models_give_a_graph_or_invalid_model_error(real_models):
    rng = random.Random(99)
    protos = [onnx.load_from_string(d) for d in real_models]
    for i in range(150):
        proto = onnx.ModelProto()
        proto.CopyFrom(protos[i % len(protos)])
        _mutate_structure(proto, rng)
        try:
            g = load_graph(proto.SerializeToString())
            assert 0.0 <= keeper.similarity(g, g) <= 1.0
            keeper.align(g, g)
        except InvalidModelError as exc:
            assert str(exc)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=3000))
def test_random_bytes_never_escape_as_anything_but_invalid_model_error(data):
    try:
        load_graph(data)
    except InvalidModelError:
        pass


@settings(max_examples=60, deadline=None)
@given(prefix=st.binary(max_size=64), seed=st.integers(0, 2**16))
def test_random_protobuf_fields_around_a_valid_model(prefix, seed):
    # Valid field framing with random payloads, prepended to a valid model: the parser reads fields, the checks
    # must decide.
    rng = np.random.default_rng(seed)
    field = int(rng.integers(1, 30))
    payload = bytes(rng.integers(0, 256, int(rng.integers(0, 40)), dtype=np.uint8))
    data = _varint(field << 3 | 2) + _varint(len(payload)) + payload + prefix + _tiny().SerializeToString()
    try:
        load_graph(data)
    except InvalidModelError:
        pass
