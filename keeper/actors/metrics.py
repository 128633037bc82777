"""Ray metrics of the service (``ray.util.metrics``): queries, query latency, zoo size, matcher count.

They are exported by Ray's metrics agent (Prometheus format) under the names below. Outside a Ray worker, or
when Ray's metrics cannot be created, every call is a no-op: metrics never fail a query.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ServiceMetrics", "LATENCY_BOUNDARIES_S"]

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
