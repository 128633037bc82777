"""The data probe (keeper.choice.probe, keeper.torch_support.DataProbe): the best of the cold init and the top
candidates wins; a harmful parent is rejected and the child stays cold, saying why."""

from __future__ import annotations

import math

import pytest
import torch

import keeper
from keeper.choice.probe import probe_choice
from keeper.choice.selection import Candidate
from keeper.errors import ProbeError
from keeper.torch_support import DataProbe, export, warm_start
from keeper.warm import WarmResult
from keeper_bench import families
from tests.nets import quiet

SPEC = {"family": "resnet", "dim": 1, "in_channels": 1, "num_classes": 5, "input_length": 16,
        "widths": [8, 16], "blocks": [1, 1], "kernel": 3}


def _result(name):
    return WarmResult(name, 1.0 if name else 0.0, {}, {})


def _cands(*names):
    return [Candidate(n, 0.9, 0.8) for n in names]


def test_probe_keeps_the_lowest_loss_and_reports_cost():
    losses = {None: 2.0, "a": 1.5, "b": 0.5, "c": 0.1}
    result, report = probe_choice(_cands("a", "b", "c"), _result, lambda: _result(None),
                                  lambda r: losses[r.parent], top=2)
    assert result.parent == "b" and report.chosen == "b"  # "c" is beyond top=2: never transformed
    assert report.losses == {"a": 1.5, "b": 0.5} and report.cold == 2.0
    assert report.transform_s >= 0 and report.forward_s >= 0 and "b" in report.reason


def test_probe_falls_back_to_cold_when_nothing_beats_it():
    result, report = probe_choice(_cands("a", "b"), _result, lambda: _result(None),
                                  lambda r: {None: 1.0, "a": 1.0, "b": float("nan")}[r.parent], top=3)
    assert result.parent is None and report.chosen is None
    assert report.losses["b"] == math.inf  # NaN: diverged, never chosen
    assert "stays cold" in report.reason and "a 1" in report.reason


def test_probe_returning_no_number_is_a_typed_error():
    with pytest.raises(ProbeError, match="expected a loss"):
        probe_choice(_cands("a"), _result, lambda: _result(None), lambda r: "low", top=1)


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 16, generator=g)
    return x, (x[:, 0, :5].argmax(dim=1))  # a learnable rule


def _trained(seed=0, steps=60):
    torch.manual_seed(seed)
    m = families.build(SPEC)
    x, y = _data()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m.eval()


def test_probe_rejects_a_harmful_parent_and_falls_back_to_cold(tmp_path):
    zoo = keeper.Zoo(str(tmp_path / "zoo"), keeper.ZooConfig(outlier_z=None))
    bad = _trained()
    with torch.no_grad():  # a parent whose function is wrecked: same architecture, weights blown up and flipped
        for p in bad.parameters():
            p.mul_(-25.0)
    x, y = _data()
    with quiet():
        zoo.register(export(bad, x[:2]).onnx, 0.9, "wrecked")
        torch.manual_seed(5)
        child = families.build(SPEC)
        before = {k: v.clone() for k, v in child.state_dict().items()}
        plain = warm_start(families.build(SPEC), x[:2], zoo, noise=0.0)
        probed = warm_start(child, x[:2], zoo, noise=0.0, probe=DataProbe((x, y), torch.nn.CrossEntropyLoss()))
    assert plain.parent == "wrecked" and plain.preserved  # the structure alone cannot see the damage
    assert probed.parent is None and "stays cold" in probed.reason
    assert probed.probe["losses"]["wrecked"] > probed.probe["cold"]
    assert probed.probe["transform_s"] > 0 and probed.probe["forward_s"] > 0
    assert all(torch.equal(before[k], v) for k, v in child.state_dict().items())  # the child keeps its init
    # the service's way: its choice lists the candidates; the probe runs here, warming them from the store
    from keeper.choice.selection import ParentChoice
    from keeper.torch_support import export_graph, module_weights
    from keeper.torch_support.probe import module_probe
    from keeper.warm import warm

    with quiet():
        exported = export_graph(child, x[:2])
    choice = ParentChoice("wrecked", 1.0, zoo.uri, 0.0, 0, (Candidate("wrecked", 1.0, 0.9, preserved=True),), 3, 1)
    served = warm(zoo, exported.onnx, exported.graph, weights=module_weights(child, exported), choice=choice,
                  probe=module_probe(child, exported.keys, ((x, y), torch.nn.CrossEntropyLoss())))
    assert served.parent is None and served.probe["losses"]["wrecked"] > served.probe["cold"]


def test_probe_keeps_a_helpful_parent_and_accepts_a_module_callable(tmp_path):
    zoo = keeper.Zoo(str(tmp_path / "zoo"), keeper.ZooConfig(outlier_z=None))
    x, y = _data()
    with quiet():
        zoo.register(export(_trained(), x[:2]).onnx, 0.9, "good")
        child = families.build(SPEC)
        seen = []

        def loss_of(module):
            seen.append(module)
            with torch.no_grad():
                return torch.nn.functional.cross_entropy(module.eval()(x), y)  # a 0-d tensor is a number too

        r = warm_start(child, x[:2], zoo, noise=0.0, probe=loss_of)
    assert r.parent == "good" and r.probe["chosen"] == "good" and r.probe["losses"]["good"] < r.probe["cold"]
    assert len(seen) == 2 and all(m is not child for m in seen)  # scored on copies
    # the embedded zoo's probe reads WarmResults; the winner is made again into the file asked for
    with quiet():
        onnx_child = export(families.build(SPEC), x[:2]).onnx
    out = tmp_path / "w.safetensors"
    z = zoo.warm(onnx_child, noise=0.0, probe=lambda r: 0.0 if r.parent else 1.0, out=out)
    assert z.parent == "good" and z.probe["cold"] == 1.0 and out.exists() and zoo.record("good").hits == pytest.approx(2.0, abs=1e-3)
    with torch.no_grad():
        assert float(torch.nn.functional.cross_entropy(child.eval()(x), y)) == pytest.approx(r.probe["losses"]["good"],
                                                                                          rel=1e-4)


def test_data_probe_checks_its_arguments():
    with pytest.raises(keeper.errors.KeeperError, match="batches"):
        DataProbe([], torch.nn.CrossEntropyLoss())
    with pytest.raises(keeper.errors.KeeperError, match="steps"):
        DataProbe(_data(), torch.nn.CrossEntropyLoss(), steps=-1)
