"""The keeper Ray service: one ZooManager owns the zoo, a pool of Matchers scores candidates in parallel, and
the Keeper front door serves every job.

Example:
    >>> import ray, keeper.actors
    >>> handle = keeper.actors.start(zoo="s3://bucket/zoo", matchers=4)     # doctest: +SKIP
    >>> result = ray.get(handle.warm.remote(onnx_bytes), timeout=120)       # doctest: +SKIP
    >>> ray.get(handle.register.remote(trained_bytes, 0.91, "net-a"), timeout=300)  # doctest: +SKIP
    >>> ray.get(handle.scale.remote(matchers=8), timeout=30)                 # doctest: +SKIP
    >>> ray.get(handle.stats.remote(), timeout=30)["p50"]                    # doctest: +SKIP

Modules: :mod:`config` (settings), :mod:`launcher` (the one place Ray options are applied; start/shutdown),
:mod:`front` (Keeper), :mod:`manager` (ZooManager), :mod:`matcher` (Matcher), :mod:`pool` (MatcherPool),
:mod:`snapshot` (Shard, View), :mod:`indexing` (k-medoids fit), :mod:`transfer` (the weight-transfer task),
:mod:`metrics`, :mod:`cli` (``keeper serve | scale | stats``).
"""

from __future__ import annotations

from typing import Any

from keeper.actors.config import ServiceConfig, load_config
from keeper.actors.launcher import get_handle, shutdown, start

__all__ = ["start", "shutdown", "get_handle", "ServiceConfig", "load_config", "Keeper", "ZooManager", "Matcher",
           "MatcherPool", "warm_from_store"]

_LAZY = {"Keeper": "keeper.actors.front", "ZooManager": "keeper.actors.manager", "Matcher": "keeper.actors.matcher",
         "MatcherPool": "keeper.actors.pool", "warm_from_store": "keeper.actors.transfer"}


def __getattr__(name: str) -> Any:
    # the classes pull in numba and onnx; `keeper --help` should not
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'keeper.actors' has no attribute {name!r}")
