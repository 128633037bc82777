"""torchvision and timm (vision_libs, vision_catalogue): optional, skipped with the
reason when they do not import. Where they do, every learned tensor of their models is read and a warm from a
parent of the same architecture is exact; CNN growth pairs (VGG-11 -> 13 with BatchNorm, ConvNeXt deepening,
MobileNetV2 0.5 -> 1.0) compute the parent's function.

CI installs neither library, so the model tests skip there; to run them, in a separate environment (a torchvision
that fails at import breaks ``import transformers``)::

    python -m venv --system-site-packages /tmp/tvenv
    /tmp/tvenv/bin/pip install --no-deps torchvision==0.28.0 timm
    PYTHONPATH=$PWD /tmp/tvenv/bin/python -m pytest tests/test_vision_libs.py -q -p no:cacheprovider
"""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch

from keeper.errors import PartialWarmWarning
from keeper.graph import load_graph
from keeper.torch_support import export_graph, register, warm_start
from keeper.zoo import Zoo
import vision_libs
from hf_catalogue import build
from hf_growth import warm_deviation
from vision_catalogue import catalogue, growth_pairs

BUILDERS, SKIPPED = catalogue()
EXACT = 1e-5  # float32 round-off of an exact copy is ~1e-7; a tensor left at the child's init gives ~1

TORCHSCRIPT = ["tv-vit", "tv-swin", "tv-swin_v2", "tv-convnext", "tv-densenet", "timm-vit_tiny",
               "timm-deit_tiny_distilled", "timm-cait", "timm-levit", "timm-swin", "timm-mixer", "timm-beit"]
DYNAMO = ["tv-vit", "timm-deit_tiny_distilled"]
CASES = [(m, False) for m in TORCHSCRIPT] + [(m, True) for m in DYNAMO]
# Known gaps: catalogue models with learned tensors no layer reads; the warm must say so: a warning naming them,
# and a score below 1. None is left: BEiT's qkv bias built from pieces is read since graph format 9, Swin V2's qkv
# bias with its key slice zeroed, position-bias MLP and logit scale since format 10 (both are in TORCHSCRIPT); a
# tensor no layer reads is reported in tests/test_torch_support.py and tests/test_hf_models.py.
PARTIAL: dict[str, list[str]] = {}
GROWTH = [("tv-vgg11_bn", "tv-vgg13_bn"), ("tv-convnext", "tv-convnext_deep"),
          ("tv-mobilenet_v2_0.5", "tv-mobilenet_v2")]


def _need(name: str) -> None:
    if name not in BUILDERS:
        lib = "timm" if name.startswith("timm-") else "torchvision"
        pytest.skip(f"{name}: {SKIPPED.get(lib, f'{lib} imports, but the catalogue has no {name}')}")


def test_a_library_that_does_not_import_is_left_out_with_its_reason():
    for lib, importer in (("torchvision", vision_libs.import_torchvision), ("timm", vision_libs.import_timm)):
        module, why = importer()
        assert (module is None) == bool(why), "a module, or a reason, never both nor neither"
        if module is None:
            assert lib in SKIPPED and SKIPPED[lib] == why and why.startswith(lib)
            assert not any(n.startswith("tv-" if lib == "torchvision" else "timm-") for n in BUILDERS)
            if importlib.util.find_spec(lib) is None:
                assert why == f"{lib} is not installed"
        else:
            assert lib not in SKIPPED
            assert any(n.startswith("tv-" if lib == "torchvision" else "timm-") for n in BUILDERS)


