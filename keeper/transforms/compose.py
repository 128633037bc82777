"""Apply the width, kernel and depth operators to a whole child graph, given its alignment to a parent.

Invariant: with ``noise=0``, when the child only widens, deepens by identity-able blocks, or enlarges kernels
relative to the parent, the child computes the parent's function. Width maps are chosen per channel group, never
per layer, so every tensor sharing a channel dimension (residual streams, concatenations, norms and their running
statistics, depthwise convs) agrees on which parent unit each child unit copies.

Precision and memory: parent and child may hold float32, float16 or bfloat16, alike or mixed. Steps that only move
values (copies, unit selection, kernel pads and crops) run in the parent's dtype; steps that divide or scale
(input division after widening, attention factors, noise) run in float32 for a low-precision tensor, and each
result is cast once to the child's dtype. Tensors are produced one at a time, each parent tensor read only when
its child tensor is made (parent arrays may be memory-mapped), and a ``sink`` can take each child tensor as soon
as it exists, so the transform holds at most the child's weights plus one tensor (one tensor with a sink).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import ml_dtypes
import numpy as np

from keeper.graph import INPUT_ROLE, LayerGraph
from keeper.kinds import kinds_where, traits
from keeper.matching import Alignment
from keeper.onnx_weights import fixed_rows, layer_arrays, role_arrays, to_source
from keeper.transforms.depth import identity_fill, new_branch_tails, zero_fill
from keeper.transforms.kernel import fit_kernel
from keeper.transforms.stream_width import StreamGrowth
from keeper.transforms.unit_maps import GroupMaps
from keeper.transforms.width import take_inputs, take_units, take_units_and_inputs

__all__ = ["Transfer", "transfer", "transfer_layers", "tensor_writers", "tied_input_divisors", "LayerTensors",
           "paste_overlap"]

# dtypes whose arithmetic keeper runs in float32 (bfloat16 keeps 8 bits of mantissa: a division by a replication
# count or a product with an attention factor in it would round the function away)
_LOW_PRECISION = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _wide(a: np.ndarray) -> np.ndarray:
    """``a`` in float32 when its dtype is low-precision, else ``a`` itself."""
    return a.astype(np.float32) if a.dtype in _LOW_PRECISION else a


@dataclass
class Transfer:
    """Child tensors (key -> array as stored in the child model) and, per key, (parent key or None, operator)."""

    weights: dict[str, np.ndarray] = field(default_factory=dict)
    provenance: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    # child layers whose constant zero rows (a bias in pieces or zeroed) the transform made non-zero: they stay zero
    unkept: list[str] = field(default_factory=list)


def paste_overlap(parent_t: np.ndarray, child_t: np.ndarray) -> np.ndarray:
    """Parent values on the overlapping leading block, the child's own values elsewhere."""
    out = np.array(child_t, copy=True)
    sl = tuple(slice(0, min(a, b)) for a, b in zip(parent_t.shape, child_t.shape))
    out[sl] = parent_t[sl]
    return out


def _map_fits(m: np.ndarray | None, child_len: int, parent_len: int) -> bool:
    return m is not None and len(m) == child_len and int(m.max(initial=-1)) < parent_len


def _moves(m: np.ndarray, parent_len: int) -> bool:
    """The map is not the identity on ``parent_len`` units."""
    return len(m) != parent_len or bool(np.any(m != np.arange(len(m))))


