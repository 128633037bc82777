"""Zoo: the embedded, Ray-free facade over the durable store (register / warm / remove / list).

Invariants:
    * a refused registration (bad name, bad or outlying accuracy, unreadable model, too large) stores nothing;
    * registering identical content again under its name and accuracy returns the stored record and stores
      nothing; under another name or accuracy it is refused, or aliased / updated when the caller asks so, or,
      with ``record_again`` (a Tune trial that trained the same weights again), recorded on the stored model;
    * after every successful registration the zoo's blobs fit the byte budget; eviction removes the models of
      least value per byte (value = accuracy relative to the best model of its task interface, plus decayed
      parent hits), losers of near-duplicate pairs first;
    * accuracies are compared only within a task interface (the graph's inputs and outputs past the batch axis,
      :func:`interface_of`): in a zoo several teams share, a language model's next-token accuracy of 0.3 is not an
      outlier beside image classifiers at 0.95, nor the first model to evict; records of earlier versions, which
      have no interface, count as peers of every model;
    * reopening the same URI restores every model (graphs come back from their stored arrays, not re-parsed;
      a graph stored by an older version is extracted again from its model once and stored back);
    * a model registered with its weights apart is stored as its graph (the model blob, ONNX without the
      weights' data) plus a ``weights.safetensors`` extra holding exactly the graph's data-less initializers,
      checked before anything is stored; a model registered as ONNX with weights inside is stored as one blob,
      as every record of earlier versions was. Both kinds load and warm; warming memory-maps a parent's weights.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import numpy as np

from keeper.choice.candidates import (AssessedPairs, Assessable, ParentFacts, architecture_digest, assess_found,
                                     may_qualify_all)
from keeper.choice.inheritance import Inheritances, Training
from keeper.choice.preservation import Roles, layer_roles
from keeper.choice.probe import ResultScore
from keeper.choice.selection import Candidate, ParentChoice, SelectionPolicy, make_choice, rank_parents
from keeper.errors import AdmissionError, InvalidWeightsError, ModelNotFoundError, StoreError
from keeper.graph import LayerGraph, as_graph, graph_from_proto, load_graph
from keeper.matching import MatchArrays, PackedParents, match_arrays, score_many, signature, upper_bounds
from keeper.onnx_safety import ModelInput, load_model
from keeper.onnx_weights import apart_specs
from keeper.store import ModelRecord, ModelStore, check_name, sha256
from keeper.store.stored import GRAPH_EXTRA, WEIGHTS_EXTRA, graph_blob, graph_format, graph_from_blob
from keeper.warm import DEFAULT_NOISE, WarmResult, inherit_stored, warm
from keeper.weights import WeightsInput, staged_weights

__all__ = ["Zoo", "ZooConfig"]

log = logging.getLogger(__name__)


@dataclass
class ZooConfig:
    """Every tunable of the embedded zoo (the Ray service reads the same fields from its YAML config)."""

    capacity_bytes: int | None = None     # None: unbounded
    outlier_z: float | None = 3.0          # refuse accuracies more than z std below the zoo mean; None disables
    outlier_min_models: int = 5            # the filter starts once the zoo holds this many models
    outlier_min_gap: float = 0.05          # ...and refuses only accuracies at least this far below the mean too
    hit_half_life_s: float = 7 * 24 * 3600.0
    near_duplicate: float = 0.1            # distance under which two architectures are near-duplicates
    selection: SelectionPolicy = field(default_factory=SelectionPolicy)
    noise: float = DEFAULT_NOISE
    seed: int = 0


def check_accuracy(accuracy: float, name: str) -> float:
    """Accuracy must be a finite number in [0, 1]."""
    try:
        a = float(accuracy)
    except (TypeError, ValueError):
        raise AdmissionError(f"model {name!r}: accuracy {accuracy!r} is not a number; pass a float in [0, 1]") from None
    if not math.isfinite(a) or not 0.0 <= a <= 1.0:
        raise AdmissionError(f"model {name!r}: accuracy {accuracy!r} is outside [0, 1]; pass a fraction "
                             "(e.g. 0.93, not 93 or NaN)")
    return a


def interface_of(proto: Any) -> str:
    """A model's task interface: a digest of its graph inputs' and outputs' element types and shapes past the batch
    axis (a symbolic dimension as ``?``). Models trained for one task share it; accuracies across interfaces (an
    image classifier's, a language model's next-token accuracy) are measured on different scales, so admission and
    eviction compare a model only with models of its interface."""
    weights = {i.name for i in proto.graph.initializer}

    def spec(values: Any) -> list:
        out = []
        for v in values:
            if v.name in weights:  # an initializer listed among the inputs (older exporters)
                continue
            t = v.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else "?" for d in t.shape.dim][1:]
            out.append([int(t.elem_type), dims])
        return out

    text = json.dumps([spec(proto.graph.input), spec(proto.graph.output)], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _peer(rec: ModelRecord, interface: str | None) -> bool:
    """Whether ``rec`` is compared with a model of ``interface`` (a record without one, stored by an earlier
    version, is compared with every model)."""
    theirs = rec.summary.get("interface")
    return interface is None or theirs is None or theirs == interface


class Zoo:
    """A durable zoo of trained models, usable without Ray.

    ``mode="write"`` (the default) creates the zoo when missing; ``mode="read"`` requires it
    (:class:`~keeper.errors.ZooNotFoundError`) and writes nothing but best-effort usage counts, so a zoo on a
    read-only volume or bucket lists and warms.

    Example:
        >>> zoo = keeper.Zoo("/tmp/zoo")                          # doctest: +SKIP
        >>> zoo.register(trained_onnx, accuracy=0.91, name="r18")  # doctest: +SKIP
        >>> result = zoo.warm(new_onnx)                            # doctest: +SKIP
        >>> result.parent, result.score                           # doctest: +SKIP
    """

    def __init__(self, uri: str | ModelStore | None = None, config: ZooConfig | None = None, *,
                 mode: str = "write"):
        self.store = uri if isinstance(uri, ModelStore) else ModelStore(uri, mode=mode)
        self.config = config or ZooConfig()
        self._hits_failed = False  # usage counts are best-effort: one warning, then quiet
        self._graphs: dict[str, LayerGraph] = {}
        self._arrays: dict[str, MatchArrays] = {}
        self._sigs: dict[str, np.ndarray] = {}
        self._roles: dict[str, Roles] = {}
        self._assessed = AssessedPairs()  # alignments assessed, per child architecture and stored model
        self._inheritances = Inheritances()  # the search rule: which converged parents each search took
        self.reload()

    # -- catalog
    def reload(self) -> None:
        """Re-read the catalog and every model's graph from the store."""
        self.store.reload()
        self._graphs.clear(), self._arrays.clear(), self._sigs.clear()
        for rec in self.store.records():
            self._load(rec)

    def refresh(self) -> tuple[list[str], list[str]]:
        """Take in what other processes changed in the store: re-read the catalog, load the graphs of the models
        new to this process and forget the removed ones (graphs already held are not read again). Returns
        ``(added, removed)``."""
        self.store.reload()
        names = {r.name for r in self.store.records()}
        removed = sorted(set(self._graphs) - names)
        for name in removed:
            self._forget(name)
        added = []
        for name in sorted(names - set(self._graphs)):
            try:
                self._load(self.store.record(name))
            except ModelNotFoundError:  # removed again meanwhile
                continue
            added.append(name)
        return added, removed

    def _load(self, rec: ModelRecord) -> None:
        blob = self.store.get_extra(rec.name, GRAPH_EXTRA)
        if graph_format(blob) < LayerGraph.FORMAT:
            graph = load_graph(self.store.get(rec.name))
            self._write_back(rec.name, graph)
        else:
            graph = graph_from_blob(blob)
        self._cache(rec.name, graph)

    def _forget(self, name: str) -> None:
        for d in (self._graphs, self._arrays, self._sigs, self._roles):
            d.pop(name, None)

    def _write_back(self, name: str, graph: LayerGraph) -> None:
        """Store a graph extracted again by this version, so later loads read it instead of parsing the model.
        Best effort: a store this process may not write to keeps the old graph, re-extracted on each load."""
        try:
            self.store.replace_extra(name, GRAPH_EXTRA, graph_blob(graph))
        except StoreError as exc:
            log.warning("zoo %s: model %r's graph was extracted again but could not be stored (%s); it will be "
                        "extracted again on the next load", self.uri, name, exc)

    def _cache(self, name: str, graph: LayerGraph) -> None:
        self._graphs[name] = graph
        self._arrays[name] = match_arrays(graph)
        self._sigs[name] = signature(self._arrays[name])
        self._roles.pop(name, None)

    def __len__(self) -> int:
        return len(self.store)

    def __iter__(self) -> Iterator[ModelRecord]:
        return iter(self.store.records())

    def __contains__(self, name: object) -> bool:
        return name in self.store

    @property
    def uri(self) -> str:
        return self.store.uri

    def record(self, name: str) -> ModelRecord:
        return self.store.record(name)

    def graph(self, name: str) -> LayerGraph:
        if name not in self._graphs:
            raise ModelNotFoundError(f"model {name!r} is not in the zoo at {self.uri}; `keeper zoo ls` lists them")
        return self._graphs[name]

    def names(self) -> list[str]:
        return sorted(self._graphs)

    # -- register / remove
    def register(self, model: ModelInput, accuracy: float, name: str | None = None, *,
                 weights: WeightsInput | None = None, lineage: Mapping[str, Any] | None = None,
                 alias: bool = False, update_accuracy: bool = False, record_again: bool = False) -> ModelRecord:
        """Admit a trained model with its accuracy in [0, 1]: ONNX with weights inside, or its graph (ONNX whose
        initializers hold no data, e.g. from :func:`keeper.torch_support.export_graph`) with ``weights`` apart as
        safetensors keyed by initializer name (bytes, a path, or a mapping of arrays), for models of any size.

        ``lineage``: how the model was obtained, ``WarmResult.lineage()`` of the warm start it was trained from
        (its parent, whether the warm preserved the parent's function, its structure score, whether a data probe
        chose it over the cold init). A model warmed across block structures (structure below 1) without a probe
        vouching for it, or from a parent that was, is stored as not ``clean``: the choice
        then ranks it below every clean candidate, so a model trained from a bad warm start does not become
        everyone's parent. Without ``lineage`` a model counts as clean (trained from its own init).

        Content already stored (the same model and weights) is never registered silently under other terms: again
        under its name (or without a name) with its accuracy, the stored record is returned and nothing changes;
        with another accuracy it is refused unless ``update_accuracy`` (then the stored accuracy is replaced);
        under another name it is refused unless ``alias`` (then a second record names the same blobs).
        ``record_again``: such content is the stored model trained again (a Tune trial repeating a seed): recorded
        on its record (the better accuracy kept, ``summary["trained"]`` counts, ``summary["again"]`` lists the
        last 16 names, accuracies, parents), which is returned; a retry of one of them changes nothing.

        Raises:
            AdmissionError: bad name or accuracy, an accuracy outlier, a name taken by other content, content
                already stored under other terms (see above), or a model larger than the whole capacity. Nothing
                is stored then.
            InvalidModelError: the model is not a safe, readable ONNX model.
            InvalidWeightsError: ``weights`` is unreadable, or lacks or mis-shapes a tensor the graph leaves
                without data (the message names it). Nothing is stored then.

        Example:
            >>> zoo.register("graph.onnx", 0.91, "gpt-a", weights="model.safetensors")  # doctest: +SKIP
        """
        what = f"model {name!r}" if name else "model"
        proto = load_model(model, what=what, weights_apart=weights is not None)
        specs = apart_specs(proto)
        if weights is None and specs:
            raise InvalidWeightsError(f"{what}: initializer {next(iter(specs))!r} (and {len(specs) - 1} more) has no "
                                      "data; pass the model's weights as safetensors (weights=..., --weights)")
        if weights is not None and not specs:
            raise InvalidWeightsError(f"{what}: every initializer holds its data inside the ONNX, so the weights "
                                      "given apart would be ignored; pass the graph without weights, or no weights")
        origin = self._lineage(lineage, what)
        # written beside the blobs (a local store): storing the weights is then a rename, not a copy
        with self.store.staging(WEIGHTS_EXTRA) as staged:
            wpath, wsum = staged_weights(weights, specs, f"{what} weights", staged) if specs else (None, None)
            return self._register(proto, wpath, accuracy, name, origin, alias=alias,
                                  update_accuracy=update_accuracy, record_again=record_again, wsum=wsum)

    def _lineage(self, lineage: Mapping[str, Any] | None, what: str) -> dict[str, Any] | None:
        """The stored lineage: the given one plus ``clean`` (no warm across block structures on the way here)."""
        if lineage is None:
            return None
        if not isinstance(lineage, Mapping):
            raise AdmissionError(f"{what}: lineage {lineage!r} is not a mapping; pass WarmResult.lineage() of the "
                                 "warm start the model was trained from")
        parent = lineage.get("parent")
        structure = lineage.get("structure", 1.0)
        if parent is not None and not isinstance(parent, str):
            raise AdmissionError(f"{what}: lineage parent {parent!r} is not a model name; pass WarmResult.lineage()")
        if not isinstance(structure, (int, float)) or not 0.0 <= float(structure) <= 1.0:
            raise AdmissionError(f"{what}: lineage structure {structure!r} is not a fraction in [0, 1]; pass "
                                 "WarmResult.lineage()")
        clean = True
        if parent is not None:
            parent_clean = (self.store.record(parent).summary.get("lineage", {}).get("clean", True)
                            if parent in self.store else True)
            vouched = bool(lineage.get("preserved", False)) or float(structure) >= 1.0 or bool(lineage.get("probed"))
            clean = bool(parent_clean) and vouched
        out = {"parent": parent, "preserved": bool(lineage.get("preserved", False)),
               "structure": float(structure), "probed": bool(lineage.get("probed", False)), "clean": clean}
        training = lineage.get("training")
        if training is not None:  # how its trial trained, as the Tune callback saw it (keeper.choice.inheritance)
            try:
                out["training"] = Training.from_dict(training).as_dict()
            except (TypeError, ValueError, AttributeError):
                raise AdmissionError(f"{what}: lineage training {training!r} is not a learning-curve summary; pass "
                                     "keeper.choice.inheritance.training_of(...).as_dict()") from None
        return out

    def _register(self, proto, wpath: os.PathLike | None, accuracy: float, name: str | None,
                  lineage: dict[str, Any] | None = None, *, alias: bool = False,
                  update_accuracy: bool = False, record_again: bool = False,
                  wsum: str | None = None) -> ModelRecord:
        """``wsum``: the sha256 of ``wpath`` when the caller hashed it as it wrote it."""
        blob = proto.SerializeToString()
        graph = graph_from_proto(proto)
        if wsum is None and wpath is not None:
            wsum = sha256(wpath)
        checksum = hashlib.sha256(blob).hexdigest()
        # the default name covers the weights too: one graph registered with two sets of weights is two models
        ident = checksum if wsum is None else hashlib.sha256(f"{checksum}:{wsum}".encode()).hexdigest()
        # check an explicit name first: "" must not fall back to the hash name, and a bad name must not be
        # answered with the stored record of identical content
        named = name is not None
        name = f"model-{ident[:12]}" if name is None else check_name(name)
        acc = check_accuracy(accuracy, name)
        same = [r for r in self.store.records()
                if r.checksum == checksum and r.extra_checksums.get(WEIGHTS_EXTRA) == wsum]
        if same:
            stored = next((r for r in same if r.name == name), None if named else same[0])
            if record_again:
                return self._record_again(stored or same[0], name, acc, lineage)
            if stored is not None:
                return self._again(stored, acc, update_accuracy)
            if not alias and name not in self.store:  # a name taken by other content: the store refuses it
                raise AdmissionError(
                    f"model {name!r}: this content is already stored as {same[0].name!r} (accuracy "
                    f"{same[0].accuracy:.4f}) in the zoo at {self.uri}; use that name, or register with --alias "
                    f"(Python: alias=True) to list it under {name!r} too")
        interface = interface_of(proto)
        self._check_outlier(acc, name, interface)
        cap = self.config.capacity_bytes
        size = len(blob) + (0 if wpath is None else os.path.getsize(wpath))
        if cap is not None and size > cap:
            raise AdmissionError(f"model {name!r}: {size} bytes exceeds the zoo capacity of {cap} bytes; "
                                 "raise capacity_bytes")
        extras: dict = {GRAPH_EXTRA: graph_blob(graph)}
        if wpath is not None:
            extras[WEIGHTS_EXTRA] = wpath
        rec, created = self.store.put(name, blob, accuracy=acc, num_params=graph.total_params,
                                      summary=dict(graph.summary(), interface=interface,
                                                   **({"lineage": lineage} if lineage else {})),
                                      extras=extras,
                                      content_extras=(WEIGHTS_EXTRA,) if wpath is not None else (),
                                      known_checksums={WEIGHTS_EXTRA: wsum} if wsum is not None else None)
        if created:
            self._cache(name, graph)
            self._evict(protect=name)
        return rec

    def _record_again(self, stored: ModelRecord, name: str, acc: float,
                      lineage: dict[str, Any] | None) -> ModelRecord:
        """``stored`` registered again as ``name`` with ``acc`` (see ``record_again`` in :meth:`register`)."""
        summary = dict(stored.summary)
        again = [dict(e) for e in summary.get("again", ()) if isinstance(e, dict)]
        if name == stored.name or any(e.get("name") == name for e in again):  # a retry of a recorded registration
            return stored if acc <= stored.accuracy else self.store.update(stored.name, accuracy=acc)
        again.append({"name": name, "accuracy": acc, "parent": (lineage or {}).get("parent")})
        summary["again"] = again[-16:]  # the latest registrations, a record stays small
        summary["trained"] = int(summary.get("trained", 1)) + 1
        return self.store.update(stored.name, accuracy=max(stored.accuracy, acc), summary=summary)

    def _again(self, stored: ModelRecord, acc: float, update_accuracy: bool) -> ModelRecord:
        """Stored content registered again under its own name: the stored record when the accuracy agrees, the
        record with the new accuracy when ``update_accuracy``, refused otherwise."""
        if acc == stored.accuracy:
            return stored
        if not update_accuracy:
            raise AdmissionError(f"model {stored.name!r}: this content is already stored with accuracy "
                                 f"{stored.accuracy:.4f}, not {acc:.4f}; register with --update-accuracy "
                                 "(Python: update_accuracy=True) to record the new accuracy")
        return self.store.update(stored.name, accuracy=acc)

    def _check_outlier(self, acc: float, name: str, interface: str | None = None) -> None:
        z = self.config.outlier_z
        accs = np.array([r.accuracy for r in self.store.records() if _peer(r, interface)])
        if z is None or len(accs) < self.config.outlier_min_models:
            return
        mean, std = float(accs.mean()), float(accs.std())
        # both tests: in a zoo of near-equal accuracies a tiny std makes a model 2 points below the mean a
        # "3 std" outlier, although it is as useful a parent as any
        if std > 0 and (acc - mean) / std < -z and mean - acc >= self.config.outlier_min_gap:
            raise AdmissionError(f"model {name!r}: accuracy {acc:.4f} is more than {z} std below the zoo mean "
                                 f"{mean:.4f} (std {std:.4f}, over its {len(accs)} models with this model's inputs "
                                 f"and outputs) and at least {self.config.outlier_min_gap} below it; it would not be "
                                 "a useful parent. Set outlier_z=None to admit it anyway")

    def remove(self, name: str) -> None:
        """Delete a model and its blobs."""
        if name not in self.store:
            raise ModelNotFoundError(f"model {name!r} is not in the zoo at {self.uri}; `keeper zoo ls` lists them")
        self.store.remove(name)
        self._forget(name)

    def value(self, rec: ModelRecord, now: float | None = None, best: float | None = None) -> float:
        """Eviction value: accuracy plus parent hits decayed with the configured half-life; with ``best`` (the best
        accuracy among the model's peers, the models of its task interface), the accuracy relative to it, so models
        of tasks measured on other scales compete on equal terms."""
        now = time.time() if now is None else now
        age = max(0.0, now - float(rec.summary.get("hit_time", rec.created)))
        accuracy = rec.accuracy / best if best else rec.accuracy
        return accuracy + rec.hits * 0.5 ** (age / self.config.hit_half_life_s)

    def _evict(self, protect: str) -> list[str]:
        cap = self.config.capacity_bytes
        if cap is None:
            return []
        recs = {r.name: r for r in self.store.records()}
        total = sum(r.nbytes for r in recs.values())
        if total <= cap:
            return []
        losers = self._near_duplicate_losers(protect, recs)
        now = time.time()
        best: dict[str | None, float] = {}
        for r in recs.values():
            key = r.summary.get("interface")
            best[key] = max(best.get(key, 0.0), r.accuracy)

        def value(n: str) -> float:
            return self.value(recs[n], now, best.get(recs[n].summary.get("interface")))

        order = sorted((n for n in recs if n != protect),
                       key=lambda n: (n not in losers, value(n) / max(recs[n].nbytes, 1), n))
        evicted = []
        for n in order:
            if total <= cap:
                break
            self.remove(n)
            total -= recs[n].nbytes
            evicted.append(n)
        return evicted

    def _near_duplicate_losers(self, name: str, recs: dict[str, ModelRecord]) -> set[str]:
        """Models within ``near_duplicate`` distance of ``name`` both ways, less accurate than their twin."""
        others = [n for n in recs if n != name]
        if not others:
            return set()
        me = self._arrays[name]
        fwd = score_many([self._arrays[n] for n in others], me)
        back = np.array([score_many([me], self._arrays[n])[0] for n in others])
        limit = 1.0 - self.config.near_duplicate
        out = set()
        for n, a, b in zip(others, fwd, back):
            if a >= limit and b >= limit:
                out.add(n if recs[n].accuracy <= recs[name].accuracy else name)
        out.discard(name)  # the newcomer is protected; it can still lose later
        return out

    # -- warm
    def candidates(self, child: LayerGraph | ModelInput, names: list[str] | None = None) -> list[Candidate]:
        """Every zoo model that may qualify as a parent, with its exact score, coverage and what its alignment keeps
        (``preserved``, ``structure``), and whether its lineage is ``clean`` (see :meth:`register`); assembled as
        the service assembles them (:mod:`keeper.choice.candidates`)."""
        g = as_graph(child)
        pool = names if names is not None else self.names()
        if not pool:
            return []
        ca = match_arrays(g)
        sel = self.config.selection
        bounds = upper_bounds(np.stack([self._sigs[n] for n in pool]), ca)
        totals = np.array([self._arrays[n].total for n in pool])
        keep = [n for n, ok in zip(pool, may_qualify_all(bounds, totals, ca.total, sel.floor, sel.preserve)) if ok]
        if not keep:
            return []
        scores = score_many(PackedParents.pack([self._arrays[n] for n in keep]), ca)
        recs = {r.name: r for r in self.store.records()}
        found = {n: float(s) for n, s in zip(keep, scores) if n in recs}

        def facts(name: str) -> ParentFacts:
            lineage = recs[name].summary.get("lineage", {})
            return ParentFacts(recs[name].accuracy, bool(lineage.get("clean", True)), self._arrays[name].total)

        digest = architecture_digest(ca)
        return assess_found(found, g, sel.floor, facts,
                            lambda n: Assessable(self._graphs[n], self._arrays[n], self._roles_of(n)), ca,
                            self._assessed, lambda n: (digest, n, recs[n].checksum, recs[n].created))

    def _roles_of(self, name: str) -> Roles:
        if name not in self._roles:
            self._roles[name] = layer_roles(self._graphs[name])
        return self._roles[name]

    def rank(self, child: LayerGraph | ModelInput) -> list[Candidate]:
        """The qualifying candidates for ``child``, best first (:func:`keeper.choice.selection.rank_parents`)."""
        return rank_parents(self.candidates(child), self.config.selection)

    def choose(self, graph: LayerGraph | ModelInput, fresh: bool = False, search: str = "") -> ParentChoice:
        """The parent choice for ``graph`` of a trial of ``search`` under the search rule
        (:mod:`keeper.choice.inheritance`; "" outside a search), a :class:`~keeper.warm.ParentSource` method
        that counts no hit. ``fresh``: re-read the catalog first (another process may have removed the parent)."""
        if fresh:
            self.reload()
        choice = make_choice(self.candidates(graph), self.config.selection, self.uri, self.config.noise,
                             self.config.seed, len(self))
        return self._inheritances.apply(choice, search, self._training)

    def _training(self, name: str) -> Training | None:
        return Training.from_dict(self.store.record(name).summary.get("lineage", {}).get("training"))

    def warm(self, model: ModelInput, noise: float | None = None, seed: int | None = None, *,
             weights: WeightsInput | None = None, out: str | os.PathLike | None = None,
             probe: ResultScore | None = None, graph: LayerGraph | None = None) -> WarmResult:
        """Warm-start ``model`` from the best parent in the zoo (its own weights when none qualifies).

        Args:
            model: the child: ONNX with its initial weights inside, or its graph alone (then ``weights`` holds
                its initial weights, or, when absent, the tensors the parent does not supply are ``unset``).
            seed: the transfer's seed (None: the zoo's ``seed`` setting).
            out: stream the warmed weights into this safetensors file (any size; see :func:`keeper.warm.inherit`).
            graph: ``model``'s LayerGraph when the caller has extracted it (it is not extracted again).
            probe: a data probe over warm results (lower is better; e.g. load ``result`` into your model and
                return a loss): the best ``selection.probe_top`` candidates and the cold init are scored and
                the best is kept, cold included (:func:`keeper.choice.probe.probe_choice`). Torch users pass a module
                probe or ``(batches, loss_fn)`` to :func:`keeper.torch_support.warm_start` instead.

        The result says what the choice used: ``candidates`` (score, coverage, preserved, structure per
        candidate), ``preserved`` / ``structure`` of the warm, ``probe`` and ``reason``.
        """
        proto = load_model(model, what="child model", weights_apart=weights is not None)
        graph = graph if graph is not None else graph_from_proto(proto)
        return warm(self, proto, graph, weights=weights, noise=noise, seed=seed, out=out, probe=probe)

    def inherit(self, choice: ParentChoice | None, parent: str | None, child: ModelInput,
                graph: LayerGraph | None = None, *, weights: WeightsInput | None = None, noise: float | None = None,
                out: str | os.PathLike | None = None) -> WarmResult:
        """``child`` warmed from the named zoo model (its own weights when ``parent`` is None) along ``choice``'s
        alignment of it, with its seed (the zoo's without a choice); counts no hit (a
        :class:`~keeper.warm.ParentSource` method; :func:`keeper.warm.inherit_stored` on this zoo's store).

        Raises:
            ModelNotFoundError: ``parent`` is not in the zoo.
        """
        return inherit_stored(self.store, parent, child, child_graph=graph, child_weights=weights,
                              parent_graph=self.graph(parent) if parent is not None else None,
                              noise=self.config.noise if noise is None else noise,
                              seed=self.config.seed if choice is None else choice.seed, out=out,
                              restart_shrink=1.0 if choice is None else choice.restart_shrink,
                              assessment=None if choice is None else choice.assessment_of(parent))

    def hit(self, name: str) -> None:
        """Count one use of ``name`` as a parent (decayed value for eviction). Best-effort: a zoo this process may
        not write to (a read-only volume or bucket) warns once and counts nothing; nothing else changes."""
        rec = self.store.record(name)
        now = time.time()
        summary = dict(rec.summary)
        summary["hit_time"] = now
        try:
            self.store.update(name, hits=self.value(rec, now) - rec.accuracy + 1.0, summary=summary)
        except StoreError as exc:
            if not self._hits_failed:
                log.warning("usage counts of the zoo at %s are not updated (%s)", self.uri, exc)
            self._hits_failed = True
