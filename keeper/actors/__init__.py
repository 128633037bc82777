"""The keeper Ray service: one ZooManager owns the zoo, a pool of Matchers scores candidates in parallel, and
the front door (:class:`FrontDoor`) serves every job.

Public surface: :func:`start` (start or find the service; returns the front door's handle, whose methods are
those of :class:`FrontDoor`), :func:`connect` (the running one, never starting it), :func:`shutdown`,
:class:`ServiceClient` (the service as a parent source for warms that run in the caller's process), and the
settings (:class:`ServiceConfig`, :func:`load_config`).

Example:
    >>> import ray, keeper.actors
    >>> service = keeper.actors.start(zoo="s3://bucket/zoo", matchers=4)     # doctest: +SKIP
    >>> result = ray.get(service.warm.remote(onnx_bytes), timeout=120)       # doctest: +SKIP
    >>> ray.get(service.register.remote(trained_bytes, 0.91, "net-a"), timeout=300)  # doctest: +SKIP
    >>> ray.get(service.scale.remote(matchers=8), timeout=30)                 # doctest: +SKIP
    >>> ray.get(service.stats.remote(), timeout=30)["p50"]                    # doctest: +SKIP

Modules: :mod:`config` (settings), :mod:`launcher` (the one place Ray options are applied), :mod:`front` (FrontDoor),
:mod:`client` (ServiceClient), :mod:`manager` (ZooManager), :mod:`matcher` and :mod:`pool` (scoring),
:mod:`snapshot` (Shard, View, ViewTable), :mod:`indexing` (k-medoids fit), :mod:`clustering` (the index and the
exact two-stage search), :mod:`viewsearch` (the front door's search state and plan), :mod:`remote` (the bounded
wait), :mod:`metrics` (and QueryClock), :mod:`cli` (``keeper serve | scale | stats``).
"""

from __future__ import annotations

from keeper.lazy import exports

__all__ = ["start", "connect", "shutdown", "FrontDoor", "ServiceClient", "ServiceConfig", "load_config"]

# Each public name is imported from its module on first use, so importing a module of this package (the CLI's
# service commands, keeper.actors.config) does not import Ray: keeper's embedded zoo and its `keeper` commands
# work where Ray is not installed.
_HOME = {"start": "launcher", "connect": "launcher", "shutdown": "launcher", "FrontDoor": "front",
         "ServiceClient": "client", "ServiceConfig": "config", "load_config": "config"}
__getattr__, __dir__ = exports(__name__, {name: f"{__name__}.{module}" for name, module in _HOME.items()})
