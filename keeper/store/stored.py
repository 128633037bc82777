"""A zoo model as the store holds it, read back wherever the caller runs.

Layout of one model in a :class:`~keeper.store.ModelStore`: the model blob (ONNX: with its weights inside, or the
graph whose initializers hold no data), the ``graph.npz`` extra (its LayerGraph as plain arrays, never pickled),
and for a graph without data the ``weights.safetensors`` extra holding exactly its data-less initializers.
:func:`read_parent` memory-maps a parent's weights where it is called (a local file for a local store, a verified
copy streamed from an object store), so a parent's weights never pass through an actor
(:func:`keeper.warm.inherit_stored` warms from them there).

Invariant: a graph is read as it was stored (``LayerGraph.from_arrays``), or extracted again from its model when it
predates ``LayerGraph.FORMAT``; nothing is unpickled.
"""

from __future__ import annotations

import io
import threading
from typing import Any, Callable, NamedTuple

import numpy as np

from keeper.choice.inheritance import Training
from keeper.errors import ModelNotFoundError
from keeper.graph import LayerGraph, load_graph
from keeper.onnx_safety import ModelInput
from keeper.store.model_store import ModelStore
from keeper.weights import SafeTensors

__all__ = ["GRAPH_EXTRA", "WEIGHTS_EXTRA", "graph_blob", "graph_format", "graph_from_blob", "stored_weights",
           "store_for", "StoredParent", "read_parent", "read_parent_graph", "read_training"]

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


class StoredParent(NamedTuple):
    """A zoo model read back to warm from: its ONNX bytes, its stored graph, and its weights memory-mapped from
    the store (None when they are inside the ONNX bytes)."""

    blob: bytes
    graph: LayerGraph
    weights: SafeTensors | None


def read_parent(uri: str, parent: str) -> StoredParent:
    """The zoo model ``parent`` stored at ``uri`` (see :class:`StoredParent`).

    Raises:
        ModelNotFoundError: ``parent`` is not in the store (removed or evicted since it was chosen).
    """
    store, (blob, gblob) = _read_stored(uri, lambda s: (s.get(parent), s.get_extra(parent, GRAPH_EXTRA)))
    return StoredParent(blob, graph_from_blob(gblob, lambda: blob), stored_weights(store, parent))


def read_training(uri: str, name: str) -> Training | None:
    """How the zoo model ``name`` at ``uri`` was trained, from its catalog record (None: registered without a
    learning curve; see :mod:`keeper.choice.inheritance`).

    Raises:
        ModelNotFoundError: ``name`` is not in the store.
    """
    _, rec = _read_stored(uri, lambda s: s.record(name))
    return Training.from_dict(rec.summary.get("lineage", {}).get("training"))


def read_parent_graph(uri: str, parent: str) -> tuple[LayerGraph, Any]:
    """The stored graph and catalog record of the zoo model ``parent`` at ``uri`` (its weights are not read).

    Raises:
        ModelNotFoundError: ``parent`` is not in the store.
    """
    store, (rec, gblob) = _read_stored(uri, lambda s: (s.record(parent), s.get_extra(parent, GRAPH_EXTRA)))
    return graph_from_blob(gblob, lambda: store.get(parent)), rec
