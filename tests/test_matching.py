"""Alignment: the compiled DP against a plain-Python reference, score properties (hypothesis) on synthetic arrays
and hand-built graphs, and the contract on real torch families (self 1.0, sub-network >= 0.95, narrower < 1,
unrelated near 0)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import keeper
from keeper.graph import Kind, LayerGraph, load_graph
from keeper.matching import (
    DEFAULT_RULES,
    Alignment,
    MatchArrays,
    MatchRules,
    PackedParents,
    align,
    match_arrays,
    score_many,
    signature,
    similarity,
    upper_bounds,
)

import nets

# ------------------------------------------------------------------------------------------ reference DP


def _gain(c: MatchArrays, i: int, p: MatchArrays, j: int) -> int:
    g = 1
    for d in range(5):
        g *= min(int(c.shape[i, d]), int(p.shape[j, d]))
    return g + min(int(c.vectors[i]), int(p.vectors[j])) * min(int(c.shape[i, 0]), int(p.shape[j, 0]))


def reference_inherited(p: MatchArrays, c: MatchArrays) -> int:
    """The textbook DP: most child elements inherited by an order-preserving one-to-one matching of equal classes."""
    m, n = c.n, p.n
    f = [[0] * (n + 1) for _ in range(m + 1)]
    for i in range(1, m + 1):
        for j in range(1, n + 1):
            best = max(f[i - 1][j], f[i][j - 1])
            if c.cls[i - 1] == p.cls[j - 1]:
                best = max(best, f[i - 1][j - 1] + _gain(c, i - 1, p, j - 1))
            f[i][j] = best
    return f[m][n]


def arrays(cls, shape, vectors) -> MatchArrays:
    """MatchArrays of a synthetic graph whose total is the sum of its own layers, as for a LayerGraph."""
    cls = np.asarray(cls, dtype=np.int32).reshape(-1)
    shape = np.asarray(shape, dtype=np.int64).reshape(-1, 5)
    vectors = np.asarray(vectors, dtype=np.int64).reshape(-1)
    total = int((shape.prod(axis=1) + vectors * shape[:, 0]).sum())
    zeros = np.zeros(len(cls), dtype=np.int64)
    extra = {name: zeros for name in MatchArrays.__dataclass_fields__ if name not in
             ("cls", "shape", "vectors", "total")}  # tie-break costs: they never change the score
    return MatchArrays(cls=cls, shape=shape, vectors=vectors, total=total, **extra)


@st.composite
def synthetic(draw, max_layers: int = 14, min_layers: int = 0) -> MatchArrays:
    n = draw(st.integers(min_layers, max_layers))
    cls = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    rank = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    shape = np.ones((n, 5), dtype=np.int64)
    for i in range(n):
        dims = draw(st.lists(st.integers(1, 9), min_size=rank[i], max_size=rank[i]))
        shape[i, :rank[i]] = dims
    vectors = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    return arrays(cls, shape, vectors)


def _take(a: MatchArrays, rows) -> MatchArrays:
    rows = np.asarray(rows, dtype=np.int64)
    return arrays(a.cls[rows], a.shape[rows], a.vectors[rows])


@settings(max_examples=150, deadline=None)
@given(p=synthetic(), c=synthetic())
def test_compiled_scores_equal_the_reference_dp(p, c):
    ref = reference_inherited(p, c)
    expected = ref / c.total if c.total else 0.0
    assert similarity(p, c) == expected
    assert score_many([p], c).tolist() == [expected]
    a = align(p, c)
    assert a.inherited == ref and a.child_total == c.total and a.score == expected


@settings(max_examples=100, deadline=None)
@given(p=synthetic(), c=synthetic())
def test_align_pairs_are_a_valid_one_to_one_order_preserving_matching(p, c):
    a = align(p, c)
    assert a.pairs.shape == (c.n,)
    matched = [(i, int(j)) for i, j in enumerate(a.pairs) if j >= 0]
    parents = [j for _, j in matched]
    assert parents == sorted(set(parents))  # one-to-one, in order
    assert all(c.cls[i] == p.cls[j] for i, j in matched)
    assert sum(_gain(c, i, p, j) for i, j in matched) == a.inherited
    assert all(_gain(c, i, p, j) > 0 for i, j in matched)


@settings(max_examples=100, deadline=None)
@given(p=synthetic(), c=synthetic(min_layers=1))
def test_score_bounds_and_no_double_counting(p, c):
    s = similarity(p, c)
    assert 0.0 <= s <= 1.0
    inherited = align(p, c).inherited
    # every parent element feeds at most one child element: branches and merges cannot count twice
    assert inherited <= min(p.total, c.total)
    assert similarity(c, c) == 1.0


@settings(max_examples=80, deadline=None)
@given(c=synthetic(min_layers=1), data=st.data())
def test_a_sub_network_of_the_parent_inherits_everything(c, data):
    keep = data.draw(st.lists(st.booleans(), min_size=c.n, max_size=c.n))
    if not any(keep):
        keep[0] = True
    child = _take(c, [i for i, k in enumerate(keep) if k])
    assert similarity(c, child) == 1.0
    pairs = align(c, child).pairs
    assert np.all(pairs >= 0) and np.all(np.diff(pairs) > 0)
    assert np.array_equal(c.cls[pairs], child.cls)
    assert all(_gain(child, i, c, int(j)) == _gain(child, i, child, i) for i, j in enumerate(pairs))  # whole layers


@settings(max_examples=60, deadline=None)
@given(p=synthetic(min_layers=1), c=synthetic(min_layers=1), extra=synthetic(min_layers=1), data=st.data())
def test_more_parent_layers_never_lower_the_score(p, c, extra, data):
    at = data.draw(st.integers(0, p.n))
    rows = np.concatenate([p.cls[:at], extra.cls, p.cls[at:]])
    bigger = arrays(rows, np.concatenate([p.shape[:at], extra.shape, p.shape[at:]]),
                    np.concatenate([p.vectors[:at], extra.vectors, p.vectors[at:]]))
    assert similarity(bigger, c) >= similarity(p, c)


@settings(max_examples=60, deadline=None)
@given(c=synthetic(min_layers=1), data=st.data())
def test_a_narrower_parent_scores_strictly_below_one_on_synthetic_graphs(c, data):
    wide = [(i, d) for i in range(c.n) for d in range(5) if c.shape[i, d] > 1]
    assume(wide)
    i, d = data.draw(st.sampled_from(wide))
    shape = c.shape.copy()
    shape[i, d] -= 1
    assert similarity(arrays(c.cls, shape, c.vectors), c) < 1.0


@settings(max_examples=60, deadline=None)
@given(parents=st.lists(synthetic(), max_size=6), c=synthetic())
def test_score_many_equals_similarity_and_bounds_hold(parents, c):
    expected = [similarity(p, c) for p in parents]
    assert score_many(parents, c).tolist() == expected
    assert score_many(PackedParents.pack(parents), c).tolist() == expected
    sigs = np.stack([signature(p) for p in parents]) if parents else np.zeros((0, 64), dtype=np.int64)
    bounds = upper_bounds(sigs, c)
    assert bounds.shape == (len(parents),)
    assert all(b >= s - 1e-12 for b, s in zip(bounds.tolist(), expected))


def test_empty_and_degenerate_inputs():
    empty = arrays([], np.zeros((0, 5)), [])
    one = arrays([1], [[4, 3, 1, 1, 1]], [1])
    assert similarity(one, empty) == 0.0 and similarity(empty, one) == 0.0
    assert score_many([], one).shape == (0,)
    assert score_many([empty, one], one).tolist() == [0.0, 1.0]
    a = align(empty, one)
    assert a.pairs.tolist() == [-1] and a.inherited == 0 and a.score == 0.0


# ------------------------------------------------------------------------------------------ hand-built graphs

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
BLOCKS = st.lists(BLOCK, min_size=1, max_size=8)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=BLOCKS, data=st.data())
def test_generated_sub_networks_score_at_least_095(blocks, data):
    parent = load_graph(nets.cnn_onnx(blocks, in_channels=4, seed=1))
    keep = data.draw(st.lists(st.booleans(), min_size=len(blocks), max_size=len(blocks)))
    child_blocks = nets.drop_blocks(blocks, keep)
    child = load_graph(nets.cnn_onnx(child_blocks, in_channels=4, seed=2))
    assert similarity(parent, parent) == 1.0
    assert similarity(parent, child) >= 0.95
    if child_blocks == list(blocks):
        assert similarity(parent, child) == 1.0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=BLOCKS, b=BLOCKS)
def test_generated_pairs_stay_in_bounds(a, b):
    ga, gb = load_graph(nets.cnn_onnx(a, in_channels=4)), load_graph(nets.cnn_onnx(b, in_channels=4))
    for p, c in ((ga, gb), (gb, ga)):
        s = similarity(p, c)
        assert 0.0 <= s <= 1.0
        assert align(p, c).inherited <= p.total_params
        assert score_many([p, c], c).tolist() == [s, 1.0]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=BLOCKS)
def test_a_generated_child_twice_as_wide_inherits_part(blocks):
    def widen(blk):
        if blk[0] == "conv":
            return ("conv", 2 * blk[1]) + blk[2:]
        if blk[0] == "branch":
            return ("branch", tuple(2 * w for w in blk[1]), blk[2])
        return blk
    blocks = [("conv", 4, 3, True)] + list(blocks)
    narrow = load_graph(nets.cnn_onnx(blocks, in_channels=4))
    wide = load_graph(nets.cnn_onnx([widen(b) for b in blocks], in_channels=4))
    assert 0.0 < similarity(narrow, wide) < 1.0
    assert similarity(wide, narrow) == 1.0  # every narrow layer is a slice of its wide counterpart


def test_parallel_branches_are_not_counted_twice():
    # the child has two identical parallel branches where the parent has one: only one can inherit
    parent = load_graph(nets.cnn_onnx([("conv", 8, 3, False), ("res", 3)], in_channels=4))
    child = load_graph(nets.cnn_onnx([("conv", 8, 3, False), ("branch", (8, 8), 3), ("res", 3)], in_channels=4))
    a = align(parent, child)
    assert a.inherited <= parent.total_params
    assert len(set(int(j) for j in a.pairs if j >= 0)) == int((a.pairs >= 0).sum())
    assert a.score < 1.0


# ------------------------------------------------------------------------------------------ torch families

SUB_NETWORKS = {
    "resnet": ({"blocks": [3, 2]}, {"blocks": [1, 1]}),
    "vgg": ({"depths": [3, 2]}, {"depths": [1, 2]}),
    "mobilenetv2": ({"blocks": [3, 2]}, {"blocks": [1, 1]}),
    "transformer": ({"layers": 4}, {"layers": 2}),
}
NARROWER = {
    "resnet": {"widths": [6, 12]},
    "vgg": {"widths": [6, 16]},
    "mobilenetv2": {"widths": [8, 12]},
    "transformer": {"d_model": 12, "ffn": 24},
}


def graph_of(family: str, exporter: str = "torchscript", mode: str = "keep", **overrides) -> LayerGraph:
    return load_graph(nets.family_onnx(nets.spec(family, **overrides), exporter, mode))


@pytest.mark.parametrize("mode", nets.MODES)
@pytest.mark.parametrize("family", sorted(SUB_NETWORKS))
def test_identical_architectures_score_exactly_one(family, mode):
    g = graph_of(family, mode=mode)
    other = load_graph(nets.export_onnx(*nets.build(nets.spec(family), seed=5), "torchscript", mode))
    assert similarity(g, other) == 1.0 and similarity(other, g) == 1.0
    assert align(g, other).pairs.tolist() == list(range(g.num_layers))


@pytest.mark.parametrize("mode", nets.MODES)
@pytest.mark.parametrize("family", sorted(SUB_NETWORKS))
def test_a_sub_network_child_scores_at_least_095(family, mode):
    big, small = SUB_NETWORKS[family]
    parent, child = graph_of(family, mode=mode, **big), graph_of(family, mode=mode, **small)
    assert similarity(parent, child) >= 0.95
    assert similarity(child, parent) < 0.95  # the deeper model has layers the shallow one cannot give
    a = align(parent, child)
    matched = a.pairs[a.pairs >= 0]
    assert np.all(np.diff(matched) > 0)
    pa, ca = match_arrays(parent), match_arrays(child)
    for ci, pi in enumerate(a.pairs.tolist()):  # every child layer inherits whole from a layer of its own kind
        assert pi >= 0
        assert child.layer_kind[ci] == parent.layer_kind[pi]
        assert _gain(ca, ci, pa, pi) == child.params[ci]
    tp = a.tensor_pairs(parent, child)
    assert set(tp) == {r.key for refs in child.tensors for r in refs} and None not in tp.values()


def test_sub_network_across_exporters():
    parent = graph_of("resnet", "torchscript", "eval", **SUB_NETWORKS["resnet"][0])
    child = graph_of("resnet", "dynamo", "eval")  # the base spec (shared with test_graph's export) is smaller
    assert similarity(parent, child) >= 0.95


@pytest.mark.parametrize("family", sorted(NARROWER))
def test_a_narrower_parent_scores_strictly_below_one(family):
    narrow, child = graph_of(family, **NARROWER[family]), graph_of(family)
    assert 0.3 < similarity(narrow, child) < 1.0
    assert similarity(child, narrow) == 1.0  # the wider model holds every narrow tensor as a slice


@pytest.mark.parametrize("cnn", ["resnet", "vgg", "mobilenetv2"])
def test_unrelated_models_score_near_zero(cnn):
    a, t = graph_of(cnn), graph_of("transformer")
    assert similarity(a, t) < 0.1 and similarity(t, a) < 0.1
    tokens = load_graph(nets.extra_onnx("tokens"))
    assert similarity(a, tokens) < 0.1 and similarity(tokens, a) < 0.1


def _role(name: str) -> str:
    """A layer's role in its block: its name without the block or stage index (``blocks.3/bn1`` -> ``bn1``)."""
    return name.rsplit("/", 2)[-2]


