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
    >>> result = warm_from_store(choice["uri"], choice["parent"], child_bytes, noise=0)  # doctest: +SKIP
"""

from __future__ import annotations

import threading
from typing import Any

from keeper.errors import ModelNotFoundError
from keeper.onnx_safety import ModelInput
from keeper.warm import DEFAULT_NOISE, WarmResult, cold_result, warm_from_parent
from keeper.weights import WeightsInput

__all__ = ["warm_from_store"]

_stores: dict[str, object] = {}
_stores_lock = threading.Lock()


def _store(uri: str, fresh: bool = False):
    """One ModelStore per URI and process (opening one reads its catalog)."""
    from keeper.store import ModelStore

    with _stores_lock:
        if fresh or uri not in _stores:
            _stores[uri] = ModelStore(uri)
        return _stores[uri]


def warm_from_store(uri: str, parent: str | None, child: ModelInput, noise: float = DEFAULT_NOISE,
                    seed: int = 0, *, child_weights: WeightsInput | None = None, **options: Any) -> WarmResult:
    """Warm ``child`` from the zoo model ``parent`` stored at ``uri`` (the child's own weights when None).

    ``child_weights``: the child's initial weights when ``child`` is its graph alone (see
    :func:`keeper.warm.warm_from_parent`). ``options`` go to :func:`keeper.warm.warm_from_parent`.

    Raises:
        ModelNotFoundError: ``parent`` is not in the store (removed or evicted since it was chosen).
    """
    if parent is None:
        return cold_result(child, child_weights)
    from keeper.zoo import GRAPH_EXTRA, graph_from_blob, stored_weights

    store = _store(uri)
    try:
        blob, graph_blob = store.get(parent), store.get_extra(parent, GRAPH_EXTRA)
    except ModelNotFoundError:
        # registered after this process opened the catalog: read it again once
        store = _store(uri, fresh=True)
        blob, graph_blob = store.get(parent), store.get_extra(parent, GRAPH_EXTRA)
    return warm_from_parent(blob, child, parent_weights=stored_weights(store, parent), child_weights=child_weights,
                            parent_name=parent, parent_graph=graph_from_blob(graph_blob, lambda: blob),
                            noise=noise, seed=seed, **options)
