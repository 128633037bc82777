"""Shrink and perturb: a restart that keeps part of its parent, so the child's own training decides where it ends.

A child of its parent's own architecture can inherit the parent's whole function (a restart). In a
hyperparameter search that turns "train with these hyperparameters" into "fine-tune the parent with them", and a
network warm-started from weights that fit their training data generalises worse than a fresh one (Ash & Adams,
NeurIPS 2020). Their remedy, shrink and perturb, is this module: every learned tensor the child inherited becomes

    shrink x inherited + (1 - shrink) x the child's own initial value

(the child's own initialisation is the perturbation: the scale its initialiser chose for that tensor, no noise
parameter of keeper's). Running statistics (a batch norm's mean and variance) and constant tables are not learned
by gradient and stay as inherited; pieces of a bias built in the forward pass and rows the forward pass zeroes are
only shrunk, so their constant zeros stay zero. Where the child has no value of its own (it came as a graph
without weights), the inherited tensor is only shrunk.

Invariant: pure (no input is modified); ``shrink=1`` returns the inherited arrays unchanged; dtypes and shapes are
kept; a tensor the child did not inherit is never touched.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from keeper.graph import LayerGraph

__all__ = ["MIXED_ROLES", "shrink_perturb", "mixer"]

#: The roles whose tensors gradient descent learns (a norm's running mean and variance, and tables read as
#: inputs, are not).
MIXED_ROLES = frozenset({"weight", "bias", "scale"})


def mixer(graph: LayerGraph, own: Mapping[str, np.ndarray], shrink: float,
          inherited: Callable[[str], bool]) -> Callable[[str, np.ndarray], np.ndarray]:
    """A function ``(key, warmed array) -> array`` applying shrink and perturb to one child tensor (see the module
    docstring); ``own``: the child's initial arrays by key; ``inherited(key)``: whether the tensor came from the
    parent. Usable tensor by tensor while a transfer streams."""
    if not 0.0 <= shrink <= 1.0:
        raise ValueError(f"shrink must be a share of the parent's weights in [0, 1], got {shrink!r}")
    mixed: set[str] = set()
    shrunk: set[str] = set()
    for refs in graph.tensors:
        for ref in refs:
            if ref.role not in MIXED_ROLES:
                continue
            (shrunk if ref.span or ref.zeroed else mixed).add(ref.key)
    mixed -= shrunk  # a key read both whole and in pieces keeps its constant zeros

    def mix(key: str, value: np.ndarray) -> np.ndarray:
        if shrink == 1.0 or not inherited(key) or (key not in mixed and key not in shrunk):
            return value
        warm = np.asarray(value)
        out = warm.astype(np.float64) * shrink
        mine = own.get(key)
        if key in mixed and mine is not None and np.shape(mine) == warm.shape:
            out += (1.0 - shrink) * np.asarray(mine, dtype=np.float64)
        return out.astype(warm.dtype)

    return mix


def shrink_perturb(graph: LayerGraph, warmed: Mapping[str, np.ndarray], own: Mapping[str, np.ndarray],
                   shrink: float, inherited: Callable[[str], bool]) -> dict[str, np.ndarray]:
    """``warmed`` with shrink and perturb applied (a new dict; see :func:`mixer` and the module docstring).

    Example:
        >>> mixed = shrink_perturb(child_graph, result.weights, child_init, 0.5,       # doctest: +SKIP
        ...                        lambda k: result.mapping[k][0] is not None)
    """
    mix = mixer(graph, own, shrink, inherited)
    return {k: mix(k, v) for k, v in warmed.items()}