def _block(name: str) -> str:
    return name.split("/")[2] if name.startswith("/blocks/") else name


@pytest.mark.parametrize("parent_blocks,child_blocks", [([2, 2], [1, 2]), ([2, 2], [2, 1]), ([1, 3], [1, 2])])
def test_a_dropped_residual_block_goes_whole_and_every_layer_keeps_its_role(parent_blocks, child_blocks):
    # every BatchNorm of one width inherits equally from every other, so only structure (what feeds a layer,
    # where a run of dropped layers may start and end) keeps the stem's norm on the stem's and a block whole
    base = dict(family="resnet", dim=1, in_channels=1, num_classes=10, input_length=32, widths=[8, 16], kernel=3)
    parent = load_graph(nets.family_onnx({**base, "blocks": parent_blocks}))
    child = load_graph(nets.family_onnx({**base, "blocks": child_blocks}))
    al = align(parent, child)
    assert al.score == 1.0  # a sub-network inherits everything
    matched = set(al.pairs.tolist())
    for ci, pi in enumerate(al.pairs.tolist()):
        assert pi >= 0 and _role(child.layer_names[ci]) == _role(parent.layer_names[pi]), \
            (child.layer_names[ci], parent.layer_names[pi] if pi >= 0 else None)
    dropped = [parent.layer_names[j] for j in range(parent.num_layers) if j not in matched]
    assert len({_block(n) for n in dropped}) == 1 and sorted(_role(n) for n in dropped) == \
        ["bn1", "bn2", "conv1", "conv2"], dropped


