"""Depth operators: values for child layers with no parent counterpart.

Invariant: a new layer filled by :func:`identity_fill` computes the identity on its channel space (Dirac conv,
identity linear, BatchNorm that is the identity in eval mode); a residual branch whose last layer is filled by
:func:`zero_fill` adds nothing, so the block it belongs to is the identity.
"""

from __future__ import annotations

import numpy as np

from keeper.graph import LayerGraph
from keeper.kinds import Identity, Merge, kinds_where, traits

__all__ = ["identity_fill", "zero_fill", "new_branch_tails"]


def identity_fill(kind: int, child: dict[str, np.ndarray], *, epsilon: float = 1e-5,
                  strides: list[int] | None = None) -> dict[str, np.ndarray] | None:
    """Identity values for a layer (role -> array, shapes as ``child``), or None when it cannot be the identity.

    How a kind starts as the identity is its ``identity`` trait (:mod:`keeper.kinds`); None there means never.
    """
    w = child.get("weight", child.get("scale"))
    how = traits(kind).identity
    if w is None or how is None:
        return None
    if how is Identity.UNIT_NORM:
        c = w.shape[0]
        return {"scale": np.full(c, np.sqrt(1.0 + epsilon), w.dtype), "bias": np.zeros(c, w.dtype),
                "mean": np.zeros(c, w.dtype), "var": np.ones(c, w.dtype)}
    if strides and any(s != 1 for s in strides):
        return None
    if how is Identity.EYE:
        if w.shape[0] != w.shape[1]:
            return None
        out = _zeros(child)
        out["weight"] = np.eye(w.shape[0], dtype=w.dtype)
        return out
    # Dirac: one at the kernel centre, which only an odd kernel has
    if not all(k % 2 == 1 for k in w.shape[2:]):
        return None
    centre = tuple(k // 2 for k in w.shape[2:])
    if how is Identity.DIRAC and w.shape[0] == w.shape[1]:
        out = _zeros(child)
        idx = np.arange(w.shape[0])
        out["weight"][(idx, idx) + centre] = 1.0
        return out
    if how is Identity.DIRAC_DEPTHWISE and w.shape[1] == 1:
        out = _zeros(child)
        out["weight"][(np.arange(w.shape[0]), 0) + centre] = 1.0
        return out
    return None


def zero_fill(kind: int, child: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Values that make the layer output zero: zero weights and shifts; the roles of the kind's ``zero_ones`` trait
    stay one (a BatchNorm keeps unit variance)."""
    out = _zeros(child)
    for role in traits(kind).zero_ones:
        if role in out:
            out[role] = np.ones_like(child[role])
    return out


def _zeros(child: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    # np.zeros, not zeros_like: it takes pages the OS already zeroed instead of writing every byte, which was
    # about a fifth of a deepened 100M-parameter ResNet's transfer time (profiled on scripts/bench_warm.py's models)
    return {k: np.zeros(v.shape, v.dtype) for k, v in child.items()}


# by kind, from keeper.kinds: residual adds (a zero branch leaves the skip input), and every merge
_RESIDUAL_KINDS = kinds_where(lambda t: t.merge is Merge.SUM)
_MERGE_KINDS = kinds_where(lambda t: t.merge is not None)


def new_branch_tails(graph: LayerGraph, new_layer: np.ndarray) -> set[int]:
    """Layers that end a residual branch made only of new layers: zero them and the branch adds nothing.

    For each Add node, each input is walked back through single-input nodes until a node that feeds several
    others (the fork) or a merge; if every layer on the way is new (``new_layer[l]``) and there is at least
    one, the layer nearest the Add is a tail. The other input must not also be such a branch (then the Add
    would output zero rather than its skip input).
    """
    node_layer = np.full(graph.num_nodes, -1, dtype=np.int64)
    node_layer[graph.layer_node] = np.arange(graph.num_layers)
    fanout = np.bincount(graph.pred_indices, minlength=graph.num_nodes)
    tails: set[int] = set()
    for node in np.flatnonzero(np.isin(graph.kind, sorted(_RESIDUAL_KINDS))):
        preds = graph.predecessors(int(node))
        if len(preds) != 2:
            continue
        found = []
        for start in preds:
            cur, layers = int(start), []
            if fanout[cur] > 1:
                # the input is the fork itself: the skip path, no branch (a post-LN block adds its branch to the
                # norm output that also feeds the branch)
                found.append(None)
                continue
            while True:
                if node_layer[cur] >= 0:
                    layers.append(int(node_layer[cur]))
                p = graph.predecessors(cur)
                if len(p) != 1 or fanout[cur] > 1 or graph.kind[cur] in _MERGE_KINDS:
                    break
                if fanout[int(p[0])] > 1:  # p[0] is the fork: the branch starts after it
                    break
                cur = int(p[0])
            found.append(layers if layers and all(new_layer[l] for l in layers) else None)
        fresh = [b for b in found if b]
        if len(fresh) == 1:
            tails.add(fresh[0][0])
    return tails
