"""What keeper is measured against in ``scripts/bench_training.py``; not used by the service.

Both are composed from keeper's public pieces (alignment, layer arrays, the per-layer loop
:func:`keeper.transforms.compose.transfer_layers`, the store reader of the transfer task), so only the operators
differ from keeper's.

- :func:`published_transfer` (and :func:`published_warm`, a whole warm start with it): the published system's
  (ModelKeeper, NSDI '23) weight operators, as its paper and code describe them, over keeper's own alignment so
  only the operators differ: width mapping chosen per
  layer (so layers sharing a channel dimension disagree), extra units copied with noise at 5% of the weights'
  std and the next layer divided by the copy count, kernels zero-padded at the corner, and unmatched layers
  near a warmed one made the identity plus N(0, 0.05) noise. (Its warm-up learning-rate scaling is not
  reproduced: every arm trains with the same schedule.)
- :func:`name_shape_load`: what ``load_state_dict(strict=False)`` after dropping mismatched tensors gives
  (Hugging Face's ``ignore_mismatched_sizes``): every tensor whose name and shape match is copied, nothing else.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from keeper.store.stored import read_parent
from keeper.graph import LayerGraph, graph_from_proto
from keeper.matching import Alignment, align
from keeper.onnx_safety import ModelInput, load_model
from keeper.onnx_weights import layer_arrays, model_weights
from keeper.weights import WeightsInput
from keeper.transforms.compose import LayerTensors, Transfer, paste_overlap, transfer_layers
from keeper.transforms.depth import identity_fill
from keeper.transforms.width import take_inputs, take_units, unit_map
from keeper.warm import WarmResult

__all__ = ["published_transfer", "published_warm", "published_warm_from_store", "name_shape_load",
           "PUBLISHED_NOISE"]

#: The published system's noise: 5% of the weights' std on copied units, N(0, 0.05) on identity layers.
PUBLISHED_NOISE = 0.05
#: Unmatched layers this close (in layer order) to a warmed one become identities there.
_IDENTITY_REACH = 4


def _corner(t: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``t`` zero-padded or cropped at the end of each kernel axis (the published kernel operator)."""
    out = np.zeros(t.shape[:2] + tuple(shape), dtype=t.dtype)
    sl = (slice(None), slice(None)) + tuple(slice(0, min(a, b)) for a, b in zip(t.shape[2:], shape))
    out[sl] = t[sl]
    return out


def _published_map(parent_units: int, child_units: int, seed: int, key: int) -> np.ndarray:
    """The published system's width map of one layer (Net2Net): every parent unit once, then as many whole copies
    as fit, then distinct units drawn at random, by a generator of the layer's own (``key``) so layers sharing a
    channel dimension draw apart. Shrinking keeps the first units."""
    if child_units <= parent_units:
        return unit_map(parent_units, child_units)
    reps, rest = divmod(child_units, parent_units)
    rng = np.random.default_rng(zlib.crc32(f"{seed}/{key}/{parent_units}/{child_units}".encode()))
    extra = rng.choice(parent_units, size=rest, replace=False) if rest else np.zeros(0, dtype=np.int64)
    return np.concatenate([np.tile(np.arange(parent_units), reps), extra])


