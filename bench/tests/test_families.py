"""Tests for keeper_bench.families (architecture specs) and keeper_bench.workload (the MNIST-1D workload)."""

from __future__ import annotations

import contextlib
import io
import json
import random
import warnings

import numpy as np
import onnx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx.reference import ReferenceEvaluator

from keeper.errors import InvalidModelError
from keeper_bench.families import (FAMILIES, SCALES, build, default_spec, example_input, neighbours, num_macs, num_params,
                             sample_spec, sized_spec)
from keeper_bench.workload import Dataset, evaluate, mnist1d_dataset, train, with_precise_bn

IMAGE = {"dim": 2, "in_channels": 3, "input_length": 16}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # tiny models gain nothing from intra-op threads, and spinning threads crawl on a shared machine
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _tokens_spec() -> dict:
    return {**default_spec("transformer"), "embedding": "tokens", "vocab_size": 50, "pre_ln": False,
            "activation": "gelu"}


# ----------------------------------------------------------------------------------------------- building

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dim", [1, 2])
def test_every_family_builds_and_runs(family, dim):
    spec = default_spec(family, **(IMAGE if dim == 2 else {}))
    json.dumps(spec)  # a spec must be a valid Tune config
    model = build(spec)
    x = example_input(spec, batch=3)
    assert x.shape == (3, spec["in_channels"]) + (spec["input_length"],) * dim
    assert model(x).shape == (3, 10)
    assert SCALES["small"][0] <= num_params(spec) <= SCALES["small"][1] * 1.1
    assert num_params(spec) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("family", ["transformer", "mlp"])
def test_channel_less_input_is_accepted(family):
    model = build(default_spec(family)).eval()
    x = torch.randn(4, 1, 40)
    torch.testing.assert_close(model(x), model(x[:, 0]))


def test_token_transformer_takes_integer_tokens():
    spec = _tokens_spec()
    x = example_input(spec, batch=5)
    assert x.dtype == torch.int64 and x.shape == (5, 40)
    assert build(spec)(x).shape == (5, 10)


@pytest.mark.parametrize("family", FAMILIES)
def test_build_is_deterministic_under_manual_seed(family):
    spec = default_spec(family)
    torch.manual_seed(7)
    a = build(spec).state_dict()
    torch.manual_seed(7)
    b = build(spec).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resnet_and_vgg_shapes_follow_the_spec():
    spec = {**default_spec("resnet"), "widths": [8, 12], "blocks": [2, 3], "kernel": 7}
    convs = [m for m in build(spec).modules() if isinstance(m, torch.nn.Conv1d)]
    assert all(c.kernel_size[0] in (1, 7) and c.padding[0] == c.kernel_size[0] // 2 for c in convs)
    assert 1 + 2 * 5 + 1 == len(convs)  # stem, two per block, one shortcut where the width changes
    spec = {**default_spec("vgg"), "widths": [8, 16, 32], "depths": [1, 2, 3]}
    assert len([m for m in build(spec).modules() if isinstance(m, torch.nn.Conv1d)]) == 6


@pytest.mark.parametrize("change, key", [
    ({"family": "lenet"}, "family"),
    ({"kernel": 4}, "kernel"),
    ({"widths": [16, -1, 64]}, "widths"),
    ({"blocks": [1, 1]}, "blocks"),
    ({"dim": 3}, "dim"),
    ({"widht": [3]}, "widht"),
])
def test_invalid_specs_name_the_key(change, key):
    with pytest.raises(ValueError, match=key) as info:
        build({**default_spec("resnet"), **change})
    assert isinstance(info.value, InvalidModelError)


def test_invalid_transformer_specs_raise():
    with pytest.raises(InvalidModelError, match="d_model"):
        build({**default_spec("transformer"), "d_model": 50, "heads": 4})
    with pytest.raises(InvalidModelError, match="patch"):
        build({**default_spec("transformer"), "patch": 3})
    with pytest.raises(InvalidModelError, match="vocab_size"):
        build({**default_spec("transformer"), "embedding": "tokens"})
    spec = default_spec("resnet")
    del spec["kernel"]
    with pytest.raises(InvalidModelError, match="missing keys"):
        build(spec)


# ----------------------------------------------------------------------------------------------- export

def _export(model: torch.nn.Module, x: torch.Tensor, dynamo: bool) -> onnx.ModelProto:
    f = io.BytesIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), f, dynamo=dynamo)
    return onnx.load_from_string(f.getvalue())


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("family", FAMILIES + ("tokens",))
def test_both_exporters_export_every_family(family, dynamo):
    spec = _tokens_spec() if family == "tokens" else default_spec(family)
    torch.manual_seed(0)
    model = build(spec).eval()
    x = example_input(spec)
    proto = _export(model, x, dynamo)
    onnx.checker.check_model(proto)
    feed = x.numpy()
    (got,) = ReferenceEvaluator(proto).run(None, {proto.graph.input[0].name: feed})
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


