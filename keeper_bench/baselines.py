"""What keeper is measured against in ``scripts/bench_training.py``; not used by the service.

- :func:`published_transfer`: the published system's (ModelKeeper, NSDI '23) weight operators, as its paper
  and code describe them, over keeper's own alignment so only the operators differ: width mapping chosen per
  layer (so layers sharing a channel dimension disagree), extra units copied with noise at 5% of the weights'
  std and the next layer divided by the copy count, kernels zero-padded at the corner, and unmatched layers
  near a warmed one made the identity plus N(0, 0.05) noise. (Its warm-up learning-rate scaling is not
  reproduced: every arm trains with the same schedule.)
- :func:`name_shape_load`: what ``load_state_dict(strict=False)`` after dropping mismatched tensors gives
  (Hugging Face's ``ignore_mismatched_sizes``): every tensor whose name and shape match is copied, nothing else.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from keeper.graph import LayerGraph
from keeper.matching import Alignment
from keeper.onnx_weights import layer_arrays, to_source
from keeper.transforms.compose import Transfer
from keeper.transforms.depth import identity_fill
from keeper.transforms.width import take_inputs, take_units, unit_map

__all__ = ["published_transfer", "name_shape_load", "PUBLISHED_NOISE"]

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


def _paste(t: np.ndarray, ct: np.ndarray) -> np.ndarray:
    out = np.array(ct, copy=True)
    sl = tuple(slice(0, min(a, b)) for a, b in zip(t.shape, ct.shape))
    out[sl] = t[sl]
    return out


def published_transfer(parent: LayerGraph, parent_inits: dict[str, np.ndarray], child: LayerGraph,
                       child_inits: dict[str, np.ndarray], alignment: Alignment, *, noise: float = PUBLISHED_NOISE,
                       seed: int = 0) -> Transfer:
    """Child weights warmed with the published system's operators (same signature as keeper's ``transfer``)."""
    P, C = layer_arrays(parent, parent_inits), layer_arrays(child, child_inits)
    pairs = np.asarray(alignment.pairs)
    rng = np.random.default_rng(seed)
    warmed = np.flatnonzero(pairs >= 0)
    out = Transfer()
    for c in range(child.num_layers):
        refs, cvals, p = child.tensors[c], C[c], int(pairs[c])
        values: dict[str, np.ndarray] = {}
        if p >= 0:
            pkeys = {r.role: r.key for r in parent.tensors[p]}
            for role, ct in cvals.items():
                if role not in P[p]:
                    values[role] = np.array(ct, copy=True)
                    continue
                t = P[p][role]
                if t.ndim >= 1 and ct.shape[0] > t.shape[0]:
                    # a map of its own per layer: the defect that breaks shared channel dimensions
                    m = unit_map(t.shape[0], ct.shape[0], seed=seed, key=2 * c)
                    t = take_units(t, m, 0)
                    extra = np.zeros(t.shape, bool)
                    extra[P[p][role].shape[0]:] = True
                    t = t + extra * rng.normal(0.0, noise * float(t.std() or 1.0), t.shape).astype(t.dtype)
                if role == "weight" and t.ndim >= 2 and ct.shape[1] > t.shape[1] and ct.ndim == t.ndim:
                    m = unit_map(t.shape[1], ct.shape[1], seed=seed, key=2 * c + 1)
                    t = take_inputs(t, m, t.shape[1], 1)
                if role == "weight" and t.ndim > 2 and t.shape[2:] != ct.shape[2:]:
                    t = _corner(t, ct.shape[2:])
                values[role] = _paste(t, ct).astype(ct.dtype)
                out.provenance[next(r.key for r in refs if r.role == role)] = (pkeys[role], "published")
        else:
            near = warmed.size and int(np.min(np.abs(warmed - c))) <= _IDENTITY_REACH
            filled = identity_fill(int(child.layer_kind[c]), cvals) if near else None
            for role, ct in cvals.items():
                v = filled[role] if filled is not None and role in filled else np.array(ct, copy=True)
                if filled is not None and role == "weight":
                    v = v + rng.normal(0.0, PUBLISHED_NOISE, v.shape).astype(ct.dtype)
                values[role] = v
        for role in cvals:
            key = next(r.key for r in refs if r.role == role)
            out.provenance.setdefault(key, (None, "init"))
        for ref in refs:
            if ref.key not in out.weights:
                out.weights[ref.key] = to_source(ref, values[ref.role])
    return out


def name_shape_load(module: Any, parent_state: dict[str, Any]) -> tuple[int, int]:
    """Copy every ``parent_state`` tensor whose name and shape match into ``module``; returns (copied tensors,
    copied elements). The module's other tensors keep their values."""
    import torch

    own = module.state_dict()
    keep = {k: v for k, v in parent_state.items() if k in own and tuple(own[k].shape) == tuple(v.shape)}
    module.load_state_dict(keep, strict=False)
    return len(keep), int(sum(int(torch.as_tensor(v).numel()) for v in keep.values()))
