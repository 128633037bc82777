"""Transforms: pure-function invariants (hypothesis) and whole-model function preservation, both exporters."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import nets
from keeper_bench import families
from keeper.graph import Kind, load_graph
from keeper.torch_support import export
from keeper.torch_support.load import load_result
from keeper.transforms.depth import identity_fill, zero_fill
from keeper.transforms.kernel import fit_kernel
from keeper.transforms.width import take_inputs, take_units, take_units_and_inputs, unit_map
from keeper.warm import inherit

# ------------------------------------------------------------------------------------------ pure functions


@settings(max_examples=60, deadline=None)
@given(p_in=st.integers(1, 12), p_hid=st.integers(1, 12), grow=st.integers(0, 12), seed=st.integers(0, 99))
def test_widening_a_linear_pair_preserves_its_function(p_in, p_hid, grow, seed):
    rng = np.random.default_rng(seed)
    w1, b1 = rng.normal(size=(p_hid, p_in)), rng.normal(size=p_hid)
    w2 = rng.normal(size=(3, p_hid))
    before = (w1.copy(), b1.copy(), w2.copy())
    m = unit_map(p_hid, p_hid + grow)
    w1c, b1c = take_units(w1, m, 0), take_units(b1, m, 0)
    w2c = take_inputs(w2, m, p_hid, 1)
    x = rng.normal(size=(5, p_in))
    relu = lambda a: np.maximum(a, 0)  # noqa: E731
    np.testing.assert_allclose(relu(x @ w1c.T + b1c) @ w2c.T, relu(x @ w1.T + b1) @ w2.T, rtol=1e-10, atol=1e-10)
    for a, b in zip(before, (w1, b1, w2)):  # inputs untouched
        np.testing.assert_array_equal(a, b)


@settings(max_examples=40, deadline=None)
@given(parent=st.integers(1, 20), child=st.integers(1, 30))
def test_unit_map_keeps_every_parent_unit_when_growing_and_clones_whole_heads(parent, child):
    m = unit_map(parent, child, np.arange(parent, dtype=float))
    assert len(m) == child and m.min() >= 0 and m.max() < parent
    if child >= parent:
        assert set(m.tolist()) == set(range(parent))
        assert np.array_equal(m[:parent], np.arange(parent))
        counts = np.bincount(m, minlength=parent)
        assert counts.max() - counts.min() <= 1 and np.all(np.diff(counts) <= 0)  # the first units once more
    else:  # shrinking keeps the most important units, in order
        assert np.array_equal(m, np.arange(parent - child, parent))


@settings(max_examples=40, deadline=None)
@given(head=st.integers(1, 6), heads=st.integers(1, 6), more=st.integers(1, 9), groups=st.sampled_from([1, 2]))
def test_unit_map_clones_whole_heads_and_keeps_grouped_key_value_heads_paired(head, heads, more, groups):
    # q with ``heads * groups`` heads reading kv head ``h // groups``; both grow by the same factor, heads kept
    hp, hc = heads * groups, (heads + more) * groups
    q = unit_map(hp * head, hc * head).reshape(hc, head)
    kv = unit_map(heads * head, (heads + more) * head).reshape(heads + more, head)
    for h in range(hc):
        parent_q = q[h, 0] // head
        assert np.array_equal(q[h], parent_q * head + np.arange(head))  # a whole parent head
        assert kv[h // groups, 0] // head == parent_q // groups  # the clone of the kv head its parent read


@settings(max_examples=80, deadline=None)
@given(p_out=st.integers(1, 40), c_out=st.integers(1, 60), p_in=st.integers(1, 12), c_in=st.integers(1, 20),
       kernel=st.sampled_from([(), (3,), (1, 3)]), divide=st.booleans(), seed=st.integers(0, 99))
def test_fused_take_equals_the_two_step_path(p_out, c_out, p_in, c_in, kernel, divide, seed):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(p_out, p_in) + kernel).astype(np.float32)
    before = w.copy()
    units = unit_map(p_out, c_out, rng.random(p_out))
    inputs = unit_map(p_in, c_in, rng.random(p_in))
    if rng.random() < 0.3:  # arbitrary maps too, not only unit_map's identity-prefix ones
        units = rng.integers(0, p_out, c_out)
    fused = take_units_and_inputs(w, units, inputs, p_in if divide else None)
    rows = take_units(w, units, 0)
    two_step = take_inputs(rows, inputs, p_in, 1) if divide else take_units(rows, inputs, 1)
    np.testing.assert_array_equal(fused, two_step)  # bit for bit: the fused path is only faster
    np.testing.assert_array_equal(w, before)
    assert not np.shares_memory(fused, w)
    with pytest.raises(ValueError, match="outside"):
        take_units_and_inputs(w, np.array([p_out]), inputs, None)


@settings(max_examples=30, deadline=None)
@given(k=st.sampled_from([1, 3, 5]), grow=st.sampled_from([2, 4]), seed=st.integers(0, 9))
def test_centred_kernel_growth_preserves_same_padded_conv(k, grow, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(4, 3, k, k, generator=g)
    x = torch.randn(2, 3, 9, 9, generator=g)
    wk = torch.from_numpy(fit_kernel(w.numpy(), (k + grow, k + grow)))
    torch.testing.assert_close(F.conv2d(x, wk, padding=(k + grow) // 2), F.conv2d(x, w, padding=k // 2))
    crop = fit_kernel(wk.numpy(), (k, k))
    np.testing.assert_array_equal(crop, w.numpy())


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 12), factor=st.integers(1, 4), rows=st.integers(1, 5), out=st.integers(1, 6),
       seed=st.integers(0, 99))
def test_integer_growth_keeps_layernorm_and_rmsnorm_and_the_next_layer(p, factor, rows, out, seed):
    # the residual stream copied ``factor`` times (unit_map at an integer factor): LayerNorm and RMSNorm see the
    # parent's mean and variance, so the normalised child units are the parent's, copied; the layer reading the
    # stream (inputs divided by the copies) computes the parent's output
    rng = np.random.default_rng(seed)
    x, gamma, beta = rng.normal(size=(rows, p)) * 3 + 1, rng.uniform(0.5, 1.5, p), rng.normal(size=p)
    w = rng.normal(size=(out, p))
    before = (x.copy(), gamma.copy(), beta.copy(), w.copy())
    m = unit_map(p, p * factor)
    assert np.array_equal(np.bincount(m, minlength=p), np.full(p, factor))  # every unit equally often
    xc, gc, bc = take_units(x, m, 1), take_units(gamma, m, 0), take_units(beta, m, 0)
    wc = take_inputs(w, m, p, 1)
    eps = 1e-5

    def layernorm(a, g, b):
        return (a - a.mean(1, keepdims=True)) / np.sqrt(a.var(1, keepdims=True) + eps) * g + b

    def rmsnorm(a, g):
        return a / np.sqrt((a * a).mean(1, keepdims=True) + eps) * g

    for parent, child in ((layernorm(x, gamma, beta), layernorm(xc, gc, bc)), (rmsnorm(x, gamma), rmsnorm(xc, gc))):
        np.testing.assert_allclose(child, take_units(parent, m, 1), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(child @ wc.T, parent @ w.T, rtol=1e-9, atol=1e-9)
    for a, b in zip(before, (x, gamma, beta, w)):  # inputs untouched
        np.testing.assert_array_equal(a, b)


def test_identity_fills_are_identities():
    x = torch.randn(2, 6, 7, 7)
    conv = identity_fill(Kind.CONV, {"weight": np.random.randn(6, 6, 3, 3).astype(np.float32),
                                     "bias": np.ones(6, np.float32)})
    torch.testing.assert_close(F.conv2d(x, torch.from_numpy(conv["weight"]), torch.from_numpy(conv["bias"]), padding=1), x)
    dw = identity_fill(Kind.DWCONV, {"weight": np.random.randn(6, 1, 5, 5).astype(np.float32)})
    torch.testing.assert_close(F.conv2d(x, torch.from_numpy(dw["weight"]), padding=2, groups=6), x)
    bn = identity_fill(Kind.BATCHNORM, {"scale": np.ones(6, np.float32), "bias": np.ones(6, np.float32),
                                        "mean": np.ones(6, np.float32), "var": np.ones(6, np.float32)}, epsilon=1e-3)
    y = F.batch_norm(x, *(torch.from_numpy(bn[k]) for k in ("mean", "var", "scale", "bias")), training=False, eps=1e-3)
    torch.testing.assert_close(y, x)
    lin = identity_fill(Kind.LINEAR, {"weight": np.zeros((5, 5), np.float32), "bias": np.ones(5, np.float32)})
    assert np.array_equal(lin["weight"], np.eye(5)) and not lin["bias"].any()
    assert identity_fill(Kind.LINEAR, {"weight": np.zeros((5, 4), np.float32)}) is None
    assert identity_fill(Kind.CONV, {"weight": np.zeros((6, 6, 3, 3), np.float32)}, strides=[2, 2]) is None
    z = zero_fill(Kind.BATCHNORM, bn)
    assert not z["scale"].any() and not z["bias"].any() and np.all(z["var"] == 1)


# ------------------------------------------------------------------------------------------ whole models

def _deviation(parent_spec: dict, child_spec: dict, dynamo: bool, seed: int = 0) -> tuple[float, float]:
    torch.manual_seed(seed)
    parent = families.build(parent_spec)
    x = families.example_input(parent_spec, batch=4)
    nets.trained_like(parent, x, seed)
    child = families.build(child_spec).eval()
    pe, ce = export(parent, x, dynamo=dynamo), export(child, x, dynamo=dynamo)
    result = inherit(pe.onnx, ce.onnx, parent_name="parent", noise=0.0)
    load_result(child, result, ce.keys)
    assert not result.missing, result.missing
    child.eval()
    with torch.no_grad():
        a, b = parent(x), child(x)
    return float((a - b).abs().max() / a.abs().max()), result.score


CNN = dict(dim=2, in_channels=3, num_classes=10, input_length=16)
RESNET = dict(family="resnet", widths=[8, 16], blocks=[1, 1], kernel=3, **CNN)
VGG = dict(family="vgg", widths=[8, 16], depths=[1, 1], kernel=3, **CNN)
MOBILE = dict(family="mobilenetv2", stem_width=8, widths=[8, 16], blocks=[1, 2], kernel=3, expansion=2,
              head_width=32, **CNN)
PRE_LN = dict(family="transformer", dim=1, in_channels=1, num_classes=10, input_length=16, d_model=16, heads=2,
              ffn=32, layers=1, patch=2, pre_ln=True)

PRESERVING = [
    ("resnet-widen", RESNET, {**RESNET, "widths": [12, 24]}),
    ("resnet-deepen", RESNET, {**RESNET, "blocks": [2, 3]}),
    ("resnet-kernel", RESNET, {**RESNET, "kernel": 5}),
    ("resnet-all", RESNET, {**RESNET, "widths": [12, 20], "blocks": [2, 2], "kernel": 5}),
    ("vgg-deepen", VGG, {**VGG, "depths": [2, 3]}),
    ("vgg-widen-deepen", VGG, {**VGG, "widths": [10, 24], "depths": [2, 2]}),
    ("mobilenetv2-widen", MOBILE, {**MOBILE, "stem_width": 12, "widths": [12, 24], "head_width": 40}),
    ("mobilenetv2-expand", MOBILE, {**MOBILE, "expansion": 3}),
    ("mobilenetv2-kernel", MOBILE, {**MOBILE, "kernel": 5}),
    ("transformer-preln-deepen", PRE_LN, {**PRE_LN, "layers": 3}),
    ("transformer-preln-ffn", PRE_LN, {**PRE_LN, "ffn": 48}),
    # ViT-style (patches, pre-LN, packed q/k/v): d_model doubled with the heads (heads cloned) or with the head size
    ("transformer-preln-d_model-x2", PRE_LN, {**PRE_LN, "d_model": 32, "heads": 4, "ffn": 64}),
    ("transformer-preln-d_model-x2-head-size", PRE_LN, {**PRE_LN, "d_model": 32, "ffn": 64}),
]


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
@pytest.mark.parametrize("name,parent,child", PRESERVING, ids=[p[0] for p in PRESERVING])
def test_warm_child_computes_the_parents_function(name, parent, child, dynamo):
    dev, score = _deviation(parent, child, dynamo)
    assert dev <= 1e-4, f"{name}: max relative deviation {dev:.2e}"
    assert 0.0 < score <= 1.0


class AttentionNet(torch.nn.Module):
    """Linear -> nn.MultiheadAttention -> ReLU -> mean -> Linear: attention without a LayerNorm, so a wider
    d_model (and so wider heads) can compute exactly the narrower parent's function."""

    def __init__(self, d: int, heads: int = 2):
        super().__init__()
        self.embed = torch.nn.Linear(6, d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.head = torch.nn.Linear(d, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        return self.head(torch.relu(a).mean(dim=1))


class SplitAttentionNet(torch.nn.Module):
    """AttentionNet with the attention written out as GPT-2 does: one projection, split into q, k and v along
    its last axis, heads by view and transpose."""

    def __init__(self, d: int, heads: int = 2):
        super().__init__()
        self.d, self.heads = d, heads
        self.embed = torch.nn.Linear(6, d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)
        self.head = torch.nn.Linear(d, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        b, t, dh = x.shape[0], x.shape[1], self.d // self.heads
        q, k, v = (z.reshape(b, t, self.heads, dh).transpose(1, 2) for z in self.qkv(h).split(self.d, dim=-1))
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(dh), dim=-1)
        a = self.out((att @ v).transpose(1, 2).reshape(b, t, self.d))
        return self.head(torch.relu(a).mean(dim=1))


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
@pytest.mark.parametrize("net", [AttentionNet, SplitAttentionNet], ids=["gathered", "split"])
@pytest.mark.parametrize("heads,parent_d,child_d", [(2, 8, 12), (2, 8, 16), (4, 8, 12)])
def test_widening_attention_keeps_q_k_v_and_heads_apart(heads, parent_d, child_d, net, dynamo):
    # q, k and v come from one packed projection: each part, head by head, gets its own map; k's copies are
    # divided and q rescaled for the wider head size, so the wider child computes the parent's function
    torch.manual_seed(0)
    parent, child = net(parent_d, heads).eval(), net(child_d, heads).eval()
    nets.randomize(parent, 0)
    x = torch.randn(3, 7, 6)
    pe, ce = export(parent, x, dynamo=dynamo), export(child, x, dynamo=dynamo)
    packed = [a["packed"] for a in load_graph(ce.onnx).attrs if "packed" in a]
    assert packed == [{"parts": 3, "heads": [heads] * 3, "dots": [[0, 1]]}]
    result = inherit(pe.onnx, ce.onnx, parent_name="parent", noise=0.0)
    load_result(child, result, ce.keys)
    with torch.no_grad():
        a, b = parent(x), child(x)
    assert float((a - b).abs().max() / a.abs().max()) <= 1e-5
    assert any("attention-scale" in op for _, op in result.mapping.values())


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_a_shallower_transformer_computes_the_parents_first_blocks(dynamo):
    # dropping blocks cannot preserve the function; keeping the first ones keeps an exact part of it: the warmed
    # child is the parent with its last blocks removed (its final norm and head read the earlier stream)
    parent_spec, child_spec = {**PRE_LN, "layers": 4}, {**PRE_LN, "layers": 2}
    torch.manual_seed(0)
    parent = families.build(parent_spec)
    x = families.example_input(parent_spec, batch=4)
    nets.trained_like(parent, x, 0)
    child = families.build(child_spec).eval()
    pe, ce = export(parent, x, dynamo=dynamo), export(child, x, dynamo=dynamo)
    result = inherit(pe.onnx, ce.onnx, parent_name="parent", noise=0.0)
    load_result(child, result, ce.keys)
    truncated = families.build(child_spec).eval()
    state = parent.state_dict()
    truncated.load_state_dict({k: state[k] for k in truncated.state_dict()})  # layers.0 and .1 are the first two
    parent.eval()
    with torch.no_grad():
        torch.testing.assert_close(child(x), truncated(x), rtol=0, atol=0)
    assert result.score == 1.0 and not result.missing


def test_identical_architecture_is_copied_exactly():
    dev, score = _deviation(RESNET, RESNET, dynamo=True)
    assert dev == 0.0 and score == 1.0


def _roll_block_graph():
    """x (a stem's output) -> LayerNorm -> MatMul -> a roll over positions (two slices, one concatenation) -> added back to x: a
    residual branch that forks and joins inside (Swin's shifted windows), then a head."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    f32 = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    i64 = lambda v: np.array(v, np.int64)  # noqa: E731
    nodes = [helper.make_node("MatMul", ["x0", "stem"], ["x"]),
             helper.make_node("LayerNormalization", ["x", "ln_w", "ln_b"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "w"], ["h"]),
             helper.make_node("Slice", ["h", "s1", "big", "ax"], ["a"]),
             helper.make_node("Slice", ["h", "s0", "s1", "ax"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["rolled"], axis=1),
             helper.make_node("Add", ["x", "rolled"], ["z"]),
             helper.make_node("MatMul", ["z", "head"], ["y"])]
    inits = {"stem": f32(8, 8), "ln_w": f32(8), "ln_b": f32(8), "w": f32(8, 8), "head": f32(8, 3), "s0": i64([0]), "s1": i64([1]),
             "big": i64([1 << 62]), "ax": i64([1])}
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [2, 4, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    graph = load_graph(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    return graph, {refs[0].source: li for li, refs in enumerate(graph.tensors)}


def test_a_new_branch_that_rolls_its_output_is_zeroed_at_its_last_layer():
    from keeper.transforms.depth import fresh_branches, new_branch_tails

    g, layer = _roll_block_graph()
    new = np.zeros(g.num_layers, dtype=bool)
    new[[layer["ln_w"], layer["w"]]] = True
    (branch,) = fresh_branches(g, new)
    assert branch.tails == {layer["w"]} and branch.layers == {layer["ln_w"], layer["w"]}
    assert new_branch_tails(g, new) == {layer["w"]}
    new[layer["ln_w"]] = False  # a branch holding an inherited layer is not new: nothing to zero
    assert fresh_branches(g, new) == [] and new_branch_tails(g, new) == set()


def test_a_tied_table_is_written_by_the_layer_that_inherits_it():
    from keeper.transforms.compose import tensor_writers

    g, layer = _roll_block_graph()
    from dataclasses import replace
    # the head reads the LayerNorm's scale too (a tied tensor): the first reader writes it unless only a later
    # one inherits
    tied = replace(g, tensors=[*g.tensors[:-1], g.tensors[-1] + (g.tensors[layer["ln_w"]][0],)])
    inherits = np.ones(g.num_layers, dtype=bool)
    assert tensor_writers(tied, inherits)["ln_w"] == layer["ln_w"]
    inherits[layer["ln_w"]] = False
    assert tensor_writers(tied, inherits)["ln_w"] == layer["head"]


def _pieced_bias_model() -> bytes:
    """y = x @ W + concat(q_bias, zeros, v_bias): a linear layer whose bias is built from two learned pieces around
    constant zeros (a Constant node, as the TorchScript exporter writes BEiT's key bias)."""
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(4, 6)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.normal(size=2).astype(np.float32), "q_bias"),
             numpy_helper.from_array(rng.normal(size=2).astype(np.float32), "v_bias")]
    nodes = [helper.make_node("Constant", [], ["zeros"], value=numpy_helper.from_array(np.zeros(2, np.float32))),
             helper.make_node("Concat", ["q_bias", "zeros", "v_bias"], ["bias"], axis=0),
             helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "bias"], ["y"])]
    graph = helper.make_graph(nodes, "pieces", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 6])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_bias_in_pieces_is_assembled_split_back_and_its_zeros_are_never_written():
    import onnx

    from keeper.onnx_weights import read_initializers, role_arrays, to_source
    from keeper.transforms.compose import transfer_layers

    blob = _pieced_bias_model()
    g, arrays = load_graph(blob), read_initializers(onnx.load_from_string(blob))
    (layer,) = g.tensors
    assert [(r.role, r.key, r.span) for r in layer] == [("weight", "W", ()), ("bias", "q_bias", (0, 2, 6)),
                                                        ("bias", "v_bias", (4, 6, 6))]
    assert g.total_params == 24 + 4 and g.params.tolist() == [30]  # the alignment counts the bias whole
    bias = role_arrays(layer, arrays)["bias"]
    np.testing.assert_array_equal(bias, np.concatenate([arrays["q_bias"], np.zeros(2), arrays["v_bias"]]))
    for r in layer[1:]:
        np.testing.assert_array_equal(to_source(r, bias), arrays[r.key])
    # a transform that keeps the zeros writes each piece's rows; one that does not is reported, the zeros untouched
    kept = transfer_layers(g, arrays, lambda c, v: {k: (a * 2, None, "double") for k, a in v.items()})
    assert kept.unkept == [] and set(kept.weights) == {"W", "q_bias", "v_bias"}
    np.testing.assert_array_equal(kept.weights["v_bias"], arrays["v_bias"] * 2)
    broken = transfer_layers(g, arrays, lambda c, v: {k: (a + 1, None, "shift") for k, a in v.items()})
    assert broken.unkept == [g.layer_names[0]]
    np.testing.assert_array_equal(broken.weights["q_bias"], arrays["q_bias"] + 1)