def _inherit(kind: int, role: str, pt: np.ndarray, ct: np.ndarray, out_map, in_map,
             parent_in: int) -> tuple[np.ndarray, list[str]]:
    """Turn parent tensor ``pt`` into the child's shape ``ct.shape``; returns the array and the operators used."""
    ops: list[str] = []
    t = pt
    kt = traits(kind)
    take_out = t.ndim >= 1 and _map_fits(out_map, ct.shape[0], t.shape[0]) and _moves(out_map, t.shape[0])
    take_in = (role == "weight" and kt.in_axis is not None and t.ndim >= 2
               and _map_fits(in_map, ct.shape[1], t.shape[1]) and _moves(in_map, t.shape[1]))
    if take_out:
        ops.append("widen" if len(out_map) > t.shape[0] else "shrink")
    if take_in:
        grow_in = len(in_map) > t.shape[1]
        ops.append("widen-in" if grow_in else "shrink-in")
    if take_in and grow_in:
        t = _wide(t)  # the input division runs in float32
    if take_out and take_in:
        t = take_units_and_inputs(t, out_map, in_map, parent_in if grow_in else None)
    elif take_out:
        t = take_units(t, out_map, 0)
    elif take_in:
        t = take_inputs(t, in_map, parent_in, 1) if grow_in else take_units(t, in_map, 1)
    if role == "weight" and kt.kernel_axes and t.ndim > 2 and t.shape[2:] != ct.shape[2:]:
        ops.append("kernel-pad" if np.prod(ct.shape[2:]) > np.prod(t.shape[2:]) else "kernel-crop")
        t = fit_kernel(t, ct.shape[2:])
    if t.shape != ct.shape:
        ops.append("slice")
        t = paste_overlap(t, ct)
    return t, ops or ["copy"]


#: One child layer's tensors as a per-layer rule gives them: role -> (array in canonical orientation, parent
#: tensor key or None, operator). An array that *is* the child's own (the ``cvals`` entry) is kept as it is. A role
#: built from pieces (``TensorRef.span``) is one array, the whole; its parent key may be a tuple, one per piece.
LayerTensors = dict[str, tuple[np.ndarray, "str | tuple[str, ...] | None", str]]


def transfer_layers(child: LayerGraph, child_inits: Mapping[str, np.ndarray],
                    layer: Callable[[int, dict[str, np.ndarray]], LayerTensors],
                    sink: Callable[[str, np.ndarray], None] | None = None,
                    writers: Mapping[str, int] | None = None) -> Transfer:
    """The child's tensors, layer by layer in canonical order: ``layer(c, cvals)`` gives every role of child layer
    ``c`` from the child's own arrays ``cvals`` (role -> canonical array, read only now: memory-mapped inits are
    read layer by layer).

    Tied tensors (one initializer behind several layers): layer ``writers[key]`` writes the array and gives its
    provenance (:func:`tensor_writers`); without ``writers``, the first layer in canonical order writes it and the
    provenance is the last layer's. Arrays go back to each tensor's stored orientation (``to_source``) in the
    child's dtype; a tensor the child keeps is its own array, not a copy. With ``sink``, each tensor goes to
    ``sink(key, array)`` as soon as it is made and ``weights`` stays empty (streaming: one layer in memory).

    A role built from pieces (``TensorRef.span``: concat(q_bias, zeros, v_bias)) is assembled for ``layer`` and
    split back; its zero rows (and a ref's ``zeroed`` rows) are the child's constants: a layer whose new value is not
    zero there is listed in ``unkept`` (its function is then not the transform's)."""
    out = Transfer()
    done: set[str] = set()
    for c in range(child.num_layers):
        refs = child.tensors[c]
        cvals = role_arrays(refs, child_inits)
        values = layer(c, cvals)
        for role, (v, src, op) in values.items():
            for i, ref in enumerate(r for r in refs if r.role == role):
                if writers is None or writers.get(ref.key, c) == c:
                    out.provenance[ref.key] = (src[min(i, len(src) - 1)] if isinstance(src, tuple) else src, op)
            fixed = fixed_rows(refs, role)
            if fixed is not None and v is not cvals[role] and np.any(np.asarray(v)[fixed]):
                out.unkept.append(child.layer_names[c])
        for ref in refs:
            if ref.key in done or (writers is not None and writers.get(ref.key, c) != c):
                continue
            done.add(ref.key)
            v = values[ref.role][0]
            if v is cvals[ref.role] and ref.key == ref.source:
                value = child_inits[ref.key]  # kept as the child holds it: no copy, whatever its layout
            else:
                value = to_source(ref, np.asarray(v, dtype=cvals[ref.role].dtype))
            if sink is None:
                out.weights[ref.key] = value
            else:
                sink(ref.key, value)
        del values, cvals  # with a sink, nothing of this layer outlives it
    return out


