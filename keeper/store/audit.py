"""The zoo's audit log: one write-once file per write to the zoo (registrations, updates, aliases, removals,
evictions, restorations, deletions of expired holds, changes of the team table), saying who did it, when, to
what, and from which client (host and pid).

Layout: ``log/<nanoseconds>-<host>-<pid>-<8 hex>.json``, one entry per file. Object stores cannot append to an
object, so no entry is ever rewritten: each is one atomic write of its own key, and the log is the listing of
``log/`` in key order (the time of the write, to the nanosecond; a process never gives two entries one time).

Invariants:
    * the log is written after the write it records (an entry never describes a change that did not happen) and
      is best effort: a log write that fails is a warning, never a failed write of the zoo, and no model is ever
      read from the log, so losing or damaging it loses no model;
    * a damaged entry (not JSON, fields missing) is skipped with a warning naming its key; the rest still reads;
    * an entry never holds a secret: it is built from the request's facts, never from what a client presented.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

from keeper.errors import StoreError
from keeper.store.files import StoreFiles

__all__ = ["LOG_DIR", "ACTIONS", "LogEntry", "AuditLog"]

log = logging.getLogger(__name__)

LOG_DIR = "log"
#: What an entry may record.
ACTIONS = ("register", "alias", "update", "record-again", "private", "remove", "evict", "restore", "purge",
           "teams")
_HOST = re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname())[:64] or "host"
_KEY_RE = re.compile(r"(?P<ns>\d{19})-[A-Za-z0-9_]+-\d+-[0-9a-f]{8}\.json")


@dataclass(frozen=True)
class LogEntry:
    """One write to the zoo, as the log keeps it."""

    seq: int                     # nanoseconds since the epoch; the log's order
    action: str                  # one of ACTIONS
    model: str | None            # the model written (None for a change of the team table)
    owner: str | None            # the model's owning team
    team: str                    # the team of the client that did it ("operator" for an operator)
    user: str | None = None
    host: str = ""
    pid: int = 0
    details: dict[str, Any] = field(default_factory=dict)  # accuracy, checksum, hold id, reason, ...

    @property
    def time(self) -> float:
        return self.seq / 1e9

    def to_json(self) -> dict[str, Any]:
        return {"format": 1, "seq": self.seq, "time": self.time, "action": self.action, "model": self.model,
                "owner": self.owner, "team": self.team, "user": self.user, "host": self.host, "pid": self.pid,
                "details": dict(self.details)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "LogEntry":
        """Parse an entry; ValueError when it is malformed."""
        try:
            entry = cls(seq=int(d["seq"]), action=str(d["action"]),
                        model=None if d.get("model") is None else str(d["model"]),
                        owner=None if d.get("owner") is None else str(d["owner"]), team=str(d["team"]),
                        user=None if d.get("user") is None else str(d["user"]), host=str(d.get("host", "")),
                        pid=int(d.get("pid", 0)), details=dict(d.get("details") or {}))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed log entry ({exc})") from None
        return entry


class AuditLog:
    """The append-only log of one store (see the module docstring).

    Example:
        >>> log = AuditLog(files, "/tmp/zoo")                                          # doctest: +SKIP
        >>> log.append("remove", "r18", owner="vision", team="vision", host="n1", pid=7)  # doctest: +SKIP
        >>> [e.action for e in log.entries()]                                          # doctest: +SKIP
        ['remove']
    """

    def __init__(self, files: StoreFiles, uri: str):
        self._files = files
        self._uri = uri
        self._lock = threading.Lock()
        self._last = 0
        self._failed = False

    def _next_seq(self) -> int:
        with self._lock:  # strictly increasing in this process, whatever the clock's resolution
            self._last = max(time.time_ns(), self._last + 1)
            return self._last

    def append(self, action: str, model: str | None, *, owner: str | None, team: str, user: str | None = None,
               host: str | None = None, pid: int | None = None, **details: Any) -> LogEntry | None:
        """Record one write; returns the entry, or None when it could not be written (logged, never raised: the
        write it records has happened)."""
        if action not in ACTIONS:
            raise ValueError(f"log action {action!r} is not one of {ACTIONS}")
        entry = LogEntry(seq=self._next_seq(), action=action, model=model, owner=owner, team=team, user=user,
                         host=socket.gethostname() if host is None else host,
                         pid=os.getpid() if pid is None else int(pid),
                         details=json.loads(json.dumps(details, default=str)))
        key = f"{LOG_DIR}/{entry.seq:019d}-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
        try:
            self._files.write(key, json.dumps(entry.to_json(), sort_keys=True).encode())
        except StoreError as exc:
            if not self._failed:
                log.warning("zoo store %s: the audit log could not record %s of %r (%s); the write itself "
                            "happened, later entries are tried as usual", self._uri, action, model, exc)
            self._failed = True
            return None
        return entry

    def entries(self, *, model: str | None = None, since: float | None = None,
                last: int | None = None) -> list[LogEntry]:
        """The log in order, oldest first: of one ``model`` only, from time ``since`` on, the ``last`` N only.
        Damaged entries are skipped with a warning."""
        keys = []
        for info in self._files.list(LOG_DIR):
            m = _KEY_RE.fullmatch(info.base_name)
            if m is None:
                continue
            if since is not None and int(m["ns"]) < since * 1e9:
                continue
            keys.append(info.base_name)
        keys.sort()
        out: list[LogEntry] = []
        for base in reversed(keys):  # newest first, so `last` reads only what it shows
            if last is not None and len(out) >= last:
                break
            key = f"{LOG_DIR}/{base}"
            try:
                entry = LogEntry.from_json(json.loads(self._files.read(key, missing_ok=True)))
            except FileNotFoundError:
                continue
            except (ValueError, UnicodeDecodeError) as exc:
                log.warning("zoo store %s: skipping damaged log entry %s (%s); the models are not affected",
                            self._uri, key, exc)
                continue
            if model is None or entry.model == model:
                out.append(entry)
        return out[::-1]
