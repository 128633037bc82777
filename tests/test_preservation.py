"""Preserved function and structure of an alignment (keeper.choice.preservation), and the choice they drive in the zoo:
a same-family growth beats a cross-family slice, and a 2x-narrower same-family parent is chosen whatever the floor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import keeper
from keeper.choice.preservation import assess
from keeper.graph import load_graph
from keeper.matching import align
from keeper.torch_support import export, warm_start
from keeper_bench import families
from tests.nets import quiet, randomize, trained_like

RESNET = {"family": "resnet", "dim": 1, "in_channels": 1, "num_classes": 5, "input_length": 16,
          "widths": [8, 16], "blocks": [1, 1], "kernel": 3}
VGG = {"family": "vgg", "dim": 1, "in_channels": 1, "num_classes": 5, "input_length": 16,
       "widths": [8, 16], "depths": [1, 2], "kernel": 3}
MOBILE = {"family": "mobilenetv2", "dim": 1, "in_channels": 1, "num_classes": 5, "input_length": 16,
          "stem_width": 8, "widths": [8, 16], "blocks": [1, 1], "expansion": 2, "kernel": 3, "head_width": 32}


def _wide(s, f=2):
    out = {**s, "widths": [w * f for w in s["widths"]]}
    if "stem_width" in s:
        out.update(stem_width=s["stem_width"] * f, head_width=s["head_width"] * f)
    return out


def _model(s, seed=0):
    torch.manual_seed(seed)
    m = randomize(families.build(s), seed)
    return trained_like(m, families.example_input(s, 4), seed)


_cache: dict = {}


def _onnx(s, seed=0) -> bytes:
    key = (repr(sorted(s.items())), seed)
    if key not in _cache:
        with quiet():
            _cache[key] = export(_model(s, seed), families.example_input(s)).onnx
    return _cache[key]


def _assess(parent, child):
    p, c = load_graph(_onnx(parent)), load_graph(_onnx(child))
    return assess(p, c, align(p, c))


@pytest.mark.parametrize("child", [_wide(RESNET), {**RESNET, "blocks": [2, 1]}, {**RESNET, "kernel": 5},
                                   _wide(VGG), _wide(MOBILE),
                                   {**MOBILE, "blocks": [1, 2]}])
def test_growth_preserves_function_with_full_structure(child):
    fam = {"resnet": RESNET, "vgg": VGG, "mobilenetv2": MOBILE}[child["family"]]
    a = _assess(fam, child)
    assert a.preserved, a.why
    assert a.structure == 1.0


@pytest.mark.parametrize("parent, child", [(_wide(RESNET), RESNET), (RESNET, VGG), (RESNET, MOBILE),
                                           ({**RESNET, "kernel": 5}, RESNET)])
def test_slicing_and_crossing_structures_do_not_preserve(parent, child):
    a = _assess(parent, child)
    assert not a.preserved and a.why
    if parent["family"] != child["family"]:
        # a plain chain onto residual branches, or full convs into pointwise ones, counts for less
        assert a.structure < 0.75
    else:
        assert a.structure == 1.0  # same blocks, only sliced


VGG1 = {**VGG, "depths": [1, 1]}  # a stage of one conv: deepened, its old conv feeds the new one, not the head


@pytest.mark.parametrize("child", [{**VGG1, "depths": [2, 2]}, _wide({**VGG1, "depths": [2, 2]}),
                                   _wide({**VGG1, "depths": [2, 2], "kernel": 5})],
                         ids=["deeper", "wider deeper", "wider deeper kernel"])
def test_deepened_plain_chain_preserves_function_with_full_structure(child):
    """The new conv-BatchNorm-ReLU starts as the identity: its ReLU meets the stage's earlier ReLU's outputs."""
    a = _assess(VGG1, child)
    assert a.preserved, a.why
    assert a.structure == 1.0


@pytest.mark.parametrize("norm", ["none", "batchnorm"])
def test_a_new_square_layer_goes_after_the_first_not_onto_the_raw_input(norm):
    """An MLP whose hidden width equals its input size, deepened: either hidden layer could take the parent's, but
    a new one first would put its ReLU on the raw input."""
    mlp = {"family": "mlp", "dim": 1, "in_channels": 1, "num_classes": 5, "input_length": 16, "widths": [16],
           "norm": norm}
    a = _assess(mlp, {**mlp, "widths": [16, 16]})
    assert a.preserved, a.why


class _ConvChain(torch.nn.Module):
    """conv-BatchNorm-activation per width, a mean over positions, a Linear head."""

    def __init__(self, widths, act=torch.nn.ReLU):
        super().__init__()
        layers, cin = [], 1
        for w in widths:
            layers += [torch.nn.Conv1d(cin, w, 3, padding=1), torch.nn.BatchNorm1d(w), act()]
            cin = w
        self.body = torch.nn.Sequential(*layers)
        self.head = torch.nn.Linear(cin, 5)

    def forward(self, x):
        return self.head(self.body(x).mean(-1))


@pytest.mark.parametrize("child, act, exact", [([8, 8, 16, 16], torch.nn.ReLU, True),
                                               ([8, 8, 16], torch.nn.GELU, False),
                                               ([1, 8, 16], torch.nn.ReLU, False)],
                         ids=["relu after relu", "gelu after gelu", "relu on the input"])
def test_a_chain_insert_is_preserved_only_where_its_activation_changes_nothing(child, act, exact):
    """An identity conv brings its activation along: a ReLU on a ReLU's outputs changes nothing, a GELU on a
    GELU's does, and so does a ReLU on the raw input (the new conv before the first one)."""
    from hf_growth import warm_deviation

    torch.manual_seed(0)
    parent, grown = _ConvChain([8, 16], act).eval(), randomize(_ConvChain(child, act), 1).eval()
    with quiet():
        r = warm_deviation(parent, grown, (torch.randn(4, 1, 16),), dynamo=False)
    assert r.preserved == exact
    assert (r.warm <= 1e-4) == exact, f"deviation {r.warm:.2e}"  # the claim, where made, is exact; else it would lie


