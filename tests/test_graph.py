"""ONNX -> LayerGraph: both torch exporters, hand-built graphs, every op keeper must read, canonical order."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from keeper.errors import InvalidModelError
from keeper.graph import Kind, LayerGraph, as_graph, graph_from_proto, load_graph
from keeper.matching import similarity
from keeper.torch_support import export_graph

import nets

FAMILIES = ("resnet", "vgg", "mobilenetv2", "transformer", "mlp")
CNNS = ("resnet", "vgg", "mobilenetv2")


def kinds(g: LayerGraph) -> list[str]:
    return [Kind.NAMES[int(k)] for k in g.layer_kind]


def shapes(g: LayerGraph) -> list[tuple[int, ...]]:
    return [tuple(int(v) for v in s[:r]) for s, r in zip(g.shape, g.rank)]


def group_partition(g: LayerGraph) -> tuple[list[int], list[int]]:
    """Channel groups of the layers' inputs and outputs, renumbered by first use, and those groups' sizes."""
    ids: dict[int, int] = {}
    flat = []
    for a, b in zip(g.in_group.tolist(), g.out_group.tolist()):
        for x in (a, b):
            flat.append(-1 if x < 0 else ids.setdefault(x, len(ids)))
    sizes = [int(g.group_size[x]) for x in sorted(ids, key=ids.get)]
    return flat, sizes


def assert_same_graph(a: LayerGraph, b: LayerGraph, names: bool = True) -> None:
    for key in LayerGraph._ARRAYS:
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=key)
    assert a.tensors == b.tensors
    assert a.attrs == b.attrs
    if names:
        assert a.layer_names == b.layer_names


@pytest.fixture(scope="module")
def family_graphs() -> dict[tuple[str, str, str], LayerGraph]:
    """Every family exported with both exporters in both modes (the MLP with TorchScript only: a dynamo export
    costs seconds); the exports are cached for the session."""
    return {(f, e, m): load_graph(nets.family_onnx(nets.spec(f), e, m))
            for f in FAMILIES for e in nets.EXPORTERS for m in nets.MODES if f != "mlp" or e == "torchscript"}


# ------------------------------------------------------------------------------------------ torch families

@pytest.mark.parametrize("family,exporter", [(f, e) for f in FAMILIES for e in nets.EXPORTERS
                                              if f != "mlp" or e == "torchscript"])
def test_total_params_equals_the_torch_parameter_count(family_graphs, family, exporter):
    expected = nets.param_count(nets.spec(family))
    assert family_graphs[family, exporter, "keep"].total_params == expected
    if family in ("transformer", "mlp"):  # nothing to fold: the default export holds every parameter too
        assert family_graphs[family, exporter, "eval"].total_params == expected


@pytest.mark.parametrize("mode", nets.MODES)
@pytest.mark.parametrize("family", FAMILIES[:4])
def test_dynamo_and_torchscript_exports_read_the_same(family_graphs, family, mode):
    ts, dyn = family_graphs[family, "torchscript", mode], family_graphs[family, "dynamo", mode]
    assert kinds(ts) == kinds(dyn)
    assert shapes(ts) == shapes(dyn)
    for key in ("vectors", "params", "conv_groups"):
        np.testing.assert_array_equal(getattr(ts, key), getattr(dyn, key), err_msg=key)
    assert group_partition(ts) == group_partition(dyn)
    for key in ("in_level", "out_level"):
        np.testing.assert_array_equal(getattr(ts, key), getattr(dyn, key), err_msg=key)
    assert similarity(ts, dyn) == 1.0 and similarity(dyn, ts) == 1.0


def test_resolution_levels_count_strided_convs_and_pools(family_graphs):
    r = family_graphs["resnet", "torchscript", "keep"]
    step = [(k, int(a), int(b)) for k, a, b in zip(kinds(r), r.in_level, r.out_level) if a != b]
    # each stage after the first starts with a strided conv1 and a strided projection, nothing else downsamples
    assert step == [("conv", s, s + 1) for s in range(len(nets.spec("resnet")["blocks"]) - 1) for _ in range(2)]
    assert r.out_level[0] == 0 and r.in_level[-1] == r.out_level[-1] == len(nets.spec("resnet")["blocks"]) - 1
    v = family_graphs["vgg", "torchscript", "keep"]  # stages end in strided max pools
    conv_levels = [int(a) for k, a in zip(kinds(v), v.in_level) if k == "conv"]
    assert conv_levels == sorted(conv_levels) and conv_levels[-1] == len(nets.spec("vgg")["widths"]) - 1
    t = family_graphs["transformer", "torchscript", "keep"]
    assert not t.in_level.any() and not t.out_level.any()


@pytest.mark.parametrize("exporter", nets.EXPORTERS)
@pytest.mark.parametrize("family", CNNS)
def test_default_export_folds_batchnorm_and_keepers_export_keeps_it(family_graphs, family, exporter):
    folded, kept = family_graphs[family, exporter, "eval"], family_graphs[family, exporter, "keep"]
    assert "batchnorm" not in kinds(folded) and "batchnorm" in kinds(kept)
    convs = [s for k, s in zip(kinds(kept), shapes(kept)) if k != "batchnorm"]
    assert shapes(folded) == convs  # same layers, BatchNorm gone
    assert kinds(folded).count("conv") == kinds(kept).count("conv")


def test_family_layers_are_what_the_models_hold(family_graphs):
    g = family_graphs["resnet", "torchscript", "keep"]
    s = nets.spec("resnet")
    assert shapes(g)[0] == (8, 3, 3, 3) and shapes(g)[-1] == (5, 16)
    assert kinds(g).count("conv") == 1 + 2 * sum(s["blocks"]) + 1  # stem, two per block, one projection
    assert kinds(g).count("batchnorm") == kinds(g).count("conv")

    m = family_graphs["mobilenetv2", "dynamo", "eval"]
    dw = [sh for k, sh in zip(kinds(m), shapes(m)) if k == "dwconv"]
    assert len(dw) == sum(nets.spec("mobilenetv2")["blocks"]) and all(sh[1] == 1 for sh in dw)
    assert all(int(cg) == sh[0] for cg, sh, k in zip(m.conv_groups, shapes(m), kinds(m)) if k == "dwconv")

    t = family_graphs["transformer", "dynamo", "eval"]
    d, ffn, layers = 16, 32, nets.spec("transformer")["layers"]
    sh = shapes(t)
    assert sh.count((3 * d, d)) == layers  # fused q/k/v in-projection of nn.MultiheadAttention
    assert sh.count((ffn, d)) == layers and sh.count((d, ffn)) == layers
    assert kinds(t).count("layernorm") == 2 * layers + 1
    assert kinds(t).count("param") == 1  # the positional embedding added to the tokens


def test_summary_and_array_round_trip(family_graphs):
    g = family_graphs["transformer", "torchscript", "keep"]
    s = g.summary()
    assert s["layers"] == g.num_layers and s["params"] == g.total_params and s["nodes"] == g.num_nodes
    back = LayerGraph.from_arrays({k: np.array(v) for k, v in g.to_arrays().items()})
    assert_same_graph(g, back)
    broken = g.to_arrays()
    del broken["shape"]
    with pytest.raises(InvalidModelError, match="incomplete or corrupt"):
        LayerGraph.from_arrays(broken)
    assert as_graph(g) is g


# ------------------------------------------------------------------------------------------ extra torch nets

@pytest.fixture(scope="module")
def extra_graphs() -> dict[tuple[str, str, str], LayerGraph]:
    out = {}
    for name in nets.EXTRA:
        for e in nets.EXPORTERS:
            out[name, e, "keep"] = load_graph(nets.extra_onnx(name, e, "keep"))
        out[name, "torchscript", "eval"] = load_graph(nets.extra_onnx(name, "torchscript", "eval"))
    return out


@pytest.mark.parametrize("exporter", nets.EXPORTERS)
def test_branches_splits_grouped_depthwise_transposed_convs(extra_graphs, exporter):
    g = extra_graphs["branchnet", exporter, "keep"]
    model, _ = nets.extra_model("branchnet")
    assert g.total_params == sum(p.numel() for p in model.parameters())
    w = 16
    assert list(zip(kinds(g), shapes(g))) == [
        ("conv", (w, 3, 3, 3)),
        ("conv", (w // 2, w, 1, 1)), ("conv", (w, w, 3, 3)), ("conv", (w // 2, w, 5, 5)),  # concat, in slot order
        ("conv", (w, 2 * w, 1, 1)),
        ("conv", (w // 2, w // 2, 3, 3)), ("conv", (w // 2, w // 2, 3, 3)),  # the two Split halves
        ("conv", (w, w // 4, 3, 3)),  # groups=4
        ("dwconv", (2 * w, 1, 3, 3)),  # depthwise with multiplier 2
        ("batchnorm", (2 * w,)),
        ("convT", (w, 2 * w, 2, 2)),  # stored (in, out, k, k), read as (out, in, k, k)
        ("linear", (5, w)),
    ]
    assert g.conv_groups.tolist() == [1, 1, 1, 1, 1, 1, 1, 4, w, 1, 1, 1]
    assert g.vectors.tolist() == [1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1]
    # the three branches feed one concatenation: the mix conv reads a composite group of their outputs
    branch_outs = [int(x) for x in g.out_group[1:4]]
    mix_in = int(g.in_group[4])
    assert g.group_of_parts(mix_in).tolist() == branch_outs
    assert int(g.group_size[mix_in]) == 2 * w
    # depthwise conv and its BatchNorm share one channel group (in == out), of 2w channels
    assert int(g.in_group[8]) == int(g.out_group[8]) == int(g.in_group[9]) == int(g.out_group[9])
    assert int(g.group_size[g.out_group[8]]) == 2 * w
    # the convT reads the BatchNorm's channels
    assert int(g.in_group[10]) == int(g.out_group[9])


def test_branchnet_exports_agree(extra_graphs):
    ts, dyn = extra_graphs["branchnet", "torchscript", "keep"], extra_graphs["branchnet", "dynamo", "keep"]
    assert shapes(ts) == shapes(dyn) and group_partition(ts) == group_partition(dyn)
    assert similarity(ts, dyn) == 1.0


@pytest.mark.parametrize("exporter", nets.EXPORTERS)
def test_embedding_attention_and_encoder_layers(extra_graphs, exporter):
    g = extra_graphs["tokens", exporter, "keep"]
    model, _ = nets.extra_model("tokens")
    assert g.total_params == sum(p.numel() for p in model.parameters())
    d, vocab = 16, 40
    sh, k = shapes(g), kinds(g)
    assert (k[0], sh[0]) == ("embedding", (d, vocab))  # Gather from the table, canonical (units, vocab)
    assert sh.count((3 * d, d)) == 3  # one nn.MultiheadAttention + two encoder layers
    assert sh.count((d, d)) == 3  # their out-projections
    norms = [i for i, kind in enumerate(k) if kind == "layernorm"]
    assert len(norms) == 5 and g.vectors[norms[-1]] == 0  # the final LayerNorm has no bias
    assert (k[-1], sh[-1], int(g.vectors[-1])) == ("linear", (3, d), 0)
    # the residual stream: embedding output, attention out-projections and every LayerNorm share one group
    stream = int(g.out_group[0])
    assert all(int(g.in_group[i]) == stream for i in norms)
    assert all(int(g.out_group[i]) == stream for i, s in enumerate(sh) if s == (d, d))
    assert int(g.group_size[stream]) == d
    # each packed q/k/v projection: its output is a composite of three d-unit parts, two heads each, q . k
    # recorded, and the out-projection reads the v part
    packed = [i for i, s in enumerate(sh) if s == (3 * d, d)]
    out_proj = [i for i, s in enumerate(sh) if s == (d, d)]
    for i, o in zip(packed, out_proj):
        assert g.attrs[i]["packed"] == {"parts": 3, "heads": [2, 2, 2], "dots": [[0, 1]]}
        parts = g.group_of_parts(int(g.out_group[i])).tolist()
        assert len(parts) == 3 and all(int(g.group_size[p]) == d for p in parts)
        assert int(g.in_group[o]) == parts[2]


@pytest.mark.parametrize("exporter", [*nets.EXPORTERS, "trace"])
@pytest.mark.parametrize("unpack", ["unbind", "index"])
def test_a_projection_reshaped_to_parts_and_heads_then_permuted_apart_is_packed(extra_graphs, exporter, unpack):
    """timm's ViT attention (qkv reshaped to (B, N, 3, heads, head size), the 3 moved first and taken apart: a
    Split, SequenceAt, a Slice or a Gather per part depending on the exporter) is a packed projection with its
    heads, as GPT-2's split along the units is."""
    if exporter == "trace" or unpack != "unbind":
        model, x = nets.UnbindViT(unpack=unpack), nets.EXTRA["unbind"][1]()
        with nets.quiet():
            g = load_graph(export_graph(model, x, dynamo={"trace": None, "torchscript": False,
                                                          "dynamo": True}[exporter]).onnx)
    else:
        g = extra_graphs["unbind", exporter, "keep"]
    d, sh = 32, shapes(g)
    packed = [i for i, s in enumerate(sh) if s == (3 * d, d)]
    out_proj = [i for i, s in enumerate(sh) if s == (d, d)]
    assert len(packed) == len(out_proj) == 2
    for i, o in zip(packed, out_proj):
        assert g.attrs[i].get("packed") == {"parts": 3, "heads": [2, 2, 2], "dots": [[0, 1]]}, g.attrs[i]
        assert "unit_axes" not in g.attrs[i]
        parts = g.group_of_parts(int(g.out_group[i])).tolist()
        assert len(parts) == 3 and all(int(g.group_size[p]) == d for p in parts)
        assert int(g.in_group[o]) == parts[2]  # the out-projection reads the v part


