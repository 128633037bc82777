"""Shrink and perturb (keeper/transforms/shrink.py): a restart that keeps a share of its parent's weights, through
``inherit`` and ``warm_start`` (torch modules exported by keeper, real ONNX round trips)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import keeper
from keeper.errors import KeeperError
from keeper.graph import load_graph
from keeper.onnx_safety import load_model
from keeper.onnx_weights import model_weights
from keeper.torch_support import export, warm_start
from keeper.transforms.shrink import mixer, shrink_perturb
from keeper.warm import inherit


def _cnn(width: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Conv1d(1, width, 3, padding=1), torch.nn.BatchNorm1d(width),
                                torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(width * 8, 4))
    with torch.no_grad():  # running statistics no fresh init has, so a mixed one would show
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    return model.eval()


X = torch.randn(2, 1, 8)


def test_a_restart_keeps_the_share_of_its_parent_and_its_own_init_for_the_rest():
    parent, child = _cnn(6, seed=0), _cnn(6, seed=1)
    p, c = export(parent, X), export(child, X)
    whole = inherit(p.onnx, c.onnx, noise=0.0)
    half = inherit(p.onnx, c.onnx, noise=0.0, restart_shrink=0.5)
    assert whole.preserved and whole.shrink == 1.0
    assert not half.preserved and half.shrink == 0.5, "a shrunk restart no longer computes its parent's function"
    own = {k: np.asarray(v) for k, v in model_weights(load_model(c.onnx), None, "child").items()}
    graph = load_graph(c.onnx)
    roles = {r.key: r.role for refs in graph.tensors for r in refs}
    mixed = [k for k, role in roles.items() if role in ("weight", "bias", "scale")]
    stats = [k for k, role in roles.items() if role in ("mean", "var")]
    assert mixed and stats
    for k in mixed:
        np.testing.assert_allclose(half.weights[k], 0.5 * whole.weights[k] + 0.5 * own[k], rtol=1e-6, atol=1e-7)
    for k in stats:  # not learned by gradient: the parent's, as they were
        np.testing.assert_array_equal(half.weights[k], whole.weights[k])


def test_a_growth_is_never_shrunk():
    parent, child = _cnn(6, seed=0), _cnn(12, seed=1)
    grown = inherit(export(parent, X).onnx, export(child, X).onnx, noise=0.0, restart_shrink=0.5)
    assert grown.preserved and grown.shrink == 1.0


def test_the_mix_is_pure_and_keeps_dtypes_and_constant_zeros():
    parent = _cnn(4, seed=0)
    graph = load_graph(export(parent, X).onnx)
    keys = [r.key for refs in graph.tensors for r in refs]
    warmed = {k: np.full((3,), 2.0, dtype=np.float16) for k in keys}
    own = {k: np.full((3,), 4.0, dtype=np.float16) for k in keys}
    before = {k: v.copy() for k, v in warmed.items()}
    out = shrink_perturb(graph, warmed, own, 0.25, lambda k: True)
    for k in keys:
        np.testing.assert_array_equal(warmed[k], before[k])  # inputs untouched
        assert out[k].dtype == np.float16
    roles = {r.key: r.role for refs in graph.tensors for r in refs}
    for k, role in roles.items():
        expect = 3.5 if role in ("weight", "bias", "scale") else 2.0
        np.testing.assert_allclose(out[k].astype(float), expect)
    assert all(out[k] is warmed[k] for k in keys if not any(roles[k] == r for r in ("weight", "bias", "scale")))
    same = mixer(graph, own, 1.0, lambda k: True)
    assert all(same(k, warmed[k]) is warmed[k] for k in keys)
    with pytest.raises(ValueError, match="shrink must be"):
        mixer(graph, own, 1.5, lambda k: True)


def test_warm_start_shrinks_a_restart_only_when_asked(tmp_path):
    zoo = keeper.Zoo(str(tmp_path / "zoo"))
    parent = _cnn(6, seed=0)
    keeper.torch_support.register(parent, X, zoo, 0.9, "p")
    exact = _cnn(6, seed=1)
    result = warm_start(exact, X, zoo, noise=0.0)
    assert result.preserved and result.shrink == 1.0, "by default a same-architecture warm is exact"
    assert "shrink=0.5" in result.reason, "the reason says what to do when warmed trials end below cold ones"
    assert all(torch.equal(a, b) for a, b in zip(exact.state_dict().values(), parent.state_dict().values()))
    child = _cnn(6, seed=1)
    init = {k: v.clone() for k, v in child.state_dict().items()}
    result = warm_start(child, X, zoo, noise=0.0, shrink=0.5)
    assert not result.preserved and result.shrink == 0.5 and "shrink and perturb" in result.reason
    torch.testing.assert_close(child[0].weight, 0.5 * parent[0].weight + 0.5 * init["0.weight"])
    torch.testing.assert_close(child[1].running_var, parent[1].running_var)
    assert result.recipe(100).start == 1.0, "not a restart of the parent's function: the schedule as it is"
    with pytest.raises(KeeperError, match="shrink"):
        warm_start(_cnn(6, seed=2), X, zoo, shrink=2.0)
