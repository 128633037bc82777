"""The one place that turns keeper's plain classes into Ray actors (and its transfer function into a Ray task),
with the options the config gives per kind: num_cpus, max_restarts, max_task_retries, max_concurrency,
resources, scheduling strategy.

The ZooManager and the front door (:class:`~keeper.actors.front.FrontDoor`) are named, detached actors in the
config's namespace, created with ``get_if_exists`` so two concurrent ``start()`` calls get the same actors.
Matchers are unnamed actors owned by the front door (they end with it, and its restart makes a new pool); the front
door gets the functions that start them and the transfer task from here, so it never imports this module.

Resources: the shipped defaults reserve no CPU for any actor or for the transfer task (they wait far more than
they compute), so keeper never holds a CPU a Tune trial needs and nothing it waits on can be left unscheduled.
``start`` refuses, naming the setting, a config whose request no node of the cluster can ever hold.

Example:
    >>> handle = start(zoo="/tmp/zoo", matchers=2)       # doctest: +SKIP
    >>> ray.get(handle.stats.remote(), timeout=30)       # doctest: +SKIP
    >>> shutdown()                                       # doctest: +SKIP
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import ray

from keeper.actors.config import ACTOR_KINDS, ConfigInput, ServiceConfig, load_config
from keeper.actors.remote import demand_of, get, infeasible, shortfall
from keeper.errors import ConfigError, ServiceError

# The actors' own modules are imported where an actor is made: a Tune trial that only finds the running service
# (connect, find) must not import the front door's, the manager's and the clustering's code.

logger = logging.getLogger(__name__)

__all__ = ["start", "shutdown", "connect", "find", "check_resources", "launch_manager", "launch_front_door",
           "launch_matcher", "transfer_task"]

_remote_classes: dict[type, Any] = {}


def _actor(cls: type, config: ServiceConfig, kind: str, **extra: Any) -> Any:
    if cls not in _remote_classes:
        _remote_classes[cls] = ray.remote(cls)
    return _remote_classes[cls].options(**config.actor_options(kind), **extra)


def launch_manager(config: ServiceConfig) -> Any:
    """The named, detached ZooManager (the running one when it exists)."""
    from keeper.actors.manager import ZooManager

    return _actor(ZooManager, config, "zoo_manager", name=config.manager_name, namespace=config.namespace,
                  lifetime="detached", get_if_exists=True).remote(config)


def launch_front_door(config: ServiceConfig) -> Any:
    """The named, detached front door (the running one when it exists)."""
    from keeper.actors.front import FrontDoor

    return _actor(FrontDoor, config, "keeper", name=config.name, namespace=config.namespace, lifetime="detached",
                  get_if_exists=True).remote(config, spawn_matcher=functools.partial(launch_matcher, config),
                                             transfer_task=functools.partial(transfer_task, config))


def launch_matcher(config: ServiceConfig) -> Any:
    """One Matcher actor (unnamed; owned by the caller, normally the front door)."""
    from keeper.actors.matcher import Matcher

    return _actor(Matcher, config, "matcher").remote(config.timeouts.batch_s)


def transfer_task(config: ServiceConfig) -> Any:
    """The weight transfer (:func:`keeper.warm.inherit_stored`) as a Ray remote function with the config's
    ``transfer`` options."""
    from keeper.warm import inherit_stored

    return ray.remote(inherit_stored).options(**config.actor_options("transfer"))


def _ensure_ray(config: ServiceConfig) -> None:
    if not ray.is_initialized():
        ray.init(address=config.address, namespace=config.namespace, include_dashboard=False)


def find(config: ConfigInput = None, **overrides: Any) -> Any | None:
    """The running front door's handle, or None when the service is not running."""
    cfg = load_config(config, **overrides)
    _ensure_ray(cfg)
    try:
        return ray.get_actor(cfg.name, namespace=cfg.namespace)
    except ValueError:
        return None


def connect(config: ConfigInput = None, **overrides: Any) -> Any:
    """The running front door's handle (connecting to Ray first when needed); unlike :func:`start`, never starts
    the service.

    Raises:
        ServiceError: no keeper service of this config's name and namespace is running.
    """
    cfg = load_config(config, **overrides)
    handle = find(cfg)
    if handle is None:
        raise ServiceError(f"keeper: no service named {cfg.name!r} is running in namespace {cfg.namespace!r}; start "
                           "one with `keeper serve`, keeper.actors.start(), or KeeperCallback(...) in the Tune "
                           "run's callbacks")
    return handle


def check_resources(config: ServiceConfig) -> None:
    """Refuse a config whose actors or transfer task ask for more than any node of the cluster has; warn when
    the matchers cannot all be placed now (the pool then scores in the front door until they are).

    Raises:
        ConfigError: naming the ``actors.<kind>`` setting that no node can satisfy.
    """
    for kind in ACTOR_KINDS:
        if kind == "matcher" and config.matchers == 0:
            continue
        need = demand_of(kind, kind, config.actor_options(kind))
        why = infeasible(need.resources)
        if why:
            raise ConfigError(f"config key actors.{kind}: {why}, so keeper's {kind} could never be scheduled; "
                              f"lower actors.{kind}.num_cpus (0 is the default: keeper's actors mostly wait) or "
                              "add a node that has it")
    need = demand_of("matcher", "matcher", config.actor_options("matcher"))
    if need.resources and config.matchers:
        total = {r: a * config.matchers for r, a in need.resources.items()}
        short = shortfall(total)
        if short:
            logger.warning("keeper: %d matchers at %s each cannot all be placed now (%s); queries are scored in "
                           "the front door until they are. Set actors.matcher.num_cpus to 0 (the default) or fewer "
                           "matchers to avoid this", config.matchers, need.resources, short)


def start(config: ConfigInput = None, *, wait: bool = True, **overrides: Any) -> Any:
    """Start the keeper service, or find the running one, and return its front door's handle.

    Args:
        config: a YAML path, a mapping, a ServiceConfig, or None for the defaults (``configs/default.yaml``).
        wait: wait for the front door's first answer (bounded by ``timeouts.start_s``); False returns as soon as
            the actors are created (calls queue until they are up; the caller checks ``handle.ping``).
        **overrides: settings on top, e.g. ``zoo="s3://bucket/zoo"``, ``matchers=4``.

    Re-running ``start`` returns the running instance (its own settings stay in force; use ``scale`` to change
    the pool). Connects to Ray (``config.address``) when it is not initialized.

    Raises:
        ConfigError: a setting asks for resources no node has (named).
        ServiceError: the front door did not answer within ``timeouts.start_s`` (with the likely cause).

    Example:
        >>> keeper = start(zoo="/data/zoo", matchers=4)                 # doctest: +SKIP
        >>> ray.get(keeper.warm.remote(onnx_bytes), timeout=120).parent  # doctest: +SKIP
    """
    cfg = load_config(config, **overrides)
    _ensure_ray(cfg)
    handle = find(cfg)
    if handle is None:
        check_resources(cfg)
        launch_manager(cfg)
        handle = launch_front_door(cfg)
    if not wait:
        return handle
    need = demand_of(f"the front door {cfg.name!r} answering its first ping (timeouts.start_s; zoo "
                     f"{cfg.zoo_uri!r})", "keeper", cfg.actor_options("keeper"), handle)
    get(handle.ping.remote(), cfg.timeouts.start_s, need)
    return handle


def shutdown(config: ConfigInput = None, **overrides: Any) -> list[str]:
    """Kill the named actors of the service (front door first, then the manager); returns the names killed.

    The zoo itself stays in its store; ``start`` again serves it.
    """
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
