"""Real architectures (hf_catalogue: Hugging Face transformers built from small configs, random init):
every learned tensor is read and a warm from a parent of the same architecture is exact, with both exporters;
tied weights are transferred once, counted once and written back under every key; constant tables are no layers;
a warm that leaves a tensor behind says so and scores below 1.

The dynamo exporter is slow, so the suite runs it on the models whose dynamo graphs differ in kind from their
TorchScript ones (GatherND lookups, RoPE as a broadcast Mul, tied weights, class tokens, a bias table shared by all
blocks); ``scripts/bench_coverage.py`` runs every model with both exporters. The torch front end (``dynamo=None``,
the default) runs on every model and must read each without falling back to an exporter.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

import nets
from keeper.errors import PartialWarmWarning, TraceFallbackWarning
from keeper.graph import load_graph
from keeper.torch_support import export_graph, module_weights, register, warm_start
from keeper.torch_support.tensors import tied_keys
from keeper.zoo import Zoo
from hf_catalogue import CATALOGUE, build

TORCHSCRIPT = ["gpt2", "bert", "distilbert", "vit", "deit", "swin", "levit", "t5-encoder", "llama", "convnext",
               "resnet"]
DYNAMO = ["gpt2", "deit", "swin", "t5-encoder", "llama"]
CASES = [(m, False) for m in TORCHSCRIPT] + [(m, True) for m in DYNAMO] + [(m, None) for m in TORCHSCRIPT]
PATHS = {False: "torchscript", True: "dynamo", None: "trace"}
EXACT = 1e-5  # float32 round-off of an exact copy is ~1e-7; a tensor left at the child's init gives ~1


rel_dev = nets.rel_dev


def warm_pair(root, parent: torch.nn.Module, child: torch.nn.Module, args: tuple,
              dynamo: bool | None) -> SimpleNamespace:
    """Register ``parent`` in a fresh zoo, warm ``child`` from it; the child's graph, the result and the
    warnings raised. On the torch front end's path (``dynamo=None``) a fallback to the exporter fails the test."""
    zoo = Zoo(str(root / "zoo"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceFallbackWarning)
        register(parent, args, zoo, 0.9, name="parent", config={"dynamo": dynamo})
        exported = export_graph(child, args, dynamo=dynamo)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PartialWarmWarning)
        result = warm_start(child, args, zoo, noise=0.0, config={"dynamo": dynamo})
    partial = [str(w.message) for w in caught if issubclass(w.category, PartialWarmWarning)]
    with torch.no_grad():
        dev = rel_dev(parent(*args), child(*args))
    return SimpleNamespace(graph=load_graph(exported.onnx), result=result, partial=partial, dev=dev,
                           parent=parent, child=child, args=args, zoo=zoo, exported=exported)


@pytest.fixture(scope="module")
def warm_case(tmp_path_factory):
    """(model name, dynamo) -> its same-architecture warm (parent seed 1, child seed 2), each made once."""
    done: dict[tuple[str, bool], SimpleNamespace] = {}

    def get(name: str, dynamo: bool) -> SimpleNamespace:
        if (name, dynamo) not in done:
            parent, args = build(name, seed=1)
            child, _ = build(name, seed=2)
            with torch.no_grad():
                cold = rel_dev(parent(*args), child(*args))
            out = warm_pair(tmp_path_factory.mktemp(name), parent, child, args, dynamo)
            out.name, out.cold = name, cold
            done[(name, dynamo)] = out
        return done[(name, dynamo)]

    return get


@pytest.fixture(params=CASES, ids=[f"{m}-{PATHS[d]}" for m, d in CASES])
def warmed(request, warm_case):
    return warm_case(*request.param)


def test_same_architecture_warm_is_exact(warmed):
    assert warmed.cold > 0.1, "the two inits must differ, or exactness proves nothing"
    assert warmed.dev < EXACT, f"{warmed.name}: deviation {warmed.dev:.3g} after a same-architecture warm"
    assert warmed.result.load.missing == [] and warmed.partial == []
    assert warmed.result.score == 1.0


