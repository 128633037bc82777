"""Tests of keeper.torch_support.trace, the torch front end: on a representative subset its LayerGraph equals the
dynamo exporter's and a growth pair warms identically through both paths (``scripts/check_trace.py`` runs the
whole catalogue, tests/test_trace_catalogue.py traces it); in-place ops are written as the exporter
functionalizes them, and a tensor changed behind the graph's back is refused; a module it cannot read falls back
to the exporter with a warning naming the op and gets the exporter's answer; the default path calls no torch.onnx
exporter."""

from __future__ import annotations

import warnings

import pytest
import torch

import nets
from keeper.errors import TraceFallbackWarning, TraceUnsupported
from keeper.torch_support import cache, cache_files, export_graph
from keeper.torch_support.trace import trace_graph
import hf_catalogue
import hf_growth
from trace_check import compare_graphs, graph_differences, warm_differences


@pytest.fixture(autouse=True)
def own_disk_cache(tmp_path, monkeypatch):
    """Each test exports for itself: no architecture kept on disk by another test (or another process)."""
    monkeypatch.setenv(cache_files.ENV, str(tmp_path / "arch-cache"))


@pytest.mark.parametrize("name", ["mlp", "resnet", "gpt2", "llama"])
def test_the_traced_graph_is_the_exporters(name):
    if name in nets.BASE_SPECS:
        module, x = nets.build(nets.BASE_SPECS[name])
        args = (x,)
    else:
        module, args = hf_catalogue.build(name, seed=1)
    check = graph_differences(module, args)
    assert check.fallback is None
    assert check.differences == []


class _Logits(torch.nn.Module):
    """GPT-2 as a user builds it, with eager attention and its key/value cache on (the default): the cache's first
    update concatenates onto an empty tensor."""

    def __init__(self, layers: int):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(layers)
        self.model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=32, n_embd=64, n_layer=layers, n_head=2,
                                                attn_implementation="eager"))

    def forward(self, ids):
        return self.model(input_ids=ids).logits


def test_a_cached_gpt2_traces_as_the_exporter_writes_it():
    """An empty part of a concatenation is dropped and a one-part concatenation is an Identity, as the exporter
    writes them; at 12 layers the exporter's value names cross val_99 / val_100, and the canonical order compares
    the numbers in names as numbers (with text order, a parent traced here was not a preserved parent of a
    14-layer child exported by dynamo)."""
    check = graph_differences(_Logits(12).eval(), (torch.arange(8).reshape(1, 8),))
    assert check.fallback is None and check.differences == []


def test_a_growth_pair_warms_identically_through_both_paths(tmp_path):
    parent, args = hf_growth.build("gpt2")
    child, _ = hf_growth.build("gpt2", layers=4)
    hf_growth.trained_like(parent, 1), hf_growth.trained_like(child, 2)
    assert warm_differences(parent, child, args, tmp_path) == []


class _Cumulative(torch.nn.Module):
    """A cumulative sum over positions: an op outside the trace's rule table."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.cumsum(self.fc1(x), dim=1))


class _Branching(torch.nn.Module):
    """Control flow on the data's values: a graph could hold one branch only."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(x) if x.sum() > 0 else -self.fc(x)


def test_a_module_the_trace_cannot_read_falls_back_with_a_warning(tmp_path, monkeypatch):
    cache.clear()
    m, x = _Cumulative(), torch.randn(2, 4, 8)
    with pytest.warns(TraceFallbackWarning, match=r"_Cumulative: .*cumsum"):
        got = export_graph(m, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = export_graph(m, x, dynamo=True)
    assert compare_graphs(got.graph, got.keys, want.graph, want.keys) == []
    assert got.keys == want.keys and got.apart == want.apart
    cache.clear()  # the fallback under a meta default device: its stamps are drawn on the CPU, not there
    monkeypatch.setenv(cache_files.ENV, str(tmp_path / "another-arch-cache"))
    with pytest.warns(TraceFallbackWarning), torch.device("meta"):
        meta = export_graph(m, x)
    assert compare_graphs(meta.graph, meta.keys, want.graph, want.keys) == [] and meta.keys == want.keys


def test_control_flow_on_the_data_is_never_traced():
    """The trace stops at the comparison that feeds the branch; the exporter then refuses the module too."""
    cache.clear()
    with pytest.warns(TraceFallbackWarning, match=r"_Branching: .*gt"), pytest.raises(Exception):
        export_graph(_Branching(), torch.randn(2, 4, 8))


def test_the_default_path_calls_no_onnx_exporter(monkeypatch):
    cache.clear()
    calls = []
    real = torch.onnx.export
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: calls.append(1) or real(*a, **k))
    module, args = hf_catalogue.build("gpt2", seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceFallbackWarning)
        exported = export_graph(module, args)
    assert calls == [] and exported.graph.num_layers > 0 and exported.apart
    with pytest.warns(TraceFallbackWarning):
        export_graph(_Cumulative(), torch.randn(2, 4, 8))
    assert calls == [1], "the counting wrapper sees the exporter when it runs"


class _InPlace(torch.nn.Module):
    """ResNet's block ends ``out += identity; relu_(out)``; Swin V2 zeroes a slice of its qkv bias in place."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 6)

    def forward(self, x):
        out = self.fc1(x)
        out += x
        out = torch.nn.functional.relu(out, inplace=True)
        bias = self.fc2.bias.clone()
        bias[2:4].zero_()
        return torch.nn.functional.linear(out, self.fc2.weight, bias)


def test_in_place_ops_are_written_as_the_exporter_functionalizes_them():
    check = graph_differences(_InPlace().eval(), (torch.randn(2, 4, 8),))
    assert check.fallback is None
    assert check.differences == []


class _StaleView(torch.nn.Module):
    """A view read after an in-place op changed its memory through its base: its values now depend on the input,
    though it was made from no input."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x):
        buf = torch.zeros(8)
        view = buf.view(2, 4)
        buf.add_(x[0])
        return self.fc(view.reshape(8) + x[1])


class _CopiesValues(torch.nn.Module):
    """``new_tensor`` takes its argument's values, not only its shape, unlike ``zeros_like``."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(x.new_tensor(x * 2.0) + x)


class _WritesAWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x):
        self.fc.weight[0].mul_(2.0)
        return self.fc(x)


def test_a_tensor_changed_behind_the_graphs_back_is_never_traced():
    """Written as a Constant of the values it held, the view (or a copy made by ``new_tensor``) would hide the
    input behind it: the trace refuses, and a write into the module's weights too (it would change the module)."""
    m, x = _StaleView(), torch.randn(2, 8)
    with pytest.raises(TraceUnsupported, match="after an in-place op changed its memory"):
        trace_graph(m, (x,))
    with pytest.raises(TraceUnsupported, match="from the values of a tensor computed from the input"):
        trace_graph(_CopiesValues(), (x,))
    writer = _WritesAWeight()
    before = writer.fc.weight.detach().clone()
    with pytest.raises(TraceUnsupported, match="writes in place into a module tensor"):
        trace_graph(writer, (x,))
    assert torch.equal(writer.fc.weight, before), "the module is left as it was"
