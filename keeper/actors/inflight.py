"""Registrations in flight: models announced to the front door whose registration has not settled yet.

A Tune trial that ends is announced the moment the driver hands its checkpoint to its registration thread
(:mod:`keeper.actors.notices`: the driver never waits for the service); a trial that starts after that asks for its
parent, the front door admits the announcements it reads then, and the choice may wait for them to settle, so the
trial can inherit from the trial that just ended while Tune's driver goes on scheduling. The wait for a registration
is the trial's, never the driver's, and it is bounded.

Invariants: a choice waits only for registrations announced before it arrived; every wait ends by its deadline
and names what was still in flight; an announcement that never settles (its driver died) is forgotten after
``ttl_s``; an announcement read after its registration settled is not admitted again.
"""

from __future__ import annotations

import threading
import time

__all__ = ["InFlight"]


class InFlight:
    """Announced registrations and the bounded wait for them.

    Args:
        ttl_s: an announcement not settled after this long is dropped (the registration's own bound).
    """

    def __init__(self, ttl_s: float):
        self.ttl_s = float(ttl_s)
        self._cond = threading.Condition()
        self._seq = 0
        self._pending: dict[str, tuple[int, float]] = {}  # name -> (sequence number, announced at)
        self._settled: dict[str, float] = {}  # name -> wall time it settled (kept ttl_s)

    def announce(self, name: str, at: float | None = None) -> None:
        """``name``'s registration was announced at wall time ``at`` (default now; the driver's notice, read by the
        front door): pending from now on, unless it is pending already or its registration settled after the
        announcement (the notice was read before the driver withdrew it)."""
        at = time.time() if at is None else at
        with self._cond:
            if name in self._pending or self._settled.get(name, -float("inf")) >= at:
                return
            self._seq += 1
            self._pending[name] = (self._seq, time.monotonic() - max(0.0, time.time() - at))

    def settle(self, name: str) -> None:
        """``name``'s registration is over (registered or refused); unknown names are ignored."""
        with self._cond:
            self._settled[name] = time.time()
            if self._pending.pop(name, None) is not None:
                self._cond.notify_all()

    def pending(self) -> list[str]:
        with self._cond:
            self._expire()
            return sorted(self._pending)

    def wait(self, timeout_s: float) -> list[str]:
        """Wait until every registration announced before this call has settled, at most ``timeout_s`` seconds;
        returns the names still in flight when the wait ran out (empty when none was, or all settled)."""
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        with self._cond:
            mark = self._seq
            while True:
                self._expire()
                late = sorted(n for n, (s, _) in self._pending.items() if s <= mark)
                now = time.monotonic()
                left = deadline - now
                if not late or left <= 0:
                    return late
                expiry = min(t for n, (_, t) in self._pending.items() if n in late) + self.ttl_s - now
                self._cond.wait(min(left, max(expiry, 0.0) + 1e-3))

    def _expire(self) -> None:
        now = time.monotonic()
        for name in [n for n, (_, t) in self._pending.items() if now - t > self.ttl_s]:
            del self._pending[name]
        wall = time.time()
        for name in [n for n, t in self._settled.items() if wall - t > self.ttl_s]:
            del self._settled[name]
