"""The alignment's C core and its numba twin compute the same integers (keeper.matching.core,
keeper.matching.kernels, keeper/matching/_dpcore.c)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from keeper.graph import load_graph
from keeper.matching import core, kernels
from keeper.matching import align, match_arrays, score_many
from tests.nets import mlp_onnx

pytestmark = pytest.mark.skipif(core.IMPLEMENTATION != "c",
                                reason="the C extension was not built here; keeper runs the numba kernels alone")


def _layers(rng: np.random.Generator, n: int) -> tuple:
    return (rng.integers(0, 4, n).astype(np.int32), rng.integers(1, 9, (n, 5)).astype(np.int64),
            rng.integers(0, 3, n).astype(np.int64), *(rng.integers(0, 6, n).astype(np.int64) for _ in range(4)))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 24), st.integers(0, 24))
def test_the_alignment_and_its_traceback_agree(seed, m, n):
    rng = np.random.default_rng(seed)
    c, p = _layers(rng, m), _layers(rng, n)
    want_v, want_pairs = kernels.dp_pairs(*c, *p)
    got_v, got_pairs = core.dp_pairs(*c, *p)
    assert got_v == want_v and np.array_equal(got_pairs, want_pairs)
    row = np.zeros(n + 1, dtype=np.int64)
    assert core.dp_value(*c[:3], *p[:3], row) == kernels.dp_value(*c[:3], *p[:3], row)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(st.integers(0, 16), max_size=6))
def test_batch_scores_agree(seed, sizes):
    rng = np.random.default_rng(seed)
    c = _layers(rng, int(rng.integers(0, 20)))[:3]
    parents = [_layers(rng, k)[:3] for k in sizes]
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    packed = [np.concatenate([q[i] for q in parents]) if parents else np.zeros((0, 5) if i == 1 else 0, dt)
              for i, dt in enumerate((np.int32, np.int64, np.int64))]
    packed[0] = packed[0].astype(np.int32)
    want, got = np.zeros(len(sizes), np.int64), np.zeros(len(sizes), np.int64)
    kernels.dp_batch(*c, *packed, offsets, want)
    core.dp_batch(*c, *packed, offsets, got)
    assert np.array_equal(got, want)


def test_real_graphs_align_alike():
    graphs = [load_graph(mlp_onnx(w, i)) for i, w in enumerate(([16, 32, 4], [16, 48, 4], [16, 32, 32, 4]))]
    for p in graphs:
        for c in graphs:
            a, ca = match_arrays(p), match_arrays(c)
            v, pairs = kernels.dp_pairs(ca.cls, ca.shape, ca.vectors, ca.skip, ca.edge, ca.context,
                                                 ca.feeds, a.cls, a.shape, a.vectors, a.skip, a.edge, a.context,
                                                 a.feeds)
            al = align(p, c)
            assert al.inherited == v and np.array_equal(al.pairs, pairs)
            assert score_many([p], c)[0] == pytest.approx(min(1.0, int(v) / ca.total), abs=0)


def test_bad_arrays_are_refused_by_name():
    c = _layers(np.random.default_rng(0), 3)
    with pytest.raises(TypeError, match="cls_c"):
        core.dp_pairs(c[0].astype(np.int64), *c[1:], *c)
    with pytest.raises(ValueError, match="lengths disagree"):
        core.dp_pairs(*c[:6], c[6][:2], *c)
