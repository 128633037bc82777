"""The durable zoo store: model blobs plus a catalog, behind ``pyarrow.fs``.

One code path serves a laptop directory, HDFS and object stores (S3, GCS, Azure); the file layer (retried calls,
atomic writes, verified local copies) is :mod:`keeper.store.files`, and this module is the catalog on top of it.
Layout under the base path::

    blobs/<sha256>.onnx           a model blob, content-addressed
    blobs/<sha256>.<extra name>   an extra blob (e.g. ``graph.npz``, ``weights.safetensors``), addressed by its
                                  own content
    catalog/<name>.json           one record per model, written last: its presence is the commit
    held/<name>@<hold id>.json    a removed or evicted model, whole, until its retention ends
    held/<name>@<hold id>/        ... and its blobs (:mod:`keeper.store.holding`)
    log/<ns>-<host>-<pid>-<id>.json  one write-once entry per write to the zoo (:mod:`keeper.store.audit`)
    access/teams.json             the team table, secrets as salted hashes (:mod:`keeper.teams`); absent in a zoo
                                  without teams
    tmp/<host>-<pid>-<uuid>.<name> in-flight writes on filesystems that rename (local, HDFS); the writer's host
                                  and pid let a later writer remove a dead writer's leftovers

Invariants:
    * a model is listed only when its catalog entry is complete, and an entry is written only after every blob
      it names; a process killed at any point leaves each model complete or absent (orphan blobs and temp files
      at worst, which are never listed; :meth:`ModelStore.gc` removes both, and opening the store for writing
      removes the temp files of writers that are gone);
    * opening for reading (``mode="read"``) creates nothing and writes nothing;
    * every key is written atomically (:meth:`~keeper.store.files.StoreFiles.write`; on HDFS an update of a
      catalog entry deletes the old entry just before the rename); extras given as local files (weights of any
      size) are streamed in and out in chunks, never held whole;
    * blobs are verified against their sha256 on every read (a local file handed out by :meth:`ModelStore.extra_path`
      once per process, file size and mtime); nothing is ever pickled;
    * reopening a store restores every model from the files alone; the in-memory records are only a cache;
    * :meth:`ModelStore.remove` never deletes a model: it moves it to the holding area, blobs copied first and the
      catalog entry deleted last, and :meth:`ModelStore.restore` brings the same record back, catalog entry
      written before the hold is dropped, so a process killed at any point leaves a model live or held (or
      both), never lost; only :meth:`ModelStore.expire` deletes a held model, once its retention has ended.

Durability here means surviving the death of the writing process. Concurrent writers to one name are not
serialized across processes (last catalog write wins); keeper's Ray service funnels writes through one actor.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from typing import Any, Iterator, Mapping

import pyarrow.fs as pafs

from keeper.errors import (AdmissionError, CorruptModelError, HeldModelNotFoundError, ModelNotFoundError,
                           RestoreConflictError, StoreError, ZooNotFoundError)
from keeper.store import holding
from keeper.store.audit import LOG_DIR, AuditLog
from keeper.store.files import Staged, StoreFiles, open_uri, sha256, size
from keeper.store.holding import HOLD_DIR, Held
from keeper.store.records import (DEFAULT_TEAM, MUTABLE_FIELDS, NAME_RE, ModelRecord, admitted, check_name, finite,
                                  json_dict)

__all__ = ["ModelRecord", "ModelStore", "DEFAULT_ZOO_DIR", "check_name", "sha256", "zoo_is_empty"]

log = logging.getLogger(__name__)

DEFAULT_ZOO_DIR = os.path.join("~", ".keeper", "zoo")
#: The team table's key (:mod:`keeper.teams` reads and writes its content).
TEAMS_KEY = "access/teams.json"



def _damaged(rec: ModelRecord, key: str, checksum: str, what: str) -> CorruptModelError:
    return CorruptModelError(f"model {rec.name!r}: {what} {key!r} does not match its sha256 {checksum[:12]}... "
                             "(the stored bytes are damaged); remove the model and register it again")


class ModelStore:
    """Durable storage of model blobs and their catalog on any ``pyarrow.fs`` filesystem.

    Args:
        uri: ``None`` for ``~/.keeper/zoo``; a local path or ``file://`` URI; or any URI
            ``pyarrow.fs.FileSystem.from_uri`` opens (``s3://bucket/prefix?region=...``, ``gs://``, ``hdfs://``).
        mode: ``"write"`` creates the store when missing and removes the temp files of writers that are gone;
            ``"read"`` requires an existing store (:class:`~keeper.errors.ZooNotFoundError`) and writes nothing on
            opening (a later write is still tried, and fails with a :class:`StoreError` on a read-only store).
        retries: extra attempts of each filesystem call after the first one fails (0: no retry).
        retry_wait_s: wait before the first retry; it doubles on each further retry.

    Example:
        >>> store = ModelStore("/tmp/zoo")                                               # doctest: +SKIP
        >>> rec, created = store.put("r18", onnx_bytes, accuracy=0.91, num_params=11_000_000,
        ...                          summary={"nodes": 40})                              # doctest: +SKIP
        >>> store.get("r18") == onnx_bytes                                               # doctest: +SKIP
        True
    """

    def __init__(self, uri: str | None = None, *, mode: str = "write", retries: int = 3, retry_wait_s: float = 0.2):
        fs, base, shown = open_uri(DEFAULT_ZOO_DIR if uri is None else os.fspath(uri))
        self._open(StoreFiles(fs, base, shown, retries=retries, retry_wait_s=retry_wait_s), mode)

    @classmethod
    def from_filesystem(cls, fs: pafs.FileSystem, base_path: str, *, mode: str = "write", retries: int = 3,
                        retry_wait_s: float = 0.2) -> "ModelStore":
        """Open a store on an already-built filesystem (e.g. an ``S3FileSystem`` with ``endpoint_override``)."""
        self = cls.__new__(cls)
        self._open(StoreFiles(fs, base_path, retries=retries, retry_wait_s=retry_wait_s), mode)
        return self

    def _open(self, files: StoreFiles, mode: str) -> None:
        if mode not in ("read", "write"):
            raise StoreError(f"mode={mode!r} is invalid; pass 'read' (the zoo must exist; opening writes nothing) "
                             "or 'write' (creates the zoo when missing)")
        self._files = files
        self._uri = files.uri
        self._records: dict[str, ModelRecord] = {}
        self._cache_lock = threading.Lock()
        self._write_lock = threading.RLock()  # put / update / remove / gc of this instance run one at a time
        self.audit = AuditLog(files, files.uri)
        if mode == "write":
            files.make_dirs(("blobs", "catalog", "tmp", "templates", HOLD_DIR, LOG_DIR, "access"))
            files.sweep_temp()  # leftovers of writers killed mid-write; never a live writer's
        elif not files.exists():
            raise ZooNotFoundError(f"no zoo at {self._uri}; `keeper register` creates one (in Python: open it "
                                   "with mode='write')")
        self.reload()

    @contextmanager
    def _naming(self, name: str, doing: str) -> Iterator[None]:
        """A store fault during ``doing`` of model ``name`` says which model (the file layer knows only keys)."""
        try:
            yield
        except StoreError as exc:
            if type(exc) is not StoreError or str(exc).startswith("could not "):
                raise
            raise StoreError(f"could not {doing} model {name!r}: {exc}") from exc

    @property
    def uri(self) -> str:
        """Where the store lives (credentials in a URI are masked)."""
        return self._uri

    @staticmethod
    def _keys(rec: ModelRecord) -> list[str]:
        return [f"blobs/{rec.checksum}.onnx"] + [f"blobs/{rec.extra_checksums[e]}.{e}" for e in rec.extras]

    # -- catalog
    def _read_record(self, name: str) -> ModelRecord | None:
        """The record as the files say now; None when absent, or unreadable (logged)."""
        key = f"catalog/{name}.json"
        try:
            raw = self._files.read(key, missing_ok=True)
        except FileNotFoundError:
            return None
        try:
            rec = ModelRecord.from_json(json.loads(raw))
        except (ValueError, StoreError) as exc:  # json errors are ValueErrors
            log.warning("zoo store %s: skipping unreadable catalog entry %s (%s); remove it or register the "
                        "model again", self._uri, key, exc)
            return None
        if rec.name != name:
            log.warning("zoo store %s: skipping catalog entry %s, which names model %r", self._uri, key, rec.name)
            return None
        return rec

    def _write_record(self, rec: ModelRecord) -> None:
        text = json.dumps(rec.to_json(), sort_keys=True, indent=1, allow_nan=False)
        self._files.write(f"catalog/{rec.name}.json", text.encode())
        with self._cache_lock:
            self._records[rec.name] = rec

    def _current(self, name: str, doing: str) -> ModelRecord:
        """The record of ``name`` as the files say now, for a write; :class:`ModelNotFoundError` when absent."""
        rec = self._read_record(name) if isinstance(name, str) and NAME_RE.fullmatch(name) else None
        if rec is None:
            self._forget(name)
            raise ModelNotFoundError(f"model {name!r} is not in the zoo at {self._uri}; nothing to {doing}")
        return rec

    def _forget(self, name: str) -> None:
        with self._cache_lock:
            self._records.pop(name, None)

    def listed(self) -> set[str]:
        """The names the catalog lists now, from one listing (no entry is read; cheap enough to poll)."""
        names = set()
        for info in self._files.list("catalog"):
            if not info.base_name.endswith(".json"):
                continue
            name = info.base_name[: -len(".json")]
            if not NAME_RE.fullmatch(name):
                log.warning("zoo store %s: skipping catalog file %s (not a valid model name)", self._uri, info.path)
                continue
            names.add(name)
        return names

    def reload(self) -> None:
        """Re-read every catalog entry from the files (entries that do not parse are skipped, with a warning)."""
        found: dict[str, ModelRecord] = {}
        for name in sorted(self.listed()):
            rec = self._read_record(name)
            if rec is not None:
                found[name] = rec
        with self._cache_lock:
            self._records = found

    # -- public API
    def put(self, name: str, blob: bytes, *, accuracy: float, num_params: int, summary: dict,
            extras: Mapping[str, bytes | os.PathLike] | None = None,
            content_extras: tuple[str, ...] = (), known_checksums: Mapping[str, str] | None = None,
            owner: str = DEFAULT_TEAM, user: str | None = None, private: bool = False
            ) -> tuple[ModelRecord, bool]:
        """Store a model under ``name``: blobs first, the catalog entry last.

        Args:
            extras: extra name -> bytes, or a local file's path (streamed; weights of any size).
            content_extras: extras that are part of the model's content (its weights), not derived from it: they
                count in ``nbytes`` and in what "this exact content" means.
            known_checksums: sha256 of extras the caller has just computed (a large file is then read once less).
            owner, user, private: the model's owning team, who registered it, whether only its team reads it
                (the caller has checked them: :mod:`keeper.teams`).

        Returns:
            ``(record, created)``; ``created`` is False when ``name`` already holds this exact content
            (then nothing is written).

        Raises:
            AdmissionError: bad name or fields, or ``name`` holds different content.
            StoreError: the store failed; the catalog is unchanged (orphan blobs may remain for :meth:`gc`).
        """
        acc, summ, extras = admitted(name, blob, accuracy, num_params, summary, extras, content_extras)
        checksum = sha256(blob)
        known = dict(known_checksums or {})
        sums = {e: known[e] if e in known else sha256(data) for e, data in extras.items()}
        with self._write_lock, self._naming(name, "register"):
            existing = self._read_record(name)
            if existing is not None:
                with self._cache_lock:
                    self._records[name] = existing
                if existing.checksum == checksum and all(existing.extra_checksums.get(e) == sums[e]
                                                         for e in content_extras):
                    return existing, False
                raise AdmissionError(f"model name {name!r} is taken by different content (sha256 "
                                     f"{existing.checksum[:12]}..., this one {checksum[:12]}...) in the zoo at "
                                     f"{self._uri}; pick another name or remove {name!r} first")
            nbytes = memoryview(blob).nbytes + sum(size(extras[e]) for e in content_extras)
            rec = ModelRecord(name=name, accuracy=acc, checksum=checksum, nbytes=nbytes,
                              num_params=num_params, summary=summ, created=time.time(), hits=0.0,
                              extras=tuple(sorted(extras)), extra_checksums=sums,
                              owner=check_name(owner, "team name"), user=None if user is None else str(user),
                              private=bool(private))
            self._commit(rec, blob, extras)
        return rec, True

    def _commit(self, rec: ModelRecord, blob: bytes, extras: Mapping[str, bytes | os.PathLike]) -> None:
        """Write ``rec``'s blobs, then its catalog entry: the entry is the commit point."""
        keys = self._keys(rec)
        self._files.write(keys[0], blob)
        for e, key in zip(rec.extras, keys[1:]):
            self._files.write(key, extras[e])
            if isinstance(extras[e], os.PathLike):
                # the bytes of a file just hashed (or hashed as they were written): checked once, as extra_path
                # would check it
                self._files.trust_local(key, rec.extra_checksums[e])
        self._write_record(rec)

    def staging(self, extra: str) -> AbstractContextManager[Staged]:
        """A local file to write a large extra (a model's weights) into before :meth:`put` stores it: on a local
        store it lies beside the blobs, so storing it is a rename (see :meth:`StoreFiles.stage`)."""
        return self._files.stage(extra)

    def record(self, name: str) -> ModelRecord:
        """The catalog record of ``name`` (cached; a miss looks at the files). :class:`ModelNotFoundError` if absent."""
        with self._cache_lock:
            rec = self._records.get(name) if isinstance(name, str) else None
        if rec is None and isinstance(name, str) and NAME_RE.fullmatch(name):
            rec = self._read_record(name)
            if rec is not None:
                with self._cache_lock:
                    self._records[name] = rec
        if rec is None:
            raise ModelNotFoundError(f"model {name!r} is not in the zoo at {self._uri}; records() lists the "
                                     "models (reload() first if another process registered it)")
        return rec

    def _verified(self, rec: ModelRecord, key: str, checksum: str, what: str) -> bytes:
        try:
            data = self._files.read(key, missing_ok=True)
        except FileNotFoundError:
            raise self._missing(rec, key, what) from None
        if sha256(data) != checksum:
            raise _damaged(rec, key, checksum, what)
        return data

    def _missing(self, rec: ModelRecord, key: str, what: str) -> Exception:
        """The error for a missing blob of ``rec``: the model was removed meanwhile, or the blob is lost."""
        if self._read_record(rec.name) is None:
            self._forget(rec.name)
            return ModelNotFoundError(f"model {rec.name!r} was removed from the zoo at {self._uri}")
        return CorruptModelError(f"model {rec.name!r}: {what} {key!r} is missing from the zoo at {self._uri}; "
                                 "remove the model and register it again")

    def get(self, name: str) -> bytes:
        """The model blob of ``name``, verified against its checksum (:class:`CorruptModelError` if damaged)."""
        rec = self.record(name)
        return self._verified(rec, self._keys(rec)[0], rec.checksum, "blob")

    def get_extra(self, name: str, extra: str) -> bytes:
        """An extra blob stored with ``name`` (e.g. ``"graph.npz"``), verified against its checksum."""
        rec = self.record(name)
        if extra not in rec.extra_checksums:
            raise ModelNotFoundError(f"model {name!r} has no extra {extra!r} (it has {list(rec.extras)}); "
                                     "register it again with that extra")
        sum_ = rec.extra_checksums[extra]
        return self._verified(rec, f"blobs/{sum_}.{extra}", sum_, f"extra {extra!r}")

    def extra_path(self, name: str, extra: str) -> str:
        """A local file holding the extra ``extra`` of ``name``, verified against its checksum, for memory-mapping
        (weights of any size): the blob itself on a local store, else a copy streamed into a temporary directory
        of this process (content-addressed, so kept and shared by later calls). Never read whole into memory.

        Raises:
            ModelNotFoundError: no such model or extra. CorruptModelError: the stored bytes are damaged.
        """
        rec = self.record(name)
        if extra not in rec.extra_checksums:
            raise ModelNotFoundError(f"model {name!r} has no extra {extra!r} (it has {list(rec.extras)})")
        sum_ = rec.extra_checksums[extra]
        key = f"blobs/{sum_}.{extra}"
        path = self._files.local_file(key, f"{sum_}.{extra}")
        try:
            ok = self._files.verify_local(path, sum_)
        except FileNotFoundError:
            raise self._missing(rec, key, "extra") from None
        if not ok:
            raise _damaged(rec, key, sum_, "extra")
        return path

    def records(self) -> list[ModelRecord]:
        """Every complete model, sorted by name (from the cache; :meth:`reload` re-reads the files)."""
        with self._cache_lock:
            return [self._records[n] for n in sorted(self._records)]

    def update(self, name: str, **fields: Any) -> ModelRecord:
        """Atomically rewrite the mutable fields (``accuracy``, ``hits``, ``summary``, ``private``) of ``name``'s
        record."""
        bad = sorted(set(fields) - set(MUTABLE_FIELDS))
        if bad:
            raise AdmissionError(f"model {name!r}: fields {bad} cannot be updated, only {list(MUTABLE_FIELDS)}; "
                                 "register changed content under a new name")
        new: dict[str, Any] = {}
        for k in ("accuracy", "hits"):
            if k in fields:
                new[k] = finite(fields[k], f"model {name!r}: {k}")
        if "summary" in fields:
            new["summary"] = json_dict(fields["summary"], f"model {name!r}: summary")
        if "private" in fields:
            new["private"] = bool(fields["private"])
        with self._write_lock, self._naming(name, "update"):
            rec = self._current(name, "update")
            rec = replace(rec, **new)
            self._write_record(rec)
        return rec

    def replace_extra(self, name: str, extra: str, data: bytes) -> ModelRecord:
        """Store new bytes for an existing extra of ``name`` (a derived file, such as a graph extracted again by a
        newer version): the new blob first, the record last, so a failure leaves the old extra in place. The
        old blob stays until :meth:`gc` (another record may share it). The model blob itself never changes."""
        if not isinstance(data, (bytes, bytearray, memoryview)) or memoryview(data).nbytes == 0:
            raise AdmissionError(f"model {name!r}: extra {extra!r} must be non-empty bytes")
        with self._write_lock, self._naming(name, "update"):
            rec = self._current(name, "replace")
            if extra not in rec.extra_checksums:
                raise ModelNotFoundError(f"model {name!r} has no extra {extra!r} (it has {list(rec.extras)}); "
                                         "only an existing extra can be replaced")
            sum_ = sha256(data)
            if sum_ != rec.extra_checksums[extra]:
                self._files.write(f"blobs/{sum_}.{extra}", data)
                rec = replace(rec, extra_checksums={**rec.extra_checksums, extra: sum_})
                self._write_record(rec)  # the commit point
            with self._cache_lock:
                self._records[name] = rec
        return rec

    def remove(self, name: str, *, reason: str = "removed", by: Mapping[str, Any] | None = None) -> Held:
        """Move ``name`` to the holding area (:mod:`keeper.store.holding`): its blobs copied there and its hold
        entry written, then its catalog entry deleted, then its blobs that no other record references. The model
        can be restored (:meth:`restore`) until :meth:`expire` deletes the hold.

        Args:
            reason: ``"removed"`` or ``"evicted"``.
            by: who held it (team, user, host, pid), kept in the hold entry.

        Raises:
            ModelNotFoundError: no model ``name``. StoreError: the store failed; the model is live, or held.
        """
        if reason not in holding.REASONS:
            raise StoreError(f"hold reason {reason!r} is not one of {holding.REASONS}")
        with self._write_lock:
            rec = self._current(name, "remove")
            held = Held(rec, holding.new_hold_id(), time.time(), reason, dict(by or {}))
            with self._naming(name, "remove"):
                self._files.make_dirs((f"{HOLD_DIR}/{name}@{held.hold_id}",))
                for key in self._keys(rec):
                    try:
                        self._files.copy(key, holding.blob_key(name, held.hold_id, key))
                    except FileNotFoundError:  # a damaged model can still be removed; restoring it will say so
                        log.warning("zoo store %s: model %r's blob %s is missing; it is held without it", self._uri,
                                    name, key)
                entry = json.dumps(held.to_json(), sort_keys=True, indent=1, allow_nan=False).encode()
                self._files.write(holding.entry_key(name, held.hold_id), entry)  # the hold's commit
                self._files.delete(f"catalog/{name}.json")                      # ... then the model leaves
            self._forget(name)
            self._drop_unreferenced(rec, name)
        return held

    def _drop_unreferenced(self, rec: ModelRecord, name: str) -> None:
        """Delete ``rec``'s live blobs that no record references (the hold keeps its own copies)."""
        try:
            self.reload()  # references as the files say, so another process's models keep their blobs
            used = {k for r in self.records() for k in self._keys(r)}
            for key in self._keys(rec):
                if key not in used:
                    self._files.delete(key)
        except StoreError as exc:
            log.warning("zoo store %s: model %r is held but some of its live blobs remain (%s); gc() removes "
                        "them", self._uri, name, exc)

    def held(self, name: str | None = None) -> list[Held]:
        """The models in the holding area (of ``name`` only, when given), oldest hold first."""
        return holding.read_held(self._files, self._uri, name)

    def _hold_of(self, name: str, hold_id: str | None) -> Held:
        holds = [h for h in self.held(name) if hold_id is None or h.hold_id == hold_id]
        if not holds:
            which = f"hold {hold_id!r} of model {name!r}" if hold_id else f"model {name!r}"
            live = self._read_record(name)
            if live is not None and hold_id is None:
                raise HeldModelNotFoundError(f"model {name!r} is live in the zoo at {self._uri} (owner "
                                             f"{live.owner!r}) and has no hold: there is nothing to restore")
            raise HeldModelNotFoundError(f"{which} is not in the holding area of the zoo at {self._uri} (never "
                                         "removed or evicted, restored already, or deleted by gc once its retention "
                                         "ended); `keeper zoo held` lists what can be restored")
        return holds[-1]

    def restore(self, name: str, hold_id: str | None = None, as_name: str | None = None) -> tuple[ModelRecord, Held]:
        """Bring the held model ``name`` back into the catalog with the very record it had (weights hash, lineage,
        accuracy, hits, created): its blobs copied back, its catalog entry written (the commit), then its hold
        deleted. Returns ``(record, the hold it came from)``.

        Args:
            hold_id: which hold of ``name`` (default: the latest).
            as_name: restore under this name instead (when ``name`` is live again).

        Raises:
            HeldModelNotFoundError: no such hold. RestoreConflictError: the name is live with another record.
            CorruptModelError: a copy in the hold is missing. StoreError: the store failed; the model is held,
            or live.
        """
        target = name if as_name is None else check_name(as_name)
        with self._write_lock:
            held = self._hold_of(name, hold_id)
            rec = held.record if target == name else replace(held.record, name=target)
            live = self._read_record(target)
            if live is not None:
                if _same_version(live, rec):  # an interrupted hold or restore of this record: only the hold to drop
                    self._drop_hold(held)
                    with self._cache_lock:
                        self._records[target] = live
                    return live, held
                raise RestoreConflictError(
                    f"model {target!r} cannot be restored from hold {held.hold_id} (owner {held.record.owner!r}): "
                    f"the name is live again, owned by team {live.owner!r} (sha256 {live.checksum[:12]}..., "
                    f"registered {time.strftime('%Y-%m-%d %H:%M', time.localtime(live.created))}); remove the live "
                    f"one first, or restore under another name (`keeper zoo restore {name} --as NEW-NAME`)")
            with self._naming(target, "restore"):
                for key in self._keys(rec):
                    try:
                        self._files.copy(holding.blob_key(name, held.hold_id, key), key)
                    except FileNotFoundError:
                        raise CorruptModelError(
                            f"model {name!r}: hold {held.hold_id} lacks its copy of {key!r} (it was removed while "
                            f"damaged, or the copy was deleted); it cannot be restored whole. Register the model "
                            "again") from None
                self._write_record(rec)  # the commit: the model is live
                self._drop_hold(held)
        return rec, held

    def _drop_hold(self, held: Held) -> None:
        """Delete a hold: its entry first (then it is no hold), then its copies."""
        try:
            self._files.delete(holding.entry_key(held.name, held.hold_id))
            self._files.delete_dir(f"{HOLD_DIR}/{held.name}@{held.hold_id}")
        except StoreError as exc:
            log.warning("zoo store %s: hold %s of model %r could not be deleted whole (%s); gc() removes what "
                        "remains", self._uri, held.hold_id, held.name, exc)

    def expire(self, retention_s: float, now: float | None = None) -> list[Held]:
        """Delete the holds whose retention has ended (held more than ``retention_s`` seconds ago); returns them.
        This is the only way a model leaves the zoo for good."""
        now = time.time() if now is None else now
        gone = []
        with self._write_lock:
            for held in self.held():
                if held.expires_at(retention_s) <= now:
                    self._drop_hold(held)
                    gone.append(held)
        return gone

    def read_teams(self) -> bytes | None:
        """The team table's bytes (:mod:`keeper.teams`), or None in a zoo without teams."""
        try:
            return self._files.read(TEAMS_KEY, missing_ok=True)
        except FileNotFoundError:
            return None

    def write_teams(self, data: bytes) -> None:
        """Replace the team table atomically (its content is :mod:`keeper.teams`' business)."""
        self._files.write(TEAMS_KEY, data)

    def gc(self, min_age_s: float = 0.0) -> int:
        """Delete blobs no record references, the temp files of writers that are gone and hold directories
        without an entry (:func:`keeper.store.holding.sweep`); returns how many. Held models stay: only
        :meth:`expire` deletes them.

        Args:
            min_age_s: spare blobs younger than this, so a put in flight in another process keeps its blobs. Temp
                files go by their writer (:meth:`~keeper.store.files.StoreFiles.sweep_temp`): never a live one's.
        """
        with self._write_lock:
            self.reload()
            used = {k for r in self.records() for k in self._keys(r)}
            cutoff_ns = (time.time() - min_age_s) * 1e9
            count = self._files.sweep_temp() + holding.sweep(self._files, min_age_s)
            for info in self._files.list("blobs"):
                key = f"blobs/{info.base_name}"
                young = min_age_s > 0 and info.mtime_ns is not None and info.mtime_ns > cutoff_ns
                if key not in used and not young and self._files.delete(key):
                    count += 1
        return count

    # -- architecture templates (not zoo models: how to read a trained state_dict back into ONNX)
    def put_template(self, key: str, data: bytes) -> bool:
        """Store an architecture template under ``key`` (a content signature) once; False when it was there.

        Templates are small and content-addressed: two writers of one key write the same architecture, so the
        first write stands and a race between them stores the same bytes.
        """
        return self._files.write_once(f"templates/{check_name(key, 'template key')}.onnx", data)

    def get_template(self, key: str) -> bytes | None:
        """The template stored under ``key``, or None."""
        try:
            return self._files.read(f"templates/{check_name(key, 'template key')}.onnx", missing_ok=True)
        except FileNotFoundError:
            return None

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        with self._cache_lock:
            return name in self._records

    def __len__(self) -> int:
        with self._cache_lock:
            return len(self._records)

    def __iter__(self) -> Iterator[ModelRecord]:
        return iter(self.records())

    def __repr__(self) -> str:
        return f"ModelStore({self._uri!r}, models={len(self)})"


def _same_version(a: ModelRecord, b: ModelRecord) -> bool:
    """Whether two records are one registration of one model (hits and accuracy may have moved since)."""
    return (a.name, a.checksum, a.extra_checksums, a.created, a.owner) == \
        (b.name, b.checksum, b.extra_checksums, b.created, b.owner)


def zoo_is_empty(uri: str | None) -> bool:
    """Whether the zoo at ``uri`` holds no model (or does not exist yet), from one listing of its catalog: what a
    caller checks before it pays for the service or a parent choice. Opening nothing, it writes nothing."""
    fs, base, shown = open_uri(DEFAULT_ZOO_DIR if uri is None else os.fspath(uri))
    files = StoreFiles(fs, base, shown)
    return not any(info.base_name.endswith(".json") for info in files.list("catalog"))

