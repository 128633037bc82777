"""Depth operators: values for child layers with no parent counterpart.

Invariant: a new layer filled by :func:`identity_fill` computes the identity on its channel space (Dirac conv,
identity linear, BatchNorm that is the identity in eval mode); a residual branch whose last layer is filled by
:func:`zero_fill` adds nothing, so the block it belongs to is the identity.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from keeper.graph import INPUT_ROLE, LayerGraph
from keeper.kinds import Identity, Merge, kinds_where, traits

__all__ = ["identity_fill", "zero_fill", "FreshBranch", "fresh_branches", "new_branch_tails"]


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
    # a table the layer reads as its input (INPUT_ROLE) is no weight: it stays the child's
    return {k: np.zeros(v.shape, v.dtype) for k, v in child.items() if k != INPUT_ROLE}


# by kind, from keeper.kinds: residual adds (a zero branch leaves the skip input)
_RESIDUAL_KINDS = kinds_where(lambda t: t.merge is Merge.SUM)


@dataclass(frozen=True)
class FreshBranch:
    """A residual branch made only of new layers: the ``add`` node closing it, its ``tails`` (the layers whose
    output reaches the add through weightless nodes alone: zeroed, the branch adds nothing), all its ``layers``
    and its ``nodes`` (the fork feeding it and the add excluded)."""

    add: int
    tails: frozenset[int]
    layers: frozenset[int]
    nodes: frozenset[int]


def fresh_branches(graph: LayerGraph, new_layer: np.ndarray) -> list[FreshBranch]:
    """The residual branches of ``graph`` made only of new layers (``new_layer[l]``).

    For each residual add with two inputs, each input's branch is walked back in reverse topological order (the
    canonical node order is one): a node belongs to the branch when everything it feeds does (the input itself
    always), so the walk stops at the fork that also feeds the skip path, and at side inputs shared with other
    blocks (a mask). The branch may fork and join inside (a roll written as slices and a concatenation, attention's
    products): its tails are the layers with a path to the add through weightless nodes alone. A branch qualifies
    when it has layers, all new, and no path from its fork reaches the add without a layer (it could not be
    zeroed). The other input must not also qualify (the add would then output zero rather than its skip input);
    an input that is itself a fork (a post-LN block adds its branch to the norm output that feeds the branch) is
    the skip path.
    """
    node_layer = np.full(graph.num_nodes, -1, dtype=np.int64)
    node_layer[graph.layer_node] = np.arange(graph.num_layers)
    succs = graph.successors()
    out: list[FreshBranch] = []
    for node in np.flatnonzero(np.isin(graph.kind, sorted(_RESIDUAL_KINDS))).tolist():
        preds = graph.predecessors(int(node)).tolist()
        if len(preds) != 2 or preds[0] == preds[1]:
            continue
        found = [_branch(graph, int(node), int(s), succs, node_layer, new_layer) for s in preds]
        fresh = [b for b in found if b is not None]
        if len(fresh) == 1:
            out.append(fresh[0])
    return out


def _branch(graph: LayerGraph, add: int, start: int, succs: list[list[int]], node_layer: np.ndarray,
            new_layer: np.ndarray) -> FreshBranch | None:
    """The fresh branch ending at input ``start`` of ``add`` (see :func:`fresh_branches`), or None."""
    if len(succs[start]) > 1:
        return None  # the input is the fork itself: the skip path, no branch
    region: set[int] = set()
    bare: set[int] = set()  # region nodes with a path to the add through weightless nodes alone
    heap = [-start]
    queued = {start}
    while heap:
        v = -heapq.heappop(heap)  # the latest node first: everything it feeds is decided before it
        inside = [w for w in succs[v] if w in region]
        if v != start and len(inside) < len(succs[v]):
            if any(w in bare for w in inside):
                return None  # a path from the fork to the add with no layer on it
            continue  # the fork (or a side input shared with others): not part of the branch
        region.add(v)
        if node_layer[v] < 0 and (v == start or any(w in bare for w in inside)):
            bare.add(v)
            if len(graph.predecessors(v)) == 0:
                return None  # an input reaches the add with no layer on the way
        for p in graph.predecessors(v).tolist():
            if p not in queued:
                queued.add(p)
                heapq.heappush(heap, -p)
    layers = frozenset(int(node_layer[v]) for v in region if node_layer[v] >= 0)
    if not layers or not all(new_layer[l] for l in layers):
        return None
    tails = frozenset(int(node_layer[v]) for v in region
                      if node_layer[v] >= 0 and (v == start or any(w in bare for w in succs[v])))
    return FreshBranch(add, tails, layers, frozenset(region))


def new_branch_tails(graph: LayerGraph, new_layer: np.ndarray) -> set[int]:
    """Layers that end a residual branch made only of new layers (:func:`fresh_branches`): zero them and the
    branch adds nothing."""
    return {t for b in fresh_branches(graph, new_layer) for t in b.tails}
