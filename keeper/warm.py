"""WarmResult, and warming one child from one chosen parent.

A WarmResult holds plain data only (strings, floats, numpy arrays, the child's ONNX bytes), so Ray moves it
with its zero-copy numpy path and no user object is pickled on the wire.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from keeper.graph import LayerGraph, graph_from_proto
from keeper.matching import Alignment, align
from keeper.onnx_safety import ModelInput, load_model
from keeper.onnx_weights import read_initializers, write_weights
from keeper.transforms import transfer

__all__ = ["WarmResult", "warm_from_parent", "cold_result", "DEFAULT_NOISE"]

#: Relative std of the symmetry-breaking noise added to warmed weights unless the caller says otherwise.
DEFAULT_NOISE = 0.01


@dataclass
class WarmResult:
    """The outcome of a warm start.

    Attributes:
        parent: name of the parent model in the zoo, or None when the child keeps its own weights.
        score: similarity of the parent to the child (fraction of child parameter elements inherited).
        weights: child ONNX initializer name -> array, for every initializer (and every untied alias).
        mapping: child tensor -> (parent tensor or None, operator), operators such as ``copy``, ``widen``,
            ``kernel-pad``, ``identity``, ``zero``, ``init``.
        model: the child's ONNX bytes as given (its own initial weights).
        missing / unexpected: filled by torch loading: state_dict keys not warmed / warm keys with no
            state_dict entry.
    """

    parent: str | None
    score: float
    weights: dict[str, np.ndarray]
    mapping: dict[str, tuple[str | None, str]]
    model: bytes = b""
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    def to_onnx(self) -> onnx.ModelProto:
        """The child model with the warmed initializers."""
        return write_weights(load_model(self.model, what="child model"), self.weights)

    def summary(self) -> dict[str, Any]:
        """Counts of child tensors per operator, and the share of tensors that came from the parent."""
        ops = Counter(op for _, op in self.mapping.values())
        inherited = sum(1 for src, _ in self.mapping.values() if src is not None)
        return {"parent": self.parent, "score": round(float(self.score), 6), "tensors": len(self.mapping),
                "from_parent": inherited, "operators": dict(sorted(ops.items()))}


def cold_result(child: ModelInput, graph: LayerGraph | None = None) -> WarmResult:
    """The child's own weights, no parent (``graph``: the child's, when the caller has extracted it)."""
    proto = load_model(child, what="child model")
    graph = graph if graph is not None else graph_from_proto(proto)
    weights = dict(read_initializers(proto))
    mapping = {r.key: (None, "init") for refs in graph.tensors for r in refs}
    _add_aliases(graph, weights)
    return WarmResult(None, 0.0, weights, mapping, proto.SerializeToString())


def warm_from_parent(parent: ModelInput, child: ModelInput, *, parent_name: str | None = None,
                     parent_graph: LayerGraph | None = None, child_graph: LayerGraph | None = None,
                     alignment: Alignment | None = None, noise: float = DEFAULT_NOISE, seed: int = 0) -> WarmResult:
    """Warm ``child`` from ``parent`` (both ONNX bytes, paths or ModelProtos with weights).

    Example:
        >>> r = warm_from_parent(parent_bytes, child_bytes, noise=0.0)  # doctest: +SKIP
        >>> r.score, r.summary()["operators"]                            # doctest: +SKIP
    """
    if not (noise >= 0.0 and np.isfinite(noise)):
        raise ValueError(f"noise must be a finite relative std >= 0, got {noise!r}")
    pproto = load_model(parent, what="parent model")
    cproto = load_model(child, what="child model")
    pg = parent_graph or graph_from_proto(pproto)
    cg = child_graph or graph_from_proto(cproto)
    al = alignment or align(pg, cg)
    child_inits = read_initializers(cproto)
    moved = transfer(pg, read_initializers(pproto), cg, child_inits, al, noise=noise, seed=seed)
    weights = dict(child_inits)
    weights.update(moved.weights)
    return WarmResult(parent_name, al.score, weights, moved.provenance, cproto.SerializeToString())


def _add_aliases(graph: LayerGraph, weights: dict[str, np.ndarray]) -> None:
    for refs in graph.tensors:
        for r in refs:
            if r.key not in weights and r.source in weights:
                weights[r.key] = weights[r.source]
