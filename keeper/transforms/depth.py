"""Depth operators: values for child layers with no parent counterpart.

Invariant: a new layer filled by :func:`identity_fill` computes the identity on its channel space (Dirac conv,
identity linear, BatchNorm that is the identity in eval mode); a residual branch whose last layer is filled by
:func:`zero_fill` adds nothing, so the block it belongs to is the identity.
"""

from __future__ import annotations

import numpy as np

from keeper.graph import Kind, LayerGraph

__all__ = ["identity_fill", "zero_fill", "new_branch_tails"]


def identity_fill(kind: int, child: dict[str, np.ndarray], *, epsilon: float = 1e-5,
                  strides: list[int] | None = None) -> dict[str, np.ndarray] | None:
    """Identity values for a layer (role -> array, shapes as ``child``), or None when it cannot be the identity."""
    w = child.get("weight", child.get("scale"))
    if w is None:
        return None
    if kind == Kind.BATCHNORM:
        c = w.shape[0]
        return {"scale": np.full(c, np.sqrt(1.0 + epsilon), w.dtype), "bias": np.zeros(c, w.dtype),
                "mean": np.zeros(c, w.dtype), "var": np.ones(c, w.dtype)}
    if strides and any(s != 1 for s in strides):
        return None
    out = _zeros(child)
    if kind == Kind.LINEAR and w.shape[0] == w.shape[1]:
        out["weight"] = np.eye(w.shape[0], dtype=w.dtype)
        return out
    if kind in (Kind.CONV, Kind.DWCONV) and all(k % 2 == 1 for k in w.shape[2:]):
        centre = tuple(k // 2 for k in w.shape[2:])
        d = out["weight"]
        if kind == Kind.CONV and w.shape[0] == w.shape[1]:
            idx = np.arange(w.shape[0])
            d[(idx, idx) + centre] = 1.0
        elif kind == Kind.DWCONV and w.shape[1] == 1:
            d[(np.arange(w.shape[0]), 0) + centre] = 1.0
        else:
            return None
        out["weight"] = d
        return out
    return None


def zero_fill(kind: int, child: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Values that make the layer output zero: zero weights and shifts (BatchNorm keeps unit statistics)."""
    out = _zeros(child)
    if kind == Kind.BATCHNORM and "var" in out:
        out["var"] = np.ones_like(child["var"])
    return out


def _zeros(child: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    # np.zeros, not zeros_like: it takes pages the OS already zeroed instead of writing every byte, which was
    # about a fifth of a deepened 100M-parameter ResNet's transfer time (profiled on scripts/bench_warm.py's models)
    return {k: np.zeros(v.shape, v.dtype) for k, v in child.items()}


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
    for node in np.flatnonzero(graph.kind == Kind.ADD):
        preds = graph.predecessors(int(node))
        if len(preds) != 2:
            continue
        found = []
        for start in preds:
            cur, layers = int(start), []
            while True:
                if node_layer[cur] >= 0:
                    layers.append(int(node_layer[cur]))
                p = graph.predecessors(cur)
                if len(p) != 1 or fanout[cur] > 1 or graph.kind[cur] in (Kind.ADD, Kind.CONCAT):
                    break
                if fanout[int(p[0])] > 1:  # p[0] is the fork: the branch starts after it
                    break
                cur = int(p[0])
            found.append(layers if layers and all(new_layer[l] for l in layers) else None)
        fresh = [b for b in found if b]
        if len(fresh) == 1:
            tails.add(fresh[0][0])
    return tails
