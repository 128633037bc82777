"""The weight transfer of one warm start, run where the caller wants it: a Ray task (the service's way) or the
caller's own process.

It reads the parent's ONNX and stored graph straight from the durable store, and memory-maps the parent's weights
when they are stored apart (a local file for a local store, a verified copy streamed from an object store), so a
parent's weights never pass through the front door or the ZooManager; only the child's warmed weights travel,
from this task to the caller (or none: run it in the caller's process, as ``warm_start`` does).

Invariant: ``warm_from_store(uri, parent, child)`` equals ``Zoo(uri).warm_from(parent, child)`` except that it
counts no parent hit (the service counts hits in the ZooManager, its single writer).

Example:
    >>> choice = ray.get(keeper.choose.remote(child_bytes), timeout=60)                 # doctest: +SKIP
    >>> result = warm_from_store(choice.uri, choice.parent, child_bytes, noise=0)        # doctest: +SKIP
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from keeper.errors import ModelNotFoundError
from keeper.graph import LayerGraph
from keeper.onnx_safety import ModelInput
from keeper.warm import DEFAULT_NOISE, WarmResult, cold_result, warm_from_parent
from keeper.weights import SafeTensors, WeightsInput

__all__ = ["warm_from_store", "read_parent", "read_parent_graph", "store_for", "ask_service"]

_stores: dict[str, object] = {}
_stores_lock = threading.Lock()


def ask_service(handle: Any, graph: LayerGraph, timeout_s: float, what: str = "warm_start") -> Any:
    """The service's :class:`~keeper.selection.ParentChoice` for the child ``graph``, counting a hit: the first half
    of a warm whose transfer runs in this process (:func:`warm_from_store`). The graph travels as its arrays
    (plain data), so the front door extracts nothing."""
    from keeper.actors.remote import Demand, get

    return get(handle.choose.remote(graph.to_arrays(), True), timeout_s,
               Demand(f"{what}: the keeper service's parent choice", actor=handle))


def store_for(uri: str, fresh: bool = False):
    """One ModelStore per URI and process (opening one reads its catalog)."""
    from keeper.store import ModelStore

    with _stores_lock:
        if fresh or uri not in _stores:
            _stores[uri] = ModelStore(uri)
        return _stores[uri]


def read_parent(uri: str, parent: str) -> tuple[bytes, LayerGraph, SafeTensors | None]:
    """The zoo model ``parent`` stored at ``uri``: its ONNX bytes, its stored graph, and its weights memory-mapped
    from the store (None when they are inside the ONNX bytes).

    Raises:
        ModelNotFoundError: ``parent`` is not in the store (removed or evicted since it was chosen).
    """
    from keeper.zoo import GRAPH_EXTRA, graph_from_blob, stored_weights

    store, (blob, graph_blob) = _read_stored(uri, lambda s: (s.get(parent), s.get_extra(parent, GRAPH_EXTRA)))
    return blob, graph_from_blob(graph_blob, lambda: blob), stored_weights(store, parent)


def read_parent_graph(uri: str, parent: str) -> tuple[LayerGraph, Any]:
    """The stored graph and catalog record of the zoo model ``parent`` at ``uri`` (its weights are not read).

    Raises:
        ModelNotFoundError: ``parent`` is not in the store.
    """
    from keeper.zoo import GRAPH_EXTRA, graph_from_blob

    store, (rec, graph_blob) = _read_stored(uri, lambda s: (s.record(parent), s.get_extra(parent, GRAPH_EXTRA)))
    return graph_from_blob(graph_blob, lambda: store.get(parent)), rec


def _read_stored(uri: str, read: Callable[[Any], Any]) -> tuple[Any, Any]:
    """``(store, read(store))`` for the zoo at ``uri``; a model missing from the catalog this process opened is
    looked up once more in a fresh one (it may have been registered since)."""
    store = store_for(uri)
    try:
        return store, read(store)
    except ModelNotFoundError:
        store = store_for(uri, fresh=True)
        return store, read(store)


def warm_from_store(uri: str, parent: str | None, child: ModelInput, noise: float = DEFAULT_NOISE,
                    seed: int = 0, child_graph: LayerGraph | dict[str, np.ndarray] | None = None, *,
                    child_weights: WeightsInput | None = None) -> WarmResult:
    """Warm ``child`` from the zoo model ``parent`` stored at ``uri`` (the child's own weights when None).

    ``child_graph``: the child's LayerGraph (or its ``to_arrays()``) when the caller has already extracted it,
    so it is not extracted twice. ``child_weights``: the child's initial weights when ``child`` is its graph
    alone (see :func:`keeper.warm.warm_from_parent`).

    Raises:
        ModelNotFoundError: ``parent`` is not in the store (removed or evicted since it was chosen).
    """
    if isinstance(child_graph, dict):
        child_graph = LayerGraph.from_arrays(child_graph)
    if parent is None:
        return cold_result(child, child_weights, graph=child_graph)
    blob, graph, weights = read_parent(uri, parent)
    return warm_from_parent(blob, child, parent_weights=weights, child_weights=child_weights, parent_name=parent,
                            parent_graph=graph, child_graph=child_graph, noise=noise, seed=seed)
