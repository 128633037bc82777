"""keeper.matching.kernel_cache and the numba kernels where keeper.matching._dpcore is not built: the compile is paid
once per machine (a second process, and a copy of the package elsewhere, load the first one's code), said once per
process, and shown by ``keeper doctor``.

"Not built" is real here: each process runs with an import hook that refuses ``keeper.matching._dpcore``, as an install
without a C compiler has no such module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from keeper.matching import kernel_cache

ROOT = Path(__file__).resolve().parents[1]
NOT_BUILT = '''
import sys
class _NotBuilt:
    def find_spec(self, name, path=None, target=None):
        if name == "keeper.matching._dpcore":
            raise ModuleNotFoundError("No module named 'keeper.matching._dpcore'")
sys.meta_path.insert(0, _NotBuilt())
'''
ALIGN = NOT_BUILT + '''
import dataclasses, json, warnings
import numpy as np
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as said:
    from keeper.matching import MatchArrays, align, score_many, similarity
    numba_at_import = "numba" in sys.modules  # a process that never aligns never imports numba
    from keeper.matching import kernels
    one = {f.name: np.zeros(1, np.int64) for f in dataclasses.fields(MatchArrays)}
    one.update(cls=np.ones(1, np.int32), shape=np.ones((1, 5), np.int64), total=1)
    tiny = MatchArrays(**one)
    for _ in range(2):
        similarity(tiny, tiny), align(tiny, tiny), score_many([tiny], tiny)
print(json.dumps({"numba_at_import": numba_at_import, "compiled": [k for k in ("dp_value", "dp_pairs", "dp_batch")
                               if getattr(kernels, k).stats.cache_misses],
                  "loaded": [k for k in ("dp_value", "dp_pairs", "dp_batch")
                             if getattr(kernels, k).stats.cache_hits],
                  "warnings": [f"{w.category.__name__}: {w.message}" for w in said]}))
'''


def run(code: str, root: Path, cache: Path, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=root,
                         env={**os.environ, "PYTHONPATH": str(root), "KEEPER_KERNEL_CACHE": str(cache), **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)  # the one JSON document the process prints


def test_the_numba_kernels_compile_once_per_machine_and_say_so_once_per_process(tmp_path):
    cache = tmp_path / "kernels"
    first = run(ALIGN, ROOT, cache)
    assert first["numba_at_import"] is False
    assert first["compiled"] == ["dp_value", "dp_pairs", "dp_batch"]
    [said] = first["warnings"]  # once, though the kernels ran twice each
    assert said.startswith("KernelCompileWarning") and "compiles them now" in said and str(cache) in said
    assert "C compiler" in said and "pip install -e ." in said and "keeper doctor" in said
    second = run(ALIGN, ROOT, cache)
    assert second["compiled"] == [] and second["loaded"] == ["dp_value", "dp_pairs", "dp_batch"]
    assert "compiled them before" in second["warnings"][0]
    # a copy of the package at another path, its files newer (what Ray's runtime_env unpacks per job): same code,
    # so the same cache entry
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "keeper", copy / "keeper", ignore=shutil.ignore_patterns("__pycache__", "_dpcore*"))
    os.utime(copy / "keeper" / "matching" / "kernels.py")
    moved = run(ALIGN, copy, cache)
    assert moved["compiled"] == [] and moved["loaded"] == ["dp_value", "dp_pairs", "dp_batch"]
    # a process that asked for numba is not warned
    assert run(ALIGN, ROOT, cache, KEEPER_DP="numba")["warnings"] == []


def test_doctor_shows_the_kernels_in_use_and_loads_them_on_request(tmp_path):
    cache = tmp_path / "kernels"
    doctor = NOT_BUILT + "from keeper.cli import main\nraise SystemExit(main(['doctor', '--json'] + ARGS))\n"
    before = run(doctor.replace("ARGS", "[]"), ROOT, cache)["kernels"]
    assert before["implementation"] == "numba" and "keeper.matching._dpcore" in before["reason"]
    assert before["cache"].startswith(str(cache)) and not any(before["cached"].values())
    loaded = run(doctor.replace("ARGS", "['--load-kernels']"), ROOT, cache)
    assert loaded["kernels"]["load"]["compiled"] == ["dp_value", "dp_pairs", "dp_batch"]
    assert all(loaded["kernels"]["cached"].values())
    again = run(doctor.replace("ARGS", "['--load-kernels']"), ROOT, cache)
    assert again["kernels"]["load"]["compiled"] == [] and not any("not compiled on this machine" in n
                                                                   for n in again["notes"])
    assert any("not built" in n and "C compiler" in n for n in again["notes"])


def test_the_cache_directory_is_the_first_writable_place(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setenv(kernel_cache.ENV, str(blocked))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(kernel_cache, "_chosen", [])
    where = kernel_cache.directory()
    assert where is not None and where.parent == tmp_path / "xdg" / "keeper" / "kernels" and where.is_dir()
    assert where.name.startswith("numba-")  # named by the kernels' source, not by where the package lies


def test_where_no_place_is_writable_numba_keeps_its_own_defaults(monkeypatch):
    """No writable place (here: every candidate under /proc, which no one may write): no directory, so
    keeper.matching.kernels asks numba for no cache (``_CACHE``) and compiles in each process instead of failing its
    import on numba's "cannot cache function"."""
    import tempfile

    for var, value in ((kernel_cache.ENV, "/proc/keeper-kernels"), ("XDG_CACHE_HOME", "/proc/xdg"),
                       ("HOME", "/proc/home")):
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(tempfile, "tempdir", "/proc/tmp")
    monkeypatch.setattr(kernel_cache, "_chosen", [])
    assert kernel_cache.directory() is None