def tensor_writers(child: LayerGraph, inherits: np.ndarray) -> dict[str, int]:
    """Tensor key -> the child layer that writes it: of the layers reading it, the first in canonical order that
    inherits (``inherits[c]``), else the first. A table several blocks share (T5's relative-position bias, read in
    every block and computed in the first) keeps the parent's values when new blocks come first."""
    first: dict[str, int] = {}
    inherited: dict[str, int] = {}
    for c in range(child.num_layers):
        for ref in child.tensors[c]:
            first.setdefault(ref.key, c)
            if inherits[c]:
                inherited.setdefault(ref.key, c)
    return {k: inherited.get(k, c) for k, c in first.items()}


# weightless kinds between a norm and the layer it feeds that keep the norm's output proportional to its tensors
_PROPORTIONAL = kinds_where(lambda t: t.proportional)


def tied_input_divisors(child: LayerGraph, maps: GroupMaps, writers: Mapping[str, int]) -> dict[int, np.ndarray]:
    """Child layer -> per-unit divisors of its affine tensors, for the norms feeding a layer whose grown input
    cannot be divided because its weight is tied to a layer that copies it.

    GPT-2's LM head shares ``wte`` with the token embedding, which writes it (:func:`tensor_writers`) with every
    column copied as the grown stream's units are; the head would need them divided by the copy counts. The final
    norm feeding only the head sees the parent's statistics (every unit copied equally often), so dividing its
    scale and shift per unit by the unit's copy count makes its output the parent's units, each copy divided,
    and the head's sum over them the parent's logits. Found generally: a layer with an input axis whose weight
    another layer with no input axis writes, whose input units are copied, fed (through shape ops and
    identities, every node feeding only the next) by a LayerNorm, BatchNorm or scaling PARAM (an RMSNorm weight)
    over the same units. A GELU in that chain would not stay proportional; exporters write only identities there.
    """
    out: dict[int, np.ndarray] = {}
    node_layer = np.full(child.num_nodes, -1, dtype=np.int64)
    node_layer[child.layer_node] = np.arange(child.num_layers)
    fanout = np.bincount(child.pred_indices, minlength=child.num_nodes)
    for c in range(child.num_layers):
        refs = child.tensors[c]
        if traits(int(child.layer_kind[c])).in_axis is None or not refs:
            continue
        w = writers.get(refs[0].key, c)
        if w == c or traits(int(child.layer_kind[w])).in_axis is not None:
            continue
        gi = int(child.in_group[c])
        m, ps = maps.map(gi), maps.parent_size(gi)
        if m is None or ps <= 0:
            continue
        counts = np.bincount(m, minlength=ps)[m]
        st = maps.streams.get(gi)
        if st is not None:  # the copies hold the stream scaled; the mean units are 0 after the norm
            counts = np.concatenate([counts * st.scale, np.ones(st.child_units - len(m))])
        elif np.all(counts == 1):
            continue
        preds = child.predecessors(int(child.layer_node[c]))
        while len(preds) == 1 and fanout[preds[0]] == 1 and node_layer[preds[0]] < 0 \
                and int(child.kind[preds[0]]) in _PROPORTIONAL:
            preds = child.predecessors(int(preds[0]))
        if len(preds) != 1 or fanout[preds[0]] != 1 or node_layer[preds[0]] < 0:
            continue
        p = int(node_layer[preds[0]])
        attrs = child.attrs[p] if p < len(child.attrs) else {}
        divisible = attrs.get("scales", True) and not attrs.get("through")  # exp(clamp(s)) is not divided by s
        if traits(int(child.layer_kind[p])).affine and divisible and int(child.out_group[p]) == gi:
            out[p] = counts.astype(np.float64)
    return out