def test_widened_deepened_plain_chain_child_warms_from_its_only_relative(tmp_path):
    """The zoo holds one VGG; the child is 2x wider with one more conv per stage (similarity below the floor)."""
    zoo = _zoo(tmp_path, vgg=(VGG1, 0.8))
    child = _wide({**VGG1, "depths": [2, 2]})
    model, x = randomize(families.build(child), 3).eval(), families.example_input(child, 4)
    with quiet():
        r = warm_start(model, families.example_input(child), zoo, noise=0.0)
    assert r.parent == "vgg" and r.preserved and r.score < zoo.config.selection.floor, r.reason
    with torch.no_grad():
        want, got = _model(VGG1, seed=len("vgg")).eval()(x), model.eval()(x)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-4


def _zoo(tmp_path, **models):
    zoo = keeper.Zoo(str(tmp_path / "zoo"), keeper.ZooConfig(outlier_z=None))
    for name, (s, acc) in models.items():
        zoo.register(_onnx(s, seed=len(name)), acc, name)
    return zoo


def test_narrower_same_family_parent_is_chosen_below_the_floor_and_warms_exactly(tmp_path):
    """The floor must not reject a function-preserving growth: a ResNet whose only relative is 2x narrower."""
    zoo = _zoo(tmp_path, narrow=(RESNET, 0.8), vgg=(VGG, 0.9))
    child = _wide(RESNET)
    cands = {c.name: c for c in zoo.candidates(load_graph(_onnx(child)))}
    assert cands["narrow"].score < zoo.config.selection.floor and cands["narrow"].preserved
    model = families.build(child)
    x = families.example_input(child, 4)
    with quiet():
        r = warm_start(model, families.example_input(child), zoo, noise=0.0)
    assert r.parent == "narrow" and r.preserved and r.structure == 1.0
    assert [c["name"] for c in r.candidates][0] == "narrow" and r.candidates[0]["preserved"]
    parent = _model(RESNET, seed=len("narrow")).eval()
    with torch.no_grad():
        want, got = parent(x), model.eval()(x)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-4  # the parent's function, exactly


def test_cross_family_slice_loses_to_same_family_growth(tmp_path):
    """A VGG child: a 2x-wider ResNet covers it entirely by slicing (similarity 1.0, higher accuracy) but maps
    chains onto residual branches; the narrower VGG it grows from wins."""
    zoo = _zoo(tmp_path, resnet=(_wide(RESNET, 4), 0.95), vgg=(VGG, 0.7))
    child = _wide(VGG)
    cands = {c.name: c for c in zoo.candidates(load_graph(_onnx(child)))}
    assert cands["resnet"].score > cands["vgg"].score
    assert cands["resnet"].structure < 1.0 and not cands["resnet"].preserved
    legacy = keeper.choice.selection.choose_parent(cands.values(), keeper.choice.selection.SelectionPolicy(
        preserve=False, structure=False, cross_structure=True))
    assert legacy is not None and legacy.name == "resnet"  # what similarity alone picked
    with quiet():
        r = zoo.warm(_onnx(child), noise=0.0)
    assert r.parent == "vgg" and r.preserved


