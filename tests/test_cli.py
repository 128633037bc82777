"""Tests of the ``keeper`` command line (keeper.cli.main, in-process): register (a file, a directory, refusals),
warm, zoo ls / info / rm, help, exit codes and messages, and the $KEEPER_ZOO default."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

import nets
from keeper.cli import main
from keeper.zoo import Zoo

mlp_onnx = nets.mlp_onnx




@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """No test may reach the user's real zoo: $KEEPER_ZOO unset and ~ pointed into tmp_path."""
    monkeypatch.delenv("KEEPER_ZOO", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    yield
    assert not (tmp_path / "home" / ".keeper").exists(), "a command fell back to the default zoo"


@pytest.fixture
def zoo_dir(tmp_path) -> str:
    return str(tmp_path / "zoo")


def write(path: Path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


def keeper(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``keeper argv`` in-process: (exit code, stdout, stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def registered(zoo_dir: str, path: str, name: str, accuracy: float = 0.9) -> None:
    assert main(["register", path, "--accuracy", str(accuracy), "--name", name, "--zoo", zoo_dir]) == 0


# ---------------------------------------------------------------------------------------------- register


def test_register_a_single_file(tmp_path, zoo_dir, capsys):
    path = write(tmp_path / "trained.onnx", mlp_onnx([24, 10], 1))
    code, out, _ = keeper(capsys, "register", path, "--accuracy", "0.91", "--name", "mlp-a", "--zoo", zoo_dir)
    assert code == 0
    assert re.search(r"registered mlp-a \(accuracy 0\.9100, 658 params, \d+ bytes\) into ", out)
    rec = Zoo(zoo_dir).record("mlp-a")
    assert rec.accuracy == 0.91 and rec.num_params == 658
    # without --name the content hash names it
    code, out, _ = keeper(capsys, "register", write(tmp_path / "b.onnx", mlp_onnx([24, 10], 2)), "--accuracy", "0.8",
                          "--zoo", zoo_dir)
    assert code == 0 and re.search(r"registered model-[0-9a-f]{12} ", out) and len(Zoo(zoo_dir)) == 2


def test_register_a_directory_with_an_accuracy_file(tmp_path, zoo_dir, capsys):
    runs = tmp_path / "runs"
    for i, stem in enumerate(["a", "b", "c"]):
        write(runs / f"{stem}.onnx", mlp_onnx([24, 10], i))
    write(runs / "notes.txt", b"not a model, not an .onnx file: ignored")
    # entries by file name and by stem; c falls back to --accuracy
    acc_file = write(tmp_path / "acc.json", json.dumps({"a.onnx": 0.81, "b": 0.82}).encode())
    code, out, err = keeper(capsys, "register", str(runs), "--accuracy-file", acc_file, "--accuracy", "0.83",
                            "--zoo", zoo_dir)
    assert code == 0
    assert "registering" in err  # the progress bar
    for stem in "abc":
        assert f"registered {stem} (accuracy" in out
    assert "3 of 3 registered" in out
    assert {r.name: r.accuracy for r in Zoo(zoo_dir)} == {"a": 0.81, "b": 0.82, "c": 0.83}


def test_register_a_directory_with_garbage_registers_the_rest(tmp_path, zoo_dir, capsys):
    runs = tmp_path / "runs"
    write(runs / "good.onnx", mlp_onnx([24, 10], 1))
    write(runs / "garbage.onnx", b"\x00\x01 this is not onnx")
    write(runs / "unscored.onnx", mlp_onnx([24, 10], 2))
    acc_file = write(tmp_path / "acc.json", json.dumps({"good": 0.9, "garbage": 0.9}).encode())
    code, out, err = keeper(capsys, "register", str(runs), "--accuracy-file", acc_file, "--zoo", zoo_dir)
    assert code == 1
    assert "refused garbage.onnx" in err
    assert "skipped unscored.onnx: no accuracy" in err
    assert "1 of 3 registered" in out
    assert Zoo(zoo_dir).names() == ["good"]


def test_register_without_accuracy_is_refused(tmp_path, zoo_dir, capsys):
    path = write(tmp_path / "trained.onnx", mlp_onnx([24, 10], 1))
    code, out, err = keeper(capsys, "register", path, "--zoo", zoo_dir)
    assert code == 1 and out == ""
    assert err.startswith("keeper: error: register: --accuracy is required")
    assert len(Zoo(zoo_dir)) == 0


@pytest.mark.parametrize("accuracy,message", [("1.5", "outside [0, 1]"), ("91", "outside [0, 1]"),
                                              ("nan", "outside [0, 1]"), ("-0.1", "outside [0, 1]")])
def test_a_bad_accuracy_exits_1_without_a_traceback(tmp_path, zoo_dir, capsys, accuracy, message):
    path = write(tmp_path / "trained.onnx", mlp_onnx([24, 10], 1))
    code, _, err = keeper(capsys, "register", path, "--accuracy", accuracy, "--name", "m", "--zoo", zoo_dir)
    assert code == 1 and err.startswith("keeper: error: ") and message in err
    assert len(Zoo(zoo_dir)) == 0


def test_a_malformed_accuracy_file_exits_1_without_a_traceback(tmp_path, zoo_dir, capsys):
    write(tmp_path / "runs" / "a.onnx", mlp_onnx([24, 10], 1))
    for text in (b"{'a': 0.9,", b"[0.9]"):
        acc_file = write(tmp_path / "acc.json", text)
        code, _, err = keeper(capsys, "register", str(tmp_path / "runs"), "--accuracy-file", acc_file,
                              "--zoo", zoo_dir)
        assert code == 1 and "--accuracy-file" in err and "acc.json" in err
    code, _, err = keeper(capsys, "register", str(tmp_path / "runs"), "--accuracy-file", str(tmp_path / "none.json"),
                          "--zoo", zoo_dir)
    assert code == 1 and "none.json" in err
    assert len(Zoo(zoo_dir)) == 0


def test_register_a_missing_file_exits_1(tmp_path, zoo_dir, capsys):
    code, _, err = keeper(capsys, "register", str(tmp_path / "nope.onnx"), "--accuracy", "0.9", "--zoo", zoo_dir)
    assert code == 1 and "nope.onnx" in err


# ---------------------------------------------------------------------------------------------- warm


def test_warm_writes_a_loadable_model_computing_the_parents_function(tmp_path, zoo_dir, capsys):
    parent = mlp_onnx([24, 10], 1)
    registered(zoo_dir, write(tmp_path / "parent.onnx", parent), "mlp-a")
    capsys.readouterr()
    child, out_path = write(tmp_path / "child.onnx", mlp_onnx([40, 10], 2)), tmp_path / "warm.onnx"
    code, out, _ = keeper(capsys, "warm", child, "-o", str(out_path), "--noise", "0", "--zoo", zoo_dir)
    assert code == 0
    score = Zoo(zoo_dir).candidates(child)[0].score
    assert f"parent mlp-a  similarity {score:.4f}" in out and 0.5 < score < 1.0
    assert "preserved yes" in out  # a widened MLP computes its parent's function
    row = next(ln.split() for ln in out.splitlines() if ln.startswith("  mlp-a "))
    assert float(row[1]) == pytest.approx(score, abs=1e-4) and row[5] == "yes"  # per-candidate: score ... preserved
    assert f"wrote {out_path}" in out
    warmed = onnx.load(str(out_path))
    onnx.checker.check_model(warmed)
    x = np.random.default_rng(0).standard_normal((6, 16)).astype(np.float32)
    a = ReferenceEvaluator(parent).run(None, {"x": x})[0]
    b = ReferenceEvaluator(warmed).run(None, {"x": x})[0]
    assert np.abs(a - b).max() / np.abs(a).max() <= 1e-4
    assert Zoo(zoo_dir).record("mlp-a").hits == pytest.approx(1.0)


def test_warm_verbose_prints_provenance(tmp_path, zoo_dir, capsys):
    registered(zoo_dir, write(tmp_path / "parent.onnx", mlp_onnx([24, 10], 1)), "mlp-a")
    capsys.readouterr()
    child = write(tmp_path / "child.onnx", mlp_onnx([40, 10], 2))
    code, out, _ = keeper(capsys, "warm", child, "-o", str(tmp_path / "w.onnx"), "-v", "--zoo", zoo_dir)
    assert code == 0
    lines = {ln.split()[0]: ln.split() for ln in out.splitlines() if " <- " in ln}
    assert set(lines) == {"fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias"}
    for key, (_, arrow, src, op) in lines.items():
        assert arrow == "<-" and src == key  # same layer names in parent and child
    assert lines["fc0.weight"][3] == "widen" and lines["fc1.weight"][3] == "widen-in"
    # without -v there is no provenance
    code, out, _ = keeper(capsys, "warm", child, "-o", str(tmp_path / "w.onnx"), "--zoo", zoo_dir)
    assert code == 0 and " <- " not in out


def test_warm_without_a_parent_keeps_the_models_weights(tmp_path, zoo_dir, capsys):
    child_bytes = mlp_onnx([40, 10], 2)
    child, out_path = write(tmp_path / "child.onnx", child_bytes), tmp_path / "w.onnx"
    Zoo(zoo_dir)  # an empty zoo
    code, out, _ = keeper(capsys, "warm", child, "-o", str(out_path), "--zoo", zoo_dir)
    assert code == 0 and "no parent: " in out and "holds no model" in out  # an empty zoo says so
    got = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out_path)).graph.initializer}
    want = {t.name: numpy_helper.to_array(t) for t in onnx.load_from_string(child_bytes).graph.initializer}
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)


