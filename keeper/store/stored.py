"""A zoo model as the store holds it, and the warm that reads its parent straight from the store.

Layout of one model in a :class:`~keeper.store.ModelStore`: the model blob (ONNX: with its weights inside, or the
graph whose initializers hold no data), the ``graph.npz`` extra (its LayerGraph as plain arrays, never pickled),
and for a graph without data the ``weights.safetensors`` extra holding exactly its data-less initializers.

:func:`warm_from_store` runs a weight transfer wherever the caller wants it (a Ray task of the service, a Tune
trial, a shell) and memory-maps the parent's weights there (a local file for a local store, a verified copy
streamed from an object store), so a parent's weights never pass through an actor.

Invariant: ``warm_from_store(uri, p, child)`` equals ``Zoo(uri).transfer(p, child)``: both read the same stored
graph and weights; neither counts a parent hit (the chooser does, through its parent source).
"""

from __future__ import annotations

import dataclasses
import io
import threading
from typing import Any, Callable, Mapping

import numpy as np

from keeper.errors import ModelNotFoundError
from keeper.graph import LayerGraph, load_graph
from keeper.onnx_safety import ModelInput
from keeper.store.model_store import ModelStore
from keeper.warm import DEFAULT_NOISE, WarmResult, cold_result, warm_from_parent
from keeper.weights import SafeTensors, WeightsInput

__all__ = ["GRAPH_EXTRA", "WEIGHTS_EXTRA", "graph_blob", "graph_format", "graph_from_blob", "stored_weights",
           "store_for", "read_parent", "read_parent_graph", "warm_from_store"]

#: The extra holding a model's LayerGraph (``LayerGraph.to_arrays()`` as ``.npz``).
GRAPH_EXTRA = "graph.npz"
#: The extra holding a model's weights when they are kept apart from its graph.
WEIGHTS_EXTRA = "weights.safetensors"

_stores: dict[str, ModelStore] = {}
_stores_lock = threading.Lock()
# numpy parses each .npz member's header with ast.literal_eval, and CPython 3.11 keeps the AST constructor's
# recursion count per interpreter, not per thread: two parses at once in the service's threaded actors can fail
# with "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905); graph blobs are read one
# at a time per process (a few milliseconds each)
_npz_lock = threading.Lock()


def graph_blob(graph: LayerGraph) -> bytes:
    """A LayerGraph as ``.npz`` bytes (no pickle)."""
    buf = io.BytesIO()
    np.savez(buf, **graph.to_arrays())
    return buf.getvalue()


def graph_format(blob: bytes) -> int:
    """The ``LayerGraph.FORMAT`` a graph blob was written with (1 for blobs that predate the field)."""
    with _npz_lock, np.load(io.BytesIO(blob), allow_pickle=False) as z:
        return int(z["format"]) if "format" in z.files else 1


def graph_from_blob(blob: bytes, model: Callable[[], ModelInput] | None = None) -> LayerGraph:
    """The LayerGraph stored by :func:`graph_blob`; re-extracted from ``model()`` (the ONNX it was made from)
    when the blob predates ``LayerGraph.FORMAT``, since an older graph lacks what matching and the transforms
    now read."""
    if model is not None and graph_format(blob) < LayerGraph.FORMAT:
        return load_graph(model())
    with _npz_lock, np.load(io.BytesIO(blob), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return LayerGraph.from_arrays(arrays)


def stored_weights(store: ModelStore, name: str) -> SafeTensors | None:
    """The weights of ``name`` memory-mapped from the store (None when they are inside its ONNX blob)."""
    if WEIGHTS_EXTRA not in store.record(name).extra_checksums:
        return None
    return SafeTensors(store.extra_path(name, WEIGHTS_EXTRA), f"model {name!r}: stored weights")


def store_for(uri: str, fresh: bool = False) -> ModelStore:
    """One ModelStore per URI and process (opening one reads its catalog)."""
    with _stores_lock:
        if fresh or uri not in _stores:
            _stores[uri] = ModelStore(uri)
        return _stores[uri]


def _read_stored(uri: str, read: Callable[[ModelStore], Any]) -> tuple[ModelStore, Any]:
    """``(store, read(store))`` for the zoo at ``uri``; a model missing from the catalog this process opened is
    looked up once more in a fresh one (it may have been registered since)."""
    store = store_for(uri)
    try:
        return store, read(store)
    except ModelNotFoundError:
        store = store_for(uri, fresh=True)
        return store, read(store)


def read_parent(uri: str, parent: str) -> tuple[bytes, LayerGraph, SafeTensors | None]:
    """The zoo model ``parent`` stored at ``uri``: its ONNX bytes, its stored graph, and its weights memory-mapped
    from the store (None when they are inside the ONNX bytes).

    Raises:
        ModelNotFoundError: ``parent`` is not in the store (removed or evicted since it was chosen).
    """
    store, (blob, gblob) = _read_stored(uri, lambda s: (s.get(parent), s.get_extra(parent, GRAPH_EXTRA)))
    return blob, graph_from_blob(gblob, lambda: blob), stored_weights(store, parent)


def read_parent_graph(uri: str, parent: str) -> tuple[LayerGraph, Any]:
    """The stored graph and catalog record of the zoo model ``parent`` at ``uri`` (its weights are not read).

    Raises:
        ModelNotFoundError: ``parent`` is not in the store.
    """
    store, (rec, gblob) = _read_stored(uri, lambda s: (s.record(parent), s.get_extra(parent, GRAPH_EXTRA)))
    return graph_from_blob(gblob, lambda: store.get(parent)), rec


def warm_from_store(uri: str, parent: str | None, child: ModelInput, noise: float = DEFAULT_NOISE,
                    seed: int = 0, child_graph: LayerGraph | dict[str, np.ndarray] | None = None, *,
                    child_weights: WeightsInput | None = None, out: Any = None,
                    report: Mapping[str, Any] | None = None, restart_shrink: float = 1.0) -> WarmResult:
    """Warm ``child`` from the zoo model ``parent`` stored at ``uri`` (the child's own weights when None).

    Args:
        child_graph: the child's LayerGraph (or its ``to_arrays()``, as a Ray task receives it) when the caller
            has extracted it, so it is not extracted twice.
        child_weights: the child's initial weights when ``child`` is its graph alone (see
            :func:`keeper.warm.warm_from_parent`).
        out: stream the warmed weights into this safetensors file.
        report: the choice's report (``candidates``, ``reason``, ``probe``) the result carries.
        restart_shrink: see :func:`keeper.warm.warm_from_parent`.

    Raises:
        ModelNotFoundError: ``parent`` is not in the store (removed or evicted since it was chosen).
    """
    if isinstance(child_graph, dict):
        child_graph = LayerGraph.from_arrays(child_graph)
    if parent is None:
        result = cold_result(child, child_weights, out=out, graph=child_graph)
    else:
        blob, graph, weights = read_parent(uri, parent)
        result = warm_from_parent(blob, child, parent_weights=weights, child_weights=child_weights,
                                  parent_name=parent, parent_graph=graph, child_graph=child_graph, out=out,
                                  noise=noise, seed=seed, restart_shrink=restart_shrink)
    return dataclasses.replace(result, **report) if report else result
