"""Tests of keeper.torch_support.cache through keeper.torch_support.export_graph: a second module of one architecture
reuses the first export and gets what a fresh export gives it; anything that changes the trace (an attribute, a
buffer's value, the input's shape, the exporter) exports again; a module keeper cannot fingerprint is exported
every time; a warm through a remembered export is exact. Exports kept on disk serve a fresh process, are checked
against the module's tensors before use, and a broken or unwritable disk cache costs a fresh export, never an
error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import nets
from keeper.torch_support import cache as export_cache
from keeper.torch_support import cache_files
from keeper.torch_support import export_graph, module_weights, warm_start
from keeper.zoo import Zoo


class Gated(nn.Module):
    """A block whose forward depends on plain attributes (a flag and a scale) and on a buffer's values."""

    def __init__(self, residual: bool = True, scale: float = 1.0, width: int = 8):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, width), nn.Linear(width, 3)
        self.residual, self.scale = residual, scale
        self.register_buffer("offset", torch.zeros(width))
        self.register_buffer("order", torch.arange(width))  # indices: held in the graph as data

    def forward(self, x):
        h = torch.relu(self.fc1(x[:, self.order])) * self.scale + self.offset
        return self.fc2(h + x if self.residual else h)


def _model(seed: int, **kw) -> Gated:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return nets.randomize(Gated(**kw), seed)


X = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))


@pytest.fixture(autouse=True)
def empty_cache(tmp_path, monkeypatch):
    """An empty process cache and an empty disk cache of this test."""
    monkeypatch.setenv(cache_files.ENV, str(tmp_path / "arch-cache"))
    export_cache.clear()
    yield
    export_cache.clear()


def _fresh(module, x, dynamo):
    """A true export: neither cache is read."""
    export_cache.clear()
    os.environ[cache_files.ENV], saved = "off", os.environ[cache_files.ENV]
    try:
        with nets.quiet():
            return export_graph(module, x, dynamo=dynamo)
    finally:
        os.environ[cache_files.ENV] = saved


def _export(module, x, dynamo):
    with nets.quiet():
        return export_graph(module, x, dynamo=dynamo)


@pytest.mark.parametrize("dynamo", [False, True])
def test_second_module_of_one_architecture_reuses_the_export(dynamo):
    first, second = _model(0), _model(1)
    _export(first, X, dynamo)
    before = export_cache.stats()
    got = _export(second, X, dynamo)
    assert export_cache.stats()["hits"] == before["hits"] + 1
    want = _fresh(second, X, dynamo)
    assert (got.onnx, got.keys, got.apart) == (want.onnx, want.keys, want.apart)
    # the weights are the second module's, read in place
    w = module_weights(second, got)
    key = next(k for k, (sd, _) in got.keys.items() if sd == "fc1.weight")
    init = next(i for i, k in got.apart.items() if k == key)
    np.testing.assert_array_equal(np.asarray(w[init]).reshape(-1), second.fc1.weight.detach().numpy().reshape(-1))


@pytest.mark.parametrize("change", ["flag", "scale", "buffer", "input", "exporter", "width"])
def test_what_changes_the_trace_exports_again(change):
    base = _model(0)
    _export(base, X, False)
    other, x, dynamo = _model(1), X, False
    if change == "flag":
        other = _model(1, residual=False)
    elif change == "scale":
        other = _model(1, scale=2.0)
    elif change == "buffer":  # a buffer no layer reads is held in the graph as data: its value is part of it
        other.order = other.order.flip(0)
    elif change == "input":
        x = torch.randn(3, 8)
    elif change == "exporter":
        dynamo = True
    else:
        other, x = _model(1, width=6), torch.randn(2, 6)
    hits = export_cache.stats()["hits"]
    got = _export(other, x, dynamo)
    assert export_cache.stats()["hits"] == hits, f"a changed {change} must not reuse the export"
    want = _fresh(other, x, dynamo)
    assert got.onnx == want.onnx and got.keys == want.keys


def test_module_with_an_opaque_attribute_is_exported_every_time():
    class Opaque:  # no value keeper can read: its effect on forward is unknown
        pass

    module = _model(0)
    module.helper = Opaque()
    before = export_cache.stats()
    _export(module, X, False)
    _export(module, X, False)
    after = export_cache.stats()
    assert after["uncacheable"] == before["uncacheable"] + 2 and after["hits"] == before["hits"]


