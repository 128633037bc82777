"""The layer-traits table: it covers every kind, stored codes never move, and its readers use it."""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
from types import MappingProxyType

import numpy as np
import pytest

from keeper import kinds
from keeper.errors import KeeperError
from keeper.graph import Kind, LayerGraph, graph_from_proto, groups, rules
from keeper.kinds import TRAITS, Identity, Merge, kinds_where, traits
from keeper.matching import alignment
from keeper.transforms import compose, depth

import nets

# Stored graphs hold these codes (int8): renumbering one would misread every zoo on disk.
STORED_CODES = {"CONV": 1, "DWCONV": 2, "CONVT": 3, "LINEAR": 4, "BATCHNORM": 5, "LAYERNORM": 6, "EMBEDDING": 7,
                "PARAM": 8, "ADD": 10, "MUL": 11, "CONCAT": 12, "SPLIT": 13, "POOL": 14, "ACTIVATION": 15,
                "MATMUL": 16, "SOFTMAX": 17, "RESHAPE": 18, "TRANSPOSE": 19, "REDUCE": 20, "OTHER": 21, "RECTIFIER": 22}


def test_every_kind_has_traits_and_codes_are_stable():
    assert {k.name: int(k) for k in Kind} == STORED_CODES
    assert set(TRAITS) == set(Kind)
    assert Kind.NAMES == {int(k): t.name for k, t in TRAITS.items()}
    assert Kind.CONVT.label == "convT" and traits(np.int8(5)).name == "batchnorm"


def test_a_kind_without_traits_fails_loudly(monkeypatch):
    table = {k: t for k, t in TRAITS.items() if k != Kind.MUL}
    monkeypatch.setattr(kinds, "TRAITS", MappingProxyType(table))
    with pytest.raises(KeeperError, match="MUL.*TRAITS"):
        traits(Kind.MUL)
    with pytest.raises(KeeperError, match="MUL"):
        kinds._check_table()
    with pytest.raises(KeeperError, match="MUL"):
        depth.zero_fill(Kind.MUL, {"weight": np.ones(3, np.float32)})


def test_an_unknown_code_fails_loudly():
    with pytest.raises(KeeperError, match="9.*not a keeper.kinds.Kind"):
        traits(9)
    with pytest.raises(KeeperError, match="99"):
        depth.identity_fill(99, {"weight": np.ones((2, 2), np.float32)})


def test_every_kind_has_a_channel_group_handler_and_op_rules_agree_with_traits():
    assert set(groups.HANDLERS) == set(Kind)
    with pytest.raises(KeeperError, match="handler"):
        groups.handler(99)
    assert not any(traits(k).weighted for k in rules.WEIGHTLESS.values())


def test_readers_keep_no_kind_lists_of_their_own():
    # matching and the transforms say what a kind does only through keeper.kinds
    for module in (alignment, compose, depth):
        src = inspect.getsource(module)
        assert "Kind." not in src, f"{module.__name__} names kinds itself; read keeper.kinds.TRAITS instead"
    assert set(np.flatnonzero(alignment._LEVELLED).tolist()) == kinds_where(lambda t: t.levelled)
    assert set(np.flatnonzero(alignment._MERGE_MASK).tolist()) == kinds_where(lambda t: t.merge is not None)
    assert depth._RESIDUAL_KINDS == kinds_where(lambda t: t.merge is Merge.SUM)
    assert compose._PROPORTIONAL == kinds_where(lambda t: t.proportional)


def test_depth_and_compose_follow_the_table(monkeypatch):
    ln = {"scale": np.full(4, 2.0, np.float32), "bias": np.ones(4, np.float32)}
    assert depth.identity_fill(Kind.LAYERNORM, ln) is None
    w = np.arange(2 * 3 * 3, dtype=np.float32).reshape(2, 3, 3)
    grown, ops = compose._inherit(Kind.CONV, "weight", w, np.zeros((2, 3, 5), np.float32), None, None, 3)
    assert "kernel-pad" in ops and grown.shape == (2, 3, 5)
    table = dict(TRAITS)
    table[Kind.LAYERNORM] = dataclasses.replace(TRAITS[Kind.LAYERNORM], identity=Identity.UNIT_NORM,
                                                zero_ones=("scale",))
    table[Kind.CONV] = dataclasses.replace(TRAITS[Kind.CONV], kernel_axes=False)
    monkeypatch.setattr(kinds, "TRAITS", MappingProxyType(table))
    assert depth.identity_fill(Kind.LAYERNORM, ln) is not None
    assert np.all(depth.zero_fill(Kind.LAYERNORM, ln)["scale"] == 1.0)
    _, ops = compose._inherit(Kind.CONV, "weight", w, np.zeros((2, 3, 5), np.float32), None, None, 3)
    assert "kernel-pad" not in ops


def test_stored_graph_round_trip_keeps_plain_codes():
    g = graph_from_proto(nets.cnn_onnx([("conv", 8, 3, True), ("res", 3), ("branch", [4, 6], 3), ("dw", 3)]))
    buf = io.BytesIO()
    np.savez(buf, **g.to_arrays())
    back = LayerGraph.from_arrays(dict(np.load(io.BytesIO(buf.getvalue()), allow_pickle=False)))
    a, b = g.to_arrays(), back.to_arrays()
    assert a.keys() == b.keys()
    assert all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)
    assert g.kind.dtype == np.int8 and g.layer_kind.dtype == np.int8
    kinds_seen = json.loads(json.dumps(g.summary()))["layer_kinds"]
    assert kinds_seen == {"conv": 5, "batchnorm": 4, "dwconv": 1, "linear": 2, "layernorm": 1}
