"""Where the alignment's dynamic programs run: keeper's C extension (``keeper._dpcore``, built from
``keeper/_dpcore.c`` at install) when it was built, else the same kernels under numba
(:mod:`keeper.matching_kernels`).

Why both: numba's first call in a process loads its compiled code and its registries (about half a second, more
on a busy machine), which every fresh process pays: a Tune trial, a shell command. The C extension loads in a
millisecond, releases the GIL while it runs (matcher threads score in parallel) and computes the same integers.
``KEEPER_DP=numba`` forces the numba kernels (the tests hold the two against each other).

Invariant: both implementations return identical results for identical arrays.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

__all__ = ["dp_value", "dp_pairs", "dp_batch", "IMPLEMENTATION"]

try:
    if os.environ.get("KEEPER_DP") == "numba":
        raise ImportError("KEEPER_DP=numba")
    from keeper import _dpcore
except ImportError:
    _dpcore = None

if _dpcore is None:
    # numba is imported only when the extension is missing: importing it costs a fresh process a fraction of a second
    from keeper.matching_kernels import dp_batch as _nb_batch, dp_pairs as _nb_pairs, dp_value as _nb_value

#: "c" or "numba": which implementation this process uses.
IMPLEMENTATION = "c" if _dpcore is not None else "numba"


def dp_value(cls_c: np.ndarray, shp_c: np.ndarray, vec_c: np.ndarray, cls_p: np.ndarray, shp_p: np.ndarray,
             vec_p: np.ndarray, row: np.ndarray) -> int:
    """Most child elements any order-preserving one-to-one matching of equal classes inherits (``row``: n + 1
    int64 scratch, used by the numba kernel)."""
    if _dpcore is None:
        return int(_nb_value(cls_c, shp_c, vec_c, cls_p, shp_p, vec_p, row))
    out = np.zeros(1, dtype=np.int64)
    _dpcore.dp_batch(cls_c, shp_c, vec_c, cls_p, shp_p, vec_p, np.array([0, cls_p.shape[0]], dtype=np.int64), out)
    return int(out[0])


def dp_batch(cls_c: np.ndarray, shp_c: np.ndarray, vec_c: np.ndarray, cls_p: np.ndarray, shp_p: np.ndarray,
             vec_p: np.ndarray, offsets: np.ndarray, out: np.ndarray) -> None:
    """Inherited elements of the child from each parent stored back to back (parent k = rows
    ``offsets[k]:offsets[k+1]``), written into ``out``."""
    (_nb_batch if _dpcore is None else _dpcore.dp_batch)(cls_c, shp_c, vec_c, cls_p, shp_p, vec_p, offsets, out)


def dp_pairs(*arrays: Any) -> tuple[int, np.ndarray]:
    """``(inherited elements, pairs)``: the alignment with its tie-breaks (child arrays cls, shape, vectors, skip,
    edge, context, feeds, then the parent's); ``pairs[i]`` is the parent layer of child layer ``i`` or -1."""
    if _dpcore is None:
        v, pairs = _nb_pairs(*arrays)
        return int(v), pairs
    pairs = np.empty(arrays[0].shape[0], dtype=np.int64)
    return int(_dpcore.dp_pairs(*arrays, pairs)), pairs
