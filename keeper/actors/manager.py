"""ZooManager: the single writer of the zoo. It owns the embedded :class:`~keeper.zoo.Zoo` (a local path or an
object-store URI), admission, eviction and the two-stage search index, and publishes what queries read as
immutable Shards and Views.

Invariants:
    * every change to the zoo goes through this class, under one lock; reads (``view``, ``shard``) never wait
      long for a write: while a write holds the lock they answer with the last published view;
    * ``register`` is idempotent (the Zoo returns the stored record for identical bytes under their name and
      accuracy), so a call that Ray retries after a restart never stores twice;
    * a new instance over the same URI (a restart) serves every stored model: the Zoo reloads the catalog and
      graphs from the store, and the index is fitted again in the background (queries search the zoo whole
      meanwhile);
    * the index is re-fitted in a background thread, never on a caller's path, once the additions and removals
      since the last fit exceed ``clustering.recluster_stale`` x N; models that arrive meanwhile join their
      nearest medoid at once;
    * models other processes register into (or remove from) the store are served within
      :data:`CATALOG_POLL_S` seconds: a background thread lists the catalog that often and takes in what changed
      (:meth:`ZooManager.sync`); :meth:`ZooManager.reload` (``keeper reload``) re-reads everything at once,
      accuracies updated elsewhere included.

Plain class: the launcher makes it a Ray actor; unit tests use it directly.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Any

import numpy as np

from keeper.actors.config import ServiceConfig
from keeper.actors.indexing import fit_index, symmetric_distance
from keeper.actors.snapshot import Shard, View
from keeper.errors import KeeperError, ModelNotFoundError, ServiceError, StoreError
from keeper.matching import SIGNATURE_SIZE, MatchArrays, match_arrays
from keeper.onnx_safety import ModelInput
from keeper.zoo import Zoo

__all__ = ["ZooManager"]

log = logging.getLogger(__name__)

#: Compaction: at most this many shards, and at most this share of their rows dead, before re-packing.
_MAX_SHARDS = 16
_MAX_DEAD_SHARE = 0.25
#: Models per shard when re-packing.
_SHARD_MODELS = 4096
#: Seconds between two listings of the catalog for models other processes registered or removed: the bound on
#: how stale the service's view of its store gets (one LIST request per period on an object store).
CATALOG_POLL_S = 5.0


class ZooManager:
    """Owns the zoo; see the module docstring.

    Example:
        >>> mgr = ZooManager(load_config(zoo="/tmp/zoo"))          # doctest: +SKIP
        >>> mgr.register(onnx_bytes, 0.91, "resnet-a")["name"]     # doctest: +SKIP
        'resnet-a'
    """

    def __init__(self, config: ServiceConfig | None = None, zoo: Any = None, poll_s: float | None = CATALOG_POLL_S):
        self.config = config or ServiceConfig()
        self._lock = threading.RLock()
        self.zoo = zoo if zoo is not None else Zoo(self.config.zoo_uri, self.config.zoo_config())
        self._token = uuid.uuid4().hex[:8]
        self._seq = 0
        self._arrays: dict[str, MatchArrays] = {}
        self._accuracy: dict[str, float] = {}
        self._clean: dict[str, bool] = {}  # lineage without a warm across block structures (see Zoo.register)
        self._loc: dict[str, tuple[str, int]] = {}   # name -> (shard id, row)
        self._shards: dict[str, Shard] = {}
        self._retired: dict[str, Shard] = {}         # the generation before the last compaction
        self._pending: list[str] = []                # added, not yet in a shard
        self._index = None
        self._changes = 0                            # adds + removes since the index snapshot was taken
        self._fitting: threading.Thread | None = None
        self._fits = 0
        self._fit_error: str | None = None
        self._view: View = View.empty(f"{self._token}-0", self.zoo.uri)
        self._dirty = True
        self._load_all()
        if poll_s:
            threading.Thread(target=self._poll, args=(poll_s,), daemon=True, name="keeper-catalog-poll").start()

    # -- loading and bookkeeping (callers hold the lock)
    def _load_all(self) -> None:
        with self._lock:
            self._arrays.clear(), self._accuracy.clear(), self._loc.clear(), self._shards.clear()
            self._clean.clear()
            self._pending = []
            self._index = None
            for rec in self.zoo:
                self._arrays[rec.name] = match_arrays(self.zoo.graph(rec.name))
                self._accuracy[rec.name] = float(rec.accuracy)
                self._clean[rec.name] = _clean(rec)
                self._pending.append(rec.name)
            self._dirty = True
            self._publish()
            self._maybe_refit(force=True)

    def _added(self, name: str, arrays: MatchArrays, accuracy: float, clean: bool = True) -> None:
        self._arrays[name] = arrays
        self._accuracy[name] = accuracy
        self._clean[name] = clean
        self._pending.append(name)
        self._changes += 1
        if self._index is not None:
            medoids = list(self._index.medoid_names)
            d = symmetric_distance([arrays], [self._arrays[m] for m in medoids])[0]
            self._index.add(name, d)
        self._dirty = True

    def _removed(self, name: str) -> None:
        self._arrays.pop(name, None)
        self._accuracy.pop(name, None)
        self._clean.pop(name, None)
        self._loc.pop(name, None)
        if name in self._pending:
            self._pending.remove(name)
        self._changes += 1
        if self._index is not None and name in self._index:
            self._index.remove(name)
            if not len(self._index.medoid_names):
                self._index = None
        self._dirty = True

    def _sync(self, before: set[str]) -> None:
        """Bring the caches in line with the zoo after a write (registrations can evict other models)."""
        after = set(self.zoo.names())
        for name in sorted(before - after):
            self._removed(name)
        for name in sorted(after - before):
            rec = self.zoo.record(name)
            self._added(name, match_arrays(self.zoo.graph(name)), float(rec.accuracy), _clean(rec))

    def _live(self) -> list[str]:
        return sorted(self._arrays)

    # -- writes
    def register(self, model: ModelInput, accuracy: float, name: str | None = None,
                 weights: bytes | None = None, lineage: dict[str, Any] | None = None) -> dict[str, Any]:
        """Admit a trained model; returns its catalog record as a dict (the stored one for identical content).
        ``weights``: safetensors bytes when ``model`` is its graph without weights (any size); ``lineage``: as
        for :meth:`keeper.zoo.Zoo.register`.

        Raises:
            AdmissionError, InvalidModelError: refused; nothing was stored.
            StoreError: the store failed; what was stored before is intact.
        """
        with self._lock:
            before = set(self.zoo.names())
            rec = self.zoo.register(model, accuracy, name, weights=weights, lineage=lineage)
            self._sync(before)
        self._maybe_refit()
        return rec.to_json()

    def remove(self, name: str) -> None:
        """Delete a model."""
        with self._lock:
            before = set(self.zoo.names())
            self.zoo.remove(name)
            self._sync(before)
        self._maybe_refit()

    def hit(self, name: str) -> None:
        """Count one use of ``name`` as a parent; a model removed meanwhile is ignored."""
        with self._lock:
            try:
                self.zoo.hit(name)
            except ModelNotFoundError:
                pass
            except StoreError as exc:  # a hit only ages a model slower; never worth failing over
                log.warning("zoo manager: could not count a hit of %r (%s)", name, exc)

    def reload(self) -> int:
        """Re-read the whole zoo from the store; returns the model count."""
        with self._lock:
            self.zoo.reload()
            self._load_all()
            return len(self._arrays)

    def sync(self) -> dict[str, list[str]]:
        """Take in the models other processes registered into or removed from the store since the last look;
        returns ``{"added": [...], "removed": [...]}``. One catalog listing when nothing changed."""
        if self.zoo.store.listed() == set(self.zoo.names()):
            return {"added": [], "removed": []}
        with self._lock:
            before = set(self.zoo.names())
            added, removed = self.zoo.refresh()
            self._sync(before)
        if added or removed:
            log.info("zoo manager: took in %d model(s) and dropped %d that other processes changed in %s",
                     len(added), len(removed), self.zoo.uri)
            self._maybe_refit()
        return {"added": added, "removed": removed}

    def _poll(self, period_s: float) -> None:
        """The catalog poll (a daemon thread): the service's view is at most ``period_s`` behind its store."""
        while True:
            time.sleep(period_s)
            try:
                self.sync()
            except (KeeperError, OSError, ValueError) as exc:  # a store down now may answer later: poll on
                log.warning("zoo manager: could not look for models other processes changed in %s (%s)",
                            self.zoo.uri, exc)

    # -- index maintenance
    def _maybe_refit(self, force: bool = False) -> None:
        c = self.config.clustering
        with self._lock:
            n = len(self._arrays)
            if self._fitting is not None and self._fitting.is_alive():
                return
            if n < max(c.brute_force_below, 2):
                self._index = None
                self._dirty = True
                return
            due = force or self._index is None or self._changes > c.recluster_stale * n
            if not due:
                return
            names = self._live()
            arrays = {k: self._arrays[k] for k in names}
            self._changes = 0
            self._fitting = threading.Thread(target=self._refit, args=(names, arrays), daemon=True,
                                             name="keeper-recluster")
            self._fitting.start()

    def _refit(self, names: list[str], arrays: dict[str, MatchArrays]) -> None:
        c = self.config.clustering
        try:
            index = fit_index(names, arrays, k=c.k, fit_sample=c.fit_sample, seed=c.seed + self._fits)
        except Exception as exc:  # the old index (or a whole-zoo search) keeps serving; stats() shows why
            self._fit_error = f"{type(exc).__name__}: {exc}"
            return
        with self._lock:
            live = set(self._arrays)
            fitted = set(names)
            for name in sorted(fitted - live):
                if name in index:
                    index.remove(name)
            medoids = list(index.medoid_names)
            late = sorted(live - fitted)
            if late and medoids:
                d = symmetric_distance([self._arrays[n] for n in late], [self._arrays[m] for m in medoids])
                for name, row in zip(late, d):
                    index.add(name, row)
            self._index = index if len(index.medoid_names) else None
            self._fits += 1
            self._fit_error = None
            self._dirty = True
        self._maybe_refit()

    def wait_index(self, timeout_s: float = 60.0) -> bool:
        """Wait (bounded) for a background fit to finish; True when none is running."""
        t = self._fitting
        if t is not None:
            t.join(timeout=timeout_s)
            return not t.is_alive()
        return True

    # -- reads
    def _publish(self) -> None:
        """Pack pending models into a new shard, compact when needed, and build the view (lock held)."""
        if self._pending:
            sid = self._new_sid()
            self._shards[sid] = Shard.build(sid, [self._arrays[n] for n in self._pending])
            for row, n in enumerate(self._pending):
                self._loc[n] = (sid, row)
            self._pending = []
        rows = sum(s.n for s in self._shards.values())
        if len(self._shards) > _MAX_SHARDS or (rows and 1 - len(self._loc) / rows > _MAX_DEAD_SHARE):
            self._compact()
        names = self._live()
        shard_ids = tuple(sorted({self._loc[n][0] for n in names}))
        pos = {sid: i for i, sid in enumerate(shard_ids)}
        self._seq += 1
        self._view = View(
            key=f"{self._token}-{self._seq}",
            names=np.array(names, dtype=str),
            accuracy=np.array([self._accuracy[n] for n in names], dtype=np.float64),
            weighted=np.ones(len(names), dtype=bool),  # every model the manager holds has stored weights
            clean=np.array([self._clean.get(n, True) for n in names], dtype=bool),
            params=np.array([self._arrays[n].total for n in names], dtype=np.int64),
            shard=np.array([pos[self._loc[n][0]] for n in names], dtype=np.int32),
            row=np.array([self._loc[n][1] for n in names], dtype=np.int64),
            sigs=(np.stack([self._shards[self._loc[n][0]].sigs[self._loc[n][1]] for n in names]) if names
                  else np.zeros((0, SIGNATURE_SIZE), np.int64)),
            shards=shard_ids,
            index=self._index.to_arrays() if self._index is not None else {},
            uri=self.zoo.uri)
        self._dirty = False

    def _new_sid(self) -> str:
        self._seq += 1
        return f"{self._token}-s{self._seq}"

    def _compact(self) -> None:
        names = self._live()
        self._retired = dict(self._shards)
        self._shards = {}
        for start in range(0, len(names), _SHARD_MODELS):
            chunk = names[start:start + _SHARD_MODELS]
            sid = self._new_sid()
            self._shards[sid] = Shard.build(sid, [self._arrays[n] for n in chunk])
            for row, n in enumerate(chunk):
                self._loc[n] = (sid, row)

    def view(self, known: str | None = None) -> View | None:
        """The current View, or None when it is still ``known``. Never waits long for a write in progress."""
        if self._lock.acquire(timeout=0.05):
            try:
                if self._dirty:
                    self._publish()
            finally:
                self._lock.release()
        v = self._view
        return None if known == v.key else v

    def shard(self, sid: str) -> Shard:
        """One shard by id (the front door keeps the returned object's reference and hands it to matchers)."""
        s = self._shards.get(sid) or self._retired.get(sid)
        if s is None:
            raise ServiceError(f"zoo manager: shard {sid!r} is gone (compacted or from before a restart); "
                               "refresh the view")
        return s

    def records(self) -> list[dict[str, Any]]:
        """Catalog records of the stored models."""
        return [r.to_json() for r in self.zoo]

    def stats(self) -> dict[str, Any]:
        index = self._index
        return {
            "models": len(self._arrays),
            "clusters": len(index.medoid_names) if index is not None else 0,
            "shards": len(self._shards),
            "fitting": bool(self._fitting is not None and self._fitting.is_alive()),
            "fits": self._fits,
            "fit_error": self._fit_error,
            "changes_since_fit": self._changes,
            "view": self._view.key,
            "uri": self.zoo.uri,
            "pid": os.getpid(),
        }

    def pid(self) -> int:
        return os.getpid()

    def ping(self) -> str:
        return "ok"


def _clean(rec: Any) -> bool:
    """Whether a catalog record's lineage is clean (no warm across block structures on the way to it)."""
    return bool(rec.summary.get("lineage", {}).get("clean", True))
