"""Names a package exports but imports on first use (PEP 562), so that importing the package costs only what its
caller touches: a trial that imports keeper for ``warm_start`` must not load the service, the aligner or Ray Tune.

:func:`exports` returns the package's module-level ``__getattr__`` and ``__dir__``. Invariant: a name is imported
from its home module once, then bound in the package's namespace (later lookups never reach ``__getattr__``); a
name the table lacks raises the ``AttributeError`` Python would.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, homes: Mapping[str, str], *,
            subpackages: bool = False) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """PEP 562 hooks for ``package``: each name of ``homes`` is imported from the module ``homes[name]`` names.

    ``subpackages``: a name not in ``homes`` that names a submodule (``keeper.store`` after ``import keeper``) is
    imported as that module.
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            if (subpackages and not name.startswith("_")
                    and importlib.util.find_spec(f"{package}.{name}") is not None):
                return importlib.import_module(f"{package}.{name}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(homes))

    return __getattr__, __dir__