def test_every_learned_element_is_read_once(warmed):
    learned = sum(p.numel() for p in warmed.child.parameters())  # parameters() yields a tied tensor once
    assert warmed.graph.unread == {}
    assert warmed.graph.total_params == learned


@pytest.mark.parametrize("dynamo", [False, True, None], ids=["torchscript", "dynamo", "trace"])
def test_tied_weights_transfer_once_count_once_and_load_under_both_keys(warm_case, dynamo):
    out = warm_case("gpt2", dynamo)
    parent, child = out.parent, out.child
    wte, head = "model.transformer.wte.weight", "model.lm_head.weight"
    assert tied_keys(dict(child.state_dict(keep_vars=True)))[wte] == (wte, head)
    sources = [r.source for refs in out.graph.tensors for r in refs]
    shared = [s for s in set(sources) if sources.count(s) > 1]
    assert len(shared) == 1, "the embedding and the LM head read one tensor"
    (n_vocab, d) = parent.state_dict()[wte].shape
    assert out.graph.shared_params == n_vocab * d
    assert out.graph.total_params == sum(p.numel() for p in child.parameters())
    state = child.state_dict()
    assert torch.equal(state[wte], parent.state_dict()[wte]) and torch.equal(state[head], parent.state_dict()[wte])
    assert out.result.load.missing == [] and out.result.score == 1.0


@pytest.mark.parametrize("dynamo", [True, None], ids=["dynamo", "trace"])
def test_constant_tables_are_no_layers(warm_case, dynamo):
    """Llama under dynamo and the torch front end: rotary cos/sin (from inv_freq), the mask and the position ids
    are constants; the layers are exactly the learned tensors (each norm, projection and the embedding is one
    layer)."""
    out = warm_case("llama", dynamo)
    model, graph = out.child, out.graph
    learned = [k for k, _ in model.named_parameters()]
    assert graph.num_layers == len(learned)
    assert graph.unread == {} and graph.total_params == sum(p.numel() for p in model.parameters())
    assert not any("inv_freq" in r.source for refs in graph.tensors for r in refs)


class _GatedViT(torch.nn.Module):
    """ViT with a learned gate read through a softmax on its output: an op no layer rule takes."""

    def __init__(self, seed: int):
        super().__init__()
        self.vit, self.args = build("vit", seed=seed)
        self.gate = torch.nn.Parameter(torch.randn(32, generator=torch.Generator().manual_seed(seed)))

    def forward(self, x):
        return self.vit(x) * torch.softmax(self.gate, 0)


@pytest.mark.parametrize("dynamo", [False, None], ids=["torchscript", "trace"])
def test_a_partial_warm_warns_and_scores_below_one(tmp_path, dynamo):
    parent, child = _GatedViT(1), _GatedViT(2)
    out = warm_pair(tmp_path, parent, child, parent.args, dynamo=dynamo)
    assert out.graph.unread == {"gate": 32}
    assert out.result.load.missing == ["gate"]
    assert len(out.partial) == 1 and ": gate " in out.partial[0]
    total = sum(p.numel() for p in child.parameters())
    assert out.result.score == pytest.approx((total - 32) / total) and out.result.score < 1.0
    assert torch.equal(child.vit.state_dict()["model.embeddings.cls_token"],
                       parent.vit.state_dict()["model.embeddings.cls_token"]), "the rest is inherited"
    # without torch, the zoo's own warm names the tensor too (its ONNX name)
    assert out.zoo.warm(out.exported.onnx, weights=module_weights(child, out.exported), noise=0.0).missing == ["gate"]


def test_the_catalogue_builds_seeded_models():
    a, args = build("distilbert", seed=3)
    b, _ = build("distilbert", seed=3)
    c, _ = build("distilbert", seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not any(torch.equal(sa[k], sc[k]) for k in sa if sa[k].is_floating_point() and sa[k].numel() > 1)
    assert set(CATALOGUE) >= {"gpt2", "bert", "distilbert", "vit", "deit", "swin", "levit", "t5-encoder", "llama",
                              "convnext", "resnet", "mobilenet-v2", "efficientnet"}
    with pytest.raises(KeyError, match="not in the catalogue"):
        build("no-such-model")
