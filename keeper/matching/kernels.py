"""The alignment's dynamic programs, compiled by numba where keeper's C extension is not built (``cache=True``: the
machine code is kept in this machine's kernel cache, :mod:`keeper.matching.kernel_cache`, so only the first process on a
machine compiles and later ones load it).

:func:`dp_value` and :func:`dp_batch` compute the most child elements an order-preserving one-to-one matching of
equal classes inherits (one parent, or many stored back to back); :func:`dp_pairs` computes that matching itself
with the structural tie-breaks. They read flat arrays only (see :class:`keeper.matching.MatchArrays`);
:mod:`keeper.matching` builds those arrays and is the public face.

Invariant: every score is exact integer arithmetic (the float64 pass of :func:`_dp_rows` is exact for element
counts below 2**53); ``dp_pairs`` inherits exactly what ``dp_value`` reports for the same arrays.
"""

from __future__ import annotations

import numba
import numpy as np

from keeper.matching import kernel_cache

# before the decorators below: each looks its cache up as it is made. Where no directory is writable at all, numba
# would refuse cache=True at import: the kernels then compile in every process (and the first use says so).
_CACHE = kernel_cache.install() or kernel_cache.directory() is not None

__all__ = ["dp_value", "dp_pairs", "dp_batch", "cached", "KERNELS"]

#: The entry kernels (the helpers below are compiled into them).
KERNELS = ("dp_value", "dp_pairs", "dp_batch")


@numba.njit(cache=_CACHE, inline="always")
def _gain(shp_c, vec_c, i, shp_p, vec_p, j):
    g = 1
    for d in range(5):
        a = shp_c[i, d]
        b = shp_p[j, d]
        g *= a if a < b else b
    v = vec_c[i] if vec_c[i] < vec_p[j] else vec_p[j]
    u = shp_c[i, 0] if shp_c[i, 0] < shp_p[j, 0] else shp_p[j, 0]
    return g + v * u


@numba.njit(cache=_CACHE)
def dp_value(cls_c, shp_c, vec_c, cls_p, shp_p, vec_p, row):
    """Most child elements any order-preserving one-to-one matching of equal classes inherits (``row``: n + 1
    int64 scratch)."""
    n = cls_p.shape[0]
    return _dp_rows(cls_c, shp_c, vec_c, cls_p, shp_p, vec_p, row, np.empty((6, n)), np.empty(n))


@numba.njit(cache=_CACHE)
def _dp_rows(cls_c, shp_c, vec_c, cls_p, shp_p, vec_p, row, cols, gains):
    """The DP of :func:`dp_value`, one child row at a time in two passes (scratch: ``cols`` 6 x >= n and
    ``gains`` >= n float64).

    Pass 1 computes what matching child layer i to each parent layer would inherit (``_gain``, or 0 across
    classes). It has no dependency between columns and reads the parent as float64 columns, so it vectorises
    (AVX has float64 min and multiply, not int64 ones); a gain is an element count far below 2**53, so the float
    arithmetic is exact. Pass 2 is the recurrence itself, a chain of integer maxima. A zero gain never wins
    (``diag <= up``: rows are non-decreasing), so it stands in for "classes differ" without a branch. About 5x
    the throughput of the one-pass loop with ``_gain`` inline; the result is identical.
    """
    m = cls_c.shape[0]
    n = cls_p.shape[0]
    for j in range(n):
        for d in range(5):
            cols[d, j] = shp_p[j, d]
        cols[5, j] = vec_p[j]
    p0, p1, p2, p3, p4, pv = cols[0], cols[1], cols[2], cols[3], cols[4], cols[5]
    for j in range(n + 1):
        row[j] = 0
    for i in range(m):
        ci = cls_c[i]
        c0, c1, c2, c3, c4 = float(shp_c[i, 0]), float(shp_c[i, 1]), float(shp_c[i, 2]), float(shp_c[i, 3]), \
            float(shp_c[i, 4])
        cv = float(vec_c[i])
        for j in range(n):
            a0 = min(c0, p0[j])
            g = a0 * min(c1, p1[j]) * min(c2, p2[j]) * min(c3, p3[j]) * min(c4, p4[j]) + min(cv, pv[j]) * a0
            gains[j] = g if cls_p[j] == ci else 0.0
        diag = 0
        left = 0
        for j in range(n):
            up = row[j + 1]
            cand = diag + np.int64(gains[j])
            best = up if up > left else left
            best = cand if cand > best else best
            diag = up
            row[j + 1] = best
            left = best
    return row[n]