def published_transfer(parent: LayerGraph, parent_inits: dict[str, np.ndarray], child: LayerGraph,
                       child_inits: dict[str, np.ndarray], alignment: Alignment, *, noise: float = PUBLISHED_NOISE,
                       seed: int = 0) -> Transfer:
    """Child weights warmed with the published system's operators (same signature as keeper's ``transfer``)."""
    P = layer_arrays(parent, parent_inits)
    pairs = np.asarray(alignment.pairs)
    rng = np.random.default_rng(seed)
    warmed = np.flatnonzero(pairs >= 0)

    def inherited(c: int, p: int, C: dict[str, np.ndarray]) -> LayerTensors:
        pkeys = {r.role: r.key for r in parent.tensors[p]}
        values: LayerTensors = {}
        for role, ct in C.items():
            if role not in P[p]:
                values[role] = (np.array(ct, copy=True), None, "init")
                continue
            t = P[p][role]
            if t.ndim >= 1 and ct.shape[0] > t.shape[0]:
                # a map of its own per layer: the defect that breaks shared channel dimensions
                m = _published_map(t.shape[0], ct.shape[0], seed, 2 * c)
                t = take_units(t, m, 0)
                extra = np.zeros(t.shape, bool)
                extra[P[p][role].shape[0]:] = True
                t = t + extra * rng.normal(0.0, noise * float(t.std() or 1.0), t.shape).astype(t.dtype)
            if role == "weight" and t.ndim >= 2 and ct.shape[1] > t.shape[1] and ct.ndim == t.ndim:
                m = _published_map(t.shape[1], ct.shape[1], seed, 2 * c + 1)
                t = take_inputs(t, m, t.shape[1], 1)
            if role == "weight" and t.ndim > 2 and t.shape[2:] != ct.shape[2:]:
                t = _corner(t, ct.shape[2:])
            values[role] = (paste_overlap(t, ct).astype(ct.dtype), pkeys[role], "published")
        return values

    def new(c: int, C: dict[str, np.ndarray]) -> LayerTensors:
        near = warmed.size and int(np.min(np.abs(warmed - c))) <= _IDENTITY_REACH
        filled = identity_fill(int(child.layer_kind[c]), C) if near else None
        values: LayerTensors = {}
        for role, ct in C.items():
            v = filled[role] if filled is not None and role in filled else np.array(ct, copy=True)
            if filled is not None and role == "weight":
                v = v + rng.normal(0.0, PUBLISHED_NOISE, v.shape).astype(ct.dtype)
            values[role] = (v, None, "init")  # the published system keeps no provenance of its identities
        return values

    return transfer_layers(child, child_inits,
                           lambda c, C: inherited(c, int(pairs[c]), C) if pairs[c] >= 0 else new(c, C))


def published_warm(parent: ModelInput, child: ModelInput, *, parent_name: str | None = None,
                   parent_graph: LayerGraph | None = None, parent_weights: WeightsInput | None = None,
                   child_weights: WeightsInput | None = None, noise: float = PUBLISHED_NOISE,
                   seed: int = 0) -> WarmResult:
    """``child`` warmed from ``parent`` as :func:`keeper.warm.warm_from_parent` does it (keeper's alignment),
    with the published system's operators in place of keeper's. ``child_weights``: the child's own weights when its
    graph holds none (keeper's torch front end exports graphs whose weights travel apart).

    Example:
        >>> r = published_warm(parent_bytes, child_bytes, noise=0.0)   # doctest: +SKIP
    """
    pproto = load_model(parent, what="parent model", weights_apart=parent_weights is not None)
    cproto = load_model(child, what="child model")
    pg, cg = parent_graph or graph_from_proto(pproto), graph_from_proto(cproto)
    al = align(pg, cg)
    own = model_weights(cproto, child_weights, "child model")
    moved = published_transfer(pg, model_weights(pproto, parent_weights, "parent model"), cg, own, al, noise=noise,
                               seed=seed)
    return WarmResult(parent_name, al.score, {**own, **moved.weights}, moved.provenance, cproto.SerializeToString())


def published_warm_from_store(uri: str, parent: str, child: ModelInput, *, child_weights: WeightsInput | None = None,
                              seed: int = 0) -> WarmResult:
    """:func:`published_warm` from the zoo model ``parent`` stored at ``uri`` (read as keeper's transfer task
    reads it, :func:`keeper.stored.read_parent`), with the published system's noise."""
    blob, graph, weights = read_parent(uri, parent)
    return published_warm(blob, child, parent_name=parent, parent_graph=graph, parent_weights=weights,
                          child_weights=child_weights, seed=seed)


def name_shape_load(module: Any, parent_state: dict[str, Any]) -> tuple[int, int]:
    """Copy every ``parent_state`` tensor whose name and shape match into ``module``; returns (copied tensors,
    copied elements). The module's other tensors keep their values."""
    import torch

    own = module.state_dict()
    keep = {k: v for k, v in parent_state.items() if k in own and tuple(own[k].shape) == tuple(v.shape)}
    module.load_state_dict(keep, strict=False)
    return len(keep), int(sum(int(torch.as_tensor(v).numel()) for v in keep.values()))
