"""The weight transfer of one warm start, run where the caller wants it: a Ray task (the service's way) or the
caller's own process.

It reads the parent's ONNX and stored graph straight from the durable store, so a parent's weights never pass
through the front door or the ZooManager; only the child's warmed weights travel, from this task to the caller.

Invariant: ``warm_from_store(uri, parent, child)`` equals ``Zoo(uri).warm_from(parent, child)`` except that it
counts no parent hit (the service counts hits in the ZooManager, its single writer).

Example:
    >>> choice = ray.get(keeper.choose.remote(child_bytes), timeout=60)                 # doctest: +SKIP
    >>> result = warm_from_store(choice.uri, choice.parent, child_bytes, noise=0)        # doctest: +SKIP
"""

from __future__ import annotations

import threading

import numpy as np

from keeper.errors import ModelNotFoundError
from keeper.graph import LayerGraph
from keeper.onnx_safety import ModelInput
from keeper.warm import DEFAULT_NOISE, WarmResult, cold_result, warm_from_parent

__all__ = ["warm_from_store", "read_parent", "store_for"]

_stores: dict[str, object] = {}
_stores_lock = threading.Lock()


def store_for(uri: str, fresh: bool = False):
    """One ModelStore per URI and process (opening one reads its catalog)."""
    from keeper.store import ModelStore

    with _stores_lock:
        if fresh or uri not in _stores:
            _stores[uri] = ModelStore(uri)
        return _stores[uri]


def read_parent(uri: str, parent: str) -> tuple[bytes, LayerGraph]:
    """The zoo model ``parent`` stored at ``uri``: its ONNX bytes and its stored graph.

    Raises:
        ModelNotFoundError: ``parent`` is not in the store (removed or evicted since it was chosen).
    """
    from keeper.zoo import GRAPH_EXTRA, graph_from_blob

    store = store_for(uri)
    try:
        blob, graph_blob = store.get(parent), store.get_extra(parent, GRAPH_EXTRA)
    except ModelNotFoundError:
        # registered after this process opened the catalog: read it again once
        store = store_for(uri, fresh=True)
        blob, graph_blob = store.get(parent), store.get_extra(parent, GRAPH_EXTRA)
    return blob, graph_from_blob(graph_blob, lambda: blob)


def warm_from_store(uri: str, parent: str | None, child: ModelInput, noise: float = DEFAULT_NOISE,
                    seed: int = 0, child_graph: LayerGraph | dict[str, np.ndarray] | None = None) -> WarmResult:
    """Warm ``child`` from the zoo model ``parent`` stored at ``uri`` (the child's own weights when None).

    ``child_graph``: the child's LayerGraph (or its ``to_arrays()``) when the caller has already extracted it,
    so it is not extracted twice.

    Raises:
        ModelNotFoundError: ``parent`` is not in the store (removed or evicted since it was chosen).
    """
    if isinstance(child_graph, dict):
        child_graph = LayerGraph.from_arrays(child_graph)
    if parent is None:
        return cold_result(child, child_graph)
    blob, graph = read_parent(uri, parent)
    return warm_from_parent(blob, child, parent_name=parent, parent_graph=graph, child_graph=child_graph,
                            noise=noise, seed=seed)