# ---------------------------------------------------------------------------------------------- zoo ls / info / rm


@pytest.fixture
def two_models(tmp_path, zoo_dir):
    registered(zoo_dir, write(tmp_path / "a.onnx", mlp_onnx([24, 10], 1)), "mlp-a", 0.91)
    registered(zoo_dir, write(tmp_path / "b.onnx", mlp_onnx([32, 10], 2)), "mlp-b", 0.85)
    return zoo_dir


def test_zoo_ls(two_models, capsys):
    capsys.readouterr()
    code, out, _ = keeper(capsys, "zoo", "ls", "--zoo", two_models)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("2 models in ") and lines[1].split() == ["name", "accuracy", "params", "bytes", "hits"]
    rows = {ln.split()[0]: ln.split() for ln in lines[2:]}
    assert set(rows) == {"mlp-a", "mlp-b"}
    assert rows["mlp-a"][1] == "0.9100" and rows["mlp-b"][1] == "0.8500" and rows["mlp-a"][2] == "658"


def test_zoo_ls_json(two_models, capsys):
    capsys.readouterr()
    code, out, _ = keeper(capsys, "zoo", "ls", "--json", "--zoo", two_models)
    assert code == 0
    recs = json.loads(out)
    assert [r["name"] for r in recs] == ["mlp-a", "mlp-b"]
    assert [r["accuracy"] for r in recs] == [0.91, 0.85]
    assert recs == [r.to_json() for r in Zoo(two_models)]


