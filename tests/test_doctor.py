"""keeper.doctor (``keeper doctor``): the kernels in use, versions, caches, and what slows keeper down, named with
the fix. The numba side (kernels not built, compiled once per machine) is in test_kernel_cache.py."""

from __future__ import annotations

import json

import pytest

from keeper.cli import main
from keeper.matching import core


def test_doctor_names_the_kernels_the_versions_and_the_caches(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("KEEPER_ARCH_CACHE", str(tmp_path / "arch"))
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    kernels = "C extension (keeper.matching._dpcore" if core.IMPLEMENTATION == "c" else "numba"
    for line in (f"alignment kernels:", kernels, "torch:", "onnx:", "numba:", "ray:",
                 f"architecture cache: {tmp_path / 'arch'} (0 architectures)"):
        assert line in out, out
    assert main(["doctor", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["kernels"]["implementation"] == core.IMPLEMENTATION
    assert found["torch"]["cuda_available"] in (True, False) and found["packages"]["onnx"]


@pytest.mark.parametrize("env, note", [
    ({"KEEPER_EXPORTER": "dynamo"}, "KEEPER_EXPORTER=dynamo: architectures go through torch's ONNX exporter"),
    ({"KEEPER_ARCH_CACHE": "off"}, "the architecture cache is off"),
])
def test_doctor_names_what_slows_keeper_down_and_the_fix(capsys, monkeypatch, env, note):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["doctor", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(n.startswith(note) and "unset it" in n for n in notes), notes