@pytest.mark.parametrize("parent_layers,child_layers", [(4, 2), (3, 1), (2, 4), (1, 3)])
def test_blocks_pair_up_from_the_first_so_a_shallower_child_keeps_the_parents_first_blocks(parent_layers,
                                                                                           child_layers):
    # equal blocks inherit equally wherever a run of them is dropped or added: the tie goes to the first blocks,
    # so a shallower child is the parent's prefix (which computes a part of the parent's function; the parent's
    # last blocks read what its first ones wrote and start near chance without them) and a deeper child adds
    # its new blocks after the inherited ones
    parent = load_graph(nets.family_onnx(nets.spec("transformer", layers=parent_layers)))
    child = load_graph(nets.family_onnx(nets.spec("transformer", layers=child_layers)))
    pairs = align(parent, child).pairs.tolist()
    for ci, pi in enumerate(pairs):
        name = child.layer_names[ci]
        if not name.startswith("/layers."):
            assert pi >= 0 and parent.layer_names[pi] == name, (name, pi)
        elif int(name.split(".")[1].split("/")[0]) < parent_layers:
            assert pi >= 0 and parent.layer_names[pi] == name, (name, parent.layer_names[pi] if pi >= 0 else None)
        else:
            assert pi == -1, (name, parent.layer_names[pi])


