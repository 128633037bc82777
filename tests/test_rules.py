"""Graph rules for tensors a module reads through computation (keeper/graph/rules.py, reader.py, fold.py): a bias
with rows zeroed in the forward pass, a small network run on a constant table, a scale read through clamp and exp
(Swin V2's window attention, small), each read, warmed exactly from its own architecture through torch, and never
claimed preserved by a growth that is not exact."""

from __future__ import annotations

import math
import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F

import nets
from keeper.errors import PartialWarmWarning
from keeper.graph import LayerGraph, load_graph
from keeper.graph.fold import fold_ints
from keeper.graph.reader import ModelReader
from keeper.graph.types import INPUT_ROLE
from keeper.torch_support import export_graph, register, warm_start
from keeper.zoo import Zoo


class _CosineAttention(torch.nn.Module):
    """Swin V2's window attention over ``tokens`` positions: the qkv bias is the parameter with the key's rows zeroed
    in the forward pass; a position-bias MLP runs on a constant coordinate table (a persistent buffer), its output
    gathered by a constant index, through a sigmoid, added to the scores; a per-head logit scale is read through
    clamp and exp."""

    def __init__(self, heads: int = 2, head: int = 4, dim: int = 8, tokens: int = 5, hidden: int = 16,
                 gathered: bool = False):
        super().__init__()
        self.heads, self.head, self.inner, self.gathered = heads, head, heads * head, gathered
        self.qkv = torch.nn.Linear(dim, 3 * self.inner)  # the key's bias rows stay as initialised: never read
        self.proj = torch.nn.Linear(self.inner, dim)
        self.logit_scale = torch.nn.Parameter(math.log(10.0) + 0.5 * torch.randn(heads, 1, 1))
        self.cpb = torch.nn.Sequential(torch.nn.Linear(2, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, heads, bias=False))
        rel = torch.arange(-(tokens - 1), tokens, dtype=torch.float32) / (tokens - 1)
        self.register_buffer("coords", torch.stack([rel, rel.abs()], dim=1))
        pos = torch.arange(tokens)
        self.register_buffer("rel_index", (pos[:, None] - pos[None, :] + tokens - 1).reshape(-1))

    def forward(self, x):
        b, t, _ = x.shape
        bias = self.qkv.bias.clone()
        bias[self.inner:2 * self.inner].zero_()
        qkv = F.linear(x, self.qkv.weight, bias)
        if self.gathered:  # torchvision's Swin: split into (3, heads, head) first, then q, k, v taken at 0, 1, 2
            qkv = qkv.reshape(b, t, 3, self.heads, self.head).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
        else:
            q, k, v = (p.reshape(b, t, self.heads, self.head).transpose(1, 2) for p in qkv.split(self.inner, dim=-1))
        attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        attn = attn * torch.clamp(self.logit_scale, max=math.log(100.0)).exp()
        rel = self.cpb(self.coords)[self.rel_index].view(t, t, self.heads).permute(2, 0, 1)
        attn = attn + 16 * torch.sigmoid(rel)
        return self.proj((attn.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1))


def _attention(seed: int, **sizes) -> _CosineAttention:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return _CosineAttention(**sizes).eval()


# the tracer cannot read an in-place zero_ of a slice: it falls back to the dynamo exporter, which is tested here
EXPORTERS = {"torchscript": False, "dynamo": True}


@pytest.mark.parametrize("exporter", list(EXPORTERS))
def test_each_pattern_is_read_as_layers(exporter):
    module, x = _attention(1), torch.randn(2, 5, 8)
    with nets.quiet():
        g = load_graph(export_graph(module, x, dynamo=EXPORTERS[exporter]).onnx)
    roles = {ref.source: (ref.role, ref.zeroed, g.attrs[li]) for li, refs in enumerate(g.tensors) for ref in refs}
    # the bias: the parameter whole, the key's rows zeros of the architecture
    assert roles["qkv.bias"][:2] == ("bias", (8, 16))
    # the MLP: two linear layers, the first reading the coordinate table as its input
    assert roles["cpb.0.weight"][0] == "weight" and roles["cpb.2.weight"][0] == "weight"
    assert roles["coords"][0] == INPUT_ROLE
    # the logit scale: a per-head layer read through clamp and exp, which no transform may divide
    assert roles["logit_scale"][2] == {"scales": True, "through": ["Clip", "Exp"]}
    assert g.unread == {}
    assert LayerGraph.from_arrays(g.to_arrays()).tensors == g.tensors  # zeroed rows and tables stored
    # the key's zeroed rows are the parameter's: they count, as the module trains and stores them
    assert g.total_params == sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("exporter", list(EXPORTERS))
