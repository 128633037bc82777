"""The front door of the service (:class:`FrontDoor`). Every job talks to it: ``ray.get(service.warm.remote(onnx))``.

A query parses the child once, reads the current search state (:mod:`keeper.actors.viewfeed`: a refresher thread
long-polls the ZooManager, takes in each new View as it is published and builds the state off the query path, so no
query waits on the manager or on a view of a large zoo being built; a write routed through this door takes its view
in before it returns), plans the exact two-stage search (medoids first, then the members of the closest clusters,
then any model whose signature bound beats the best found; :mod:`keeper.actors.viewsearch`), scores each stage in
parallel on the Matcher pool (one batch per matcher; ``search`` reports where the time went), assesses the
candidates as the embedded zoo does (preserved function, structure, lineage; the parents' graphs come from the
store, kept across views while a model stays in its shard), picks the parent with the selection policy, and hands
the weight transfer to a Ray task that reads the parent straight from the store. ``warm`` runs the one warm path
(:func:`keeper.warm.warm`) with this door as its parent source. The child's LayerGraph and the choice's alignment
of the parent travel to that task as flat arrays, so a warm parses the child and aligns the pair once.

Data path and sizes: parents' weights never pass through this actor. ``warm`` waits for the transfer task and
returns its WarmResult, so the *child's* warmed weights pass through this actor once (the size of the child's
initializers); ``choose`` returns the parent choice alone, for callers that warm in their own process
(:class:`keeper.actors.ServiceClient`, the path of ``keeper.warm_start``), so no weights pass through an actor.

Teams: every call takes the caller's client (:meth:`keeper.teams.Client.to_wire`). Writes go to the ZooManager with
it, which checks them; a choice leaves out the private models of other teams (the view names them), checking a
presented secret only when the view holds private models.

Plain class: the launcher makes it a detached, named Ray actor and injects what it starts (matchers, the
transfer task), so this module never imports the launcher.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
import threading
import time
from typing import Any, Callable

import numpy as np
import ray
from ray.exceptions import RayError

from keeper.actors import notices
from keeper.actors.config import ServiceConfig
from keeper.actors.inflight import InFlight
from keeper.actors.matcher import Matcher
from keeper.actors.metrics import QueryClock, ServiceMetrics
from keeper.actors.pool import MatcherPool
from keeper.actors.remote import Demand, demand_of, get, shortfall
from keeper.actors.snapshot import View
from keeper.actors.viewfeed import ViewFeed
from keeper.actors.viewsearch import SearchState, batches, plan
from keeper.choice.candidates import (AssessedPairs, Assessable, ParentFacts, architecture_digest, assess_found,
                                     may_qualify_all)
from keeper.choice.inheritance import Inheritances, Training
from keeper.choice.selection import Candidate, ParentChoice, SelectionPolicy, make_choice
from keeper.errors import ServiceError
from keeper.graph import LayerGraph, as_graph, graph_from_proto
from keeper.matching import MatchArrays, match_arrays, upper_bounds
from keeper.onnx_safety import ModelInput, load_model
from keeper.store.stored import read_parent_graph, read_training, store_for
from keeper.teams import Access, Client, Principal
from keeper.warm import WarmResult, warm

__all__ = ["FrontDoor"]

logger = logging.getLogger(__name__)

#: Cached parent choices (per zoo view and child architecture); a new view makes old entries unreachable.
_CHOICE_CACHE = 1024
#: Parents whose graph, arrays and layer roles the front door keeps for assessing alignments.
_PARENT_CACHE = 256


class FrontDoor:
    """The service's front door. Construct through :func:`keeper.actors.start` (its actor name is the config's
    ``name``).

    Example:
        >>> service = keeper.actors.start(zoo="s3://bucket/zoo?endpoint_override=...")  # doctest: +SKIP
        >>> result = ray.get(service.warm.remote(onnx_bytes), timeout=120)             # doctest: +SKIP
        >>> result.parent, result.score                                                # doctest: +SKIP
    """

    def __init__(self, config: ServiceConfig, *, spawn_matcher: Callable[[], Any],
                 transfer_task: Callable[[], Any], manager: Any = None):
        """
        Args:
            spawn_matcher: starts one Matcher actor and returns its handle (the launcher's ``launch_matcher``).
            transfer_task: returns the weight transfer as a Ray remote function with its options applied.
            manager: the ZooManager's handle (default: the named one of ``config``).
        """
        self.config = config
        self.policy = SelectionPolicy(**config.selection)
        self.manager = manager if manager is not None else ray.get_actor(config.manager_name,
                                                                          namespace=config.namespace)
        self._transfer = transfer_task()
        self._transfer_need = demand_of("the weight-transfer task", "transfer", config.actor_options("transfer"))
        self._matcher_need = demand_of("a matcher", "matcher", config.actor_options("matcher"))
        self._local = Matcher(fetch_timeout_s=config.timeouts.batch_s)
        # matchers start when the zoo is large enough for a stage to reach them (more than clustering.local_below
        # models): below that every stage is scored here, and an idle matcher process still takes CPU from trials
        self._matchers_wanted = config.matchers
        self.pool = MatcherPool(spawn_matcher, config.matchers if self._pool_needed(0) else 0,
                                config.timeouts.batch_s, self._local.score_timed)
        self.metrics = ServiceMetrics(config.name)
        self.metrics.matchers(config.matchers)
        self._views = ViewFeed(self.manager, config.timeouts.control_s, self._prefetch, self._on_size)
        self._stats_lock = threading.Lock()
        self._latencies: collections.deque[float] = collections.deque(maxlen=config.latency_window)
        self._search_latencies: collections.deque[float] = collections.deque(maxlen=config.latency_window)
        self.queries = 0
        self.registers = 0
        self.errors = 0
        self._choices: collections.OrderedDict[tuple, dict] = collections.OrderedDict()
        self._parents: collections.OrderedDict[tuple, Assessable] = collections.OrderedDict()
        self._assessed = AssessedPairs()
        self._inflight = InFlight(config.timeouts.register_s)
        self._inheritances = Inheritances()
        self._trainings: collections.OrderedDict[tuple, Training | None] = collections.OrderedDict()
        self._access: Access | None = None  # the team rules, built when a view first holds a private model
        self._views.start()

    # ------------------------------------------------------------------------------------------- public API
    def warm(self, model: ModelInput, noise: float | None = None, seed: int | None = None,
             client: dict[str, Any] | None = None) -> WarmResult:
        """Warm-start ``model`` from the best parent in the zoo (its own weights when none clears the floor) that
        ``client`` may read (:meth:`keeper.teams.Client.to_wire`; None: anyone's public models).

        The transfer runs in a Ray task; this call waits for it (bounded) and returns its WarmResult.

        Raises:
            ServiceError: a bound passed (search, transfer); InvalidModelError: ``model`` is not usable ONNX.
        """
        t0 = time.perf_counter()
        try:
            blob, graph = self._child(model)
            result = warm(_TaskSource(self, client), blob, graph, noise=noise, seed=seed)
        except Exception:
            self._count(time.perf_counter() - t0, ok=False)
            raise
        self._count(time.perf_counter() - t0, ok=True)
        return result

    def choose(self, model: ModelInput | dict[str, np.ndarray], hit: bool = False,
               fresh: bool = False, search: str = "", client: dict[str, Any] | None = None) -> ParentChoice:
        """The parent a warm start would use, without transferring weights.

        Choices are cached per architecture until the zoo changes, so a ``choose`` made ahead of time (e.g. by
        the Tune callback while a trial starts) makes the trial's own call instant.

        Args:
            model: the child: ONNX (bytes, path, ModelProto), or its graph as ``LayerGraph.to_arrays()`` (plain
                arrays) when the caller has extracted it and warms in its own process.
            hit: count a hit for the chosen parent (a caller that warms from it counts it with :meth:`hit`).
            fresh: refresh the zoo view first (the parent of an earlier choice was removed).
            search: the search the child's trial belongs to ("" outside a search): the search rule
                (:mod:`keeper.choice.inheritance`) decides what it inherits.
            client: who asks (:meth:`keeper.teams.Client.to_wire`): other teams' private models are never its
                parents; a secret it presents must be its team's.

        Returns:
            The :class:`~keeper.choice.selection.ParentChoice`; :class:`keeper.actors.ServiceClient` warms from it in
            the caller's process.
        """
        t0 = time.perf_counter()
        try:
            graph = LayerGraph.from_arrays(model) if isinstance(model, dict) else as_graph(model)
            self._read_notices(search)
            late = self._inflight.wait(self.config.timeouts.arrival_s)
            if fresh:
                self._refresh(force=True)
            choice = self._inheritances.apply(self._choose(graph, client), search, self._training)
            if late:
                choice = dataclasses.replace(choice, note=(
                    f"registrations still in flight after {self.config.timeouts.arrival_s:g} s "
                    f"(timeouts.arrival_s) were not waited for: {', '.join(late[:3])}"))
        except Exception:
            self._count(time.perf_counter() - t0, ok=False)
            raise
        if hit and choice.parent is not None:
            self.hit(choice.parent, client)
        self._count(time.perf_counter() - t0, ok=True, timed=False)
        return choice

    def settled(self, name: str) -> None:
        """``name``'s announced registration is over, registered or refused."""
        self._inflight.settle(name)

    def hit(self, name: str, client: dict[str, Any] | None = None) -> None:
        """Count one use of ``name`` as a parent by ``client``'s team (fire and forget: a lost hit only ages a model
        sooner). The secret stays here: a hit needs none."""
        self.manager.hit.remote(name, _without_secret(client))

    def search(self, child: MatchArrays | ModelInput, two_stage: bool = True) -> dict[str, Any]:
        """Scoring only: the two-stage (or, with ``two_stage=False``, whole-zoo) search for ``child``.

        Returns ``{"names", "scores", "scored", "seconds"}`` with names best first.
        """
        if not isinstance(child, MatchArrays):
            child = match_arrays(as_graph(child))
        t0 = time.perf_counter()
        clock = QueryClock()
        _, (names, scores, scored) = self._search_fresh(child, two_stage, clock)
        order = np.argsort(-scores, kind="stable")
        return {"names": [names[i] for i in order], "scores": scores[order].tolist(), "scored": scored,
                "seconds": time.perf_counter() - t0, "phases": clock.split()}

    def register(self, model: ModelInput, accuracy: float, name: str | None = None,
                 weights: bytes | None = None, lineage: dict[str, Any] | None = None,
                 record_again: bool = False, client: dict[str, Any] | None = None, team: str | None = None,
                 private: bool = False) -> dict[str, Any]:
        """Admit a trained model through the ZooManager; returns its catalog record as a dict.

        ``weights``: safetensors bytes when ``model`` is its graph without weights (models of any size). Identical
        content is stored once: again under its name and accuracy it is the stored record, so retries are safe;
        under other terms it is refused, or recorded on its model with ``record_again``; ``lineage``: how the model
        was obtained (``WarmResult.lineage()``); ``team``, ``private``: as for :meth:`keeper.zoo.Zoo.register`;
        ``client``: who registers (:meth:`keeper.teams.Client.to_wire`), checked by the manager. A registration
        announced under ``name`` (:mod:`keeper.actors.notices`) settles here, registered or refused, once the view holds the
        outcome: a choice waiting for it goes on without the driver's own ``settled`` round trip.
        """
        try:
            rec = self._manager_call("register", self.config.timeouts.register_s,
                                     _as_bytes(model, weights_apart=weights is not None), accuracy, name, weights,
                                     lineage, record_again, client, team, private)
            with self._stats_lock:
                self.registers += 1
            self._views.after_write()  # the caller's next query sees the model
        finally:
            if name is not None:
                self._inflight.settle(name)
        return rec

    def remove(self, name: str, client: dict[str, Any] | None = None) -> dict[str, Any]:
        """Move ``name`` to the holding area (its team's or an operator's right); returns the hold's summary."""
        held = self._manager_call("remove", self.config.timeouts.register_s, name, client)
        self._views.after_write()
        return held

    def restore(self, name: str, hold_id: str | None = None, as_name: str | None = None,
                client: dict[str, Any] | None = None) -> dict[str, Any]:
        """Bring a held model back with its record (its team's or an operator's right); returns the record."""
        rec = self._manager_call("restore", self.config.timeouts.register_s, name, hold_id, as_name, client)
        self._views.after_write()
        return rec

    def update(self, name: str, accuracy: float | None = None, private: bool | None = None,
               client: dict[str, Any] | None = None) -> dict[str, Any]:
        """Change a model's accuracy or privacy (its team's or an operator's right); returns the record."""
        rec = self._manager_call("update", self.config.timeouts.register_s, name, accuracy, private, client)
        self._views.after_write()
        return rec

    def held(self, client: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The models in the holding area that ``client`` may see, oldest first."""
        return self._manager_call("held", self.config.timeouts.control_s, client)

    def log(self, model: str | None = None, since: float | None = None, last: int | None = None) -> list[dict]:
        """The zoo's audit log, oldest first (:class:`keeper.store.audit.LogEntry` as dicts)."""
        return self._manager_call("log", self.config.timeouts.control_s, model, since, last)

    def gc(self, min_age_s: float = 3600.0, client: dict[str, Any] | None = None) -> dict[str, Any]:
        """Delete the holds whose retention has ended, and leftovers of killed writers."""
        return self._manager_call("gc", self.config.timeouts.register_s, min_age_s, client)

    def reload(self) -> dict[str, Any]:
        """Re-read the whole zoo from the store now: models other processes registered, removed or updated (the
        manager's catalog poll takes in additions and removals within ``CATALOG_POLL_S`` seconds anyway).
        Returns ``{"models": N}``."""
        n = self._manager_call("reload", self.config.timeouts.register_s)
        self._views.after_write(force=True)
        return {"models": n}

    def scale(self, matchers: int) -> dict[str, Any]:
        """Grow or shrink the matcher pool live, now, whatever the zoo's size; batches in flight finish (or are
        redone elsewhere)."""
        self.pool.resize(matchers)
        self._matchers_wanted = self.pool.target
        self.metrics.matchers(matchers)
        return {"matchers": self.pool.size, "target": self.pool.target}

    def stats(self) -> dict[str, Any]:
        """Service figures: models, matchers, clusters, queries, latency percentiles, and more.

        ``p50`` / ``p99``: seconds per ``warm``, end to end (over the last ``latency_window`` warms);
        ``search_p50`` / ``search_p99``: the parent search alone (``warm``, ``choose``).
        """
        view = self._refresh().view
        try:
            manager = self._manager_call("stats", self.config.timeouts.control_s)
        except ServiceError as exc:
            manager = {"error": str(exc)}
        pending = self.pool.pending()
        # matchers Ray has not placed yet do no work (batches are scored here instead); say why they wait
        why = shortfall(self._matcher_need.resources) if pending else ""
        with self._stats_lock:
            lat = np.array(self._latencies, dtype=np.float64)
            slat = np.array(self._search_latencies, dtype=np.float64)
            out = {"models": view.n, "matchers": self.pool.size, "matchers_target": self.pool.target,
                   "matchers_wanted": self._matchers_wanted,
                   "clusters": int(manager.get("clusters", view.clusters) or 0), "queries": self.queries,
                   "registers": self.registers, "errors": self.errors,
                   "p50": float(np.percentile(lat, 50)) if lat.size else None,
                   "p99": float(np.percentile(lat, 99)) if lat.size else None,
                   "search_p50": float(np.percentile(slat, 50)) if slat.size else None,
                   "search_p99": float(np.percentile(slat, 99)) if slat.size else None,
                   "matchers_pending": len(pending), "matchers_pending_why": why,
                   "matcher_deaths": self.pool.deaths, "batches_redone": self.pool.redone,
                   "local_batches": self.pool.local_batches, "view": view.key,
                   "uri": view.uri or self.config.zoo_uri,  # before the first view arrives: the zoo served
                   "manager": manager}
        return out

    def placement(self) -> list[dict[str, Any]]:
        """``ping()`` of every matcher (pid, node id): where the pool runs."""
        return self.pool.ping_all(self.config.timeouts.control_s)

    def ping(self) -> str:
        return "ok"

    def pid(self) -> int:
        return os.getpid()

    def manager_pid(self) -> int:
        return int(self._manager_call("pid", self.config.timeouts.control_s))

    # ------------------------------------------------------------------------------------------- internals
    def _read_notices(self, search: str) -> None:
        """Take in what the Tune drivers noted before the asking trial started (:mod:`keeper.actors.notices`):
        the registrations announced to this service, and ``search``'s best cold first report. A store that cannot
        be read leaves the choice to what the front door knows already (it never fails the choice)."""
        try:
            for note in notices.arriving(self.config.name, self.config.namespace, self.config.timeouts.register_s):
                self._inflight.announce(note.name, note.announced)
            bar = notices.cold_bar(self.config.name, self.config.namespace, search) if search else None
        except Exception as exc:  # the GCS unreachable for a moment: a later choice reads them again
            logger.warning("keeper: the drivers' notices could not be read (%s); this parent choice does not wait "
                           "for registrations announced in them", exc)
            return
        if bar is not None:
            self._inheritances.observe_cold_start(search, bar)

    def _manager_call(self, method: str, timeout_s: float, *args: Any) -> Any:
        need = demand_of(f"the zoo manager's {method}", "zoo_manager", self.config.actor_options("zoo_manager"),
                         self.manager)
        return get(getattr(self.manager, method).remote(*args), timeout_s, need)

    def _count(self, seconds: float, ok: bool, timed: bool = True) -> None:
        with self._stats_lock:
            self.queries += 1
            if not ok:
                self.errors += 1
            elif timed:
                self._latencies.append(seconds)
        self.metrics.query(seconds, "ok" if ok and timed else ("error" if not ok else "started"))

    def _child(self, model: ModelInput) -> tuple[bytes, LayerGraph]:
        """The child's ONNX bytes and its graph, extracted once."""
        proto = load_model(model, what="child model")
        blob = bytes(model) if isinstance(model, (bytes, bytearray)) else proto.SerializeToString()
        return blob, graph_from_proto(proto)

    def _launch(self, choice: ParentChoice, parent: str | None, blob: bytes, graph: LayerGraph,
                noise: float | None) -> Any:
        """The transfer task's ObjectRef (:func:`keeper.warm.inherit_stored`); the graph goes as flat arrays, so the
        task neither extracts it again nor unpickles an object, and the choice's assessment of the parent goes with
        it (its alignment's pairs are an array), so the task does not align the pair again."""
        return self._transfer.remote(choice.uri, parent, blob, child_graph=graph.to_arrays(),
                                     noise=choice.noise if noise is None else float(noise), seed=choice.seed,
                                     restart_shrink=choice.restart_shrink, assessment=choice.assessment_of(parent))

    def _reader(self, client: dict[str, Any] | None, view: Any) -> tuple[Principal | None, tuple]:
        """Who reads, and the key their choices are cached under: everyone alike while the view holds no private
        model (then nothing is checked), else per team and whether the team's secret was shown."""
        Client.from_wire(client).check_presentation("choosing a parent")
        if not view.private:
            return None, ()
        if self._access is None:
            self._access = Access(store_for(self.config.zoo_uri))
        reader = self._access.authenticate(client, "choosing a parent", write=False)
        return reader, (reader.team, reader.verified, reader.operator)

    def _choose(self, graph: LayerGraph, client: dict[str, Any] | None = None) -> ParentChoice:
        t0 = time.perf_counter()
        child = match_arrays(graph)
        digest = architecture_digest(child)
        current = self._refresh().view
        reader, who = self._reader(client, current)
        key = (current.key, digest, who)
        with self._stats_lock:
            cached = self._choices.get(key)
        if cached is not None:
            return cached
        state, (names, scores, _) = self._search_fresh(child, True)
        view = state.view
        if view.private and view.key != current.key:  # a newer view: who may read what may have changed
            reader, who = self._reader(client, view)
        with self._stats_lock:
            self._search_latencies.append(time.perf_counter() - t0)
        cands = self._candidates(graph, child, state, list(names), np.asarray(scores, dtype=np.float64), digest,
                                 reader)
        # the URI as configured (with any credentials it carries), not the store's redacted form
        choice = make_choice(cands, self.policy, self.config.zoo_uri, self.config.noise, self.config.seed, view.n)
        with self._stats_lock:
            self._choices[(view.key, digest, who)] = choice
            while len(self._choices) > _CHOICE_CACHE:
                self._choices.popitem(last=False)
        return choice

    def _candidates(self, graph: LayerGraph, child: MatchArrays, state: SearchState, names: list[str],
                    scores: np.ndarray, digest: bytes, reader: Principal | None = None) -> list[Candidate]:
        """The candidates the search returned, plus every weighted model that may qualify by preserved function,
        assembled as the embedded zoo assembles them (:func:`keeper.choice.candidates.assess_found`); ``digest``: the
        child's architecture, under which its assessed pairs are kept across views; ``reader``: other teams'
        private models are left out."""
        view = state.view
        if view.n == 0:
            return []
        floor = self.policy.floor
        found = dict(zip(names, (float(s) for s in scores)))
        if self.policy.preserve:
            # the search skips (or does not align) parents below the floor; those the child may grow from without
            # losing their function need exact scores. Only a weighted model no larger than the child can: bound those
            rows = np.flatnonzero(view.weighted & (view.params <= child.total))
            ok = may_qualify_all(upper_bounds(view.sigs, child, rows=rows), view.params[rows], child.total, math.inf,
                                 True)
            redo = [str(n) for n in view.names[rows[ok]].tolist() if found.get(str(n), -1.0) < floor]
            if redo:
                exact = self._score(child, state, view.positions(redo),
                                    time.monotonic() + self.config.timeouts.query_s, None)
                found.update(zip(redo, (float(s) for s in exact)))
        pos = dict(zip(found, view.positions(list(found)))) if found else {}
        found = {n: s for n, s in found.items() if view.weighted[pos[n]]}  # graph-only entries are never parents
        if view.private:
            mine = self._access.readable(reader, found, view.private) if self._access is not None else set()
            found = {n: s for n, s in found.items() if n in mine}

        def facts(name: str) -> ParentFacts:
            p = pos[name]
            return ParentFacts(float(view.accuracy[p]), view.is_clean(p), int(view.params[p]))

        def version(name: str) -> tuple:
            return _version(view, name, pos[name])

        return assess_found(found, graph, floor, facts, lambda n: self._parent(version(n)), child, self._assessed,
                            lambda n: (digest, *version(n)))

    def _training(self, name: str) -> Training | None:
        """How the zoo model ``name`` was trained (its record's learning-curve summary), read from the store once
        per version of the model (:func:`_version`)."""
        view = self._refresh().view
        version = _version(view, name, int(view.positions([name])[0]))
        with self._stats_lock:
            if version in self._trainings:
                return self._trainings[version]
        found = read_training(self.config.zoo_uri, name)
        with self._stats_lock:
            self._trainings[version] = found
            while len(self._trainings) > _PARENT_CACHE:
                self._trainings.popitem(last=False)
        return found

    def _parent(self, version: tuple) -> Assessable:
        """The graph, match arrays and layer roles of the zoo model ``version`` (:func:`_version`, its name first),
        read from the store once (a bounded LRU kept across views)."""
        with self._stats_lock:
            hit = self._parents.get(version)
            if hit is not None:
                self._parents.move_to_end(version)
                return hit
        g, _ = read_parent_graph(self.config.zoo_uri, version[0])
        entry = Assessable.of(g)
        with self._stats_lock:
            self._parents[version] = entry
            while len(self._parents) > _PARENT_CACHE:
                self._parents.popitem(last=False)
        return entry

    def _refresh(self, force: bool = False) -> SearchState:
        """The state queries read (:meth:`ViewFeed.current`): never waits unless ``force``."""
        return self._views.current(force)

    def _pool_needed(self, models: int) -> bool:
        """Whether a zoo of ``models`` can give a stage more than ``clustering.local_below`` alignments (always, at
        0: every stage goes to the pool)."""
        below = self.config.clustering.local_below
        return below <= 0 or models > below

    def _on_size(self, models: int) -> None:
        """A new view of ``models``: the metric, and the matchers once the zoo is large enough to need them."""
        self.metrics.zoo_size(models)
        if self._pool_needed(models) and self.pool.target < self._matchers_wanted:
            self.pool.resize(self._matchers_wanted)

    def _prefetch(self, new: list, every: list) -> None:
        """The shards of a new view's arrivals, fetched by the matchers and the local one ahead of queries."""
        self.pool.prefetch(new, every)
        try:
            self._local.prefetch(new)
        except RayError:
            pass  # a query fetches it then

    def _search_fresh(self, child: MatchArrays, two_stage: bool,
                      clock: QueryClock | None = None) -> tuple[SearchState, tuple]:
        """Search on the current state; once more on a forced refresh when a shard could not be read."""
        clock = clock or QueryClock()
        state = self._refresh()
        try:
            return state, self._search(child, state, two_stage, clock)
        except RayError:
            # a matcher could not read a shard (its object lost, or compacted away): fetch them all again
            with clock.phase("refresh"):
                state = self._refresh(force=True)
            return state, self._search(child, state, two_stage, clock)

    def _search(self, child: MatchArrays, state: SearchState, two_stage: bool,
                clock: QueryClock) -> tuple[list[str], np.ndarray, int]:
        """(names, scores, how many were scored) of the candidates the plan visited."""
        deadline = time.monotonic() + self.config.timeouts.query_s
        scored = [0]

        def score(pos: np.ndarray, exact: bool) -> np.ndarray:
            scored[0] += int(pos.shape[0])
            # parents below the selection floor need no alignment, except where scores rank clusters
            return self._score(child, state, pos, deadline, None if exact else self.policy.floor, clock)

        c = self.config.clustering
        pos, scores = plan(state, child, score, clusters_to_probe=c.clusters_to_probe, early_stop=c.early_stop,
                           brute_force_below=c.brute_force_below, two_stage=two_stage, clock=clock)
        return state.view.names[pos].tolist(), np.asarray(scores, dtype=np.float64), scored[0]

    def _score(self, child: MatchArrays, state: SearchState, pos: np.ndarray, deadline: float,
               floor: float | None, clock: QueryClock | None = None) -> np.ndarray:
        """Scores of the view positions ``pos``, split into one batch per matcher."""
        if not pos.shape[0]:
            return np.zeros(0)
        t = time.perf_counter()
        if pos.shape[0] <= self.config.clustering.local_below:
            # a small stage (the medoids, the few models the bounds add): a matcher's round trip costs more
            requests, order = batches(state, child, pos, 1, floor)
            results = [self._local.score_timed(*requests[0])]
            phase = "local"
        else:
            requests, order = batches(state, child, pos, self.pool.size, floor)
            results = self.pool.map(requests, deadline, method="score_timed")
            phase = "pool"
        if clock is not None:
            clock.add(phase, time.perf_counter() - t)
            clock.add("stages_n", 1)
            for k in ("fetch_s", "score_s", "gc_s"):  # the slowest matcher of the stage is what the query waits on
                clock.add(f"matcher_{k}", max(r[1][k] for r in results))
            clock.add("pairs_n", sum(r[1]["pairs_n"] for r in results))
        out = np.zeros(pos.shape[0], dtype=np.float64)
        out[np.concatenate(order)] = np.concatenate([np.asarray(r[0], dtype=np.float64) for r in results])
        return out


def _version(view: View, name: str, position: int) -> tuple:
    """What identifies one registration of ``name`` across views, for the caches of what is read or assessed from
    its graph: its registration number in the manager's incarnation, which compaction leaves alone (else its
    shard and row: a new registration under a name lands in a new shard, whose ids are never reused)."""
    if view.ident is not None:
        return name, view.incarnation, int(view.ident[position])
    return name, view.shards[int(view.shard[position])], int(view.row[position])


def _without_secret(client: dict[str, Any] | None) -> dict[str, Any] | None:
    """The client as far as a call that needs no secret may know it."""
    return None if client is None else {k: v for k, v in dict(client).items() if k != "secret"}


def _as_bytes(model: ModelInput, weights_apart: bool = False) -> bytes:
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model)
    return load_model(model, weights_apart=weights_apart).SerializeToString()


class _TaskSource:
    """The front door as a :class:`~keeper.warm.ParentSource`: it chooses here; the child inherits in the
    service's transfer task, awaited within ``timeouts.transfer_s``."""

    def __init__(self, door: FrontDoor, client: dict[str, Any] | None = None):
        self.door = door
        self.client = client

    def choose(self, graph: LayerGraph, fresh: bool = False, search: str = "") -> ParentChoice:
        if fresh:
            self.door._refresh(force=True)
        return self.door._inheritances.apply(self.door._choose(graph, self.client), search, self.door._training)

    def inherit(self, choice: ParentChoice, parent: str | None, child: ModelInput, graph: LayerGraph, *,
                weights: Any, noise: float, out: Any) -> WarmResult:
        need = self.door._transfer_need
        ref = self.door._launch(choice, parent, child, graph, noise)
        return get(ref, self.door.config.timeouts.transfer_s,
                   Demand(f"the weight-transfer task from {parent!r} (timeouts.transfer_s)", need.setting,
                          need.resources))

    def hit(self, parent: str) -> None:
        self.door.hit(parent, self.client)
