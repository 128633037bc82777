"""The keeper service as a parent source for callers that warm in their own process.

:class:`ServiceClient` wraps the front door's handle: the service chooses the parent (it receives the child's
graph as plain arrays, kilobytes), and the transfer runs here, reading the parent's graph and weights straight
from the zoo's store (memory-mapped), so no weights pass through an actor and no Ray task waits for a CPU that
Tune trials hold. :func:`keeper.torch_support.warm_start` uses it whenever it is given a handle, or none.

Invariant: warming through a ServiceClient gives what ``Zoo(uri).warm`` gives on the same zoo (same choice, same
transfer), with the hit counted by the service's ZooManager.

Example:
    >>> client = ServiceClient(keeper.actors.start())                           # doctest: +SKIP
    >>> result = keeper.warm.warm(client, onnx_bytes, load_graph(onnx_bytes))  # doctest: +SKIP
"""

from __future__ import annotations

import os

from ray.actor import ActorHandle

from keeper.actors.remote import Demand, get
from keeper.choice.selection import ParentChoice
from keeper.errors import KeeperError
from keeper.graph import LayerGraph
from keeper.onnx_safety import ModelInput
from keeper.teams import Client
from keeper.warm import WarmResult, inherit_stored
from keeper.weights import WeightsInput

__all__ = ["ServiceClient"]


class ServiceClient:
    """A :class:`~keeper.warm.ParentSource` over the service's front door.

    Args:
        handle: the front door's handle (:func:`keeper.actors.start` or :func:`keeper.actors.connect`).
        timeout_s: the bound on the service's answer to one choice.
        what: who asks, for the message of a wait that runs out.
        client: who this process is to the zoo (:class:`keeper.teams.Client`; default from the environment):
            other teams' private models are never its parents, and its hits count for its team.
    """

    def __init__(self, handle: ActorHandle, timeout_s: float = 300.0, what: str = "warm_start",
                 client: Client | None = None):
        if not isinstance(handle, ActorHandle):
            raise KeeperError(f"ServiceClient: expected the keeper front door's Ray actor handle, got "
                              f"{type(handle).__name__}; pass keeper.actors.start() or keeper.actors.connect()")
        self.handle = handle
        self.timeout_s = float(timeout_s)
        self.what = what
        self.client = client if client is not None else Client.from_env()

    def choose(self, graph: LayerGraph, fresh: bool = False, search: str = "") -> ParentChoice:
        """The service's choice for the child ``graph`` of a trial of ``search`` (sent as its arrays: plain data);
        counts no hit."""
        ref = self.handle.choose.remote(graph.to_arrays(), False, fresh, search, self.client.to_wire())
        return get(ref, self.timeout_s, Demand(f"{self.what}: the keeper service's parent choice", actor=self.handle))

    def inherit(self, choice: ParentChoice, parent: str | None, child: ModelInput, graph: LayerGraph, *,
                weights: WeightsInput | None = None, noise: float | None = None,
                out: str | os.PathLike | None = None) -> WarmResult:
        """``child`` warmed here from ``parent`` as stored in the choice's zoo, along the service's alignment of it
        (it came with the choice)."""
        return inherit_stored(choice.uri, parent, child, child_graph=graph, child_weights=weights,
                              noise=choice.noise if noise is None else noise, seed=choice.seed, out=out,
                              restart_shrink=choice.restart_shrink, assessment=choice.assessment_of(parent))

    def hit(self, parent: str) -> None:
        """Count one use of ``parent`` in the service's zoo (fire and forget), for this client's team."""
        self.handle.hit.remote(parent, {"team": self.client.team, "user": self.client.user})