def test_tied_weights_share_one_entry_in_the_fingerprint():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(16, 8)
            self.head = nn.Linear(8, 16, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, t):
            return self.head(self.emb(t))

    class Untied(Tied):
        def __init__(self):
            super().__init__()
            self.head.weight = nn.Parameter(self.emb.weight.detach().clone())

    Untied.__qualname__ = Tied.__qualname__  # the same class text: only the sharing differs
    t = torch.arange(4).reshape(1, 4)
    assert export_cache.fingerprint(Tied(), (t,), "x") == export_cache.fingerprint(Tied(), (t,), "x")
    assert export_cache.fingerprint(Tied(), (t,), "x") != export_cache.fingerprint(Untied(), (t,), "x")


def test_warm_start_through_a_remembered_export_is_exact(tmp_path):
    zoo = Zoo(str(tmp_path / "zoo"))
    parent = _model(0)
    warm_start(parent, X, zoo)  # first export of the architecture; cold
    from keeper.torch_support import register

    with nets.quiet():
        register(parent, X, zoo, 0.9, name="parent")
    child = _model(1)
    hits = export_cache.stats()["hits"]
    with nets.quiet():
        result = warm_start(child, X, zoo, noise=0.0)
    assert export_cache.stats()["hits"] > hits
    assert result.parent == "parent" and result.score == 1.0
    for (k, v), (_, w) in zip(parent.state_dict().items(), child.state_dict().items()):
        assert torch.equal(v, w), k


ROOT = Path(__file__).resolve().parents[1]
CHILD = textwrap.dedent("""
    import json, sys, torch
    sys.path[:0] = [{tests!r}]
    from test_torch_cache import _model, X
    from keeper.torch_support import cache, export_graph
    import nets
    with nets.quiet():
        got = export_graph(_model(int(sys.argv[1])), X, dynamo=False)
    print(json.dumps({{"stats": cache.stats(), "onnx": got.onnx.hex(), "keys": got.keys, "apart": got.apart}}))
""")


