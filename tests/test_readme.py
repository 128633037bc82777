"""The README's examples, and those of docs/usage.md, run as written: each block marked
``<!-- readme-test: NAME -->`` (``<!-- doc-test: NAME -->`` in docs/usage.md) is executed in a fresh process, on a
local Ray with 2 CPUs and the shipped defaults (no config override of any kind), with the zoo in ``$KEEPER_ZOO``
and ``$HOME`` in a temporary directory. An example that stops working fails here.

The only thing a test adds is what the README leaves to the reader's machine: the 2-CPU Ray itself (the Python
blocks start none; keeper and Tune connect to the one running) and, for ``--address auto``, a running Ray (the
README's ``ray start --head``). The shell block's input files come from the README's own block that makes them;
the examples that keep a zoo run twice in a row, as a reader would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray  # starts Ray on loopback; `-m "not ray"` leaves these out

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
USAGE = ROOT / "docs" / "usage.md"
MARKER = re.compile(r"<!-- (?:readme|doc)-test: ([\w-]+) -->\s*\n```(\w+)\n(.*?)\n```", re.S)
FENCE = re.compile(r"```(\w+)\n(.*?)\n```", re.S)
# a Ray of its own (address="local"), whatever other Ray instances run on the machine
# the trials' own logs stay out of the example's output, which the tests read line by line
PRELUDE = "import ray\nray.init(address=\"local\", num_cpus=2, include_dashboard=False, log_to_driver=False)\n"


def blocks(doc: Path = README) -> dict[str, tuple[str, str]]:
    return {m.group(1): (m.group(2), m.group(3)) for m in MARKER.finditer(doc.read_text())}


def _env(tmp_path: Path, home: bool = True, **extra: str) -> dict[str, str]:
    """The example's environment: the zoo in ``$KEEPER_ZOO``, and (``home``) ``$HOME`` in ``tmp_path`` so Tune's
    default results directory lands there. A shell joining the test's Ray keeps the real ``$HOME``, where Ray
    keeps the cluster's authentication token."""
    (tmp_path / "home").mkdir(exist_ok=True)
    env = {**os.environ, "KEEPER_ZOO": str(tmp_path / "zoo"),
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if home:
        env["HOME"] = str(tmp_path / "home")
    env.pop("RAY_ADDRESS", None)
    env.update(extra)
    return env


def run_python(name: str, tmp_path: Path, ray: bool = True, doc: Path = README) -> str:
    lang, code = blocks(doc)[name]
    assert lang == "python", f"{doc.name} block {name!r} is {lang}, expected python"
    script = tmp_path / f"readme_{name}.py"
    script.write_text((PRELUDE if ray else "") + code + "\n")
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, f"{doc.name} example {name!r} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return out.stdout


def run_shell(name: str, tmp_path: Path, **env: str) -> str:
    lang, code = blocks()[name]
    assert lang == "bash", f"README block {name!r} is {lang}, expected bash"
    (tmp_path / "configs").exists() or (tmp_path / "configs").symlink_to(ROOT / "configs")
    bindir = Path(sys.executable).parent  # the `keeper` script installed beside this interpreter
    out = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=tmp_path,
                         env=_env(tmp_path, home="RAY_ADDRESS" not in env,
                                  PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", **env),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"README example {name!r} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return out.stdout


def test_every_python_and_keeper_shell_block_is_tested():
    text = README.read_text()
    marked = {m.start(2) - len("```") for m in MARKER.finditer(text)}
    for m in FENCE.finditer(text):
        lang, code = m.group(1), m.group(2)
        needs = lang == "python" or (lang == "bash" and "keeper " in code and "pip install" not in code)
        assert not needs or m.start() in marked, f"README block at char {m.start()} runs untested:\n{code[:200]}"
    assert {"service", "tune", "pbt", "cli-inputs", "cli", "cli-service", "zoo"} <= set(blocks())


def test_service_example_runs_twice(tmp_path):
    for _ in range(2):  # the same zoo: a second run registers the same seeded model, which changes nothing
        out = run_python("service", tmp_path)
        parent, score = out.split()[-2:]
        assert parent == "mlp-a" and 0.3 <= float(score) <= 1.0


def _tune_example(tmp_path) -> tuple[str, bool, list[str], int]:
    out = run_python("tune", tmp_path).strip().splitlines()[-1]
    found = re.fullmatch(r"(cpu|cuda) (True|False) (\[.*\]) (\d+) registered", out)
    assert found, out
    parents = eval(found.group(3), {})  # noqa: S307 - a list of strings this test's own subprocess printed
    return found.group(1), found.group(2) == "True", parents, int(found.group(4))


@pytest.mark.slow  # > 20 s on two idle cores
def test_tune_example_warms_later_trials_and_registers_all_four(tmp_path):
    device, on_device, parents, registered = _tune_example(tmp_path)
    assert len(parents) == 4 and registered == 4 and on_device
    # 2 CPUs: the first two trials run together with nothing to inherit; the two after them are warmed
    assert sum(1 for p in parents if p) >= 2, parents


@pytest.mark.gpu  # the example's GPU path: trials holding a quarter of a GPU, modules warmed on cuda
def test_tune_example_on_a_gpu_keeps_warmed_modules_on_it(tmp_path):
    device, on_device, parents, registered = _tune_example(tmp_path)
    assert device == "cuda" and on_device and registered == 4 and sum(1 for p in parents if p) >= 2


@pytest.mark.slow  # > 20 s on two idle cores
def test_pbt_example_exploits_across_architectures_without_errors(tmp_path):
    out = run_python("pbt", tmp_path).strip().splitlines()[-1]
    found = re.fullmatch(r"0 errors; best accuracy ([0-9.]+)", out)
    assert found and float(found.group(1)) > 0.35, out  # chance is 0.25


def test_embedded_zoo_example_runs_twice(tmp_path):
    for _ in range(2):
        out = run_python("zoo", tmp_path, ray=False)
        assert out.split()[-2:] == ["mlp-a", "1"]


def test_cli_example_makes_its_inputs_and_runs_twice(tmp_path):
    for run in range(2):
        run_python("cli-inputs", tmp_path, ray=False)  # the README shows how its input files are made
        out = run_shell("cli", tmp_path)
        assert (tmp_path / "new-warm.onnx").stat().st_size > 0 and (tmp_path / "warm.safetensors").stat().st_size
        assert "mlp-a" in out and "mlp-b" in out
        assert ("already registered as mlp-b" in out) == (run == 1), out


def test_cli_service_example_on_a_running_two_cpu_ray(tmp_path):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="readme-cli")
    try:
        address = ray.get_runtime_context().gcs_address
        out = run_shell("cli-service", tmp_path, RAY_ADDRESS=address)
        assert "keeper serving" in out and "matchers: 4" in out
        assert '"matchers": 4' in out and "serves 0 models" in out and "stopped the keeper service" in out
    finally:
        import keeper.actors as ka

        ka.shutdown()
        ray.shutdown()


def test_hf_trainer_search_registers_every_trial_and_warms_the_deeper_ones_from_the_shallower(tmp_path):
    """docs/usage.md's Hugging Face Trainer search (a grid of 4, 1 CPU each, 2 CPUs): every trial is registered
    from the Trainer's checkpoint-<step>/ with the objective it reported, and the two 2-layer trials, which start
    after the 1-layer ones, are warmed from them (a 64-wide 2-layer BERT has no other parent above the floor)."""
    out = run_python("hf-trainer", tmp_path, doc=USAGE).strip().splitlines()
    rows = [re.fullmatch(r"(\{.*?\}) (\S+) ([0-9.]+) parent: (\S+)", line) for line in out[-5:-1]]
    assert all(rows), out[-5:]
    configs = [eval(r.group(1), {}) for r in rows]  # noqa: S307 - dicts this test's own subprocess printed
    names = {r.group(2): c for r, c in zip(rows, configs)}
    parents = {(c["hidden"], c["layers"]): (None if r.group(4) == "None" else names[r.group(4)])
               for r, c in zip(rows, configs)}
    assert len(names) == 4 and all(0.0 <= float(r.group(3)) <= 1.0 for r in rows), out[-5:]
    assert parents[(32, 1)] is None and parents[(64, 1)] is None, parents
    assert parents[(64, 2)] == {"hidden": 64, "layers": 1}, parents
    assert parents[(32, 2)]["layers"] == 1, parents
    best = float(out[-1].split()[-1])  # the Trainer's best last objective; keeper keeps each trial's best
    assert max(float(r.group(3)) for r in rows) >= best - 1e-4, out[-5:]
