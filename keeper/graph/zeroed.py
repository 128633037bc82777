"""A learned vector with rows zeroed in the forward pass: Swin V2's qkv bias, ``b = bias.clone(); b[k:2k].zero_()``,
which exporters write as a ScatterND of zeros into rows of the parameter, the rows computed by small integer
subgraphs (:mod:`keeper.graph.fold`).

The vector is still the parameter: one ref to it, with the rows the op overwrites marked (``TensorRef.zeroed``),
read and written as zeros and counted as learned elements. This sits above both :mod:`keeper.graph.reader` (what
the file holds) and :mod:`keeper.graph.fold` (what its integer ops compute), which reads the reader: the reader
itself never folds.

Invariant: a ref is returned only when every overwritten row is known exactly (folded from constants and static
shapes) and the values written there read as zeros; otherwise None, never a guess.
"""

from __future__ import annotations

import numpy as np

from keeper.graph.fold import fold_ints
from keeper.graph.reader import ModelReader, as_str, attr
from keeper.graph.types import TensorRef

__all__ = ["trace_zeroed"]


def trace_zeroed(reader: ModelReader, name: str, role: str) -> TensorRef | None:
    """The ref of the learned vector ``name`` is when it is a learned tensor with some of its rows set to zero (a
    ScatterND of zeros along the first axis), ``zeroed`` holding the rows the op sees as zeros, whatever the
    tensor holds there; None when ``name`` is no such ScatterND."""
    n = reader.producer.get(name)
    if n is None or n.op_type != "ScatterND" or len(n.input) < 3 or as_str(attr(n, "reduction", "none")) != "none":
        return None
    ref = reader.trace_weight(n.input[0], role)
    if ref is None or not reader.is_learned(ref.source) or len(reader.ref_shape(ref)) != 1:
        return None
    units = reader.ref_shape(ref)[0]
    idx = fold_ints(reader, n.input[1], cap=units)
    if idx is None or idx.ndim != 2 or idx.shape[1] != 1 or not reader.reads_zero(n.input[2]):
        return None
    rows = idx[:, 0]
    if rows.size == 0 or np.any(rows >= units) or np.any(rows < -units):
        return None
    mask = np.zeros(units, dtype=bool)
    mask[rows % units] = True
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return TensorRef(ref.role, ref.key, ref.source, ref.source_shape, ref.chain, ref.canon,
                     zeroed=tuple(int(e) for e in edges))
