"""The torch front end over keeper's whole catalogue (the benchmark's model families, the Hugging Face catalogue,
and the torchvision / timm models where those import): no model falls back to the exporter, the graph does not
depend on torch's default device, and it does not depend on the precision the module runs in.

The default device is set to ``meta`` around the export of a CPU module: what a user's
``torch.set_default_device("cuda")`` does on a GPU machine, made visible without a GPU, since a tensor a rule makes
without naming a device then has no values and cannot meet the module's tensors. The graphs are compared array by
array (:func:`trace_check.compare_graphs`). ``scripts/check_trace.py`` compares the same models with
the dynamo exporter; that takes minutes, so these tests only trace (each model is built once per module).

torchvision and timm run where they import (``/tmp/tvenv`` of tests/test_vision_libs.py's docstring)::

    PYTHONPATH=$PWD /tmp/tvenv/bin/python -m pytest tests/test_trace_catalogue.py -q -p no:cacheprovider
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import nets
from keeper.errors import TraceFallbackWarning
from keeper.torch_support import cache, cache_files, export_graph
from keeper.torch_support.exported import Exported
from keeper.torch_support.tensors import drop_eval_caches
from keeper.torch_support.trace import trace_graph
import hf_catalogue
from trace_check import compare_graphs
from vision_libs import import_torchvision

import_torchvision()  # first: a torchvision that fails at import breaks transformers' vision models

# the model families: the base specs and the variants whose code paths differ
FAMILIES = {**nets.BASE_SPECS, **nets.VARIANT_SPECS}
VISION, SKIPPED = hf_catalogue.optional_catalogue()
NAMES = ([f"family/{n}" for n in FAMILIES] + [f"hf/{n}" for n in hf_catalogue.CATALOGUE]
         + [f"vision/{n}" for n in VISION])
CASES = NAMES + [pytest.param(f"vision/{lib}", marks=pytest.mark.skip(reason=why)) for lib, why in SKIPPED.items()]
# precision: every family, the Hugging Face transformers (their norms and rotary tables upcast to float32), one CNN
# of each source, and the vision transformers whose code casts (a CNN's code has no dtype of its own, and float16
# convolutions on a CPU take seconds)
PRECISION = ([f"family/{n}" for n in FAMILIES] + [f"hf/{n}" for n in hf_catalogue.TRANSFORMERS] + ["hf/resnet"]
             + [f"vision/{n}" for n in ("tv-resnet18", "tv-vit", "tv-swin_v2", "timm-beit", "timm-eva02",
                                        "timm-levit") if n in VISION])
# T5 guards against fp16 overflow with a clamp it runs only in fp16: another function, so another graph
PRECISION_GAPS = {("hf/t5-encoder", torch.float16): "T5 clamps its hidden states in float16 only"}

_BUILT: dict[str, tuple[torch.nn.Module, tuple]] = {}
_PLAIN: dict[str, Exported] = {}


@pytest.fixture(autouse=True)
def own_disk_cache(tmp_path, monkeypatch):
    """Every export here runs the front end: nothing kept on disk or in memory by another test."""
    monkeypatch.setenv(cache_files.ENV, str(tmp_path / "arch-cache"))
    cache.clear()


def _model(name: str) -> tuple[torch.nn.Module, tuple]:
    """The catalogue model ``name``, built once for the module."""
    if name not in _BUILT:
        group, short = name.split("/", 1)
        if group == "family":
            module, x = nets.build(FAMILIES[short], seed=1)
            _BUILT[name] = module.eval(), (x,)
        else:
            _BUILT[name] = hf_catalogue.build(short, 1, VISION if group == "vision" else None)
    return _BUILT[name]


def _export(name: str) -> Exported:
    """``export_graph`` of the model, a fall back to the exporter raised as an error."""
    module, args = _model(name)
    cache.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceFallbackWarning)
        return export_graph(module, args)


def _plain(name: str) -> Exported:
    if name not in _PLAIN:
        _PLAIN[name] = _export(name)
    return _PLAIN[name]


@pytest.mark.parametrize("name", CASES)
def test_no_catalogue_model_falls_back_to_the_exporter(name):
    exported = _plain(name)
    assert exported.graph.num_layers > 0 and exported.apart


@pytest.mark.parametrize("name", CASES)
def test_a_meta_default_device_changes_no_graph(name):
    """A tensor made on torch's default device (a mask, a constant) would be a meta tensor here: it cannot meet
    the module's CPU tensors, nor give the graph's constants their values."""
    plain = _plain(name)
    with torch.device("meta"):
        meta = _export(name)
    assert compare_graphs(plain.graph, plain.keys, meta.graph, meta.keys) == []
    assert meta.keys == plain.keys and meta.apart == plain.apart


def _traced(module: torch.nn.Module, args: tuple) -> tuple[dict, object]:
    drop_eval_caches(module)
    try:
        traced = trace_graph(module, args)
        keys, graph = traced.keys, traced.graph
    finally:
        drop_eval_caches(module)
    return keys, graph


@pytest.mark.parametrize("name", PRECISION)
def test_the_graph_is_the_same_in_every_float_precision(name):
    """bfloat16 and float16 weights (inputs cast alike), and float32 weights under CPU autocast to bfloat16."""
    plain = _plain(name)
    module, args = _model(name)
    for dtype in (torch.bfloat16, torch.float16):
        low = copy.deepcopy(module).to(dtype)
        keys, graph = _traced(low, tuple(a.to(dtype) if torch.is_floating_point(a) else a for a in args))
        if (name, dtype) not in PRECISION_GAPS:
            assert compare_graphs(plain.graph, plain.keys, graph, keys) == [], dtype
    with torch.autocast("cpu", dtype=torch.bfloat16):
        keys, graph = _traced(module, args)
    assert compare_graphs(plain.graph, plain.keys, graph, keys) == [], "autocast"
