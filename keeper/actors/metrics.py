"""Ray metrics of the service (``ray.util.metrics``): queries, query latency, zoo size, matcher count; and where
one query's time goes (:class:`QueryClock`, with this process's GC pauses).

They are exported by Ray's metrics agent (Prometheus format) under the names below. Outside a Ray worker, or
when Ray's metrics cannot be created, every call is a no-op: metrics never fail a query.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from typing import Any, Iterator

__all__ = ["ServiceMetrics", "LATENCY_BOUNDARIES_S", "QueryClock", "gc_seconds"]

LATENCY_BOUNDARIES_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]


class ServiceMetrics:
    """The four service metrics, tagged with the service name."""

    def __init__(self, service: str):
        self._tags = {"service": service}
        self._queries = self._latency = self._models = self._matchers = None
        try:
            import ray
            from ray.util.metrics import Counter, Gauge, Histogram

            if not ray.is_initialized():
                return
            keys = ("service",)
            self._queries = Counter("keeper_queries_total", description="Warm-start queries answered.",
                                    tag_keys=keys + ("outcome",))
            self._latency = Histogram("keeper_query_latency_seconds", description="End-to-end query latency.",
                                      boundaries=LATENCY_BOUNDARIES_S, tag_keys=keys)
            self._models = Gauge("keeper_zoo_models", description="Models in the zoo.", tag_keys=keys)
            self._matchers = Gauge("keeper_matchers", description="Matcher actors in the pool.", tag_keys=keys)
        except Exception:  # metrics are an aid; a Ray without its metrics agent still serves
            self._queries = self._latency = self._models = self._matchers = None

    def _do(self, metric: Any, op: str, value: float, **tags: str) -> None:
        if metric is None:
            return
        try:
            getattr(metric, op)(value, tags={**self._tags, **tags})
        except Exception:
            pass

    def query(self, seconds: float, outcome: str = "ok") -> None:
        self._do(self._queries, "inc", 1.0, outcome=outcome)
        if outcome == "ok":
            self._do(self._latency, "observe", seconds)

    def zoo_size(self, n: int) -> None:
        self._do(self._models, "set", float(n))

    def matchers(self, n: int) -> None:
        self._do(self._matchers, "set", float(n))


# ---------------------------------------------------------------------------------------------- per query

_gc_lock = threading.Lock()
_gc_total = 0.0
_gc_started: float | None = None
_gc_installed = False


def _gc_callback(phase: str, info: dict) -> None:
    global _gc_total, _gc_started
    if phase == "start":
        _gc_started = time.perf_counter()
    elif _gc_started is not None:
        _gc_total += time.perf_counter() - _gc_started
        _gc_started = None


def gc_seconds() -> float:
    """Seconds this process has spent in the cyclic garbage collector since the first call (every thread
    stops meanwhile, so a query's share of it is a pause it waited through)."""
    global _gc_installed
    with _gc_lock:
        if not _gc_installed:
            gc.callbacks.append(_gc_callback)
            _gc_installed = True
    return _gc_total


class QueryClock:
    """Where one query's time goes: named phases (seconds, summed over repeats), counts, and the GC pauses of
    this process while it ran. Cheap (two clock reads per phase); ``split()`` is JSON.

    Example:
        >>> clock = QueryClock()
        >>> with clock.phase("plan"):
        ...     pass
        >>> sorted(clock.split())
        ['gc_s', 'plan_s', 'total_s']
    """

    def __init__(self) -> None:
        self._t0 = time.perf_counter()
        self._gc0 = gc_seconds()
        self._s: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t)

    def add(self, name: str, value: float) -> None:
        self._s[name] = self._s.get(name, 0.0) + float(value)

    def split(self) -> dict[str, float]:
        """``{"<phase>_s": seconds, ..., "gc_s": GC pauses, "total_s": since construction}``."""
        out = {(k if k.endswith(("_s", "_n")) else f"{k}_s"): v for k, v in self._s.items()}
        out["gc_s"] = gc_seconds() - self._gc0
        out["total_s"] = time.perf_counter() - self._t0
        return out
