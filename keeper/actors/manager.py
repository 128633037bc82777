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
    * a model that arrives joins its nearest medoid at once (k alignments each way, no re-fit) and is in the
      next view; the index is re-fitted in a background thread, never on a caller's path, once the clusters
      drift: the additions and removals since the last fit exceed ``clustering.recluster_stale`` x N, or at
      least ``max(32, N / 100)`` arrivals sit on average ``clustering.recluster_drift`` times farther from
      their medoid than the fitted members did. A stale index never makes a search inexact (the score bounds
      find any model the clusters miss), it only makes searches score more models;
    * models other processes register into (or remove from) the store are served within
      :data:`CATALOG_POLL_S` seconds: a background thread lists the catalog that often and takes in what changed
      (:meth:`ZooManager.sync`); :meth:`ZooManager.reload` (``keeper reload``) re-reads everything at once,
      accuracies updated elsewhere included;
    * every write carries its caller's client (:meth:`keeper.teams.Client.to_wire`: team, user, the secret as the
      client presents it, read-only, host, pid) and is checked here, by the zoo's team rules, before anything is
      read or stored; a refusal raises the rule's :class:`~keeper.errors.AccessError` and changes nothing. Secrets
      are compared with the team table's hashes and never kept, logged or put in a message;
    * ``remove`` and eviction hold a model (:mod:`keeper.store.holding`) and ``restore`` brings it back: each step
      is ordered so that a kill of this actor at any point leaves the model live or held, and a call Ray retries
      on the restarted actor finishes what the killed one began.

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
from keeper.actors.snapshot import Entry, Shard, View, ViewTable
from keeper.errors import KeeperError, ModelNotFoundError, ServiceError, StoreError
from keeper.matching import MatchArrays, match_arrays
from keeper.onnx_safety import ModelInput
from keeper.teams import Client
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
        self._changed = threading.Condition()  # notified whenever the zoo changes (see _dirty)
        # the service's own writes (a graph extracted again) are nobody's; every request names its client
        self.zoo = zoo if zoo is not None else Zoo(self.config.zoo_uri, self.config.zoo_config(), client=Client())
        self._token = uuid.uuid4().hex[:8]
        self._seq = 0
        self._arrays: dict[str, MatchArrays] = {}
        self._accuracy: dict[str, float] = {}
        self._clean: dict[str, bool] = {}  # lineage without a warm across block structures (see Zoo.register)
        self._private: dict[str, str] = {}  # private model -> its team
        self._loc: dict[str, tuple[str, int]] = {}   # name -> (shard id, row)
        self._ident: dict[str, int] = {}             # name -> its registration number (View.ident)
        self._idents = 0
        self._shards: dict[str, Shard] = {}
        self._retired: dict[str, Shard] = {}         # the generation before the last compaction
        self._pending: list[str] = []                # added, not yet in a shard
        self._table: ViewTable | None = None         # the last published columns (None: build them whole)
        self._t_added: set[str] = set()              # added since the table, removed since the table
        self._t_removed: set[str] = set()
        self._relabel = True                         # the index changed beyond the additions: read every label
        self._serial: dict[str, int] = {}            # shard id -> serial number, and back
        self._sid_of: dict[int, str] = {}
        self._index = None
        self._changes = 0                            # adds + removes since the index snapshot was taken
        self._drift = [0.0, 0]                       # arrivals' summed distance to their medoid, and their count
        self._fitting: threading.Thread | None = None
        self._fits = 0
        self._fit_s: tuple[float, int] | None = None   # the last fit: seconds, models
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
            self._clean.clear(), self._private.clear()
            self._pending = []
            self._index = None
            self._table, self._relabel = None, True
            self._t_added, self._t_removed = set(), set()
            for rec in self.zoo:
                self._arrays[rec.name] = match_arrays(self.zoo.graph(rec.name))
                self._accuracy[rec.name] = float(rec.accuracy)
                self._clean[rec.name] = _clean(rec)
                if rec.private:
                    self._private[rec.name] = rec.owner
                self._pending.append(rec.name)
                self._number(rec.name)
            self._dirty = True
            self._publish()
            self._maybe_refit(force=True)

    def _added(self, name: str, arrays: MatchArrays, accuracy: float, clean: bool = True) -> None:
        self._arrays[name] = arrays
        self._number(name)
        self._accuracy[name] = accuracy
        self._clean[name] = clean
        self._pending.append(name)
        self._changes += 1
        self._t_added.add(name)
        if self._index is not None:
            medoids = list(self._index.medoid_names)
            d = symmetric_distance([arrays], [self._arrays[m] for m in medoids])[0]
            self._index.add(name, d)
            self._drift[0] += float(np.min(d))
            self._drift[1] += 1
        self._dirty = True

    def _number(self, name: str) -> None:
        """Give ``name`` a new registration number (View.ident): the caches keyed on it then hold for it alone."""
        self._idents += 1
        self._ident[name] = self._idents

    def _removed(self, name: str) -> None:
        self._arrays.pop(name, None)
        self._accuracy.pop(name, None)
        self._clean.pop(name, None)
        self._private.pop(name, None)
        self._loc.pop(name, None)
        self._ident.pop(name, None)
        if name in self._pending:
            self._pending.remove(name)
        if name in self._t_added:
            self._t_added.discard(name)
        else:
            self._t_removed.add(name)
        self._changes += 1
        if self._index is not None and name in self._index:
            self._index.remove(name)  # may renumber clusters
            self._relabel = True
            if not len(self._index.medoid_names):
                self._index = None
        self._dirty = True

    def _restated(self, name: str, accuracy: float) -> None:
        """A live model's accuracy changed (same graph, same place): its view entry is written again."""
        self._accuracy[name] = accuracy
        if name not in self._t_added:  # not yet in the table: it enters with the new accuracy anyway
            self._t_removed.add(name)
            self._t_added.add(name)
        self._dirty = True

    def _sync(self, before: set[str]) -> None:
        """Bring the caches in line with the zoo after a write (registrations can evict other models)."""
        after = set(self.zoo.names())
        for name in sorted(before - after):
            self._removed(name)
        for name in sorted(after - before):
            rec = self.zoo.record(name)
            if rec.private:
                self._private[name] = rec.owner
            self._added(name, match_arrays(self.zoo.graph(name)), float(rec.accuracy), _clean(rec))

    def _live(self) -> list[str]:
        return sorted(self._arrays)

    # -- writes
    def register(self, model: ModelInput, accuracy: float, name: str | None = None,
                 weights: bytes | None = None, lineage: dict[str, Any] | None = None,
                 record_again: bool = False, client: dict[str, Any] | None = None, team: str | None = None,
                 private: bool = False) -> dict[str, Any]:
        """Admit a trained model; returns its catalog record as a dict (the stored one for identical content).
        ``weights``: safetensors bytes when ``model`` is its graph without weights (any size); ``lineage``,
        ``record_again``, ``team`` and ``private``: as for :meth:`keeper.zoo.Zoo.register` (a stored model's new
        accuracy is in the next view); ``client``: who asks (:meth:`keeper.teams.Client.to_wire`; None: the
        default team without a secret).

        Raises:
            AdmissionError, InvalidModelError: refused; nothing was stored.
            AccessError: refused by the team rules; nothing was stored.
            StoreError: the store failed; what was stored before is intact.
        """
        with self._lock:
            before = set(self.zoo.names())
            rec = self.zoo.register(model, accuracy, name, weights=weights, lineage=lineage,
                                    record_again=record_again, team=team, private=private,
                                    client=Client.from_wire(client))
            self._sync(before)
            if rec.name in before and self._accuracy.get(rec.name) != float(rec.accuracy):
                self._restated(rec.name, float(rec.accuracy))
        self._maybe_refit()
        return rec.to_json()

    def remove(self, name: str, client: dict[str, Any] | None = None) -> dict[str, Any]:
        """Move a model to the holding area (its team's or an operator's right); returns the hold's summary."""
        with self._lock:
            before = set(self.zoo.names())
            held = self.zoo.remove(name, client=Client.from_wire(client))
            self._sync(before)
        self._maybe_refit()
        return held.summary()

    def restore(self, name: str, hold_id: str | None = None, as_name: str | None = None,
                client: dict[str, Any] | None = None) -> dict[str, Any]:
        """Bring a held model back (:meth:`keeper.zoo.Zoo.restore`); returns its record as a dict. A call Ray
        retries after this actor was killed mid-restore finishes it (the model live with its record, or still
        held and restored now)."""
        with self._lock:
            before = set(self.zoo.names())
            rec = self.zoo.restore(name, hold_id, as_name=as_name, client=Client.from_wire(client))
            self._sync(before)
        self._maybe_refit()
        return rec.to_json()

    def update(self, name: str, accuracy: float | None = None, private: bool | None = None,
               client: dict[str, Any] | None = None) -> dict[str, Any]:
        """Change a model's accuracy or privacy (its team's or an operator's right); returns its record."""
        with self._lock:
            rec = self.zoo.update(name, accuracy=accuracy, private=private, client=Client.from_wire(client))
            if rec.private:
                self._private[name] = rec.owner
            else:
                self._private.pop(name, None)
            self._restated(name, float(rec.accuracy))
        return rec.to_json()

    def held(self, client: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The models in the holding area the client may see, oldest first."""
        return [h.summary() for h in self.zoo.held(client=Client.from_wire(client))]

    def log(self, model: str | None = None, since: float | None = None, last: int | None = None) -> list[dict]:
        """The audit log, oldest first, as dicts (:class:`keeper.store.audit.LogEntry`)."""
        return [e.to_json() for e in self.zoo.log(model=model, since=since, last=last)]

    def gc(self, min_age_s: float = 3600.0, client: dict[str, Any] | None = None) -> dict[str, Any]:
        """Delete expired holds and leftovers (:meth:`keeper.zoo.Zoo.gc`)."""
        with self._lock:
            count, gone = self.zoo.gc(min_age_s, client=Client.from_wire(client))
        return {"leftovers": count, "purged": [h.summary() for h in gone]}

    def hit(self, name: str, client: dict[str, Any] | None = None) -> None:
        """Count one use of ``name`` as a parent (by ``client``'s team); a model removed meanwhile is ignored."""
        with self._lock:
            try:
                self.zoo.hit(name, client)
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
                if self._index is not None:
                    self._index, self._relabel = None, True
                self._dirty = True
                return
            due = force or self._index is None or self._changes > c.recluster_stale * n or self._drifted(n)
            if not due:
                return
            names = self._live()
            arrays = {k: self._arrays[k] for k in names}
            self._changes = 0
            self._drift = [0.0, 0]
            self._fitting = threading.Thread(target=self._refit, args=(names, arrays), daemon=True,
                                             name="keeper-recluster")
            self._fitting.start()

    def _drifted(self, n: int) -> bool:
        """Enough arrivals since the fit sit, on average, ``recluster_drift`` times farther from their medoid than
        the fitted members did (a new family arriving, say): the clusters no longer describe the zoo."""
        total, count = self._drift
        cost = getattr(self._index, "fit_cost", None)
        if cost is None or count < max(32, n // 100):
            return False
        return total / count > self.config.clustering.recluster_drift * max(cost, 1e-3)

    def _refit(self, names: list[str], arrays: dict[str, MatchArrays]) -> None:
        c = self.config.clustering
        t0 = time.perf_counter()
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
            self._relabel = True
            self._fits += 1
            self._fit_s = (time.perf_counter() - t0, len(names))
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
        """Pack pending models into a new shard, compact when needed, and build the view (lock held). The
        columns change by the additions and removals since the last publish (:class:`ViewTable`), so a publish
        after an arrival costs numpy work over N, not a Python loop over every model."""
        if self._pending:
            self._add_shard(self._pending)
            self._pending = []
        moved = self._compact()
        index, t = self._index, self._table
        if t is None:
            t = ViewTable.build({n: self._entry(n) for n in self._arrays})
            self._relabel = True
        else:
            if self._t_added or self._t_removed:
                labels = {n: index.cluster_of(n) for n in self._t_added if n in index} if index is not None else {}
                t = t.changed({n: self._entry(n) for n in self._t_added}, sorted(self._t_removed), labels)
            if moved:
                t = t.moved(moved, np.array([self._serial[self._loc[n][0]] for n in moved], np.int64),
                            np.array([self._loc[n][1] for n in moved], np.int64))
        if self._relabel:
            t = t.relabel(index)
        self._table, self._relabel = t, False
        self._t_added, self._t_removed = set(), set()
        serials, shard = np.unique(t.serial, return_inverse=True)
        self._seq += 1
        self._view = View(
            key=f"{self._token}-{self._seq}", names=t.names, accuracy=t.accuracy, weighted=t.weighted,
            clean=t.clean, params=t.params, shard=shard.astype(np.int32), row=t.row, sigs=t.sigs,
            shards=tuple(self._sid_of[int(x)] for x in serials.tolist()),
            labels=t.labels if index is not None else None, medoids=t.medoid_positions(index), uri=self.zoo.uri,
            private=dict(self._private), ident=t.ident)
        self._dirty = False

    def _entry(self, name: str) -> Entry:
        sid, row = self._loc[name]
        return (self._accuracy[name], self._weighted(name), self._clean.get(name, True), self._arrays[name].total,
                self._serial[sid], row, self._shards[sid].sigs[row], self._ident[name])

    def _weighted(self, name: str) -> bool:
        """Whether ``name`` has stored weights (every model this class holds has; subclasses may hold others)."""
        return True

    def _add_shard(self, names: list[str]) -> None:
        self._seq += 1
        sid = f"{self._token}-s{self._seq}"
        self._serial[sid] = self._seq
        self._sid_of[self._seq] = sid
        self._shards[sid] = Shard.build(sid, [self._arrays[n] for n in names])
        for row, n in enumerate(names):
            self._loc[n] = (sid, row)

    def _compact(self) -> list[str]:
        """Re-pack when the shards are too many or too dead; returns the names that moved. Past a quarter of
        dead rows every live model is re-packed; past ``_MAX_SHARDS`` only the small shards (recent arrivals)
        are merged, so a steady stream of arrivals never re-packs the whole zoo."""
        rows = sum(s.n for s in self._shards.values())
        whole = bool(rows) and 1 - len(self._loc) / rows > _MAX_DEAD_SHARE
        if not whole and len(self._shards) <= _MAX_SHARDS:
            return []
        small = set(self._shards) if whole else {sid for sid, s in self._shards.items() if s.n < _SHARD_MODELS}
        if len(small) < 2 and not whole:
            return []
        names = sorted(n for n, (sid, _) in self._loc.items() if sid in small)
        self._retired = {sid: self._shards.pop(sid) for sid in small}
        for sid in small:
            self._sid_of.pop(self._serial.pop(sid), None)
        for start in range(0, len(names), _SHARD_MODELS):
            self._add_shard(names[start:start + _SHARD_MODELS])
        return names

    @property
    def _dirty(self) -> bool:
        """Whether the zoo changed since the last View; setting it notifies the views waiting for a change."""
        return self._dirty_flag

    @_dirty.setter
    def _dirty(self, value: bool) -> None:
        self._dirty_flag = bool(value)
        if value:
            with self._changed:
                self._changed.notify_all()

    def view(self, known: str | None = None, wait_s: float = 0.0) -> View | None:
        """The current View, or None when it is still ``known``: at once, or, with ``wait_s``, when the zoo changes
        within that many seconds (a long poll: the front door learns of a change as it happens, and asks nothing
        while the zoo is quiet). Never waits long for a write in progress."""
        if wait_s > 0 and known == self._view.key:
            with self._changed:
                if not self._dirty_flag:
                    self._changed.wait(min(float(wait_s), 60.0))
        # a long poll may wait for a write in progress to end (it is the refresher's thread, not a query's)
        if self._lock.acquire(timeout=0.05 if wait_s <= 0 else min(float(wait_s), 5.0)):
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
            "last_fit": ({"seconds": self._fit_s[0], "models": self._fit_s[1]} if self._fit_s else None),
            "fit_error": self._fit_error,
            "changes_since_fit": self._changes,
            "drift": (self._drift[0] / self._drift[1] / max(getattr(index, "fit_cost", None) or 1e-3, 1e-3)
                      if self._drift[1] and index is not None else None),
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