def test_the_patterns_warm_exactly_from_their_own_architecture(tmp_path, exporter):
    dynamo, x = EXPORTERS[exporter], torch.randn(2, 5, 8)
    parent, child = _attention(1), _attention(2)
    result = nets.warm_strictly(parent, child, x, tmp_path, dynamo)
    assert result.parent == "p" and result.score == 1.0 and result.preserved and result.load.missing == []
    assert nets.rel_dev(nets.outputs(parent, x), nets.outputs(child, x)) <= 1e-6
    for name in ("cpb.0.weight", "cpb.0.bias", "cpb.2.weight", "logit_scale", "qkv.weight", "coords"):
        assert torch.equal(child.get_parameter(name) if name != "coords" else child.coords,
                           parent.get_parameter(name) if name != "coords" else parent.coords), name
    inner = parent.inner  # every row the forward reads is the parent's
    for rows in (slice(0, inner), slice(2 * inner, 3 * inner)):
        assert torch.equal(child.qkv.bias[rows], parent.qkv.bias[rows])


@pytest.mark.parametrize("gathered", [False, True], ids=["split", "gathered"])
@pytest.mark.parametrize("heads, head", [(4, 4), (2, 8), (3, 4)], ids=["heads-x2", "head-size-x2", "heads-x1.5"])
def test_a_growth_is_preserved_only_when_exact(tmp_path, heads, head, gathered):
    """Whole heads cloned, or each head grown by an integer factor (cosine attention reads a head's units by their
    norm, so only an integer factor copies every unit equally often): exact and claimed. The heads of q, k and v
    are found whether they are split before the heads (GPT-2) or after (Swin: (3, heads, head) gathered)."""
    x = torch.randn(2, 5, 8)
    parent, child = _attention(1, gathered=gathered), _attention(2, heads=heads, head=head, gathered=gathered)
    zoo = Zoo(str(tmp_path / "zoo"))
    with nets.quiet(), warnings.catch_warnings():
        warnings.simplefilter("ignore", PartialWarmWarning)
        register(parent, x, zoo, 0.9, name="p", config={"dynamo": False})
        result = warm_start(child, x, zoo, noise=0.0, config={"dynamo": False})
    assert result.parent == "p" and result.load.missing == []
    assert result.preserved or heads == 3
    if result.preserved:
        assert nets.rel_dev(nets.outputs(parent, x), nets.outputs(child, x)) <= 1e-5


def test_rows_are_folded_from_the_ops_that_compute_them():
    """The dynamo exporter's rows of ``b[4:8].zero_()`` on a vector of 12: Slice(Range(0, Shape(b)[0], 1)),
    unsqueezed into ScatterND's (rows, 1) indices."""
    h = onnx.helper
    ints = [h.make_tensor(n, onnx.TensorProto.INT64, [len(v)], v)
            for n, v in (("zero", [0]), ("one", [1]), ("s", [4]), ("e", [8]), ("a", [0]), ("ax", [1]))]
    nodes = [h.make_node("Shape", ["b"], ["shape"]), h.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
             h.make_node("Squeeze", ["n"], ["limit"]), h.make_node("Squeeze", ["zero"], ["start"]),
             h.make_node("Squeeze", ["one"], ["delta"]), h.make_node("Range", ["start", "limit", "delta"], ["all"]),
             h.make_node("Slice", ["all", "s", "e", "a"], ["rows"]), h.make_node("Unsqueeze", ["rows", "ax"], ["idx"]),
             h.make_node("Identity", ["idx"], ["y"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [12])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.INT64, None)], initializer=ints)
    reader = ModelReader(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)]))
    np.testing.assert_array_equal(fold_ints(reader, "idx"), np.arange(4, 8).reshape(4, 1))
    assert fold_ints(reader, "idx", cap=3) is None  # more elements than asked for: not folded
