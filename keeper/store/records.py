"""A zoo model's catalog record, and the checks of everything that goes into one (names, accuracy, summary,
extras), shared by the store and the zoo.

Invariant: a :class:`ModelRecord` built by :meth:`ModelRecord.from_json` or from :func:`admitted`'s output names a
valid model, holds finite numbers and sha256 checksums, and a summary that is plain JSON (never an alias of a
caller's object), and an owning team (``DEFAULT_TEAM`` for entries written before teams, which carry none).

On disk an entry of the default team that is public and names no user is written exactly as before teams (the
three fields are left out), so a zoo without teams keeps its files byte for byte; readers of earlier versions
ignore the fields."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from keeper.errors import AdmissionError, StoreError

__all__ = ["DEFAULT_TEAM", "FORMAT_VERSION", "MUTABLE_FIELDS", "NAME_RE", "ModelRecord", "admitted", "check_name",
           "finite", "json_dict"]

FORMAT_VERSION = 1
MUTABLE_FIELDS = ("accuracy", "hits", "summary", "private")
#: The team of every model registered without one (and of every entry written before teams).
DEFAULT_TEAM = "default"
NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
SHA_RE = re.compile(r"[0-9a-f]{64}")
NAME_RULE = "1 to 128 characters of A-Z a-z 0-9 . _ -, not starting with '.'"


def check_name(name: object, what: str = "model name") -> str:
    """Return ``name`` if it is a valid model (or extra) name, else raise :class:`AdmissionError`."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise AdmissionError(f"{what} {name!r} is not allowed: use {NAME_RULE} (e.g. 'resnet18-cifar10_v2')")
    return name


def finite(value: object, what: str) -> float:
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise AdmissionError(f"{what} {value!r} is not a number; pass a finite float") from None
    if not math.isfinite(out):
        raise AdmissionError(f"{what} {value!r} is not finite; pass a finite float")
    return out


def json_dict(value: object, what: str) -> dict:
    """A JSON-able dict, copied through JSON so the record never aliases the caller's object."""
    if not isinstance(value, Mapping):
        raise AdmissionError(f"{what} must be a dict of JSON values, got {type(value).__name__}")
    try:
        return json.loads(json.dumps(dict(value), sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise AdmissionError(f"{what} is not JSON-serializable ({exc}); keep to str, numbers, lists, dicts") from None


def admitted(name: object, blob: object, accuracy: object, num_params: object, summary: object,
              extras: Mapping[str, bytes | os.PathLike] | None, content_extras: tuple[str, ...]
              ) -> tuple[float, dict, dict[str, bytes | os.PathLike]]:
    """``(accuracy, summary, extras)`` of a model to store, checked and copied; :class:`AdmissionError` naming the
    field otherwise (see :meth:`ModelStore.put`)."""
    check_name(name)
    if not isinstance(blob, (bytes, bytearray, memoryview)) or memoryview(blob).nbytes == 0:
        raise AdmissionError(f"model {name!r}: the blob must be non-empty bytes, got {type(blob).__name__}"
                             f"{' (empty)' if isinstance(blob, (bytes, bytearray, memoryview)) else ''}")
    acc = finite(accuracy, f"model {name!r}: accuracy")
    if isinstance(num_params, bool) or not isinstance(num_params, int) or num_params < 0:
        raise AdmissionError(f"model {name!r}: num_params {num_params!r} must be an integer >= 0")
    summ = json_dict(summary, f"model {name!r}: summary")
    extras = dict(extras or {})
    for e, data in extras.items():
        check_name(e, f"model {name!r}: extra name")
        if not isinstance(data, (bytes, bytearray, memoryview, os.PathLike)):
            raise AdmissionError(f"model {name!r}: extra {e!r} must be bytes or a file path, got "
                                 f"{type(data).__name__}")
    unknown = sorted(set(content_extras) - set(extras))
    if unknown:
        raise AdmissionError(f"model {name!r}: content extras {unknown} are not among the extras given")
    return acc, summ, extras

@dataclass(frozen=True)
class ModelRecord:
    """One catalog entry. ``summary`` is a plain dict: treat it as read-only (copy before changing it)."""

    name: str
    accuracy: float
    checksum: str
    nbytes: int
    num_params: int
    summary: dict
    created: float
    hits: float = 0.0
    extras: tuple[str, ...] = ()
    extra_checksums: dict[str, str] = field(default_factory=dict)
    owner: str = DEFAULT_TEAM          # the team that registered it
    user: str | None = None            # who in that team, where the client said
    private: bool = False              # readable (and a parent) only for its team and operators

    def to_json(self) -> dict:
        out = {"format": FORMAT_VERSION, "name": self.name, "accuracy": self.accuracy, "checksum": self.checksum,
               "nbytes": self.nbytes, "num_params": self.num_params, "summary": self.summary,
               "created": self.created, "hits": self.hits, "extras": list(self.extras),
               "extra_checksums": dict(self.extra_checksums)}
        # left out at their defaults: a zoo without teams keeps the entries it always wrote
        if self.owner != DEFAULT_TEAM:
            out["owner"] = self.owner
        if self.user is not None:
            out["user"] = self.user
        if self.private:
            out["private"] = True
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ModelRecord":
        """Parse and check a catalog entry; :class:`StoreError` when it is malformed."""
        try:
            if int(d.get("format", FORMAT_VERSION)) > FORMAT_VERSION:
                raise ValueError(f"format {d['format']} is newer than this keeper reads ({FORMAT_VERSION}); "
                                 "upgrade keeper")
            extras = tuple(str(e) for e in d.get("extras", ()))
            sums = {str(k): str(v) for k, v in dict(d.get("extra_checksums", {})).items()}
            rec = cls(name=check_name(d["name"]), accuracy=float(d["accuracy"]), checksum=str(d["checksum"]),
                      nbytes=int(d["nbytes"]), num_params=int(d["num_params"]), summary=dict(d["summary"]),
                      created=float(d["created"]), hits=float(d.get("hits", 0.0)), extras=extras,
                      extra_checksums=sums, owner=check_name(d.get("owner", DEFAULT_TEAM), "team name"),
                      user=None if d.get("user") is None else str(d["user"]), private=bool(d.get("private", False)))
            if not SHA_RE.fullmatch(rec.checksum) or set(extras) != set(sums) or \
                    not all(SHA_RE.fullmatch(s) for s in sums.values()):
                raise ValueError("checksums are missing or not sha256 hex")
            for e in extras:
                check_name(e, "extra name")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            label = d.get("name", "?") if isinstance(d, Mapping) else "?"
            raise StoreError(f"catalog entry {label!r} is malformed ({exc!s}); remove its "
                             "catalog file and register the model again") from None
        return rec
