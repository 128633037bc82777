"""Graph-only zoo entries for zoo-scale measurements: a ZooManager that also holds match arrays without weights.

Scoring and clustering need graphs, not weights, so ``scripts/bench_scale.py`` fills the service's zoo with
thousands of synthesised match arrays instead of exporting and storing thousands of models, and the service
tests load the matchers the same way. :class:`GraphOnlyManager` is keeper's ZooManager plus such entries;
:func:`start` runs the keeper service with it in place of the plain manager.

Invariants:
    * a graph-only entry is held in memory only (never stored, gone after a restart or ``reload``), scored and
      clustered like any model, and never chosen as a parent (``View.weighted`` is False for it), so a warm
      start never reads weights it does not have;
    * graph-only names and stored names never collide: either side refuses a name the other holds.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

from keeper.actors.config import ConfigInput, load_config
from keeper.actors.manager import ZooManager
from keeper.errors import AdmissionError
from keeper.matching import MatchArrays
from keeper.onnx_safety import ModelInput

__all__ = ["GraphOnlyManager", "start"]


class GraphOnlyManager(ZooManager):
    """ZooManager with graph-only entries (see the module docstring).

    Example:
        >>> mgr = GraphOnlyManager(load_config(zoo="/tmp/zoo"))            # doctest: +SKIP
        >>> mgr.add_graph_only(["g0", "g1"], [arrays0, arrays1])          # doctest: +SKIP
        2
    """

    def __init__(self, config: Any = None, zoo: Any = None):
        self._graph_only: dict[str, float] = {}  # name -> accuracy; set before the base class publishes
        super().__init__(config, zoo)

    def add_graph_only(self, names: Sequence[str], arrays: Sequence[MatchArrays],
                       accuracies: Sequence[float] | None = None) -> int:
        """Add match-only entries; returns how many.

        Raises:
            AdmissionError: a name is already in use, or the lists differ in length.
        """
        accuracies = list(accuracies) if accuracies is not None else [0.0] * len(names)
        if not len(names) == len(arrays) == len(accuracies):
            raise AdmissionError(f"add_graph_only: {len(names)} names, {len(arrays)} arrays and {len(accuracies)} "
                                 "accuracies; give one of each per entry")
        with self._lock:
            taken = [n for n in names if n in self._arrays]
            if taken or len(set(names)) != len(names):
                raise AdmissionError(f"add_graph_only: names already in use or repeated: {sorted(taken)[:5]}; "
                                     "graph-only names must be new and unique")
            bulk = self._index is None or len(names) > len(self._arrays)
            for n, a, acc in zip(names, arrays, accuracies):
                self._graph_only[n] = float(acc)
                if bulk:  # the re-fit below places them; skip k alignments each
                    self._arrays[n], self._accuracy[n] = a, float(acc)
                    self._pending.append(n)
                    self._number(n)
                    self._t_added.add(n)
                    self._changes += 1
                    self._dirty = True
                else:
                    self._added(n, a, float(acc))
            if bulk:
                self._index = None
        self._maybe_refit(force=bulk)
        return len(names)

    def remove_graph_only(self, names: Sequence[str] | None = None) -> int:
        """Drop graph-only entries (all of them when ``names`` is None); returns how many went."""
        with self._lock:
            gone = [n for n in (list(self._graph_only) if names is None else names) if n in self._graph_only]
            for n in gone:
                self._removed(n)
        self._maybe_refit()
        return len(gone)

    # -- the base class's writes and reads, aware of graph-only entries
    def register(self, model: ModelInput, accuracy: float, name: str | None = None,
                 weights: bytes | None = None, lineage: dict[str, Any] | None = None,
                 record_again: bool = False, *args: Any, **kwargs: Any) -> dict[str, Any]:
        with self._lock:
            if name is not None and name in self._graph_only:
                raise AdmissionError(f"model {name!r}: the name is held by a graph-only entry; remove it first "
                                     "or pick another name")
            return super().register(model, accuracy, name, weights, lineage, record_again, *args, **kwargs)

    def remove(self, name: str, client: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Delete a graph-only entry, or hold a stored model (the base class's remove)."""
        with self._lock:
            if name in self._graph_only:
                self._removed(name)
                return None
        return super().remove(name, client)

    def hit(self, name: str, client: dict[str, Any] | None = None) -> None:
        if name not in self._graph_only:  # nothing stored to count the hit on
            super().hit(name, client)

    def reload(self) -> int:
        """Re-read the whole zoo from the store; graph-only entries are dropped."""
        with self._lock:
            self._graph_only.clear()
            return super().reload()

    def _removed(self, name: str) -> None:
        self._graph_only.pop(name, None)
        super()._removed(name)

    def _weighted(self, name: str) -> bool:
        return name not in self._graph_only

    def stats(self) -> dict[str, Any]:
        s = super().stats()
        s.update(stored=s["models"] - len(self._graph_only), graph_only=len(self._graph_only))
        return s


def start(config: ConfigInput = None, **overrides: Any) -> Any:
    """:func:`keeper.actors.start` with a :class:`GraphOnlyManager` as the zoo manager; returns the front door.

    The manager is created first under the configured name (with the config's ``zoo_manager`` Ray options), so
    the launcher finds it and starts the front door, matchers and transfer tasks as usual. A running service is
    returned as it is.
    """
    import ray

    import keeper.actors as ka

    cfg = load_config(config, **overrides)
    if not ray.is_initialized():
        ray.init(address=cfg.address, namespace=cfg.namespace, include_dashboard=False)
    # this module sits beside the tests, where Ray's workers cannot import it: the class travels by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.remote(GraphOnlyManager).options(**cfg.actor_options("zoo_manager"), name=cfg.manager_name,
                                         namespace=cfg.namespace, lifetime="detached",
                                         get_if_exists=True).remote(cfg)
    return ka.start(cfg)
