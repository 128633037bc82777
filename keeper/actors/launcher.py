"""The one place that turns keeper's plain classes into Ray actors (and its transfer function into a Ray task),
with the options the config gives per kind: num_cpus, max_restarts, max_task_retries, max_concurrency,
resources, scheduling strategy.

The ZooManager and the Keeper front door are named, detached actors in the config's namespace, created with
``get_if_exists`` so two concurrent ``start()`` calls get the same actors. Matchers are unnamed actors owned by
the front door (they end with it, and its restart makes a new pool).

Example:
    >>> handle = start(zoo="/tmp/zoo", matchers=2)       # doctest: +SKIP
    >>> ray.get(handle.stats.remote(), timeout=30)       # doctest: +SKIP
    >>> shutdown()                                       # doctest: +SKIP
"""

from __future__ import annotations

import time
from typing import Any

from keeper.actors.config import ConfigInput, ServiceConfig, load_config
from keeper.errors import ServiceError

__all__ = ["start", "shutdown", "get_handle", "launch_manager", "launch_keeper", "launch_matcher", "transfer_task"]

_remote_classes: dict[type, Any] = {}


def _actor(cls: type, config: ServiceConfig, kind: str, **extra: Any) -> Any:
    import ray

    if cls not in _remote_classes:
        _remote_classes[cls] = ray.remote(cls)
    return _remote_classes[cls].options(**config.actor_options(kind), **extra)


def launch_manager(config: ServiceConfig) -> Any:
    """The named, detached ZooManager (the running one when it exists)."""
    from keeper.actors.manager import ZooManager

    return _actor(ZooManager, config, "zoo_manager", name=config.manager_name, namespace=config.namespace,
                  lifetime="detached", get_if_exists=True).remote(config)


def launch_keeper(config: ServiceConfig) -> Any:
    """The named, detached front door (the running one when it exists)."""
    from keeper.actors.front import Keeper

    return _actor(Keeper, config, "keeper", name=config.name, namespace=config.namespace, lifetime="detached",
                  get_if_exists=True).remote(config)


def launch_matcher(config: ServiceConfig) -> Any:
    """One Matcher actor (unnamed; owned by the caller, normally the front door)."""
    from keeper.actors.matcher import Matcher

    return _actor(Matcher, config, "matcher").remote(config.timeouts.batch_s)


def transfer_task(config: ServiceConfig) -> Any:
    """The weight transfer as a Ray remote function with the config's ``transfer`` options."""
    import ray

    from keeper.actors.transfer import warm_from_store

    return ray.remote(warm_from_store).options(**config.actor_options("transfer"))


def _ensure_ray(config: ServiceConfig) -> None:
    import ray

    if not ray.is_initialized():
        ray.init(address=config.address, namespace=config.namespace, include_dashboard=False)


def get_handle(config: ConfigInput = None, **overrides: Any) -> Any | None:
    """The running front door's handle, or None when the service is not running."""
    import ray

    cfg = load_config(config, **overrides)
    _ensure_ray(cfg)
    try:
        return ray.get_actor(cfg.name, namespace=cfg.namespace)
    except ValueError:
        return None


def start(config: ConfigInput = None, **overrides: Any) -> Any:
    """Start the keeper service, or find the running one, and return its front door's handle.

    Args:
        config: a YAML path, a mapping, a ServiceConfig, or None for the defaults (``configs/default.yaml``).
        **overrides: settings on top, e.g. ``zoo="s3://bucket/zoo"``, ``matchers=4``.

    Re-running ``start`` returns the running instance (its own settings stay in force; use ``scale`` to change
    the pool). Connects to Ray (``config.address``) when it is not initialized.

    Raises:
        ServiceError: the front door did not answer within ``timeouts.start_s``.

    Example:
        >>> keeper = start(zoo="/data/zoo", matchers=4)                 # doctest: +SKIP
        >>> ray.get(keeper.warm.remote(onnx_bytes), timeout=120).parent  # doctest: +SKIP
    """
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    cfg = load_config(config, **overrides)
    _ensure_ray(cfg)
    handle = get_handle(cfg)
    if handle is None:
        launch_manager(cfg)
        handle = launch_keeper(cfg)
    try:
        ray.get(handle.ping.remote(), timeout=cfg.timeouts.start_s)
    except GetTimeoutError:
        raise ServiceError(f"keeper: the front door {cfg.name!r} did not answer within {cfg.timeouts.start_s:.0f} s; "
                           "check the cluster has room for it (actors.keeper options) and its log") from None
    except RayActorError as exc:
        raise ServiceError(f"keeper: the front door {cfg.name!r} failed to start ({exc}); check the zoo URI "
                           f"{cfg.zoo_uri!r} and the actor's log") from None
    return handle


def shutdown(config: ConfigInput = None, **overrides: Any) -> list[str]:
    """Kill the named actors of the service (front door first, then the manager); returns the names killed.

    The zoo itself stays in its store; ``start`` again serves it.
    """
    import ray

    cfg = load_config(config, **overrides)
    if not ray.is_initialized():
        return []
    killed = []
    for name in (cfg.name, cfg.manager_name):
        try:
            handle = ray.get_actor(name, namespace=cfg.namespace)
        except ValueError:
            continue
        ray.kill(handle, no_restart=True)
        killed.append(name)
    # the names are free only once the GCS has seen the actors die; a start() before that would find them
    deadline = time.monotonic() + cfg.timeouts.control_s
    for name in killed:
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name, namespace=cfg.namespace)
            except ValueError:
                break
            time.sleep(0.1)
        else:
            raise ServiceError(f"keeper: actor {name!r} was killed but its name is still taken after "
                               f"{cfg.timeouts.control_s:.0f} s; check `ray list actors`")
    return killed