def test_eval_export_of_attention_equals_keep_export(extra_graphs):
    assert similarity(extra_graphs["tokens", "torchscript", "eval"], extra_graphs["tokens", "dynamo", "keep"]) == 1.0


# ------------------------------------------------------------------------------------------ hand-built graphs

def _model(nodes, inits, inputs=(("x", [2, 8]),), outputs=("y",), opset=17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                          initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).normal(size=shape).astype(np.float32)


def test_gemm_and_matmul_weights_read_in_one_orientation():
    w = _rand(6, 8)  # (out, in)
    variants = {
        "gemm transB": _model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], {"w": w, "b": _rand(6)}),
        "gemm": _model([helper.make_node("Gemm", ["x", "wt", "b"], ["y"])], {"wt": w.T.copy(), "b": _rand(6)}),
        "matmul + add": _model([helper.make_node("MatMul", ["x", "wt"], ["h"]),
                                helper.make_node("Add", ["h", "b"], ["y"])], {"wt": w.T.copy(), "b": _rand(6)}),
        "transposed weight": _model([helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
                                     helper.make_node("MatMul", ["x", "wt"], ["h"]),
                                     helper.make_node("Add", ["b", "h"], ["y"])], {"w": w, "b": _rand(6)}),
        "aliased, cast, reshaped weight": _model(
            [helper.make_node("Identity", ["flat"], ["alias"]), helper.make_node("Cast", ["alias"], ["c"], to=1),
             helper.make_node("Reshape", ["c", "shape"], ["wt"]),
             helper.make_node("Gemm", ["x", "wt", "b"], ["y"])],
            {"flat": w.T.reshape(-1).copy(), "shape": np.array([8, 6], dtype=np.int64), "b": _rand(6)}),
    }
    for name, model in variants.items():
        g = load_graph(model)
        assert kinds(g) == ["linear"] and shapes(g) == [(6, 8)], name
        assert g.vectors.tolist() == [1] and g.total_params == 54, name
        roles = {r.role for r in g.tensors[0]}
        assert roles == {"weight", "bias"}, name


