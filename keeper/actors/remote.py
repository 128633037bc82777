"""The one bounded remote wait of keeper, and why a wait ran out.

Every ``ray.get`` on a path a user waits on goes through :func:`get`: it has a timeout, and a timeout or a dead
actor becomes a :class:`~keeper.errors.ServiceError` that says what was awaited and the likely cause. When the
awaited work asks for resources (a task or an actor with ``num_cpus`` and the like), the message reads the
cluster (Ray's GCS: node totals, free resources, the actor table; no dashboard needed) and names the resource
and the config key to change, e.g. "the transfer task was not back within 120 s: it asks for 1 CPU and the
cluster has 0 of 2 CPU free; lower actors.transfer.num_cpus or add nodes".

:func:`infeasible` is the same reading before anything is submitted: a request no node can ever hold fails at
once instead of waiting.

Example:
    >>> need = Demand("the weight-transfer task", "actors.transfer", {"CPU": 1.0})
    >>> get(task.remote(...), 120, need)                          # doctest: +SKIP
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from keeper.errors import ServiceError

__all__ = ["Demand", "get", "infeasible", "shortfall", "demand_of", "actor_state"]

#: Ray option keys that reserve resources, and the resource each names.
_RESOURCE_KEYS = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}


@dataclass(frozen=True)
class Demand:
    """What a wait is waiting for: a label for messages, the config key that sets its resources, the resources
    it asks for, and (for an actor call) the actor's handle, whose creation state explains a wait."""

    what: str
    setting: str | None = None
    resources: Mapping[str, float] = field(default_factory=dict)
    actor: Any = None


def demand_of(what: str, kind: str, options: Mapping[str, Any], actor: Any = None) -> Demand:
    """A :class:`Demand` from one actor kind's Ray options (``ServiceConfig.actor_options(kind)``)."""
    resources = {res: float(options[key]) for key, res in _RESOURCE_KEYS.items() if options.get(key)}
    resources.update({k: float(v) for k, v in (options.get("resources") or {}).items()})
    return Demand(what, f"actors.{kind}", resources, actor)


def get(ref: Any, timeout_s: float, need: Demand | str) -> Any:
    """``ray.get(ref)`` bounded by ``timeout_s``; failures become ServiceError naming ``need`` and the cause.

    ``ref`` may be one ObjectRef or a list of them. Errors raised by the remote code itself pass through
    unchanged (they are the callee's answer, not a failure of the wait).

    Raises:
        ServiceError: the wait ran out (with the likely cause), or the actor or its node died.
    """
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    need = need if isinstance(need, Demand) else Demand(need)
    t0 = time.monotonic()
    try:
        return ray.get(ref, timeout=timeout_s)
    except GetTimeoutError:
        waited = time.monotonic() - t0
        raise ServiceError(f"keeper: {need.what} was not back within {waited:.0f} s: {_cause(need)}") from None
    except RayActorError as exc:
        raise ServiceError(f"keeper: {need.what} failed because its actor died ({type(exc).__name__}); "
                           "keeper restarts its named actors on their own (call again), or run "
                           "keeper.actors.start() if the service was shut down") from None


def _cause(need: Demand) -> str:
    """The likely reason a wait for ``need`` ran out, read off the cluster now."""
    state = actor_state(need.actor) if need.actor is not None else None
    short = shortfall(need.resources)
    fix = f"lower {need.setting}.num_cpus (or its other resources) or add nodes" if need.setting else "add nodes"
    if state == "PENDING_CREATION" or (state is None and short):
        where = f"its actor was never placed ({state})" if state else "it is most likely still pending"
        return f"{where}: {short or 'the cluster cannot place it now'}; {fix}"
    if state in ("RESTARTING", "DEPENDENCIES_UNREADY"):
        return f"its actor is {state.lower().replace('_', ' ')}; call again shortly, or check its log"
    if state == "DEAD":
        return "its actor is dead; run keeper.actors.start() again"
    return ("it was running, not waiting for resources: the work took longer than the bound; raise the "
            "matching timeouts.* setting, or check the actor's log (`ray logs`)")


def shortfall(resources: Mapping[str, float]) -> str:
    """'' when the cluster has every resource in ``resources`` free on one node now; else what is missing,
    e.g. "it asks for 1 CPU and the cluster has 0 of 2 CPU free"."""
    import ray

    if not resources:
        return ""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    free = ray.available_resources()
    for res, amount in resources.items():
        total = sum(float(n["Resources"].get(res, 0.0)) for n in nodes)
        if float(free.get(res, 0.0)) + 1e-9 < amount:
            return (f"it asks for {_amount(amount, res)} and the cluster has {_amount(free.get(res, 0.0), res)} "
                    f"of {_amount(total, res)} free")
    return ""


def infeasible(resources: Mapping[str, float]) -> str:
    """'' when some alive node could ever hold ``resources`` (free or not); else why none can."""
    import ray

    if not resources:
        return ""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if any(all(float(n.get(r, 0.0)) + 1e-9 >= a for r, a in resources.items()) for n in nodes):
        return ""
    asks = ", ".join(_amount(a, r) for r, a in resources.items())
    short = [f"largest: {_amount(most, r)}" for r, a in resources.items()
             if (most := max((float(n.get(r, 0.0)) for n in nodes), default=0.0)) + 1e-9 < a]
    why = "; ".join(short) if short else "each fits on some node, but no node has all of them"
    return f"it asks for {asks} on one node and no node of the {len(nodes)} has that much ({why})"


def actor_state(handle: Any) -> str | None:
    """The actor's state in the GCS actor table (ALIVE, PENDING_CREATION, RESTARTING, DEAD...), or None."""
    import ray

    try:
        info = ray._private.state.state.actor_table(handle._actor_id.hex())
    except Exception:  # an internal API: a missing or changed one only costs the diagnosis
        return None
    return str(info.get("State")) if info else None


def _amount(value: float, res: str) -> str:
    if res == "memory":
        return f"{float(value) / 2**30:.1f} GiB memory"
    return f"{float(value):g} {res}"