def test_in_a_plain_chain_the_conv_feeding_the_next_stage_keeps_its_place():
    # a run of equal convs without residual blocks (VGG): each inherits as much from any other, but only the last
    # one feeds the pooling and the head; a deeper child's new conv goes before it, so the parent's last conv still
    # feeds the head, the warm preserves the function and its structure is whole (a parent once fell under the
    # floor for this: its last conv was paired with a middle one)
    from keeper.choice.preservation import assess

    base = dict(family="vgg", dim=1, in_channels=1, num_classes=10, input_length=32, widths=[8, 16], kernel=3)
    parent = load_graph(nets.family_onnx({**base, "depths": [1, 2]}))
    child = load_graph(nets.family_onnx({**base, "depths": [1, 3]}))
    al = align(parent, child)
    last = child.layer_names.index("/features/features.10/Conv")
    assert parent.layer_names[al.pairs[last]] == "/features/features.7/Conv"
    fit = assess(parent, child, al)
    assert fit.preserved and fit.structure == 1.0, fit


def test_a_widened_stage_keeps_its_own_blocks_and_streams():
    # widening stage 1 and dropping a stage-2 block: the parent's stage-2 blocks are wider than its stage-1 ones,
    # so pairing the child's stage-1 blocks with them inherits more elements, but those channels belong to
    # another residual stream at another resolution (the warmed child started at chance that way)
    base = dict(family="resnet", dim=1, in_channels=1, num_classes=10, input_length=32, kernel=7)
    parent = load_graph(nets.family_onnx({**base, "widths": [24, 32], "blocks": [2, 3]}))
    child = load_graph(nets.family_onnx({**base, "widths": [36, 32], "blocks": [2, 2]}))
    pairs = align(parent, child).pairs.tolist()
    stage_of = {"blocks.0": 1, "blocks.1": 1, "blocks.2": 2, "blocks.3": 2, "blocks.4": 2}
    for ci, pi in enumerate(pairs):
        cb, pb = _block(child.layer_names[ci]), _block(parent.layer_names[pi]) if pi >= 0 else None
        assert pi >= 0, f"{child.layer_names[ci]} is left unmatched"
        assert _role(child.layer_names[ci]) == _role(parent.layer_names[pi])
        assert stage_of.get(cb, cb) == stage_of.get(pb, pb), (child.layer_names[ci], parent.layer_names[pi])
        if cb in ("blocks.0", "blocks.1", "blocks.2"):  # the same blocks up to the transition; block 3 or 4 after
            assert cb == pb, (child.layer_names[ci], parent.layer_names[pi])
    assert np.array_equal(child.in_level, parent.in_level[pairs]) and \
        np.array_equal(child.out_level, parent.out_level[pairs])


