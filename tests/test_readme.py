"""The README's examples run as written: each block marked ``<!-- readme-test: NAME -->`` is executed in a fresh
process, on a local Ray with 2 CPUs and the shipped defaults (no config override of any kind), with the zoo in
``$KEEPER_ZOO`` and ``$HOME`` in a temporary directory (tests/doc_blocks.py). An example that stops working fails
here; docs/usage.md's examples: tests/test_usage.py.

The only thing a test adds is what the README leaves to the reader's machine: the 2-CPU Ray itself (the Python
blocks start none; keeper and Tune connect to the one running: one Ray for this module, which each example joins
as a driver of its own, the keeper service it left stopped after it) and, for ``--address auto``, the running
Ray's address (the README's ``ray start --head``). The shell block's input files come from the README's own block
that makes them; the examples that keep a zoo run twice in a row, as a reader would.
"""

from __future__ import annotations

import re

import pytest

from doc_blocks import FENCE, MARKER, README, SharedRay, blocks, run_python, run_shell

pytestmark = pytest.mark.ray  # starts Ray on loopback; `-m "not ray"` leaves these out


@pytest.fixture(scope="module")
def ray_once():
    """The 2-CPU Ray the module's examples join (started at the first example that needs one)."""
    shared = SharedRay()
    yield shared
    shared.shutdown()


def test_every_python_and_keeper_shell_block_is_tested():
    text = README.read_text()
    marked = {m.start(2) - len("```") for m in MARKER.finditer(text)}
    for m in FENCE.finditer(text):
        lang, code = m.group(1), m.group(2)
        needs = lang == "python" or (lang == "bash" and "keeper " in code and "pip install" not in code)
        assert not needs or m.start() in marked, f"README block at char {m.start()} runs untested:\n{code[:200]}"
    assert {"service", "tune", "pbt", "cli-inputs", "cli", "cli-service", "zoo"} <= set(blocks())


def test_service_example_runs_twice(tmp_path, ray_once):
    for _ in range(2):  # the same zoo: a second run registers the same seeded model, which changes nothing
        out = run_python("service", tmp_path, ray_once)
        parent, score = out.split()[-2:]
        assert parent == "mlp-a" and 0.3 <= float(score) <= 1.0


def _tune_example(tmp_path, ray) -> tuple[str, bool, list[str], int]:
    out = run_python("tune", tmp_path, ray).strip().splitlines()[-1]
    found = re.fullmatch(r"(cpu|cuda) (True|False) (\[.*\]) (\d+) registered", out)
    assert found, out
    parents = eval(found.group(3), {})  # noqa: S307 - a list of strings this test's own subprocess printed
    return found.group(1), found.group(2) == "True", parents, int(found.group(4))


@pytest.mark.slow  # > 20 s on two idle cores
def test_tune_example_warms_later_trials_and_registers_all_four(tmp_path, ray_once):
    device, on_device, parents, registered = _tune_example(tmp_path, ray_once)
    assert len(parents) == 4 and registered == 4 and on_device
    # 2 CPUs: the first two trials run together with nothing to inherit; the two after them are warmed
    assert sum(1 for p in parents if p) >= 2, parents


@pytest.mark.gpu  # the example's GPU path: trials holding a quarter of a GPU, modules warmed on cuda
def test_tune_example_on_a_gpu_keeps_warmed_modules_on_it(tmp_path, ray_once):
    device, on_device, parents, registered = _tune_example(tmp_path, ray_once)
    assert device == "cuda" and on_device and registered == 4 and sum(1 for p in parents if p) >= 2


@pytest.mark.slow  # > 20 s on two idle cores
def test_pbt_example_exploits_across_architectures_without_errors(tmp_path, ray_once):
    out = run_python("pbt", tmp_path, ray_once).strip().splitlines()[-1]
    found = re.fullmatch(r"0 errors; best accuracy ([0-9.]+)", out)
    assert found and float(found.group(1)) > 0.35, out  # chance is 0.25


def test_embedded_zoo_example_runs_twice(tmp_path):
    for _ in range(2):
        out = run_python("zoo", tmp_path)
        assert out.split()[-2:] == ["mlp-a", "1"]


def test_cli_example_makes_its_inputs_and_runs_twice(tmp_path):
    for run in range(2):
        run_python("cli-inputs", tmp_path)  # the README shows how its input files are made
        out = run_shell("cli", tmp_path)
        assert (tmp_path / "new-warm.onnx").stat().st_size > 0 and (tmp_path / "warm.safetensors").stat().st_size
        assert "mlp-a" in out and "mlp-b" in out
        assert ("already registered as mlp-b" in out) == (run == 1), out


def test_cli_service_example_on_a_running_two_cpu_ray(tmp_path, ray_once):
    try:
        out = run_shell("cli-service", tmp_path, RAY_ADDRESS=ray_once.address)
    finally:
        ray_once.stop_services()  # `keeper stop` did, unless the block failed before it
    assert "keeper serving" in out and "matchers: 4" in out
    assert '"matchers": 4' in out and "serves 0 models" in out and "stopped the keeper service" in out