# The alignment maximises inherited elements first. Among alignments inheriting equally many it prefers, second, the
# one with the fewest runs of unmatched layers (an affine gap cost, as in Gotoh's alignment) plus the most dimensions
# agreeing exactly plus the most matched layers fed alike and feeding alike (the context and feeds codes of
# keeper.matching): a stem conv (16,3,3,3) inherits as much from any (16,16,3,3) conv as from its true counterpart, a
# final LayerNorm as much from the first block's, and a stem's BatchNorm as much from a block's; only structure tells
# them apart, and new blocks then come (and dropped ones go) as whole contiguous runs, which is what lets them start
# as identities. Both orders live in one int64 (value = inherited * K + secondary) with K above any secondary sum
# (bonuses up to 8 per match; skip, gap and edge costs up to ~36 per layer, the skip and edge costs coming from
# keeper.matching) while the two graphs hold fewer than ~23,000 layers together.
# Among alignments equal on both, the traceback takes skips as late as it can: equal blocks pair up from the first, so
# a shallower child keeps the parent's first blocks (an exact part of its function; the parent's last blocks read what
# its first ones wrote, and a 4-to-2-block transformer kept from its last two started at chance) and a deeper child
# gets its new blocks after the inherited ones.
_TIE_K = 1 << 20
_GAP_OPEN = 4
_CONTEXT = 2             # a match whose two layers are fed alike, or feed alike
_NEG = -(1 << 62)


@numba.njit(cache=_CACHE, inline="always")
def _bonus(shp_c, ctx_c, out_c, i, shp_p, ctx_p, out_p, j):
    b = _CONTEXT + 1 if ctx_c[i] == ctx_p[j] else 1
    if out_c[i] == out_p[j]:
        b += _CONTEXT
    if shp_c[i, 0] == shp_p[j, 0]:
        b += 1
    if shp_c[i, 1] == shp_p[j, 1]:
        b += 1
    same = True
    for d in range(2, 5):
        if shp_c[i, d] != shp_p[j, d]:
            same = False
    if same:
        b += 1
    return b


@numba.njit(cache=_CACHE, inline="always")
def _max3(a, b, c):
    m = a if a > b else b
    return m if m > c else c


