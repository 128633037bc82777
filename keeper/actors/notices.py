"""What a Tune driver tells the front door ahead of the trials it starts, kept in Ray's key-value store (the GCS).

Two notices must reach the front door before any trial that the driver starts afterwards asks for its parent: the
registration of a trial that just ended (the next trial may inherit from it) and a search's best cold first report
(the bar its later trials' parents must pass, :mod:`keeper.choice.inheritance`). Actor calls cannot carry them:
calls from two processes keep no order, and while the service boots the driver's and the trial's calls both queue
and then run in any order. A write to the GCS returns once it is stored, before Tune starts the next trial, and the
front door reads the notices at each parent choice, so it sees every notice given before the asking trial started,
and neither side waits for the other (the driver never waits for a service that is still booting).

Keys, in the service's Ray namespace: ``keeper/<service>/arriving/<t>/<name>`` (a registration announced at wall time
``t``, withdrawn when it settles) and ``keeper/<service>/cold/<search>`` (its value: the accuracy).

Invariants: a notice is visible to every reader once its write returns; reading never blocks on the driver; a
notice whose writer died is ignored (and removed) after the bound the reader gives.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from ray.experimental import internal_kv as _kv

__all__ = ["Arriving", "announce", "arriving", "cold_bar", "set_cold_bar", "withdraw", "clear_cold_bar"]


class Arriving(NamedTuple):
    """A registration announced and not yet withdrawn: the model's name and when it was announced (wall time)."""

    name: str
    announced: float


def _prefix(service: str, kind: str) -> bytes:
    return f"keeper/{service}/{kind}/".encode()


def announce(service: str, namespace: str, name: str) -> bytes:
    """Announce the registration of ``name``; returns the key that :func:`withdraw` takes when it settles."""
    key = _prefix(service, "arriving") + f"{time.time():.6f}/{name}".encode()
    _kv._internal_kv_put(key, b"", namespace=namespace)
    return key


def withdraw(key: bytes, namespace: str) -> None:
    """The announced registration settled (registered or refused)."""
    _kv._internal_kv_del(key, namespace=namespace)


def arriving(service: str, namespace: str, ttl_s: float) -> list[Arriving]:
    """The registrations announced to ``service`` and not withdrawn; those older than ``ttl_s`` (the driver that
    announced them died) are removed, not returned."""
    prefix = _prefix(service, "arriving")
    now, out = time.time(), []
    for key in _kv._internal_kv_list(prefix, namespace=namespace):
        stamp, _, name = key[len(prefix):].decode().partition("/")
        try:
            announced = float(stamp)
        except ValueError:  # not one of ours: leave it
            continue
        if now - announced > ttl_s:
            _kv._internal_kv_del(key, namespace=namespace)
        else:
            out.append(Arriving(name, announced))
    return out


def set_cold_bar(service: str, namespace: str, search: str, accuracy: float) -> None:
    """``search``'s best cold first report so far (the caller keeps the best; this overwrites)."""
    _kv._internal_kv_put(_prefix(service, "cold") + search.encode(), repr(float(accuracy)).encode(),
                         namespace=namespace)


def cold_bar(service: str, namespace: str, search: str) -> float | None:
    """``search``'s best cold first report, or None when its driver has given none."""
    value = _kv._internal_kv_get(_prefix(service, "cold") + search.encode(), namespace=namespace)
    return None if value is None else float(value)


def clear_cold_bar(service: str, namespace: str, search: str) -> None:
    """``search`` ended: its bar is no longer read (the front door keeps what it has seen)."""
    _kv._internal_kv_del(_prefix(service, "cold") + search.encode(), namespace=namespace)