@pytest.mark.parametrize("parent,child", [
    (dict(family="mlp", widths=[48, 48, 24, 24, 24, 24]), dict(family="mlp", widths=[48, 48, 48, 24, 24])),
    (dict(family="vgg", widths=[15, 40], depths=[2, 2], kernel=5), dict(family="vgg", widths=[15, 40], depths=[1, 2],
                                                                       kernel=7)),
])
def test_a_shorter_child_keeps_the_parents_stem_and_head(parent, child):
    # the head's and the stem's shapes fit inside hidden layers too, with equal inheritance; dropping the parent's
    # head or stem instead of a hidden layer loses the function (the head is the classifier)
    base = dict(dim=1, in_channels=1, num_classes=10, input_length=32)
    pg = load_graph(nets.family_onnx({**base, **parent}))
    cg = load_graph(nets.family_onnx({**base, **child}))
    pairs = align(pg, cg).pairs
    assert pairs[0] == 0 and pairs[-1] == pg.num_layers - 1, [pg.layer_names[j] for j in pairs]
    if parent["family"] == "vgg":  # the stem's norm too
        assert _role(pg.layer_names[pairs[1]]) == _role(cg.layer_names[1])


def test_partial_match_new_head_and_extra_layers():
    parent = graph_of("resnet")
    child = graph_of("resnet", num_classes=9, blocks=[3, 1])
    s = similarity(parent, child)
    assert 0.5 < s < 1.0
    a = align(parent, child)
    assert a.pairs[-1] == parent.num_layers - 1  # the new head still inherits the rows it can
    assert (a.pairs == -1).sum() >= 2  # the extra block's layers start fresh


