"""The durable zoo store: what a model is on disk, and the catalog and files that keep it.

:mod:`~keeper.store.files` is the file layer on any ``pyarrow.fs`` (retried calls, atomic writes, verified local
copies), :mod:`~keeper.store.records` a catalog entry and the checks of what goes into one,
:mod:`~keeper.store.model_store` the :class:`ModelStore` (content-addressed blobs plus a catalog written last), and
:mod:`~keeper.store.stored` a zoo model as the store holds it (its graph and weights extras, read back anywhere).

Invariant: the on-disk layout is the one :mod:`~keeper.store.model_store` documents; every module here reads and
writes it, none changes it.
"""

from keeper.store.files import sha256
from keeper.store.model_store import DEFAULT_ZOO_DIR, ModelRecord, ModelStore, check_name, zoo_is_empty
from keeper.store.stored import (GRAPH_EXTRA, WEIGHTS_EXTRA, StoredParent, graph_blob, graph_format, graph_from_blob,
                                 read_parent, read_parent_graph, read_training, store_for, stored_weights)

__all__ = ["ModelStore", "ModelRecord", "DEFAULT_ZOO_DIR", "check_name", "sha256", "GRAPH_EXTRA", "WEIGHTS_EXTRA",
           "graph_blob", "graph_format", "graph_from_blob", "stored_weights", "store_for", "StoredParent",
           "read_parent", "read_parent_graph", "read_training", "zoo_is_empty"]
