"""Importing torchvision and timm, which keeper's benchmarks and tests cover when they import and skip, with the
reason, when they do not.

Neither is a dependency of keeper or of its test extra: torchvision publishes no CPU-only wheel on the package
index, so ``pip install torchvision`` beside a CPU torch pulls a CUDA torch unless given ``--no-deps``, and timm
needs torchvision. A torchvision wheel installed with ``--no-deps`` (its compiled ops built for another torch
build) then fails at import: ``torchvision/_meta_registrations.py`` registers fake kernels for
``torchvision::nms`` and ``torchvision::qnms``, which only its compiled library defines. :func:`import_torchvision`
defines the two schemas in a ``torch.library`` fragment when, and only when, that is why the import failed (a
working torchvision defines them itself: defining them first would make its own library fail to load), then
imports again. The fragment has no kernel: keeper never calls nms, the schemas only let the import finish.

A broken torchvision also breaks ``import transformers`` for vision models (transformers imports torchvision
when it is installed), so a process that may meet one calls :func:`import_torchvision` before building a
transformers model.

Example:
    >>> tv, why = import_torchvision()
    >>> tv is not None or why.startswith("torchvision")
    True
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

import torch

__all__ = ["TORCHVISION_SCHEMAS", "import_torchvision", "import_timm"]

#: the operator schemas torchvision's fake-kernel registrations need at import (as its compiled library defines
#: them, ``torchvision/csrc/ops/nms.cpp``)
TORCHVISION_SCHEMAS: dict[str, str] = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}

_FRAGMENTS: list[torch.library.Library] = []  # a fragment's definitions live as long as its Library object
_RESULTS: dict[str, tuple[ModuleType | None, str]] = {}


def _defined(op: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"torchvision::{op}", "")
    except RuntimeError:
        return False
    return True


def _define_schemas() -> list[str]:
    """Define the schemas of :data:`TORCHVISION_SCHEMAS` not defined yet; the names defined."""
    missing = [op for op in TORCHVISION_SCHEMAS if not _defined(op)]
    if missing:
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for op in missing:
            lib.define(TORCHVISION_SCHEMAS[op])
        _FRAGMENTS.append(lib)
    return missing


def _forget(package: str) -> None:
    """Drop ``package`` and its submodules from ``sys.modules``: a failed import leaves the submodules that did
    import (``torchvision.extension``), and a retry must run the package's initialisation from the start."""
    for name in [k for k in sys.modules if k == package or k.startswith(package + ".")]:
        del sys.modules[name]


def _why(library: str, exc: BaseException) -> str:
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{library} does not import ({type(exc).__name__}: {first})"


def import_torchvision() -> tuple[ModuleType | None, str]:
    """``(torchvision, "")``, or ``(None, reason)`` when it does not import; the outcome is kept for the process.

    When the import fails because ``torchvision::nms`` or ``torchvision::qnms`` does not exist (a wheel whose
    compiled ops do not load into this torch), the missing schemas are defined in a ``torch.library`` fragment and
    the import is tried once more; the reason then says so if that fails too.
    """
    if "torchvision" not in _RESULTS:
        _RESULTS["torchvision"] = _import_torchvision()
    return _RESULTS["torchvision"]


def _import_torchvision() -> tuple[ModuleType | None, str]:
    try:
        return importlib.import_module("torchvision"), ""
    except ModuleNotFoundError as exc:
        if exc.name != "torchvision":
            return None, _why("torchvision", exc)
        return None, "torchvision is not installed"
    except RuntimeError as exc:
        if not any(f"torchvision::{op} does not exist" in str(exc) for op in TORCHVISION_SCHEMAS):
            return None, _why("torchvision", exc)
    _forget("torchvision")
    defined = _define_schemas()
    try:
        return importlib.import_module("torchvision"), ""
    except Exception as exc:  # whatever the second attempt raises is the reason it is left out
        _forget("torchvision")
        return None, _why("torchvision", exc) + f" even with {', '.join(defined) or 'no'} schema(s) defined"


def import_timm() -> tuple[ModuleType | None, str]:
    """``(timm, "")``, or ``(None, reason)``; torchvision is imported first (:func:`import_torchvision`), since
    timm imports it and cannot without it."""
    if "timm" not in _RESULTS:
        _RESULTS["timm"] = _import_timm()
    return _RESULTS["timm"]


def _import_timm() -> tuple[ModuleType | None, str]:
    if importlib.util.find_spec("timm") is None:
        return None, "timm is not installed"
    tv, why = import_torchvision()
    if tv is None:
        return None, f"timm needs torchvision, which is left out: {why}"
    try:
        return importlib.import_module("timm"), ""
    except Exception as exc:  # a timm that fails at import is left out with its error
        return None, _why("timm", exc)