def test_public_entry_points_take_bytes_paths_and_graphs(tmp_path):
    data = nets.family_onnx(nets.spec("vgg"))
    path = tmp_path / "vgg.onnx"
    path.write_bytes(data)
    g = load_graph(data)
    assert keeper.similarity(data, path) == keeper.similarity(g, g) == 1.0
    a = keeper.align(str(path), g)
    assert isinstance(a, Alignment) and a.score == 1.0
    assert score_many([data, g, match_arrays(g)], path).tolist() == [1.0, 1.0, 1.0]


def test_match_rules_are_pluggable():
    r, t = graph_of("resnet"), graph_of("transformer")
    anything = MatchRules(node_class=lambda g: np.zeros(g.num_layers, dtype=np.int32))
    assert similarity(r, t, anything) > similarity(r, t, DEFAULT_RULES)
    by_kind_only = MatchRules(node_class=lambda g: g.layer_kind.astype(np.int32))
    assert similarity(r, r, by_kind_only) == 1.0


def test_real_graphs_batch_scores_and_bounds_agree():
    graphs = [graph_of(f) for f in ("resnet", "vgg", "mobilenetv2", "transformer")]
    graphs += [graph_of(f, **SUB_NETWORKS[f][1]) for f in SUB_NETWORKS]
    mas = [match_arrays(g) for g in graphs]
    packed = PackedParents.pack(mas)
    sigs = np.stack([signature(m) for m in mas])
    for c in mas:
        batch = score_many(packed, c)
        assert batch.tolist() == [similarity(p, c) for p in mas]
        assert np.all(upper_bounds(sigs, c) >= batch - 1e-12)
        assert np.all((batch >= 0) & (batch <= 1))


def test_kinds_never_match_across_classes():
    g = graph_of("mobilenetv2")
    a = align(g, g)
    assert np.array_equal(g.layer_kind[a.pairs], g.layer_kind)
    dw = g.layer_kind == Kind.DWCONV
    assert dw.any() and np.all(g.layer_kind[a.pairs[dw]] == Kind.DWCONV)
