"""Width operators: unit maps for a channel group, and applying them to a tensor's output or input axis.

Invariant (Net2Net): if a layer's output units are replicated by ``unit_map`` and the next layer's input axis is
taken with :func:`take_inputs` using the same map (dividing by replication counts), the pair computes the same
function as the parent pair. Shrinking keeps the most important units, in their original order.
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["unit_map", "replication_counts", "take_units", "take_inputs"]


def unit_map(parent_units: int, child_units: int, importance: np.ndarray | None = None, *,
             seed: int = 0, key: int = 0) -> np.ndarray:
    """Index of the parent unit each child unit comes from.

    Growing keeps every parent unit once, in place, and fills the rest with copies drawn by a generator seeded
    from ``(seed, key, sizes)``: two child groups that share a parent group and a size get the same map, which
    is what lets an inserted identity layer sit between them. Shrinking keeps the ``child_units`` parent units
    of highest ``importance`` (the first ones when no importance is given), in increasing order.
    """
    if parent_units <= 0 or child_units <= 0:
        raise ValueError(f"unit_map needs positive sizes, got parent={parent_units}, child={child_units}")
    if child_units == parent_units:
        return np.arange(child_units)
    if child_units < parent_units:
        if importance is None:
            return np.arange(child_units)
        keep = np.argsort(-np.asarray(importance, dtype=np.float64), kind="stable")[:child_units]
        return np.sort(keep)
    rng = np.random.default_rng(zlib.crc32(f"{seed}/{key}/{parent_units}/{child_units}".encode()))
    extra = rng.integers(0, parent_units, size=child_units - parent_units)
    return np.concatenate([np.arange(parent_units), extra])


def replication_counts(mapping: np.ndarray, parent_units: int) -> np.ndarray:
    """How many child units copy each parent unit (0 for dropped units)."""
    return np.bincount(mapping, minlength=parent_units)


def take_units(tensor: np.ndarray, mapping: np.ndarray, axis: int = 0) -> np.ndarray:
    """The tensor's units along ``axis`` rearranged by ``mapping`` (a new array; the input is not changed)."""
    return np.take(tensor, mapping, axis=axis)


def take_inputs(tensor: np.ndarray, mapping: np.ndarray, parent_units: int, axis: int = 1) -> np.ndarray:
    """Input axis taken by ``mapping``, each copy divided by its unit's replication count, so that summing over
    replicated inputs gives back the parent's sum."""
    out = np.take(tensor, mapping, axis=axis)
    counts = replication_counts(mapping, parent_units)[mapping]
    if np.any(counts > 1):
        shape = [1] * out.ndim
        shape[axis] = -1
        out = out / counts.reshape(shape).astype(out.dtype)
    return out
