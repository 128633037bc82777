"""``keeper doctor``: what this install runs and what would make keeper slow here, in one report.

It names the alignment kernels in use (the C extension, or numba and whether this machine holds their compiled
code), the versions of keeper's dependencies (torch with its CUDA devices, ONNX, onnxruntime, Ray, numba...), the
caches keeper keeps on this machine (architectures, kernels) and the settings that change its speed
(``KEEPER_EXPORTER``, ``KEEPER_DP``, ``KEEPER_ARCH_CACHE``). Each finding that costs time comes with what to do about
it (``notes``).

Invariants: a report reads and imports; it writes nothing, except with ``load_kernels`` (which compiles the numba
kernels into this machine's kernel cache, as the first warm start would); a dependency that is missing or broken
is reported, never raised; Ray is not imported (its version comes from the package metadata).
"""

from __future__ import annotations

import os
import platform
import sys
import time
import warnings
from importlib import metadata
from typing import Any

__all__ = ["report", "render"]

_PACKAGES = ("torch", "numpy", "onnx", "onnxscript", "onnxruntime", "numba", "ray", "transformers", "safetensors",
             "pyarrow")
# what a missing optional package costs (keeper itself needs the rest)
_MISSING = {"ray": "the service, Tune and Ray Train integrations need it; the embedded keeper.Zoo works without",
            "onnxruntime": "only scripts and tests that run ONNX models need it",
            "transformers": "only Hugging Face models need it"}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _kernels(load: bool) -> dict[str, Any]:
    """Which alignment kernels run here, and for numba where their compiled code is and whether it is there."""
    from keeper.matching import core, kernel_cache

    out: dict[str, Any] = {"implementation": core.IMPLEMENTATION}
    if core.IMPLEMENTATION == "c":
        out["path"] = getattr(core._dpcore, "__file__", None)
        return out
    where = kernel_cache.directory()
    out.update(reason=core.MISSING_REASON, numba=_version("numba"),
               cache=str(where) if where is not None else None)
    if load:
        out["load"] = _load_kernels()
    from keeper.matching import kernels

    out["cached"] = kernels.cached()
    return out


def _load_kernels() -> dict[str, Any]:
    """Compile (the first time on this machine) or load the numba kernels now: seconds, and which it was."""
    import dataclasses

    import numpy as np

    from keeper.matching import kernels
    from keeper.errors import KernelCompileWarning
    from keeper.matching import MatchArrays, align, score_many, similarity

    one = {f.name: np.zeros(1, np.int64) for f in dataclasses.fields(MatchArrays)}
    one.update(cls=np.ones(1, np.int32), shape=np.ones((1, 5), np.int64), total=1)
    tiny = MatchArrays(**one)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelCompileWarning)  # this report says it itself
        similarity(tiny, tiny), align(tiny, tiny), score_many([tiny], tiny)
    seconds = time.perf_counter() - t0
    compiled = [k for k in kernels.KERNELS if getattr(kernels, k).stats.cache_misses]
    return {"seconds": round(seconds, 3), "compiled": compiled}


def _torch() -> dict[str, Any]:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken torch is a finding, not a crash
        return {"error": f"{type(exc).__name__}: {exc}"}
    out: dict[str, Any] = {"version": torch.__version__, "cuda": torch.version.cuda,
                           "cuda_available": bool(torch.cuda.is_available()), "threads": torch.get_num_threads()}
    if out["cuda_available"]:
        out["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return out


def _architecture_cache() -> dict[str, Any]:
    from keeper.torch_support import cache_files

    where = cache_files.directory()
    if where is None:
        return {"directory": None}
    entries = len(list(where.glob("*.json"))) if where.is_dir() else 0
    return {"directory": str(where), "entries": entries}


def report(load_kernels: bool = False) -> dict[str, Any]:
    """The findings as a dict (see the module docstring); ``load_kernels`` compiles or loads the numba kernels now."""
    import keeper

    out: dict[str, Any] = {
        "keeper": {"version": keeper.__version__, "path": os.path.dirname(keeper.__file__)},
        "python": f"{platform.python_version()} ({sys.executable})",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}",
        "kernels": _kernels(load_kernels),
        "packages": {name: _version(name) for name in _PACKAGES},
        "torch": _torch(),
        "architecture_cache": _architecture_cache(),
        "settings": {k: os.environ[k] for k in ("KEEPER_EXPORTER", "KEEPER_DP", "KEEPER_ARCH_CACHE",
                                                "KEEPER_KERNEL_CACHE", "KEEPER_ZOO") if k in os.environ},
    }
    out["notes"] = _notes(out)
    return out