def test_a_cross_family_parent_is_used_only_when_a_probe_or_the_switch_vouches_for_it(tmp_path):
    """A VGG child whose zoo holds only a ResNet (fit above the floor, structure below 1, not preserved): cold,
    saying why, unless a data probe prefers the ResNet to the cold init or the policy allows it."""
    zoo = _zoo(tmp_path, resnet=(_wide(RESNET, 4), 0.95))
    child = _onnx(_wide(VGG))
    with quiet():
        cold = zoo.warm(child, noise=0.0)
        probed = zoo.warm(child, noise=0.0, probe=lambda r: 0.0 if r.parent else 1.0)
        refused = zoo.warm(child, noise=0.0, probe=lambda r: 1.0 if r.parent else 0.0)
    assert cold.parent is None and "across block structures" in cold.reason, cold.reason
    assert cold.candidates[0]["name"] == "resnet" and cold.candidates[0]["structure"] < 1.0
    assert probed.parent == "resnet" and refused.parent is None
    loose = keeper.Zoo(zoo.uri, keeper.ZooConfig(outlier_z=None, selection=keeper.choice.selection.SelectionPolicy(
        cross_structure=True)))
    with quiet():
        assert loose.warm(child, noise=0.0).parent == "resnet"


def test_lineage_across_structures_ranks_last(tmp_path):
    """A model trained from a warm start across block structures is not clean: a clean candidate wins over it,
    and a model warmed from it inherits the taint."""
    zoo = _zoo(tmp_path, base=(RESNET, 0.7))
    zoo.register(_onnx(_wide(RESNET), seed=7), 0.9, "tainted", lineage={"parent": "x", "preserved": False,
                                                                        "structure": 0.4})
    zoo.register(_onnx(_wide(RESNET), seed=8), 0.95, "heir", lineage={"parent": "tainted", "preserved": True,
                                                                      "structure": 1.0})
    assert zoo.record("tainted").summary["lineage"]["clean"] is False
    assert zoo.record("heir").summary["lineage"]["clean"] is False
    with quiet():
        r = zoo.warm(_onnx(_wide(RESNET, 4)), noise=0.0)
    assert r.parent == "base"
    with pytest.raises(keeper.errors.AdmissionError):
        zoo.register(_onnx(VGG), 0.5, "bad", lineage={"parent": 3})


# Growth pairs walked for the no-overclaim invariant: the model families, Hugging Face models, the test nets.
# Integer and non-dividing factors, every kind of reader (LayerNorm, RMSNorm written out in ops, packed and plain
# attention, depthwise blocks, a chunk along channels). ``expect``: the flag exactness by construction requires
# (True: a claim the rules must make, so refusing everything fails; False: a growth the operators do not keep).
# Pre-norm streams grown by a factor that does not divide are exact (StreamGrowth under LayerNorms and RMSNorms,
# whole heads cloned, packed or not, a relative-position bias table with them); post-LN streams are not claimed.
# TorchScript, plus dynamo where it writes the readers differently; scripts/bench_growth.py walks them all.
def _family(growth):
    import family_growth

    fam, name = growth.split(": ")
    p, c = next((p, c) for n, p, c in family_growth.PAIRS[fam] if n == name)
    return lambda dynamo: family_growth.growth_deviation(p, c, dynamo=dynamo)


def _hf(family, parent, child):
    import hf_growth

    return lambda dynamo: hf_growth.growth_deviation(family, parent, child, dynamo=dynamo)


def _net(name, parent, child):
    from hf_growth import warm_deviation
    from tests import nets

    def run(dynamo):
        cls, make_x = nets.EXTRA[name]
        torch.manual_seed(0)
        return warm_deviation(cls(**parent).eval(), cls(**child).eval(), (make_x(),), dynamo=dynamo)
    return run