def test_zoo_info(two_models, capsys):
    capsys.readouterr()
    code, out, _ = keeper(capsys, "zoo", "info", "mlp-b", "--zoo", two_models)
    assert code == 0
    info = json.loads(out)
    assert info["name"] == "mlp-b" and info["accuracy"] == 0.85 and info["hits"] == 0.0
    assert info == Zoo(two_models).record("mlp-b").to_json()


def test_zoo_rm_then_info_names_the_missing_model(two_models, capsys):
    capsys.readouterr()
    code, out, _ = keeper(capsys, "zoo", "rm", "mlp-a", "--zoo", two_models)
    assert code == 0 and out.strip() == "removed mlp-a"
    assert Zoo(two_models).names() == ["mlp-b"]
    code, out, err = keeper(capsys, "zoo", "info", "mlp-a", "--zoo", two_models)
    assert code == 1 and out == "" and "'mlp-a'" in err and err.startswith("keeper: error: ")
    code, _, err = keeper(capsys, "zoo", "rm", "mlp-a", "--zoo", two_models)
    assert code == 1 and "'mlp-a'" in err


# ---------------------------------------------------------------------------------------------- help, environment


@pytest.mark.parametrize("argv", [["--help"], ["register", "--help"]], ids=["keeper", "register"])
def test_help_exits_0_and_shows_examples(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "keeper register trained.onnx --accuracy 0.91" in out
    assert out.startswith(f"usage: keeper {argv[0] if argv[0] != '--help' else ''}".rstrip())


def test_bad_usage_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["register", "m.onnx", "--accuracy", "high"])
    assert exc.value.code == 2 and "invalid float value" in capsys.readouterr().err


