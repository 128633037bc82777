"""The keeper Ray service: one ZooManager owns the zoo, a pool of Matchers scores candidates in parallel, and
the Keeper front door serves every job.

Public surface: :func:`start` (start or find the service; returns the front door's handle, whose methods are
those of :class:`Keeper`), :func:`connect` (the running one, never starting it), :func:`shutdown`,
:class:`ServiceClient` (the service as a parent source for warms that run in the caller's process), and the
settings (:class:`ServiceConfig`, :func:`load_config`).

Example:
    >>> import ray, keeper.actors
    >>> handle = keeper.actors.start(zoo="s3://bucket/zoo", matchers=4)     # doctest: +SKIP
    >>> result = ray.get(handle.warm.remote(onnx_bytes), timeout=120)       # doctest: +SKIP
    >>> ray.get(handle.register.remote(trained_bytes, 0.91, "net-a"), timeout=300)  # doctest: +SKIP
    >>> ray.get(handle.scale.remote(matchers=8), timeout=30)                 # doctest: +SKIP
    >>> ray.get(handle.stats.remote(), timeout=30)["p50"]                    # doctest: +SKIP

Modules: :mod:`config` (settings), :mod:`launcher` (the one place Ray options are applied), :mod:`front` (Keeper),
:mod:`client` (ServiceClient), :mod:`manager` (ZooManager), :mod:`matcher` and :mod:`pool` (scoring),
:mod:`snapshot` (Shard, View, ViewTable), :mod:`indexing` (k-medoids fit), :mod:`clustering` (the index and the
exact two-stage search), :mod:`viewsearch` (the front door's search state and plan), :mod:`remote` (the bounded
wait), :mod:`metrics` (and QueryClock), :mod:`cli` (``keeper serve | scale | stats``).
"""

from keeper.actors.client import ServiceClient
from keeper.actors.config import ServiceConfig, load_config
from keeper.actors.front import Keeper
from keeper.actors.launcher import connect, shutdown, start

__all__ = ["start", "connect", "shutdown", "Keeper", "ServiceClient", "ServiceConfig", "load_config"]
