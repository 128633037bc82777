"""InFlight (keeper/actors/inflight.py): a parent choice waits for the registrations announced before it, and only
for those, within its bound; plain class, no Ray."""

from __future__ import annotations

import threading
import time

from keeper.actors.inflight import InFlight


def test_a_wait_ends_when_the_registrations_announced_before_it_settle():
    inflight = InFlight(ttl_s=60)
    inflight.announce("a")
    inflight.announce("b")
    threading.Timer(0.2, inflight.settle, ("a",)).start()
    threading.Timer(0.3, inflight.settle, ("b",)).start()
    t0 = time.monotonic()
    assert inflight.wait(10.0) == []
    assert 0.25 <= time.monotonic() - t0 < 5.0, "it waited for both, and no longer"
    assert inflight.pending() == []


def test_a_wait_ignores_later_announcements_and_names_what_was_still_in_flight():
    inflight = InFlight(ttl_s=60)
    inflight.announce("early")
    threading.Timer(0.1, inflight.announce, ("late",)).start()
    threading.Timer(0.2, inflight.settle, ("early",)).start()
    assert inflight.wait(10.0) == [], "'late' came after the wait began: not waited for"
    assert inflight.pending() == ["late"]
    t0 = time.monotonic()
    assert inflight.wait(0.2) == ["late"], "a wait that runs out says what it waited for"
    assert time.monotonic() - t0 < 2.0
    inflight.settle("unknown")  # a refusal of something never announced changes nothing
    assert inflight.pending() == ["late"]


def test_an_announcement_that_never_settles_is_forgotten_after_its_bound():
    inflight = InFlight(ttl_s=0.2)
    inflight.announce("lost")
    t0 = time.monotonic()
    assert inflight.wait(5.0) == [], "expired at 0.2 s: the wait does not run to its own bound"
    assert time.monotonic() - t0 < 2.0
    assert inflight.pending() == []


def test_an_announcement_read_from_the_notices_is_waited_for_unless_it_settled_first():
    inflight = InFlight(ttl_s=60)
    inflight.announce("a", time.time())
    inflight.announce("a", time.time())  # read again at the next choice: still one registration
    assert inflight.pending() == ["a"]
    threading.Timer(0.2, inflight.settle, ("a",)).start()
    assert inflight.wait(10.0) == []
    announced = time.time() - 1.0
    inflight.settle("b")  # settled after it was announced, before the front door read the notice
    inflight.announce("b", announced)
    assert inflight.pending() == [], "a notice read after its registration settled is not waited for"
    inflight.announce("b", time.time() + 1.0)  # announced again later (the trial handed over again after a restore)
    assert inflight.pending() == ["b"]


def test_an_old_notice_keeps_its_age():
    inflight = InFlight(ttl_s=0.5)
    inflight.announce("old", time.time() - 0.45)  # its registrar has had 0.45 s of its 0.5 already
    t0 = time.monotonic()
    assert inflight.wait(5.0) == []
    assert time.monotonic() - t0 < 0.4, "forgotten at the bound counted from the announcement, not the reading"