def test_keeper_zoo_environment_variable_is_the_default(tmp_path, monkeypatch, capsys):
    env_zoo = tmp_path / "env-zoo"
    monkeypatch.setenv("KEEPER_ZOO", str(env_zoo))
    path = write(tmp_path / "trained.onnx", mlp_onnx([24, 10], 1))
    code, out, _ = keeper(capsys, "register", path, "--accuracy", "0.9", "--name", "from-env")
    assert code == 0 and str(env_zoo) in out
    assert (env_zoo / "catalog" / "from-env.json").is_file()
    code, out, _ = keeper(capsys, "zoo", "ls")
    assert code == 0 and out.startswith(f"1 models in {env_zoo}") and "from-env" in out
    # --zoo wins over the environment
    other = str(tmp_path / "other")
    Zoo(other)
    code, out, _ = keeper(capsys, "zoo", "ls", "--zoo", other)
    assert code == 0 and out.startswith(f"0 models in {other}")


@pytest.mark.parametrize("argv", [["zoo", "ls"], ["zoo", "ls", "--json"], ["zoo", "info", "m"],
                                  ["warm", "CHILD", "-o", "OUT"]], ids=["ls", "ls-json", "info", "warm"])
def test_reading_commands_refuse_a_missing_zoo_and_create_nothing(tmp_path, capsys, argv):
    typo = tmp_path / "typo-zooo"
    child = write(tmp_path / "child.onnx", mlp_onnx([24, 10], 1))
    argv = [{"CHILD": child, "OUT": str(tmp_path / "w.onnx")}.get(a, a) for a in argv]
    code, out, err = keeper(capsys, *argv, "--zoo", str(typo))
    assert code == 1 and out == ""
    assert err == f"keeper: error: no zoo at {typo}; `keeper register` creates one (in Python: open it with " \
                  "mode='write')\n"
    assert not typo.exists() and not (tmp_path / "w.onnx").exists()


def test_an_empty_keeper_zoo_is_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KEEPER_ZOO", "")
    path = write(tmp_path / "trained.onnx", mlp_onnx([24, 10], 1))
    for argv in (["zoo", "ls"], ["register", path, "--accuracy", "0.9"]):
        code, _, err = keeper(capsys, *argv)
        assert code == 1 and "KEEPER_ZOO is set but empty" in err
    code, _, err = keeper(capsys, "zoo", "ls", "--zoo", "")
    assert code == 1 and "--zoo is empty" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "trained.onnx"] or \
        sorted(p.name for p in tmp_path.iterdir()) == ["trained.onnx"], "no zoo made in the current directory"


# ---------------------------------------------------------------------------------------------- weights apart

def test_register_and_warm_a_graph_with_its_weights_apart(tmp_path, zoo_dir, capsys):
    from keeper.onnx_weights import split_weights
    from keeper.weights import SafeTensors, save_weights

    parent = mlp_onnx([24, 10], 1)
    graph, weights = split_weights(onnx.load_from_string(parent), min_elements=1)
    gpath = write(tmp_path / "graph.onnx", graph.SerializeToString())
    save_weights(weights, tmp_path / "model.safetensors")
    code, out, _ = keeper(capsys, "register", gpath, "--weights", str(tmp_path / "model.safetensors"),
                          "--accuracy", "0.9", "--name", "apart", "--zoo", zoo_dir)
    assert code == 0 and "registered apart" in out
    code, _, err = keeper(capsys, "register", gpath, "--accuracy", "0.9", "--name", "bare", "--zoo", zoo_dir)
    assert code == 1 and "'fc0.weight'" in err and "--weights" in err
    code, _, err = keeper(capsys, "register", gpath, "--weights", str(tmp_path / "nope.safetensors"),
                          "--accuracy", "0.9", "--zoo", zoo_dir)
    assert code == 1 and "nope.safetensors" in err
    # warm an ONNX child into safetensors: the warmed weights alone, computing the parent's function
    child = write(tmp_path / "child.onnx", mlp_onnx([40, 10], 2))
    out_path = tmp_path / "warm.safetensors"
    code, out, _ = keeper(capsys, "warm", child, "-o", str(out_path), "--noise", "0", "--zoo", zoo_dir)
    assert code == 0 and "parent apart" in out and f"wrote {out_path}" in out
    warmed = SafeTensors(out_path)
    proto = onnx.load(child)
    for t in proto.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(np.array(warmed[t.name]), t.name))
    x = np.random.default_rng(0).standard_normal((6, 16)).astype(np.float32)
    a = ReferenceEvaluator(parent).run(None, {"x": x})[0]
    b = ReferenceEvaluator(proto).run(None, {"x": x})[0]
    assert np.abs(a - b).max() / np.abs(a).max() <= 1e-4