UNBIND = {"d": 32, "heads": 2}
ROPE = {**UNBIND, "rope": True}
WALK = [
    ("resnet widths x1.5", _family("resnet: widths x1.5"), False, True),
    ("mobilenetv2 expansion 4 -> 6, widths x1.5", _family("mobilenetv2: expansion 4 -> 6, widths x1.5"), False,
     True),
    ("transformer d_model x2", _family("transformer: d_model x2, heads 2 -> 4"), False, True),
    ("transformer d_model x1.5", _family("transformer: d_model x1.5, heads 2 -> 3"), False, True),
    ("post-LN transformer d_model x1.5", _family("transformer: post-LN d_model x1.5"), False, False),
    ("mlp LayerNorm widths x1.5", _family("mlp: widths x1.5, LayerNorm"), False, True),
    ("gpt2 d_model 32 -> 48, heads 4 -> 6", _hf("gpt2", {}, dict(d=48, heads=6, ffn=96)), False, True),
    ("gpt2 d_model 48 -> 64, heads 6 -> 8", _hf("gpt2", dict(d=48, heads=6, ffn=96), dict(d=64, heads=8, ffn=128)),
     True, True),
    ("llama d_model x1.5, kv heads 2 -> 3", _hf("llama", {}, dict(d=48, heads=6, kv_heads=3, ffn=96)), True, True),
    ("llama d_model x1.5, kv heads 2 -> 3, torchscript", _hf("llama", {}, dict(d=48, heads=6, kv_heads=3, ffn=96)),
     False, True),
    ("llama heads 4 -> 8 of half the size", _hf("llama", {}, dict(heads=8, kv_heads=4)), False, False),
    ("gpt2 heads 4 -> 8 of half the size (packed)", _hf("gpt2", {}, dict(heads=8)), False, False),
    ("t5 d_model x1.5, relative-position bias heads 4 -> 6", _hf("t5-encoder", {}, dict(d=48, heads=6, ffn=96)),
     False, True),
    ("vit d_model x1.5 (class token, conv patches)", _hf("vit", {}, dict(d=48, heads=6, ffn=96)), True, True),
    ("bert d_model x1.5 (post-LN)", _hf("bert", {}, dict(d=48, heads=6, ffn=96)), False, False),
    ("llama d_model x2", _hf("llama", {}, dict(d=64, heads=8, kv_heads=4, ffn=128)), True, True),
    ("convnext channels x1.5", _hf("convnext", {}, dict(d=12)), False, False),
    ("branchnet width x2", _net("branchnet", dict(width=16), dict(width=32)), False, False),
    ("token encoder d_model x1.5", _net("tokens", dict(d=16, heads=2), dict(d=24, heads=3)), False, False),
    # timm's ViT packing: qkv reshaped to (B, N, 3, heads, head size), permuted, unbound (SequenceAt for the
    # tracer, Split for TorchScript, Slice for dynamo): whole heads cloned in each part; heads of another size never
    ("unbind attention heads 2 -> 4", _net("unbind", UNBIND, {"d": 64, "heads": 4}), None, True),
    ("unbind attention heads 2 -> 4, torchscript", _net("unbind", UNBIND, {"d": 64, "heads": 4}), False, True),
    ("unbind attention heads 2 -> 4, dynamo", _net("unbind", UNBIND, {"d": 64, "heads": 4}), True, True),
    ("unbind attention heads 2 -> 3", _net("unbind", UNBIND, {"d": 48, "heads": 3}), False, True),
    ("unbind attention heads 2 -> 4 of half the size", _net("unbind", UNBIND, {"d": 32, "heads": 4}), None, False),
    ("unbind attention head size 16 -> 32", _net("unbind", UNBIND, {"d": 64, "heads": 2}), False, True),
    # RoPE between the parts and q . k (EVA-02): whole heads cloned keep it, heads grown inside do not
    ("unbind attention with RoPE heads 2 -> 4", _net("unbind", ROPE, {**ROPE, "d": 64, "heads": 4}), None, True),
    ("unbind attention with RoPE head size 16 -> 32", _net("unbind", ROPE, {**ROPE, "d": 64}), None, False),
]


@pytest.mark.parametrize("name, run, dynamo, expect", WALK, ids=[w[0] for w in WALK])
def test_preserved_implies_exact(name, run, dynamo, expect):
    with quiet():
        r = run(dynamo)
    if r.preserved:
        assert r.warm <= 1e-4, f"{name}: flagged preserved but deviates {r.warm:.2e} (child's own init {r.init:.2f})"
    assert r.preserved == expect, f"{name}: preserved {r.preserved}, deviation {r.warm:.2e}"


