"""Where the alignment's dynamic programs run: keeper's C extension (``keeper.matching._dpcore``, built from
``keeper/matching/_dpcore.c`` at install) when it was built, else the same kernels under numba
(:mod:`keeper.matching.kernels`).

Why both: numba's first call in a process loads its compiled code and its registries (about half a second, more
on a busy machine), which every fresh process pays: a Tune trial, a shell command; and the first process on a
machine compiles them (1-4 s; kept in the machine's kernel cache, :mod:`keeper.matching.kernel_cache`). The C
extension loads in a millisecond, releases the GIL while it runs (matcher threads score in parallel) and computes the
same integers. ``KEEPER_DP=numba`` forces the numba kernels (the tests hold the two against each other).

Where the extension was not built (no C compiler at install), the first use of the kernels in a process warns once
(:class:`~keeper.errors.KernelCompileWarning`), naming the cost, the cache and how to get the compiled kernels; a
process that asked for numba (``KEEPER_DP=numba``) is not warned. ``keeper doctor`` shows which kernels run.

Invariant: both implementations return identical results for identical arrays.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from keeper.errors import KernelCompileWarning

__all__ = ["dp_value", "dp_pairs", "dp_batch", "IMPLEMENTATION", "FORCED", "MISSING_REASON"]

#: True when ``KEEPER_DP=numba`` asked for the numba kernels.
FORCED = os.environ.get("KEEPER_DP") == "numba"
#: Why the C extension is not used ("" when it is).
MISSING_REASON = "KEEPER_DP=numba" if FORCED else ""
try:
    if FORCED:
        raise ImportError("KEEPER_DP=numba")
    from keeper.matching import _dpcore
except ImportError as exc:
    _dpcore = None
    MISSING_REASON = MISSING_REASON or str(exc)

_kernels: list[Any] = []


def _numba() -> Any:
    """:mod:`keeper.matching.kernels`, imported at the first alignment of a process that runs them, not when this
    module is imported: importing numba costs a fresh process seconds, and most processes that import keeper never
    align (a Tune trial warms along the alignment the service's choice carries), so their import stays light."""
    if not _kernels:
        from keeper.matching import kernels

        _kernels.append(kernels)
    return _kernels[0]


#: "c" or "numba": which implementation this process uses.
IMPLEMENTATION = "c" if _dpcore is not None else "numba"
_said: list[bool] = []


def _say_numba() -> None:
    """Warn, once per process, that the numba kernels run where the C extension was not built (see the module
    docstring), naming the cost and the fix."""
    if _said or FORCED:
        return
    _said.append(True)
    from keeper.matching import kernel_cache

    where = kernel_cache.directory()
    if where is None:
        cost = (f"no cache directory is writable here, so every process compiles them (1-4 s); set {kernel_cache.ENV} "
                "to a writable directory")
    elif all(_numba().cached().values()):
        cost = f"this machine compiled them before; each process loads them from {where} (about 0.5 s)"
    else:
        cost = (f"this process compiles them now (1-4 s, once per machine: later processes load them from {where} "
                "in about 0.5 s)")
    warnings.warn(f"keeper: the compiled alignment kernels (keeper.matching._dpcore) are not built in this install "
                  f"({MISSING_REASON}), so keeper runs them under numba: {cost}. To get the compiled kernels, install "
                  "keeper again where a C compiler is present (e.g. `apt-get install gcc` or `conda install "
                  "c-compiler`, then `pip install -e .` in the checkout); `keeper doctor` shows which kernels are in "
                  "use.", KernelCompileWarning, stacklevel=3)


def dp_value(cls_c: np.ndarray, shp_c: np.ndarray, vec_c: np.ndarray, cls_p: np.ndarray, shp_p: np.ndarray,
             vec_p: np.ndarray, row: np.ndarray) -> int:
    """Most child elements any order-preserving one-to-one matching of equal classes inherits (``row``: n + 1
    int64 scratch, used by the numba kernel)."""
    if _dpcore is None:
        _say_numba()
        return int(_numba().dp_value(cls_c, shp_c, vec_c, cls_p, shp_p, vec_p, row))
    out = np.zeros(1, dtype=np.int64)
    _dpcore.dp_batch(cls_c, shp_c, vec_c, cls_p, shp_p, vec_p, np.array([0, cls_p.shape[0]], dtype=np.int64), out)
    return int(out[0])


def dp_batch(cls_c: np.ndarray, shp_c: np.ndarray, vec_c: np.ndarray, cls_p: np.ndarray, shp_p: np.ndarray,
             vec_p: np.ndarray, offsets: np.ndarray, out: np.ndarray) -> None:
    """Inherited elements of the child from each parent stored back to back (parent k = rows
    ``offsets[k]:offsets[k+1]``), written into ``out``."""
    if _dpcore is None:
        _say_numba()
        _numba().dp_batch(cls_c, shp_c, vec_c, cls_p, shp_p, vec_p, offsets, out)
        return
    _dpcore.dp_batch(cls_c, shp_c, vec_c, cls_p, shp_p, vec_p, offsets, out)


def dp_pairs(*arrays: Any) -> tuple[int, np.ndarray]:
    """``(inherited elements, pairs)``: the alignment with its tie-breaks (child arrays cls, shape, vectors, skip,
    edge, context, feeds, then the parent's); ``pairs[i]`` is the parent layer of child layer ``i`` or -1."""
    if _dpcore is None:
        _say_numba()
        v, pairs = _numba().dp_pairs(*arrays)
        return int(v), pairs
    pairs = np.empty(arrays[0].shape[0], dtype=np.int64)
    return int(_dpcore.dp_pairs(*arrays, pairs)), pairs
