"""Does the torch front end (:mod:`keeper.torch_support.trace`) give the dynamo exporter's answers?

Two checks per model, both against ``torch.onnx.export(dynamo=True)`` as keeper uses it (and
:func:`front_end_graph`, the front end alone, for coverage counts):

* :func:`graph_differences`: the two LayerGraphs, array by array (kinds, predecessors, shapes, channel groups,
  resolution levels), each layer's tensors by state_dict key, role and orientation, attrs and unread tensors;
  an empty list means alignment and warming read the same graph;
* :func:`warm_differences`: a parent registered and a child warmed through each path: the same parent chosen,
  the same similarity to 4 places, the same warmed weights.

Used by ``scripts/check_trace.py`` (the whole catalogue) and ``tests/test_trace.py`` (a subset).
"""

from __future__ import annotations

import copy
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from keeper.graph import LayerGraph
from keeper.torch_support.export import _export_graph
from keeper.torch_support.tensors import drop_eval_caches

__all__ = ["graph_differences", "warm_differences", "front_end_graph", "GraphCheck"]


class GraphCheck:
    """The outcome of :func:`graph_differences`: the differences, both timings, and the fallback reason (the
    trace could not read the module) or None."""

    def __init__(self, differences: list[str], trace_s: float, dynamo_s: float, fallback: str | None):
        self.differences, self.trace_s, self.dynamo_s, self.fallback = differences, trace_s, dynamo_s, fallback


def _refs(graph: LayerGraph, keys: dict[str, tuple[str, str]]) -> list[list[tuple]]:
    return [[(r.role, keys[r.key][0] if r.key in keys else f"(constant {r.source})", r.canon, r.chain)
             for r in refs] for refs in graph.tensors]


def compare_graphs(a: LayerGraph, keys_a: dict, b: LayerGraph, keys_b: dict) -> list[str]:
    """What differs between two LayerGraphs of one module (tensors compared by state_dict key)."""
    out = []
    for name in LayerGraph._ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        if x.shape != y.shape or not np.array_equal(x, y):
            out.append(f"{name}: {x.tolist()} vs {y.tolist()}")
    for i, (x, y) in enumerate(zip(_refs(a, keys_a), _refs(b, keys_b))):
        if x != y:
            out.append(f"layer {i} ({a.layer_names[i]}) tensors: {x} vs {y}")
    if a.attrs != b.attrs:
        out.append(f"attrs: {a.attrs} vs {b.attrs}")
    if a.unread != b.unread:
        out.append(f"unread: {a.unread} vs {b.unread}")
    return out


def front_end_graph(module: torch.nn.Module, args: tuple) -> tuple[LayerGraph, dict] | str:
    """``(LayerGraph, keys)`` from the torch front end alone (no cache, no exporter), or why it cannot read the
    module, as ``export_graph``'s fallback warning would say (it falls back on any failure of the trace)."""
    from keeper.torch_support.trace import trace_graph

    drop_eval_caches(module)
    try:
        traced = trace_graph(module, args)
        keys, graph = traced.keys, traced.graph
    except Exception as exc:  # noqa: BLE001 (see the docstring)
        first = str(exc).splitlines()[0] if str(exc) else ""
        return f"{type(exc).__name__}: {first}"[:200]
    finally:
        drop_eval_caches(module)
    return graph, keys


def graph_differences(module: torch.nn.Module, args: tuple) -> GraphCheck:
    """The torch front end's LayerGraph of ``module`` against the dynamo exporter's (module left as it was)."""
    from keeper.errors import TraceUnsupported
    from keeper.torch_support.trace import trace_graph

    drop_eval_caches(module)
    t0 = time.perf_counter()
    try:
        traced = trace_graph(module, args)
        keys, graph = traced.keys, traced.graph
    except TraceUnsupported as exc:
        return GraphCheck([], 0.0, 0.0, str(exc))
    finally:
        drop_eval_caches(module)
    t1 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = _export_graph(module, args, True, 0)
    t2 = time.perf_counter()
    return GraphCheck(compare_graphs(graph, keys, exported.graph, exported.keys), t1 - t0, t2 - t1, None)


def warm_differences(parent: torch.nn.Module, child: torch.nn.Module, args: tuple, root: Path) -> list[str]:
    """Register ``parent`` and warm a copy of ``child`` through each path (each in its own zoo); what differs
    between the two warms: parent chosen, similarity to 4 places, any warmed tensor."""
    from keeper.torch_support import register, warm_start
    from keeper.zoo import Zoo

    results: dict[str, Any] = {}
    for path, dynamo in (("trace", None), ("dynamo", True)):
        zoo = Zoo(str(root / f"zoo-{path}"))
        warm = copy.deepcopy(child)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            register(parent, args, zoo, 0.9, name="parent", config={"dynamo": dynamo})
            result = warm_start(warm, args, zoo, noise=0.0, config={"dynamo": dynamo})
        results[path] = (result.parent, round(float(result.score), 4), warm.state_dict())
    (pa, sa, wa), (pb, sb, wb) = results["trace"], results["dynamo"]
    out = []
    if pa != pb:
        out.append(f"parent: {pa} vs {pb}")
    if sa != sb:
        out.append(f"similarity: {sa} vs {sb}")
    out += [f"warmed {k} differs" for k in wa if not torch.equal(wa[k], wb[k])]
    return out
