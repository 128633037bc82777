"""The holding area: where a removed or evicted model waits, whole, for its retention period before ``gc`` deletes
it, and from where it is restored with its lineage and statistics (the same record: weights hash, lineage,
accuracy, hits, created).

Layout under the store's base path::

    held/<name>@<hold id>.json    the hold's entry: the model's catalog record as it was, and when, why and by whom
                                  it was held. Its presence is the commit of the hold
    held/<name>@<hold id>/<blob>  the model's blobs (``<sha256>.onnx``, ``<sha256>.<extra>``), copied from
                                  ``blobs/`` (hard links on a local store: no bytes copied)

A hold id is ``<nanoseconds>-<8 hex>``: the holds of one name sort by the time they were made.

Invariants (with :class:`~keeper.store.model_store.ModelStore`, which runs the steps in this order):
    * a hold copies the blobs, writes its entry, and only then deletes the catalog entry and the blobs no live
      record references; a restore copies the blobs back, writes the catalog entry, and only then deletes the
      hold's entry and then its copies. A process killed at any step leaves the model live, held, or both
      (a live record and a hold of the same record: an interrupted hold or restore), never neither;
    * a hold directory without its entry is a leftover of a killed hold or of a deletion cut short, never read as
      a hold; :func:`sweep` removes those older than the age it is given (a hold in flight writes its entry
      within seconds);
    * a held model is not in the catalog, so no listing, search or parent choice ever sees it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

from keeper.errors import StoreError
from keeper.store.files import StoreFiles
from keeper.store.records import NAME_RE, ModelRecord

__all__ = ["Held", "HOLD_DIR", "new_hold_id", "blob_key", "entry_key", "read_held", "sweep"]

log = logging.getLogger(__name__)

HOLD_DIR = "held"
#: Why a model is held.
REASONS = ("removed", "evicted")


def new_hold_id(now_ns: int | None = None) -> str:
    """A fresh hold id; ids of later holds sort after earlier ones (to the nanosecond, then at random)."""
    return f"{time.time_ns() if now_ns is None else now_ns:019d}-{uuid.uuid4().hex[:8]}"


def entry_key(name: str, hold_id: str) -> str:
    return f"{HOLD_DIR}/{name}@{hold_id}.json"


def blob_key(name: str, hold_id: str, live_key: str) -> str:
    """Where the hold keeps the copy of the live blob ``live_key`` (``blobs/<sha256>.<ext>``)."""
    return f"{HOLD_DIR}/{name}@{hold_id}/{live_key.rsplit('/', 1)[-1]}"


@dataclass(frozen=True)
class Held:
    """One held model: its record as it was when it left the catalog, and the hold's facts."""

    record: ModelRecord
    hold_id: str
    held_at: float
    reason: str                            # "removed" or "evicted"
    by: dict[str, Any] = field(default_factory=dict)   # who: team, user, host, pid (never a secret)

    @property
    def name(self) -> str:
        return self.record.name

    def expires_at(self, retention_s: float) -> float:
        """When ``gc`` may delete this hold under a retention of ``retention_s`` seconds."""
        return self.held_at + float(retention_s)

    def to_json(self) -> dict:
        return {"format": 1, "record": self.record.to_json(), "hold": {"id": self.hold_id, "at": self.held_at,
                                                                       "reason": self.reason, "by": dict(self.by)}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], name: str, hold_id: str) -> "Held":
        """Parse a hold's entry, checked against the name and id its key says; ValueError when malformed."""
        try:
            hold = dict(d["hold"])
            held = cls(record=ModelRecord.from_json(d["record"]), hold_id=str(hold["id"]),
                       held_at=float(hold["at"]), reason=str(hold["reason"]), by=dict(hold.get("by") or {}))
        except (KeyError, TypeError, ValueError, AttributeError, StoreError) as exc:
            raise ValueError(f"malformed hold entry ({exc})") from None
        if held.record.name != name or held.hold_id != hold_id:
            raise ValueError(f"the entry names {held.record.name!r}@{held.hold_id}, its key {name!r}@{hold_id}")
        return held

    def summary(self) -> dict[str, Any]:
        """What ``keeper zoo held`` shows of it."""
        r = self.record
        return {"name": r.name, "hold": self.hold_id, "held_at": self.held_at, "reason": self.reason,
                "by": dict(self.by), "owner": r.owner, "accuracy": r.accuracy, "checksum": r.checksum,
                "nbytes": r.nbytes}


def _parse_key(base_name: str) -> tuple[str, str] | None:
    """``(name, hold id)`` of a hold entry's file name, or None for anything else."""
    if not base_name.endswith(".json") or "@" not in base_name:
        return None
    name, hold_id = base_name[: -len(".json")].rsplit("@", 1)
    return (name, hold_id) if NAME_RE.fullmatch(name) and hold_id else None


def read_held(files: StoreFiles, uri: str, name: str | None = None) -> list[Held]:
    """Every hold in the store (of ``name`` only, when given), oldest first; an entry that does not parse is
    skipped with a warning (its model's copies stay on disk for an operator to look at)."""
    out = []
    for info in files.list(HOLD_DIR):
        parsed = _parse_key(info.base_name)
        if parsed is None or (name is not None and parsed[0] != name):
            continue
        key = f"{HOLD_DIR}/{info.base_name}"
        try:
            out.append(Held.from_json(json.loads(files.read(key, missing_ok=True)), *parsed))
        except FileNotFoundError:
            continue  # restored or expired meanwhile
        except ValueError as exc:  # json errors are ValueErrors
            log.warning("zoo store %s: skipping hold entry %s (%s); the model's copies are under %s/", uri, key,
                        exc, key[: -len(".json")])
    return sorted(out, key=lambda h: (h.hold_id, h.name))


def sweep(files: StoreFiles, min_age_s: float) -> int:
    """Delete the hold directories that have no entry (a hold killed before its commit, or a deletion cut short)
    and are older than ``min_age_s``; returns how many. Their age is that of the directory or its newest copy,
    whichever is younger (object stores keep no directory of their own)."""
    entries = {info.base_name[: -len(".json")] for info in files.list(HOLD_DIR) if info.base_name.endswith(".json")}
    now_ns = time.time_ns()
    count = 0
    for d in files.list_dirs(HOLD_DIR):
        if d.base_name in entries:
            continue
        inside = files.list(f"{HOLD_DIR}/{d.base_name}")
        # the directory's own time too: a copy hard-linked on a local store keeps its blob's old mtime
        stamps = [i.mtime_ns for i in inside if i.mtime_ns is not None] + ([d.mtime_ns] if d.mtime_ns else [])
        if stamps and now_ns - max(stamps) < min_age_s * 1e9:
            continue  # a hold in flight: its entry comes next
        if files.delete_dir(f"{HOLD_DIR}/{d.base_name}"):
            count += 1
    return count