def test_matmul_between_activations_is_not_a_layer():
    model = _model([helper.make_node("MatMul", ["x", "xt"], ["y"]), helper.make_node("Relu", ["x"], ["xt0"]),
                    helper.make_node("Transpose", ["xt0"], ["xt"], perm=[1, 0])], {})
    g = load_graph(model)
    assert g.num_layers == 0 and Kind.MATMUL in g.kind.tolist()


def test_conv_variants_batchnorm_layernorm_embedding_and_params():
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c1", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=2),
        helper.make_node("Conv", ["c2", "w3"], ["c3"], kernel_shape=[5, 5], pads=[2, 2, 2, 2], group=8),
        helper.make_node("BatchNormalization", ["c3", "s", "t", "m", "v"], ["n"]),
        helper.make_node("ConvTranspose", ["n", "wt"], ["u"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Mul", ["u", "scale"], ["us"]),
        helper.make_node("GlobalAveragePool", ["us"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("LayerNormalization", ["f", "g"], ["y"], axis=-1),
    ]
    inits = {"w1": _rand(8, 3, 3, 3), "b1": _rand(8), "w2": _rand(8, 4, 3, 3), "w3": _rand(16, 1, 5, 5),
             "s": _rand(16), "t": _rand(16), "m": _rand(16), "v": np.abs(_rand(16)) + 1,
             "wt": _rand(16, 4, 2, 2), "scale": _rand(1, 4, 1, 1), "g": _rand(4)}
    g = load_graph(_model(nodes, inits, inputs=(("x", [1, 3, 8, 8]),)))
    assert kinds(g) == ["conv", "conv", "dwconv", "batchnorm", "convT", "param", "layernorm"]
    # the per-channel scale (1, C, 1, 1) reads with its channel axis first, like every other layer
    assert shapes(g) == [(8, 3, 3, 3), (8, 4, 3, 3), (16, 1, 5, 5), (16,), (4, 16, 2, 2), (4, 1, 1, 1), (4,)]
    assert int(g.in_group[5]) == int(g.out_group[4]) and int(g.group_size[g.out_group[4]]) == 4
    assert g.conv_groups.tolist()[:3] == [1, 2, 8]
    # mean and variance are statistics, not trainable: BatchNorm counts scale and shift
    assert g.params.tolist() == [224, 288, 400, 32, 256, 4, 4]
    assert g.attrs[0]["pads"] == [1, 1, 1, 1] and g.attrs[4]["strides"] == [2, 2]

    emb = _model([helper.make_node("Gather", ["table", "ids"], ["e"]),
                  helper.make_node("Gather", ["e", "zero"], ["y"], axis=1)],  # a constant index: a slice, no layer
                 {"table": _rand(50, 12), "zero": np.array(0, dtype=np.int64)}, inputs=())
    emb.graph.input.append(helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5]))
    g = load_graph(emb)
    assert kinds(g) == ["embedding"] and shapes(g) == [(12, 50)] and g.total_params == 600


def test_dynamo_style_zero_bias_from_castlike_is_a_constant():
    # dynamo builds the zero bias of a bias-free conv as Expand(CastLike(0, x), Shape(w)): not data, no layer edge
    nodes = [helper.make_node("Shape", ["w"], ["ws"]),
             helper.make_node("Gather", ["ws", "zero"], ["cout"]),
             helper.make_node("Unsqueeze", ["cout", "axes"], ["bshape"]),
             helper.make_node("CastLike", ["zf", "x"], ["z"]),
             helper.make_node("Expand", ["z", "bshape"], ["b"]),
             helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3])]
    inits = {"w": _rand(4, 3, 3, 3), "zero": np.array(0, np.int64), "axes": np.array([0], np.int64),
             "zf": np.array(0.0, np.float32)}
    g = load_graph(_model(nodes, inits, inputs=(("x", [1, 3, 5, 5]),)))
    assert g.num_nodes == 1 and kinds(g) == ["conv"] and g.total_params == 108
    assert g.predecessors(0).tolist() == []