def _notes(r: dict[str, Any]) -> list[str]:
    """What costs time here, each with what to do about it."""
    notes = []
    k = r["kernels"]
    if k["implementation"] == "numba" and r["settings"].get("KEEPER_DP") != "numba":
        notes.append("the C alignment kernels (keeper.matching._dpcore) are not built: every fresh process loads the "
                     "numba ones (about 0.5 s). Install keeper again where a C compiler is present (`pip install -e .` "
                     "in the checkout)")
    if k["implementation"] == "numba" and k["cache"] is None:
        notes.append("no kernel cache directory is writable: every process compiles the numba kernels (1-4 s); set "
                     "KEEPER_KERNEL_CACHE to a writable directory")
    elif k["implementation"] == "numba" and not all(k["cached"].values()):
        notes.append("the numba kernels are not compiled on this machine yet: the first warm start compiles them "
                     "(1-4 s); `keeper doctor --load-kernels` does it now (e.g. in an image build)")
    if r["architecture_cache"]["directory"] is None:
        notes.append("the architecture cache is off (KEEPER_ARCH_CACHE): every process traces each architecture "
                     "again; unset it")
    exporter = r["settings"].get("KEEPER_EXPORTER")
    if exporter in ("dynamo", "torchscript"):
        notes.append(f"KEEPER_EXPORTER={exporter}: architectures go through torch's ONNX exporter (seconds per new "
                     "architecture and process) instead of the torch front end (milliseconds); unset it")
    for name, why in _MISSING.items():
        if r["packages"].get(name) is None:
            notes.append(f"{name} is not installed: {why}")
    return notes


def render(r: dict[str, Any]) -> str:
    """The report as aligned ``name: value`` lines, then the notes."""
    k, t, a = r["kernels"], r["torch"], r["architecture_cache"]
    if k["implementation"] == "c":
        kernels = f"C extension (keeper.matching._dpcore, {k['path']})"
    else:
        cached = sum(k["cached"].values())
        kernels = (f"numba {k['numba']} ({k['reason']}); compiled code for this machine: {cached} of "
                   f"{len(k['cached'])} kernels, in {k['cache'] or 'no writable directory'}")
        if "load" in k:
            kernels += (f"; loaded now in {k['load']['seconds']:.2f} s ("
                        f"{'compiled ' + ', '.join(k['load']['compiled']) if k['load']['compiled'] else 'from cache'})")
    if "error" in t:
        torch_line = f"cannot be imported ({t['error']})"
    else:
        gpu = ", ".join(t.get("devices", [])) or "no CUDA device visible"
        torch_line = f"{t['version']} (CUDA {t['cuda'] or 'none'}; {gpu}; {t['threads']} threads)"
    rows = [("keeper", f"{r['keeper']['version']} ({r['keeper']['path']})"), ("python", r["python"]),
            ("machine", r["machine"]), ("alignment kernels", kernels), ("torch", torch_line)]
    rows += [(name, v or "not installed") for name, v in r["packages"].items() if name != "torch"]
    rows.append(("architecture cache", f"{a['directory']} ({a['entries']} architectures)" if a["directory"]
                 else "off"))
    rows += [(name, value) for name, value in r["settings"].items()]
    width = max(len(n) for n, _ in rows)
    lines = [f"{n + ':':<{width + 1}} {v}" for n, v in rows]
    lines += [""] + ([f"- {n}" for n in r["notes"]] or ["nothing found that slows keeper down here"])
    return "\n".join(lines)