def _in_fresh_process(seed: int, cache_dir: Path) -> dict:
    env = {**os.environ, cache_files.ENV: str(cache_dir),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", CHILD.format(tests=str(ROOT / "tests")), str(seed)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_fresh_process_reads_the_export_another_process_kept(tmp_path):
    first = _in_fresh_process(0, tmp_path / "c")
    second = _in_fresh_process(1, tmp_path / "c")
    assert first["stats"]["misses"] == 1 and first["stats"]["disk_hits"] == 0
    assert second["stats"]["misses"] == 0 and second["stats"]["disk_hits"] == 1, second["stats"]
    assert (second["onnx"], second["keys"], second["apart"]) == (first["onnx"], first["keys"], first["apart"])


def test_a_kept_export_is_checked_against_the_module_before_use():
    base = _model(0)
    _export(base, X, False)
    key = export_cache.fingerprint(base, (X,), "torchscript/0")
    meta_path = Path(os.environ[cache_files.ENV]) / f"{key}.json"
    meta = json.loads(meta_path.read_text())
    assert cache_files.load(key, base) is not None
    # an entry whose tensors are not the module's (as a fingerprint collision would give) is not used
    meta["tensors"]["fc1.weight"][0] = [9, 9]
    meta_path.write_text(json.dumps(meta))
    assert cache_files.load(key, base) is None
    export_cache.clear()
    before = export_cache.stats()
    got = _export(_model(1), X, False)
    assert export_cache.stats()["misses"] == before["misses"] + 1
    want = _fresh(_model(1), X, False)
    assert (got.onnx, got.keys) == (want.onnx, want.keys)


def test_processes_missing_one_architecture_at_once_trace_it_once(monkeypatch):
    """Trials a job starts at once on a node (each its own process) export one architecture once: who misses an
    entry another is tracing waits for its entry (threads here: a file lock excludes them as it does processes)."""
    import importlib
    import threading

    export_module = importlib.import_module("keeper.torch_support.export")  # the package's `export` is a function
    real, traced = export_module._traced_graph, []

    def slow_trace(*args):
        traced.append(1)
        time.sleep(0.3)  # long enough for the other caller to miss the entry too
        return real(*args)

    monkeypatch.setattr(export_module, "_traced_graph", slow_trace)
    results, before = {}, export_cache.stats()  # counts are the process's: other tests ran in it before

    def trial(seed: int) -> None:
        results[seed] = _export(_model(seed), X, None)

    threads = [threading.Thread(target=trial, args=(seed,)) for seed in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(traced) == 1 and export_cache.stats()["disk_hits"] == before["disk_hits"] + 1
    want = _fresh(_model(1), X, None)
    assert (results[1].onnx, results[1].keys) == (want.onnx, want.keys)


@pytest.mark.parametrize("damage", ["truncated onnx", "garbage graph", "garbage json"])
def test_a_damaged_kept_export_is_exported_again(damage):
    _export(_model(0), X, False)
    key = export_cache.fingerprint(_model(0), (X,), "torchscript/0")
    root = Path(os.environ[cache_files.ENV])
    if damage == "truncated onnx":
        (root / f"{key}.onnx").write_bytes((root / f"{key}.onnx").read_bytes()[:20])
    elif damage == "garbage graph":
        (root / f"{key}.npz").write_bytes(b"not an npz")
    else:
        (root / f"{key}.json").write_text("{")
    export_cache.clear()
    child, before = _model(1), export_cache.stats()["disk_hits"]
    got = _export(child, X, False)
    assert export_cache.stats()["disk_hits"] == before
    want = _fresh(child, X, False)
    assert (got.onnx, got.keys) == (want.onnx, want.keys)


def test_an_unwritable_cache_warns_and_exports(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(cache_files.ENV, str(blocker / "below-a-file"))
    monkeypatch.setattr(cache_files, "_warned", False)
    with pytest.warns(UserWarning, match="could not keep an architecture export"):
        got = export_graph(_model(0), X, dynamo=False)  # not under nets.quiet(), which silences warnings
    assert got.onnx == _fresh(_model(0), X, False).onnx


def test_an_edit_to_the_model_file_changes_the_fingerprint(tmp_path):
    source = textwrap.dedent("""
        import torch
        def act(x):
            return torch.relu(x)
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 4)
            def forward(self, x):
                return act(self.fc(x))
    """)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import torch, netfile; "
            "from keeper.torch_support.cache import fingerprint; "
            "print(fingerprint(netfile.Net(), (torch.zeros(1, 4),), 'x'))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    prints = []
    for text in (source, source, source.replace("torch.relu(x)", "torch.tanh(x)")):
        (tmp_path / "netfile.py").write_text(text)
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        prints.append(out.stdout.strip())
    assert prints[0] == prints[1] and prints[1] != prints[2]


def test_the_fingerprint_is_the_same_in_every_process(tmp_path):
    """String hashing differs per process: a set constant in a forward (``x in {"a", "b"}``) or a config must not
    make one architecture's fingerprint differ between two Tune trials."""
    source = textwrap.dedent("""
        import torch
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc, self.mode = torch.nn.Linear(4, 4), "relu"
            def forward(self, x):
                return torch.relu(self.fc(x)) if self.mode in {"relu", "rectifier", "max0"} else self.fc(x)
    """)
    (tmp_path / "setnet.py").write_text(source)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import torch, setnet; "
            "from keeper.torch_support.cache import fingerprint; "
            "from hf_catalogue import build; m, args = build('gpt2', 0); "
            "Inline = type('Inline', (torch.nn.Linear,), {}); "  # a class no file holds (python -c, a REPL)
            "print(fingerprint(setnet.Net(), (torch.zeros(1, 4),), 'x'), fingerprint(m, args, 'x'), "
            "fingerprint(Inline(4, 4), (torch.zeros(1, 4),), 'x'))")
    prints, procs = set(), []
    for seed in ("1", "2", "3"):  # three processes at once: each is mostly its imports
        env = {**os.environ, "PYTHONHASHSEED": seed,
               "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
        procs.append(subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        prints.add(out.strip().splitlines()[-1])
    assert len(prints) == 1, prints