def _grown(child: LayerGraph, maps: Any, c: int, kind: int, role: str, pt: np.ndarray, ct: np.ndarray,
           out_map: Any, in_map: Any) -> tuple[np.ndarray, list[str]]:
    """Child layer ``c``'s value of ``role`` from the parent's ``pt``: the width operators' own, or where a residual
    stream grows by a factor that does not divide, built on the copied units with the mean units appended."""
    so, si = maps.streams.get(int(child.out_group[c])), maps.streams.get(int(child.in_group[c]))
    reads = si is not None and role == "weight" and traits(kind).in_axis is not None and ct.ndim >= 2
    parent_in = maps.parent_size(int(child.in_group[c]))
    if so is None and not reads:
        return _inherit(kind, role, pt, ct, out_map, in_map, parent_in)
    shape = list(ct.shape)
    if so is not None:
        shape[0] = len(out_map)
    if reads:
        shape[1] = len(in_map)
    v, ops = _inherit(kind, role, pt, np.broadcast_to(np.zeros((), ct.dtype), tuple(shape)), out_map, in_map,
                      parent_in)
    return _stream_units(_wide(v), so, si if reads else None, kind, role, c), ops + ["stream-grow"]


def _rescaled(v: np.ndarray, ops: list[str], role: str, factors: np.ndarray | None,
              divisor: np.ndarray | None) -> np.ndarray:
    """``v`` with attention's per-unit scale (weight and bias rows) and a tied reader's per-unit division applied,
    each named in ``ops``; one pass in float32 or the tensor's own wider dtype (a float64 product and a cast back
    cost three)."""
    if factors is not None and role in ("weight", "bias") and v.shape[:1] == factors.shape:
        v = _wide(v)
        v = v * factors.astype(v.dtype).reshape((-1,) + (1,) * (v.ndim - 1))
        ops.append("attention-scale")
    if divisor is not None and role not in ("mean", "var") and v.shape[:1] == divisor.shape:
        v = _wide(v)
        v = v / divisor.astype(v.dtype).reshape((-1,) + (1,) * (v.ndim - 1))
        ops.append("tied-divide")
    return v


