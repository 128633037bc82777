"""Where the numba alignment kernels keep their machine code, so that the compile (1-4 s) is paid once per machine,
not in every fresh process (each Tune trial, each Ray Train worker, each shell command).

Used only where keeper's C extension (``keeper.matching._dpcore``) is not built: :mod:`keeper.matching.core` then runs
:mod:`keeper.matching.kernels` under numba. numba's own cache (``cache=True``) goes to ``__pycache__`` beside the
source file when that is writable (an editable install: the checkout; a site-packages install:
``site-packages/keeper/__pycache__``), else to ``~/.cache/numba``, and is keyed by the source file's path and mtime:
a copy of the package (Ray's ``runtime_env`` unpacks ``working_dir`` / ``py_modules`` per job), a reinstall or a
fresh container layer compiles again, and where neither place is writable numba refuses to import the kernels.
keeper therefore places its kernels' cache itself, in the first writable of

    ``$KEEPER_KERNEL_CACHE``, ``$XDG_CACHE_HOME/keeper/kernels``, ``~/.cache/keeper/kernels``,
    ``<temp dir>/keeper-kernels-<uid>``

under a subdirectory named by the kernels' source *content* (not its path or mtime), and falls back to numba's own
places when none is writable.

Invariants:
    * only the functions of :mod:`keeper.matching.kernels` are located here; any other numba code in the process
      keeps numba's defaults;
    * an entry is used only for byte-identical kernel source (the directory's name) and numba's own checks (its
      version, the function's bytecode, this CPU); anything else compiles and is written beside it;
    * nothing here fails an import: a numba without the cache API keeper uses keeps numba's defaults.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["ENV", "directory", "install"]

#: Environment variable naming the directory of the numba kernels' cache.
ENV = "KEEPER_KERNEL_CACHE"
#: The module whose numba functions are cached here (:func:`keeper.matching.kernels.cached` says whether they are).
MODULE = "keeper.matching.kernels"
_SOURCE = Path(__file__).with_name("kernels.py")
_chosen: list[Path | None] = []


def _candidates() -> list[Path]:
    out = []
    if os.environ.get(ENV):
        out.append(Path(os.environ[ENV]).expanduser())
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    out.append(Path(base) / "keeper" / "kernels")
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    out.append(Path(tempfile.gettempdir()) / f"keeper-kernels-{uid}")
    return out


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def _source_digest() -> str:
    return hashlib.sha256(_SOURCE.read_bytes()).hexdigest()


def directory() -> Path | None:
    """This machine's cache directory of the kernels (the first writable place, see the module docstring), under
    the subdirectory of the current kernel source; None when no place is writable (numba's defaults then)."""
    if not _chosen:
        sub = f"numba-{_source_digest()[:16]}"
        _chosen.append(next((p / sub for p in _candidates() if _writable(p / sub)), None))
    return _chosen[0]


def install() -> bool:
    """Make numba cache :mod:`keeper.matching.kernels` in :func:`directory`; False (numba's defaults kept) when no
    place is writable or this numba lacks the locator API. Call before the kernels are decorated; idempotent."""
    try:
        from numba.core import caching
    except ImportError:
        return False
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    base = getattr(caching, "_CacheLocator", None)
    if impl is None or base is None or not isinstance(getattr(impl, "_locator_classes", None), list):
        return False
    if any(getattr(c, "_keeper", False) for c in impl._locator_classes):
        return True
    if directory() is None:
        return False
    impl._locator_classes.insert(0, _locator_class(base))
    return True


def _locator_class(base: type) -> type:
    """A numba cache locator for keeper's kernels: :func:`directory`, stamped by the source's content."""

    class KeeperKernelLocator(base):
        _keeper = True

        def __init__(self, py_func: Any, py_file: str):
            self._lineno = py_func.__code__.co_firstlineno
            self._path = str(directory())
            self._stamp = _source_digest()

        def get_cache_path(self) -> str:
            return self._path

        def get_source_stamp(self) -> str:
            # the content, not numba's (mtime, size): a copy of the same source (another job's unpacked package, a
            # reinstall) reads the code the first process compiled
            return self._stamp

        def get_disambiguator(self) -> str:
            return str(self._lineno)

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> "KeeperKernelLocator | None":
            if getattr(py_func, "__module__", None) != MODULE or directory() is None:
                return None
            try:
                self = cls(py_func, py_file)
                self.ensure_cache_path()
            except OSError:
                return None
            return self

    return KeeperKernelLocator