def test_structural_nodes_and_edges():
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Split", ["a", "halves"], ["s0", "s1"], axis=1),
             helper.make_node("MatMul", ["s0", "w0"], ["m0"]),
             helper.make_node("MatMul", ["s1", "w1"], ["m1"]),
             helper.make_node("Concat", ["m0", "m1"], ["c"], axis=1),
             helper.make_node("Add", ["c", "a"], ["y"])]
    g = load_graph(_model(nodes, {"halves": np.array([4, 4], np.int64), "w0": _rand(4, 4), "w1": _rand(4, 4)}))
    assert [Kind.NAMES[int(k)] for k in g.kind] == ["rectifier", "split", "linear", "linear", "concat", "add"]
    preds = [g.predecessors(i).tolist() for i in range(g.num_nodes)]
    assert preds == [[], [0], [1], [1], [2, 3], [0, 4]]
    assert g.layer_node.tolist() == [2, 3]


def test_unknown_and_weird_ops_do_not_break_extraction():
    nodes = [helper.make_node("FancyOp", ["x"], ["a"], domain="custom"),
             helper.make_node("Gemm", ["a", "w"], ["b"], transA=1),  # transA: not a linear layer keeper reads
             helper.make_node("Add", ["b", "p6"], ["y"])]  # a rank-6 learned tensor
    model = _model(nodes, {"w": _rand(8, 4), "p6": _rand(1, 1, 1, 1, 2, 4)})
    model.opset_import.append(helper.make_opsetid("custom", 1))
    g = load_graph(model)
    assert g.num_nodes == 3 and g.num_layers == 0
    # the learned tensors those ops read are not dropped in silence: unread, in the totals, below 1 against itself
    assert g.unread == {"p6": 8, "w": 32} and g.total_params == g.score_total == 40
    assert similarity(g, g) == 0.0
    assert LayerGraph.from_arrays(g.to_arrays()).unread == g.unread


