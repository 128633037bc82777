"""Tests of keeper.torch_support.cache through keeper.torch_support.export_graph: a second module of one architecture
reuses the first export and gets what a fresh export gives it; anything that changes the trace (an attribute, a
buffer's value, the input's shape, the exporter) exports again; a module keeper cannot fingerprint is exported
every time; a warm through a remembered export is exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import nets
from keeper.torch_support import cache as export_cache
from keeper.torch_support import export_graph, module_weights, warm_start
from keeper.zoo import Zoo


class Gated(nn.Module):
    """A block whose forward depends on plain attributes (a flag and a scale) and on a buffer's values."""

    def __init__(self, residual: bool = True, scale: float = 1.0, width: int = 8):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, width), nn.Linear(width, 3)
        self.residual, self.scale = residual, scale
        self.register_buffer("offset", torch.zeros(width))
        self.register_buffer("order", torch.arange(width))  # indices: held in the graph as data

    def forward(self, x):
        h = torch.relu(self.fc1(x[:, self.order])) * self.scale + self.offset
        return self.fc2(h + x if self.residual else h)


def _model(seed: int, **kw) -> Gated:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return nets.randomize(Gated(**kw), seed)


X = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))


@pytest.fixture(autouse=True)
def empty_cache():
    export_cache.clear()
    yield
    export_cache.clear()


def _fresh(module, x, dynamo):
    export_cache.clear()
    with nets.quiet():
        return export_graph(module, x, dynamo=dynamo)


def _export(module, x, dynamo):
    with nets.quiet():
        return export_graph(module, x, dynamo=dynamo)


@pytest.mark.parametrize("dynamo", [False, True])
def test_second_module_of_one_architecture_reuses_the_export(dynamo):
    first, second = _model(0), _model(1)
    _export(first, X, dynamo)
    before = export_cache.stats()
    got = _export(second, X, dynamo)
    assert export_cache.stats()["hits"] == before["hits"] + 1
    want = _fresh(second, X, dynamo)
    assert (got.onnx, got.keys, got.apart) == (want.onnx, want.keys, want.apart)
    # the weights are the second module's, read in place
    w = module_weights(second, got)
    key = next(k for k, (sd, _) in got.keys.items() if sd == "fc1.weight")
    init = next(i for i, k in got.apart.items() if k == key)
    np.testing.assert_array_equal(np.asarray(w[init]).reshape(-1), second.fc1.weight.detach().numpy().reshape(-1))


@pytest.mark.parametrize("change", ["flag", "scale", "buffer", "input", "exporter", "width"])
def test_what_changes_the_trace_exports_again(change):
    base = _model(0)
    _export(base, X, False)
    other, x, dynamo = _model(1), X, False
    if change == "flag":
        other = _model(1, residual=False)
    elif change == "scale":
        other = _model(1, scale=2.0)
    elif change == "buffer":  # a buffer no layer reads is held in the graph as data: its value is part of it
        other.order = other.order.flip(0)
    elif change == "input":
        x = torch.randn(3, 8)
    elif change == "exporter":
        dynamo = True
    else:
        other, x = _model(1, width=6), torch.randn(2, 6)
    hits = export_cache.stats()["hits"]
    got = _export(other, x, dynamo)
    assert export_cache.stats()["hits"] == hits, f"a changed {change} must not reuse the export"
    want = _fresh(other, x, dynamo)
    assert got.onnx == want.onnx and got.keys == want.keys


def test_module_with_an_opaque_attribute_is_exported_every_time():
    class Opaque:  # no value keeper can read: its effect on forward is unknown
        pass

    module = _model(0)
    module.helper = Opaque()
    before = export_cache.stats()
    _export(module, X, False)
    _export(module, X, False)
    after = export_cache.stats()
    assert after["uncacheable"] == before["uncacheable"] + 2 and after["hits"] == before["hits"]


def test_tied_weights_share_one_entry_in_the_fingerprint():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(16, 8)
            self.head = nn.Linear(8, 16, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, t):
            return self.head(self.emb(t))

    class Untied(Tied):
        def __init__(self):
            super().__init__()
            self.head.weight = nn.Parameter(self.emb.weight.detach().clone())

    Untied.__qualname__ = Tied.__qualname__  # the same class text: only the sharing differs
    t = torch.arange(4).reshape(1, 4)
    assert export_cache.fingerprint(Tied(), (t,), "x") == export_cache.fingerprint(Tied(), (t,), "x")
    assert export_cache.fingerprint(Tied(), (t,), "x") != export_cache.fingerprint(Untied(), (t,), "x")


def test_warm_start_through_a_remembered_export_is_exact(tmp_path):
    zoo = Zoo(str(tmp_path / "zoo"))
    parent = _model(0)
    warm_start(parent, X, zoo)  # first export of the architecture; cold
    from keeper.torch_support import register

    with nets.quiet():
        register(parent, X, zoo, 0.9, name="parent")
    child = _model(1)
    hits = export_cache.stats()["hits"]
    with nets.quiet():
        result = warm_start(child, X, zoo, noise=0.0)
    assert export_cache.stats()["hits"] > hits
    assert result.parent == "parent" and result.score == 1.0
    for (k, v), (_, w) in zip(parent.state_dict().items(), child.state_dict().items()):
        assert torch.equal(v, w), k