def test_the_schemas_are_defined_once_and_only_when_missing():
    """Where torchvision imported, its nms / qnms schemas exist (its own or the fragment's) and defining again adds
    nothing; where it is not installed, the fragment defines both once. A torchvision installed but not
    importable is left untouched (its own library might still define them)."""
    tv, why = vision_libs.import_torchvision()
    if tv is None and why != "torchvision is not installed":
        pytest.skip(f"torchvision is installed but does not import: {why}")
    before = {op: vision_libs._defined(op) for op in vision_libs.TORCHVISION_SCHEMAS}
    defined = vision_libs._define_schemas()
    assert defined == [op for op, present in before.items() if not present]
    if tv is not None:
        assert defined == []
    assert all(vision_libs._defined(op) for op in vision_libs.TORCHVISION_SCHEMAS)
    assert vision_libs._define_schemas() == []
    for op in vision_libs.TORCHVISION_SCHEMAS:
        schema = str(getattr(torch.ops.torchvision, op).default._schema)
        assert schema == f"torchvision::{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"


@pytest.mark.parametrize(("name", "dynamo"), CASES, ids=[f"{m}-{'dynamo' if d else 'torchscript'}" for m, d in CASES])
def test_same_architecture_warm_is_exact(tmp_path, name, dynamo):
    _need(name)
    graph, result, partial, dev, cold = _warm(tmp_path, name, dynamo)
    assert cold > 0.1, "the two inits must differ, or exactness proves nothing"
    assert graph.unread == {}
    assert graph.total_params == sum(p.numel() for p in BUILDERS[name]()[0].parameters())
    assert result.load.missing == [] and partial == [] and result.score == 1.0
    assert dev < EXACT, f"{name}: deviation {dev:.3g} after a same-architecture warm"


def _warm(tmp_path, name: str, dynamo: bool):
    """A same-architecture warm of ``name`` (parent seed 1, child seed 2): (child graph, result, partial-warm
    warnings, deviation after the warm, deviation at the child's own init)."""
    parent, args = build(name, 1, BUILDERS)
    child, _ = build(name, 2, BUILDERS)
    with torch.no_grad():
        want, cold = parent(*args), child(*args)
    graph = load_graph(export_graph(child, args, dynamo=dynamo).onnx)
    zoo = Zoo(str(tmp_path / "zoo"))
    register(parent, args, zoo, 0.9, name="parent", config={"dynamo": dynamo})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PartialWarmWarning)
        result = warm_start(child, args, zoo, noise=0.0, config={"dynamo": dynamo})
    partial = [str(w.message) for w in caught if issubclass(w.category, PartialWarmWarning)]
    with torch.no_grad():
        got = child(*args)
    dev = float((want - got).abs().max() / want.abs().max())
    return graph, result, partial, dev, float((want - cold).abs().max() / want.abs().max())


@pytest.mark.parametrize("name", sorted(PARTIAL))
def test_tensors_no_layer_reads_are_reported_not_dropped(tmp_path, name):
    _need(name)
    graph, result, partial, dev, cold = _warm(tmp_path, name, dynamo=False)
    assert set(PARTIAL[name]) <= set(result.load.missing)
    assert len(partial) == 1 and f" {len(result.load.missing)} tensor(s) " in partial[0]
    assert result.load.missing[0] in partial[0], "the warning names the tensors (the first few, then a count)"
    assert result.score < 1.0
    assert dev > EXACT, "what is left behind shows in the output"


@pytest.mark.parametrize(("parent_name", "child_name"), GROWTH, ids=[f"{p}->{c}" for p, c in GROWTH])
def test_cnn_growth_computes_the_parents_function(parent_name, child_name):
    _need(parent_name)
    _need(child_name)
    assert (parent_name, child_name) in [p[1:] for p in growth_pairs(BUILDERS)]
    parent, args = build(parent_name, 1, BUILDERS)
    child, _ = build(child_name, 2, BUILDERS)
    r = warm_deviation(parent, child, args, dynamo=False, seed=1)
    assert r.init > 0.1, "the child's own init must not already compute the parent's function"
    assert r.missing == []
    assert r.warm < 1e-4, f"{parent_name} -> {child_name}: deviation {r.warm:.3g} after the warm (init {r.init:.3g})"