@numba.njit(cache=_CACHE)
def dp_pairs(cls_c, shp_c, vec_c, skip_c, edge_c, ctx_c, out_c, cls_p, shp_p, vec_p, skip_p, edge_p, ctx_p, out_p):
    m = cls_c.shape[0]
    n = cls_p.shape[0]
    # M: last step matched; X: last step skipped a child layer; Y: last step skipped a parent layer.
    # Skipping child layer i also costs skip_c[i] (a layer that cannot start as an identity should rather match);
    # a run of skipped child layers costs edge_c[i] more where it starts or ends at a layer i that is not on a
    # block boundary (new blocks belong between nonlinearities or merges, not between a conv and its norm), and
    # a run of skipped parent layers edge_p[j] likewise (a dropped block goes whole, not half of two blocks), and
    # skipping parent layer j costs skip_p[j] (dropping a parent's stem or head loses its function, dropping a
    # residual branch or a square layer need not).
    M = np.full((m + 1, n + 1), _NEG, dtype=np.int64)
    X = np.full((m + 1, n + 1), _NEG, dtype=np.int64)
    Y = np.full((m + 1, n + 1), _NEG, dtype=np.int64)
    M[0, 0] = 0
    for i in range(m + 1):
        for j in range(n + 1):
            if i > 0 and j > 0 and cls_p[j - 1] == cls_c[i - 1]:
                g = _gain(shp_c, vec_c, i - 1, shp_p, vec_p, j - 1)
                if g > 0:
                    M[i, j] = _max3(M[i - 1, j - 1], X[i - 1, j - 1] - edge_c[i - 1],
                                    Y[i - 1, j - 1] - edge_p[j - 1]) \
                        + g * _TIE_K + _bonus(shp_c, ctx_c, out_c, i - 1, shp_p, ctx_p, out_p, j - 1)
            if i > 0:
                X[i, j] = _max3(M[i - 1, j] - _GAP_OPEN - edge_c[i - 1], X[i - 1, j],
                                Y[i - 1, j] - _GAP_OPEN - edge_c[i - 1]) - skip_c[i - 1]
            if j > 0:
                Y[i, j] = _max3(M[i, j - 1] - _GAP_OPEN - edge_p[j - 1], X[i, j - 1] - _GAP_OPEN - edge_p[j - 1],
                                Y[i, j - 1]) - skip_p[j - 1]
    pairs = np.full(m, -1, dtype=np.int64)
    inherited = 0
    i, j = m, n
    v = _max3(M[i, j], X[i, j], Y[i, j])
    state = 2 if Y[i, j] == v else (1 if X[i, j] == v else 0)
    while i > 0 or j > 0:
        if state == 0:
            g = _gain(shp_c, vec_c, i - 1, shp_p, vec_p, j - 1)
            pairs[i - 1] = j - 1
            inherited += g
            v = M[i, j] - g * _TIE_K - _bonus(shp_c, ctx_c, out_c, i - 1, shp_p, ctx_p, out_p, j - 1)
            i -= 1
            j -= 1
            state = 2 if j > 0 and Y[i, j] - edge_p[j] == v else (1 if i > 0 and X[i, j] - edge_c[i] == v else 0)
        elif state == 1:
            v = X[i, j] + skip_c[i - 1]
            i -= 1
            state = 1 if X[i, j] == v else (2 if Y[i, j] - _GAP_OPEN - edge_c[i] == v else 0)
        else:
            v = Y[i, j] + skip_p[j - 1]
            j -= 1
            state = 2 if Y[i, j] == v else (1 if X[i, j] - _GAP_OPEN - edge_p[j] == v else 0)
    return inherited, pairs


@numba.njit(cache=_CACHE)
def dp_batch(cls_c, shp_c, vec_c, cls_p, shp_p, vec_p, offsets, out):
    """Score the child against parents stored back to back (parent k = rows offsets[k]:offsets[k+1])."""
    maxn = 0
    for k in range(offsets.shape[0] - 1):
        if offsets[k + 1] - offsets[k] > maxn:
            maxn = offsets[k + 1] - offsets[k]
    row = np.zeros(maxn + 1, dtype=np.int64)
    cols = np.empty((6, maxn))
    gains = np.empty(maxn)
    for k in range(offsets.shape[0] - 1):
        a = offsets[k]
        b = offsets[k + 1]
        out[k] = _dp_rows(cls_c, shp_c, vec_c, cls_p[a:b], shp_p[a:b], vec_p[a:b], row, cols, gains)


def cached() -> dict[str, bool]:
    """Entry kernel -> whether this machine's kernel cache holds its compiled code for this CPU and this source
    (reads numba's index; compiles nothing). A kernel whose cache cannot be read counts as not cached."""
    out = {}
    for name in KERNELS:
        disp = globals()[name]
        try:
            index = disp._cache._cache_file._load_index()
            magic = disp.targetctx.codegen().magic_tuple()
            out[name] = any(isinstance(k, tuple) and len(k) > 1 and k[1] == magic for k in index)
        except (AttributeError, OSError, ValueError, EOFError):
            out[name] = False
    return out