def _noisy(v: np.ndarray, scale_of: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    """``v`` plus Gaussian noise of relative std ``noise`` (relative to ``scale_of``'s std), in float32 or wider."""
    v = _wide(v)
    return v + rng.normal(0.0, noise * float(np.std(_wide(scale_of)) or 1.0), v.shape).astype(v.dtype)


@dataclass
class _Run:
    """What every layer of one transfer reads: both graphs, the parent's arrays per layer, the unit maps, the new
    branches' tails, the tied readers' divisors, and the noise with its generator."""

    parent: LayerGraph
    child: LayerGraph
    parent_layers: list
    maps: GroupMaps
    tails: set[int]
    divisors: dict[int, np.ndarray]
    noise: float
    rng: np.random.Generator


def transfer(parent: LayerGraph, parent_inits: Mapping[str, np.ndarray], child: LayerGraph,
             child_inits: Mapping[str, np.ndarray], alignment: Alignment, *, noise: float = 0.0,
             seed: int = 0, sink: Callable[[str, np.ndarray], None] | None = None) -> Transfer:
    """Child weights warmed from the parent along ``alignment``.

    Args:
        parent_inits / child_inits: initializer name -> array, as read from each model (memory-mapped arrays
            are read tensor by tensor; a child tensor's values are read only where the child keeps them).
        noise: relative std of Gaussian noise added to each warmed weight tensor (0 keeps the function).
        seed: seeds the noise.
        sink: when given, called with (key, array in the child's dtype) for each child tensor once made, and
            ``weights`` stays empty (streaming to a file).

    Returns a :class:`Transfer` of every tensor of every child layer; inputs are not modified; tensors the child
    keeps (operator ``init``) are the child's own arrays.
    """
    P = layer_arrays(parent, parent_inits)
    pairs = np.asarray(alignment.pairs)
    maps = GroupMaps(parent, child, pairs, P)
    writers = tensor_writers(child, pairs >= 0)
    run = _Run(parent, child, P, maps, new_branch_tails(child, pairs < 0),
               tied_input_divisors(child, maps, writers), noise, np.random.default_rng(seed))
    return transfer_layers(child, child_inits, lambda c, cvals: _inherited_layer(run, c, int(pairs[c]), cvals)
                           if pairs[c] >= 0 else _new_layer(run, c, cvals), sink, writers)


def _inherited_layer(run: _Run, c: int, p: int, cvals: dict[str, np.ndarray]) -> LayerTensors:
    """Child layer ``c``'s tensors from parent layer ``p``: each role grown, shrunk or copied along the unit maps,
    rescaled where attention or a tied reader needs it, with noise on the weight; a table the layer reads is the
    parent's when of its shape, else the child's own."""
    child, P = run.child, run.parent_layers
    kind = int(child.layer_kind[c])
    out_map, in_map = run.maps.map(int(child.out_group[c])), run.maps.map(int(child.in_group[c]))
    pkeys: dict[str, tuple[str, ...]] = {}
    for r in run.parent.tensors[p]:  # a role's keys: one, or one per piece
        pkeys[r.role] = pkeys.get(r.role, ()) + (r.key,)
    values: LayerTensors = {}
    for role, ct in cvals.items():
        if role not in P[p] or role == INPUT_ROLE:
            same = role in P[p] and P[p][role].shape == ct.shape
            values[role] = (P[p][role], pkeys[role], "copy") if same else (ct, None, "init")
            continue
        v, ops = _grown(child, run.maps, c, kind, role, P[p][role], ct, out_map, in_map)
        v = _rescaled(v, ops, role, run.maps.factors(int(child.out_group[c])), run.divisors.get(c))
        if run.noise > 0 and role == "weight":
            v = _noisy(v, v, run.noise, run.rng)
        values[role] = (v, pkeys[role], "+".join(ops))
    return values


def _new_layer(run: _Run, c: int, cvals: dict[str, np.ndarray]) -> LayerTensors:
    """Child layer ``c``, which no parent layer feeds: zeros at the tail of a new branch (its sum adds nothing),
    an identity where its input and output units copy the same parent units, else the child's own init."""
    child = run.child
    kind = int(child.layer_kind[c])
    attrs = child.attrs[c] if c < len(child.attrs) else {}
    filled, op = None, "init"
    if c in run.tails:
        filled, op = zero_fill(kind, cvals), "zero"
    elif run.maps.copies_alike(c):
        filled = identity_fill(kind, cvals, epsilon=attrs.get("epsilon", 1e-5), strides=attrs.get("strides"))
        op = "identity" if filled is not None else "init"
    values: LayerTensors = {}
    for role, ct in cvals.items():
        v = filled[role] if filled is not None and role in filled else ct
        if run.noise > 0 and role == "weight" and filled is not None:
            v = _noisy(v, ct, run.noise, run.rng)
        values[role] = (v, None, op if filled is not None and role in filled else "init")
    return values


def _stream_units(v: np.ndarray, out: StreamGrowth | None, into: StreamGrowth | None, kind: int, role: str,
                  layer: int) -> np.ndarray:
    """A tensor built on a grown stream's copied units, completed with its filled units (see
    :class:`~keeper.transforms.stream_width.StreamGrowth`): a norm on the stream (a LayerNorm's scale, an RMSNorm's
    weight) is divided by the stream's scale and 0 on the filled units; a layer writing the stream is multiplied
    by the scale, its filled units the mean of its rows (under LayerNorms) or 0 (under RMSNorms); a layer reading
    it reads 0 from the filled units and, when it reads the stream itself, divides by the scale."""
    if out is not None:
        extra = (out.child_units - len(v),) + v.shape[1:]
        if traits(kind).normalizes or layer in out.norm_weights:
            v = v / v.dtype.type(out.scale) if role == "scale" or layer in out.norm_weights else v
            v = np.concatenate([v, np.zeros(extra, v.dtype)])
        else:
            v = v * v.dtype.type(out.scale)
            fill = v.mean(axis=0, keepdims=True) if out.fill == "mean" else np.zeros((), v.dtype)
            v = np.concatenate([v, np.broadcast_to(fill, extra)])
    if into is not None:
        if layer in into.raw_readers:
            v = v / v.dtype.type(into.scale)
        v = np.concatenate([v, np.zeros((v.shape[0], into.child_units - v.shape[1]) + v.shape[2:], v.dtype)], axis=1)
    return v