def test_a_layout_not_found_packed_is_never_claimed(monkeypatch):
    """Were the (3, heads, head size) layout of a packed projection not followed (here: its unpacking not found),
    its growth would copy units into other parts: refused, naming the layout, never claimed."""
    from keeper.graph.packed import PackedProjections
    from tests import nets

    monkeypatch.setattr(PackedProjections, "layout", lambda self, name, axis: None)
    x = nets.EXTRA["unbind"][1]()
    with quiet():
        p, c = (load_graph(export(nets.UnbindViT(d, h), x).onnx) for d, h in ((32, 2), (64, 4)))
    assert not any("packed" in a for a in c.attrs) and [a["unit_axes"] for a in c.attrs if "unit_axes" in a] == \
        [[3, 4, 16]] * 2
    a = assess(p, c, align(p, c))
    assert not a.preserved and "reshaped into axes (3, 2, 16) -> (3, 4, 16)" in a.why, a.why
    assert assess(p, p, align(p, p)).preserved  # its own architecture: nothing grows


def _growth_pair(family, rng, ops):
    """(parent spec, child spec, growth letters): a small member of ``family`` drawn from ``rng`` and its growth by
    ``ops`` (where the growth cannot be exact, the nearest spec where it is: see family_growth.growable)."""
    import family_growth

    dim = 1 if family == "transformer" else int(rng.choice([1, 2]))
    common = {"family": family, "dim": dim, "in_channels": 1, "num_classes": 5, "input_length": 16 if dim == 1 else 8}
    w = int(rng.choice([4, 6, 8]))
    depths = [int(d) for d in rng.integers(1, 3, int(rng.integers(1, 3)))]
    widths = [w * 2 ** i for i in range(len(depths))]
    kernel = int(rng.choice([3, 5]))
    spec = {
        "resnet": {"widths": widths, "blocks": depths, "kernel": kernel},
        "vgg": {"widths": widths, "depths": depths, "kernel": kernel},
        "mobilenetv2": {"stem_width": w, "widths": widths, "blocks": depths, "kernel": kernel,
                        "expansion": int(rng.choice([2, 3])), "head_width": 2 * widths[-1]},
        "transformer": {"d_model": w * len(depths), "heads": len(depths), "ffn": 2 * w * len(depths),
                        "layers": depths[0], "patch": 4, "pre_ln": bool(rng.random() < 0.5)},
        "mlp": {"widths": [w * 2] * len(depths), "norm": str(rng.choice(["none", "batchnorm", "layernorm"]))},
    }[family]
    parent, ops = family_growth.growable({**common, **spec}, ops)
    return parent, family_growth.grow(parent, ops), ops


@pytest.mark.parametrize("family", families.FAMILIES)
def test_drawn_growths_choose_their_parent_and_keep_its_function(tmp_path, family):
    """Widen, deepen, grow kernels, all together and a drawn few of them, over residual, plain-chain, depthwise,
    transformer and MLP families (seeded draws): the zoo's parent is chosen over a more accurate model of another
    family, flagged preserved, and the warmed child computes its function."""
    rng = np.random.default_rng(families.FAMILIES.index(family))
    drawn = str(rng.choice(["w", "d", "k", "wd", "wk", "dk"]))
    for i, ops in enumerate(["wdk", drawn]):
        parent, child, ops = _growth_pair(family, rng, ops)
        other = RESNET if family == "vgg" else VGG
        zoo = keeper.Zoo(str(tmp_path / f"zoo{i}"), keeper.ZooConfig(outlier_z=None))
        zoo.register(_onnx(parent), 0.8, "parent")
        zoo.register(_onnx(other), 0.99, "other")
        model = randomize(families.build(child), 5).eval()
        with quiet():
            r = warm_start(model, families.example_input(child), zoo, noise=0.0)
        assert r.parent == "parent" and r.preserved, f"{ops} {parent} -> {child}: {r.reason}"
        x = families.example_input(parent, 4)
        with torch.no_grad():
            want, got = _model(parent).eval()(x), model.eval()(x)
        assert float((got - want).abs().max() / want.abs().max()) <= 1e-4, f"{ops} {parent} -> {child}"