def test_learned_tables_read_by_lookups_are_layers():
    """A position table gathered at constant positions and added to the data, a bias table gathered by a constant
    index grid (GatherND), and a class token expanded and concatenated: each a PARAM layer holding the whole
    table; a frequency vector combined with positions into cos (RoPE) is no layer and not unread."""
    shape = helper.make_node("Constant", [], ["shp"], value=numpy_helper.from_array(np.array([2, 1, 8], np.int64)))
    nodes = [helper.make_node("Constant", [], ["pos"], value=numpy_helper.from_array(np.arange(3, dtype=np.int64))),
             helper.make_node("Gather", ["wpe", "pos"], ["pe"]),             # (3, 8) rows of a (5, 8) table
             helper.make_node("Add", ["x", "pe"], ["h1"]),
             shape, helper.make_node("Expand", ["cls", "shp"], ["tok"]),      # (1, 1, 8) -> (2, 1, 8)
             helper.make_node("Concat", ["tok", "h1"], ["h2"], axis=1),      # (2, 4, 8)
             helper.make_node("Constant", [], ["grid"],
                              value=numpy_helper.from_array(np.array([[[0], [1]], [[1], [0]]], np.int64))),
             helper.make_node("GatherND", ["table", "grid"], ["bias"]),      # (2, 2, 8) of a (2, 8) table
             helper.make_node("MatMul", ["h2", "w"], ["h3"]),
             helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(np.ones((4, 1), np.float32))),
             helper.make_node("MatMul", ["t", "inv_freq"], ["ang"]),          # (4, 1) @ (1, 8): positions x freq
             helper.make_node("Cos", ["ang"], ["cos"]),
             helper.make_node("Mul", ["h3", "cos"], ["h4"]),
             helper.make_node("Slice", ["h4", "s0", "s1", "ax"], ["h5"]),
             helper.make_node("Add", ["h5", "bias"], ["y"])]
    inits = {"wpe": _rand(5, 8), "cls": _rand(1, 1, 8), "table": _rand(2, 8), "w": _rand(8, 8),
             "inv_freq": _rand(1, 8), "s0": np.array([0], np.int64), "s1": np.array([2], np.int64),
             "ax": np.array([1], np.int64)}
    g = load_graph(_model(nodes, inits, inputs=(("x", [2, 3, 8]),)))
    by_source = {refs[0].source: (k, s, refs) for k, s, refs in zip(kinds(g), shapes(g), g.tensors)}
    assert set(by_source) == {"wpe", "cls", "table", "w"}
    assert by_source["wpe"][:2] == ("param", (8, 5)) and by_source["wpe"][2][0].chain == ()
    assert by_source["cls"][:2] == ("param", (8, 1, 1))
    assert by_source["table"][:2] == ("param", (8, 2))
    assert g.unread == {} and g.total_params == 40 + 8 + 16 + 64
    assert similarity(g, g) == 1.0