def test_register_a_directory_takes_each_graphs_safetensors_beside_it(tmp_path, zoo_dir, capsys):
    from keeper.onnx_weights import split_weights
    from keeper.weights import save_weights

    runs = tmp_path / "runs"
    graph, weights = split_weights(onnx.load_from_string(mlp_onnx([24, 10], 1)), min_elements=1)
    write(runs / "apart.onnx", graph.SerializeToString())
    save_weights(weights, runs / "apart.safetensors")
    write(runs / "inline.onnx", mlp_onnx([24, 10], 2))
    write(runs / "orphan.onnx", graph.SerializeToString())  # a graph whose weights are nowhere: refused
    code, out, err = keeper(capsys, "register", str(runs), "--accuracy", "0.9", "--zoo", zoo_dir, "-q")
    assert code == 1 and "2 of 3 registered" in out and "refused orphan.onnx" in err and "'fc0.weight'" in err
    zoo = Zoo(zoo_dir)
    assert zoo.names() == ["apart", "inline"] and "weights.safetensors" in zoo.record("apart").extras
    # a child graph without weights and without a parent: written with its tensors as zeros, each listed
    Zoo(str(tmp_path / "empty-zoo"))
    code, out, _ = keeper(capsys, "warm", str(runs / "orphan.onnx"), "-o", str(tmp_path / "o.safetensors"),
                          "--zoo", str(tmp_path / "empty-zoo"))
    assert code == 0 and "no parent" in out and "are zeros in" in out