# ----------------------------------------------------------------------------------------------- sampling

@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), family=st.sampled_from(FAMILIES), image=st.booleans())
def test_sampled_specs_and_their_neighbours_are_valid(seed, family, image):
    rng = np.random.default_rng(seed)
    kw = IMAGE if image else {}
    spec = sample_spec(rng, family, **kw)
    lo, hi = SCALES["small"]
    assert lo <= num_params(spec) <= hi
    assert num_macs(spec) <= 15_000 * spec["input_length"] ** spec["dim"] or num_params(spec) < lo * 1.5
    json.dumps(spec)
    assert build(spec)(example_input(spec)).shape == (2, 10)
    near = neighbours(spec, rng)
    assert len(near) >= 3
    for variant in near:
        assert variant != spec
        assert {k for k in variant if variant[k] != spec.get(k)}  # changes something
        with torch.device("meta"):
            build(variant)


def test_sample_spec_is_deterministic_and_varied():
    specs = [sample_spec(np.random.default_rng(s), "resnet") for s in range(12)]
    assert specs[0] == sample_spec(np.random.default_rng(0), "resnet")
    assert len({json.dumps(s["widths"]) for s in specs}) > 3
    assert len({json.dumps(s["blocks"]) for s in specs}) > 2
    assert len({s["kernel"] for s in specs}) > 1


def test_neighbours_cover_width_depth_and_kernel():
    spec = {**default_spec("resnet"), "blocks": [1, 2, 1], "kernel": 3}
    near = neighbours(spec, np.random.default_rng(0))
    changed = [{k for k in v if v[k] != spec[k]} for v in near]
    assert {"widths"} in changed and {"blocks"} in changed and {"kernel"} in changed
    assert any(sum(v["blocks"]) > sum(spec["blocks"]) for v in near)
    assert any(sum(v["blocks"]) < sum(spec["blocks"]) for v in near)


@pytest.mark.parametrize("family", ["resnet", "transformer"])
@pytest.mark.parametrize("target", [1_000_000, 10_000_000, 100_000_000])
def test_sized_spec_hits_its_target(family, target):
    assert abs(num_params(sized_spec(family, target)) / target - 1) < 0.1


# ----------------------------------------------------------------------------------------------- workload

def test_mnist1d_is_generated_deterministically_without_touching_global_rngs():
    random.seed(3)
    np.random.seed(3)
    data = mnist1d_dataset(seed=0, num_samples=2000)
    assert random.random() == random.Random(3).random()
    assert np.random.rand() == np.random.RandomState(3).rand()
    assert data.x_train.shape == (1600, 1, 40) and data.x_test.shape == (400, 1, 40)
    assert data.x_train.dtype == torch.float32 and data.y_train.dtype == torch.int64
    assert data.num_classes == 10
    again = mnist1d_dataset(seed=0, num_samples=2000)
    assert torch.equal(data.x_train, again.x_train) and data.x_train is not again.x_train
    with pytest.raises(ValueError, match="num_samples"):
        mnist1d_dataset(num_samples=3)