def test_a_tensor_two_layers_read_counts_once():
    """Tied embedding and output projection (GPT-2's wte and lm_head): one tensor, two layers, counted once."""
    nodes = [helper.make_node("Gather", ["wte", "ids"], ["h"]),
             helper.make_node("Transpose", ["wte"], ["wte_t"], perm=[1, 0]),
             helper.make_node("MatMul", ["h", "wte_t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(_rand(10, 4), "wte")])
    g = load_graph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert kinds(g) == ["embedding", "linear"]
    assert g.shared_params == 40 and g.total_params == 40 and g.score_total == 80
    assert similarity(g, g) == 1.0


# ------------------------------------------------------------------------------------------ canonical order

BLOCK = st.one_of(
    st.tuples(st.just("conv"), st.sampled_from([2, 4, 6, 8]), st.sampled_from([1, 3]), st.booleans()),
    st.tuples(st.just("res"), st.sampled_from([1, 3])),
    st.tuples(st.just("branch"), st.lists(st.sampled_from([2, 4, 6]), min_size=2, max_size=3).map(tuple),
              st.sampled_from([3, 5])),
    st.tuples(st.just("split")),
    st.tuples(st.just("dw"), st.sampled_from([3, 5])),
    st.tuples(st.just("gate")),
    st.tuples(st.just("pool")),
)
BLOCKS = st.lists(BLOCK, min_size=1, max_size=7)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=BLOCKS, seed=st.integers(0, 2**16))
def test_node_order_in_the_file_does_not_matter(blocks, seed):
    model = nets.cnn_onnx(blocks, in_channels=4, seed=seed % 7)
    g = load_graph(model)
    for k in range(2):
        shuffled = load_graph(nets.permuted(model, seed + k).SerializeToString())
        assert_same_graph(g, shuffled)
        assert similarity(g, shuffled) == 1.0


@settings(max_examples=25, deadline=None)
@given(blocks=BLOCKS)
def test_hand_built_graphs_count_every_trainable_element(blocks):
    model = nets.cnn_onnx(blocks, in_channels=4)
    g = graph_from_proto(model)
    stats = {n.input[3] for n in model.graph.node if n.op_type == "BatchNormalization"} | \
            {n.input[4] for n in model.graph.node if n.op_type == "BatchNormalization"}
    trainable = sum(int(np.prod(t.dims)) for t in model.graph.initializer
                    if t.data_type == TensorProto.FLOAT and t.name not in stats)
    assert g.total_params == trainable
    per_block = {"conv": 1, "res": 2, "split": 2, "dw": 1, "gate": 1, "pool": 0}
    convs = sum(len(b[1]) if b[0] == "branch" else per_block[b[0]] for b in blocks)
    assert kinds(g).count("conv") + kinds(g).count("dwconv") == convs
    # edges point backwards: the canonical order is topological
    for node in range(g.num_nodes):
        assert all(p < node for p in g.predecessors(node).tolist())


@pytest.mark.parametrize("source", ["transformer-dynamo", "transformer-torchscript", "branchnet", "tokens"])
def test_shuffled_real_exports_read_the_same(source):
    if source.startswith("transformer"):
        data = nets.family_onnx(nets.spec("transformer"), source.split("-")[1], "keep")
    else:
        data = nets.extra_onnx(source, "dynamo" if source == "tokens" else "torchscript", "keep")
    g = load_graph(data)
    proto = onnx.load_from_string(data)
    for seed in range(3):
        assert_same_graph(g, load_graph(nets.permuted(proto, seed)))


def test_reversed_node_order_reads_the_same():
    data = nets.family_onnx(nets.spec("resnet"), "dynamo", "keep")
    proto = onnx.load_from_string(data)
    nodes = list(proto.graph.node)[::-1]
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    assert_same_graph(load_graph(data), load_graph(proto))


# ------------------------------------------------------------------------------------------ residual stream

@pytest.mark.parametrize("family", FAMILIES[:4])
def test_residual_stream_blocks_are_contiguous_and_read_alike_by_both_exporters(family_graphs, family):
    from keeper.graph.stream import residual_stream

    streams = [residual_stream(family_graphs[(family, e, "keep")]) for e in nets.EXPORTERS]
    for s in streams:
        seen, last = set(), None
        for seg in s.segment.tolist():  # a segment, once left, never comes back: blocks are contiguous
            assert seg == last or seg not in seen, s.segment
            seen.add(seg)
            last = seg
    a, b = streams
    np.testing.assert_array_equal(a.in_block, b.in_block)
    np.testing.assert_array_equal(a.boundary_before(), b.boundary_before())
    if family == "vgg":  # a chain without forks: no blocks, placement is left to local costs
        assert not a.in_block.any() and not a.boundary_before().any()
    else:  # residual blocks: each starts at a boundary
        assert a.in_block.any() and a.boundary_before().sum() >= 2


def test_slices_and_concatenations_along_positions_keep_the_channel_group():
    """A roll over positions (two slices joined along the same axis, as Swin's shifted windows export) and a
    patch merging (strided slices over positions joined along channels) keep the units of the stream: the roll is
    in the stream's group, the merging a composite of four parts that are that group; a slice of channels opens
    a group of its own. Axes given as constants, or folded from Unsqueeze of a Constant (TorchScript's way)."""
    def const(name, v):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(v, np.int64)))

    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),                      # (2, 4, 4, 8), channels last
             const("one", 1), const("zero", [0]), helper.make_node("Unsqueeze", ["one", "zero"], ["ax1"]),
             helper.make_node("Slice", ["h", "s2", "big", "ax1"], ["r0"]),
             helper.make_node("Slice", ["h", "s0", "s2", "ax1"], ["r1"]),
             helper.make_node("Concat", ["r0", "r1"], ["rolled"], axis=1),         # a roll along axis 1
             helper.make_node("Add", ["h", "rolled"], ["z"]),
             helper.make_node("Slice", ["z", "s00", "big2", "ax12", "st2"], ["m0"]),
             helper.make_node("Slice", ["z", "s01", "big2", "ax12", "st2"], ["m1"]),
             helper.make_node("Slice", ["z", "s10", "big2", "ax12", "st2"], ["m2"]),
             helper.make_node("Slice", ["z", "s11", "big2", "ax12", "st2"], ["m3"]),
             helper.make_node("Concat", ["m0", "m1", "m2", "m3"], ["merged"], axis=-1),  # (2, 2, 2, 32)
             helper.make_node("MatMul", ["merged", "w2"], ["y"]),
             helper.make_node("Slice", ["h", "s0", "s2c", "ax3"], ["part"]),      # channels 0..3
             helper.make_node("MatMul", ["part", "w3"], ["y2"])]
    i64 = lambda v: np.array(v, np.int64)  # noqa: E731
    inits = {"w": _rand(8, 8), "w2": _rand(32, 8), "w3": _rand(4, 8), "s0": i64([0]), "s2": i64([2]),
             "big": i64([1 << 62]), "s00": i64([0, 0]), "s01": i64([0, 1]), "s10": i64([1, 0]),
             "s11": i64([1, 1]), "big2": i64([1 << 62, 1 << 62]), "ax12": i64([1, 2]), "st2": i64([2, 2]),
             "s2c": i64([4]), "ax3": i64([3])}
    g = load_graph(_model(nodes, inits, inputs=(("x", [2, 4, 4, 8]),), outputs=("y", "y2")))
    layer = {refs[0].source: li for li, refs in enumerate(g.tensors)}
    stream = int(g.out_group[layer["w"]])
    merged = int(g.in_group[layer["w2"]])
    assert g.group_of_parts(merged).tolist() == [stream] * 4 and g.group_size[merged] == 32
    assert int(g.in_group[layer["w3"]]) != stream and g.group_size[g.in_group[layer["w3"]]] == 4