def _gated_onnx(seed: int) -> bytes:
    """x -> Linear -> * softmax(gate): the gate is read by an op keeper has no layer rule for."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 6)).astype(np.float32), "fc.weight"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "fc.bias"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "gate")]
    nodes = [helper.make_node("Gemm", ["x", "fc.weight", "fc.bias"], ["h"]),
             helper.make_node("Softmax", ["gate"], ["g"]), helper.make_node("Mul", ["h", "g"], ["y"])]
    graph = helper.make_graph(nodes, "gated", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 6])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_warm_names_the_tensors_it_could_not_read(tmp_path, zoo_dir, capsys):
    registered(zoo_dir, write(tmp_path / "parent.onnx", _gated_onnx(1)), "gated")
    capsys.readouterr()
    child = write(tmp_path / "child.onnx", _gated_onnx(2))
    code, out, _ = keeper(capsys, "warm", child, "-o", str(tmp_path / "warm.onnx"), "--noise", "0", "--zoo", zoo_dir)
    assert code == 0
    assert "parent gated  similarity 0.9444" in out  # 102 of the 108 learned elements: not the gate's 6
    assert "1 learned tensors are read by ops keeper has no rule for and keep the model's own values: gate" in out


# ---------------------------------------------------------------------------------------------- read-only zoos


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@contextlib.contextmanager
def read_only(path: Path):
    """``path`` made read-only for real: chmod for a user, a read-only bind mount for root (whom chmod does not
    stop); skipped where neither restricts."""
    if os.geteuid() != 0:
        dirs = [path, *(p for p in path.rglob("*") if p.is_dir())]
        for d in dirs:
            d.chmod(0o555)
        try:
            yield
        finally:
            for d in dirs:
                d.chmod(0o755)
        return
    if shutil.which("mount") is None or subprocess.run(["mount", "--bind", "-o", "ro", str(path), str(path)],
                                                       capture_output=True, check=False).returncode != 0:
        pytest.skip("running as root without a read-only bind mount: chmod would not restrict")
    try:
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_a_read_only_zoo_lists_shows_and_warms(tmp_path, zoo_dir, capsys):
    registered(zoo_dir, write(tmp_path / "parent.onnx", mlp_onnx([24, 10], 1)), "mlp-a")
    child = write(tmp_path / "child.onnx", mlp_onnx([40, 10], 2))
    capsys.readouterr()
    before = tree(Path(zoo_dir))
    with read_only(Path(zoo_dir)):
        with pytest.raises(OSError):
            (Path(zoo_dir) / "probe").write_bytes(b"")  # the zoo is read-only for this process
        code, out, err = keeper(capsys, "zoo", "ls", "--zoo", zoo_dir)
        assert code == 0 and out.startswith("1 models in ") and "mlp-a" in out and err == ""
        code, out, err = keeper(capsys, "zoo", "info", "mlp-a", "--zoo", zoo_dir)
        assert code == 0 and json.loads(out)["name"] == "mlp-a" and err == ""
        for _ in range(2):
            code, out, err = keeper(capsys, "warm", child, "-o", str(tmp_path / "w.onnx"), "--noise", "0",
                                    "--zoo", zoo_dir)
            assert code == 0 and "parent mlp-a" in out and (tmp_path / "w.onnx").is_file()
            # one warning per command, naming the zoo; no retries (an instant answer), no error
            assert err.count("keeper: warning: ") == 1 and "usage counts" in err and zoo_dir in err, err
            assert "attempt" not in err
        code, _, err = keeper(capsys, "zoo", "rm", "mlp-a", "--zoo", zoo_dir)
        assert code == 1 and "'mlp-a'" in err and "read-only" in err and "attempt" not in err
    assert tree(Path(zoo_dir)) == before, "nothing in a read-only zoo changes"


# ---------------------------------------------------------------------------------------------- honest registration


def test_stored_content_under_another_name_or_accuracy_is_refused_unless_asked(tmp_path, zoo_dir, capsys):
    path = write(tmp_path / "p6s.onnx", mlp_onnx([24, 10], 1))
    other = write(tmp_path / "other.onnx", mlp_onnx([24, 10], 2))
    registered(zoo_dir, path, "p6s", 0.8)
    registered(zoo_dir, other, "taken", 0.8)
    before = tree(Path(zoo_dir))
    capsys.readouterr()
    code, out, _ = keeper(capsys, "register", path, "--accuracy", "0.8", "--name", "p6s", "--zoo", zoo_dir)
    assert code == 0 and out.startswith("already registered as p6s (accuracy 0.8000)") and "nothing changed" in out
    code, out, err = keeper(capsys, "register", path, "--accuracy", "0.9", "--name", "new-name", "--zoo", zoo_dir)
    assert code == 1 and out == "" and "already stored as 'p6s'" in err and "--alias" in err
    code, out, err = keeper(capsys, "register", path, "--accuracy", "0.9", "--zoo", zoo_dir)  # no name
    assert code == 1 and "'p6s'" in err and "0.8000, not 0.9000" in err and "--update-accuracy" in err
    code, out, err = keeper(capsys, "register", path, "--accuracy", "0.8", "--name", "taken", "--zoo", zoo_dir)
    assert code == 1 and "'taken' is taken by different content" in err, "the name check is not bypassed"
    code, out, err = keeper(capsys, "register", str(tmp_path), "--accuracy", "0.95", "--zoo", zoo_dir)
    assert code == 1 and "refused other.onnx" in err and "refused p6s.onnx" in err  # a directory says the same
    assert tree(Path(zoo_dir)) == before, "nothing refused changes the zoo"
    # asked for by flag: an alias under the new name (the blobs stored once), a new accuracy under the old name
    code, out, _ = keeper(capsys, "register", path, "--accuracy", "0.9", "--name", "new-name", "--alias",
                          "--zoo", zoo_dir)
    assert code == 0 and "registered new-name (accuracy 0.9000" in out and "an alias of p6s" in out
    code, out, _ = keeper(capsys, "register", path, "--accuracy", "0.85", "--name", "p6s", "--update-accuracy",
                          "--zoo", zoo_dir)
    assert code == 0 and out.startswith("updated p6s: accuracy 0.8000 -> 0.8500")
    zoo = Zoo(zoo_dir)
    assert {r.name: r.accuracy for r in zoo} == {"new-name": 0.9, "p6s": 0.85, "taken": 0.8}
    assert zoo.record("new-name").checksum == zoo.record("p6s").checksum
    assert {k for k in tree(Path(zoo_dir)) if k.startswith("blobs")} == {k for k in before if k.startswith("blobs")}


# ---------------------------------------------------------------------------------------------- arguments first


def test_warm_checks_its_output_path_before_warming(two_models, tmp_path, capsys):
    child = write(tmp_path / "child.onnx", mlp_onnx([40, 10], 2))
    capsys.readouterr()
    for output, message in ((tmp_path / "nodir" / "w.onnx", "directory"), (tmp_path / "w.txt", "must end in .onnx")):
        code, out, err = keeper(capsys, "warm", child, "-o", str(output), "--zoo", two_models)
        assert code == 1 and out == "" and message in err and err.startswith("keeper: error: warm: -o ")
    code, out, err = keeper(capsys, "warm", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "w.onnx"),
                            "--zoo", two_models)
    assert code == 1 and "warm: no file" in err and "ModelProto" not in err  # CLI words, not the Python API's
    assert all(r.hits == 0 for r in Zoo(two_models)), "no warm ran, no hit was counted"
    with pytest.raises(SystemExit) as exc:
        main(["warm", child, "-o", str(tmp_path / "w.onnx"), "--noise", "-1", "--zoo", two_models])
    assert exc.value.code == 2 and "finite number >= 0" in capsys.readouterr().err


def test_register_checks_its_arguments_before_making_a_zoo(tmp_path, zoo_dir, capsys):
    path = write(tmp_path / "m.onnx", mlp_onnx([24, 10], 1))
    for argv, message in (([str(tmp_path / "nope.onnx"), "--accuracy", "0.9"], "register: no file"),
                          ([path, "--accuracy", "91"], "outside [0, 1]"),
                          ([path, "--accuracy", "0.9", "--weights", str(tmp_path / "w.safetensors")], "--weights")):
        code, _, err = keeper(capsys, "register", *argv, "--zoo", zoo_dir)
        assert code == 1 and message in err
    assert not Path(zoo_dir).exists(), "a refused registration makes no zoo"


def test_a_closed_pipe_ends_quietly(tmp_path):
    from keeper.store import ModelStore

    store = ModelStore(str(tmp_path / "zoo"))
    for i in range(300):  # more than a pipe holds, so the writer meets the closed end
        store.put(f"m{i:03d}", f"blob-{i}".encode(), accuracy=0.5, num_params=i, summary={"pad": "x" * 400})
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    for flags in ("--json", ""):
        proc = subprocess.run(f"{sys.executable} -m keeper.cli zoo ls {flags} --zoo {tmp_path / 'zoo'} | head -1",
                              shell=True, capture_output=True, text=True, env=env, check=False)
        assert proc.stdout.strip() in ("[", "300 models in " + str(tmp_path / "zoo"))
        assert proc.stderr == "", proc.stderr


def test_version_and_every_option_has_help(capsys):
    from keeper import __version__
    from keeper.cli import _parser

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out == f"keeper {__version__}\n"

    def parsers(p, path):
        yield path, p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    yield from parsers(sub, f"{path} {name}")

    seen = set()
    for path, p in parsers(_parser(), "keeper"):
        seen.add(path)
        text = p.format_help()
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction)):
                continue
            assert a.help, f"{path} {a.option_strings or a.dest} has no help text"
            if a.option_strings and a.nargs != 0 and a.default not in (None, False):  # flags have no default
                assert f"default: {a.default}" in " ".join(text.split()), f"{path} {a.option_strings}: no default"
    assert {"keeper warm", "keeper zoo ls", "keeper zoo gc", "keeper serve"} <= seen