def test_tiny_mlp_trains_above_chance():
    data = mnist1d_dataset(seed=0, num_samples=2000)
    torch.manual_seed(0)
    model = build(default_spec("mlp"))
    reports = []
    history = train(model, data, steps=100, eval_every=25, target=0.3, report=reports.append)
    assert history.steps == [25, 50, 75, 100] and len(history.accuracies) == 4 == len(reports)
    assert history.final_accuracy > 0.3  # chance is 0.1
    assert history.steps_to_target is not None and history.steps_to_target in history.steps
    assert history.final_accuracy == evaluate(model, data)
    assert set(reports[0]) == {"step", "accuracy", "loss", "seconds", "last"}
    assert [r["last"] for r in reports] == [False, False, False, True]
    assert history.stopped_at is None and history.kept_step == 100


def test_early_stopping_ends_with_the_best_evaluations_weights():
    """With ``patience``, training stops after that many evaluations without a gain of ``min_delta`` and ends
    holding the weights of its best evaluation, which ``final_accuracy`` reads; the run up to the stop is the run
    without it."""
    data = mnist1d_dataset(seed=0, num_samples=2000)
    torch.manual_seed(0)
    model = build(default_spec("mlp"))
    start = {k: v.clone() for k, v in model.state_dict().items()}
    full = train(model, data, steps=100, eval_every=10, seed=3)
    model.load_state_dict(start)
    reports = []
    # no gain can beat min_delta 1.0: the first evaluation stays the best, and two more end the run
    h = train(model, data, steps=100, eval_every=10, seed=3, patience=2, min_delta=1.0, report=reports.append)
    assert h.steps == [10, 20, 30] and h.stopped_at == 30 and h.kept_step == 10
    assert h.accuracies == full.accuracies[:3]
    assert h.final_accuracy == h.accuracies[0] == evaluate(model, data)
    assert [r["last"] for r in reports] == [False, False, True]
    model.load_state_dict(start)
    h = train(model, data, steps=100, eval_every=10, seed=3, patience=20)  # never stale long enough: the budget
    assert h.steps == full.steps and h.accuracies == full.accuracies and h.stopped_at is None
    assert h.final_accuracy == h.accuracies[h.steps.index(h.kept_step)] == evaluate(model, data)
    assert h.final_accuracy >= max(h.accuracies) - 0.002  # the best, up to gains under min_delta
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="patience"):
            train(model, data, steps=10, patience=bad)


def test_train_stops_at_target_and_checks_arguments():
    data = mnist1d_dataset(seed=0, num_samples=2000)
    model = build(default_spec("mlp"))
    history = train(model, data, steps=200, eval_every=10, target=0.15, stop_at_target=True)
    assert history.steps[-1] == history.steps_to_target < 200
    with pytest.raises(ValueError, match="target"):
        train(model, data, steps=10, stop_at_target=True)
    with pytest.raises(ValueError, match="steps"):
        train(model, data, steps=0)
    assert isinstance(data, Dataset)


def test_precise_bn_reads_the_weights_as_they_are_and_leaves_the_model_alone():
    data = mnist1d_dataset(seed=0, num_samples=2000)
    torch.manual_seed(0)
    model = build({**default_spec("resnet"), "dim": 1, "in_channels": 1, "input_length": 40, "num_classes": 10})
    train(model, data, steps=60, eval_every=60)
    bn = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d))
    bn.running_mean.add_(5.0)  # stale statistics, as after weights moved faster than the average follows
    stale_mean = bn.running_mean.clone()
    precise = with_precise_bn(model, data)
    assert precise is not model and torch.equal(bn.running_mean, stale_mean) and model.training
    fresh = next(m for m in precise.modules() if isinstance(m, torch.nn.BatchNorm1d))
    # the first BatchNorm follows the stem conv: its statistics are that conv's output over the batches used
    with torch.no_grad():
        stem = model.stem[0](data.x_train[:1024])
    torch.testing.assert_close(fresh.running_mean, stem.mean(dim=(0, 2)), rtol=1e-4, atol=1e-5)
    assert evaluate(precise, data) > evaluate(model, data) + 0.2
    mlp = build(default_spec("mlp"))
    assert with_precise_bn(mlp, data) is mlp  # nothing to re-estimate
    history = train(model, data, steps=10, eval_every=10, precise_bn=True)
    assert history.final_accuracy == evaluate(with_precise_bn(model, data), data)
