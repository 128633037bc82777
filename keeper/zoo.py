"""Zoo: the embedded, Ray-free facade over the durable store (register / warm / remove / list).

Invariants:
    * a refused registration (bad name, bad or outlying accuracy, unreadable model, too large) stores nothing;
    * registering identical content again under its name and accuracy returns the stored record and stores
      nothing; under another name or accuracy it is refused, or aliased / updated when the caller asks so, or,
      with ``record_again`` (a Tune trial that trained the same weights again), recorded on the stored model;
    * after every successful registration the registering team's models fit its byte budget (in a zoo without
      teams: the zoo's blobs fit ``capacity_bytes``); eviction holds the team's models of least value per byte
      (value = accuracy relative to the best model of its task interface, plus decayed parent hits by every team),
      losers of near-duplicate pairs first, and never touches another team's model;
    * accuracies are compared only within a task interface (the graph's inputs and outputs past the batch axis,
      :func:`interface_of`): a language model's next-token accuracy of 0.3 is not an outlier beside image
      classifiers at 0.95, nor the first model to evict; records of earlier versions, which have no interface,
      count as peers of every model;
    * every write is checked by the zoo's team rules (:class:`keeper.teams.Access`) before anything is read or
      stored, and recorded in the store's audit log after it happened; a refused write changes nothing;
    * ``remove`` and eviction move a model to the holding area (:mod:`keeper.store.holding`), from where
      ``restore`` brings back the same record until ``gc`` deletes it once ``retention_s`` has passed; a held
      model is in no listing and never a parent;
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
from keeper.errors import (AdmissionError, ImplausibleAccuracyError, InvalidWeightsError, ModelNotFoundError,
                           StoreError)
from keeper.graph import LayerGraph, as_graph, graph_from_proto, load_graph
from keeper.matching import MatchArrays, PackedParents, match_arrays, score_many, signature, upper_bounds
from keeper.onnx_safety import ModelInput, load_model
from keeper.onnx_weights import apart_specs
from keeper.store import ModelRecord, ModelStore, check_name, sha256
from keeper.store.audit import LogEntry
from keeper.store.holding import Held
from keeper.store.stored import GRAPH_EXTRA, WEIGHTS_EXTRA, graph_blob, graph_format, graph_from_blob
from keeper.guard import Guard, check_accuracy
from keeper.teams import Client, Principal
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
    retention_s: float = 7 * 24 * 3600.0   # a removed or evicted model is held this long (a team table may say)


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

    ``client``: who this zoo's calls come from (:class:`keeper.teams.Client`: team, user, secret, read-only;
    default :meth:`Client.from_env <keeper.teams.Client.from_env>`, i.e. ``$KEEPER_TEAM``, ``$KEEPER_SECRET``...);
    each write method also takes a ``client`` of its own (the service's manager passes its caller's). In a zoo
    without teams every client may do everything, as before teams.

    Example:
        >>> zoo = keeper.Zoo("/tmp/zoo")                          # doctest: +SKIP
        >>> zoo.register(trained_onnx, accuracy=0.91, name="r18")  # doctest: +SKIP
        >>> result = zoo.warm(new_onnx)                            # doctest: +SKIP
        >>> result.parent, result.score                           # doctest: +SKIP
        >>> zoo.remove("r18"); zoo.restore("r18").name             # doctest: +SKIP
        'r18'
    """

    def __init__(self, uri: str | ModelStore | None = None, config: ZooConfig | None = None, *,
                 mode: str = "write", client: Client | None = None):
        self.store = uri if isinstance(uri, ModelStore) else ModelStore(uri, mode=mode)
        self.config = config or ZooConfig()
        self.guard = Guard(self.store, client)   # the team rules over every write (keeper.guard, keeper.teams)
        self.client = self.guard.client
        self.access = self.guard.access
        self._hits_failed = False  # usage counts are best-effort: one warning, then quiet
        self._graphs: dict[str, LayerGraph] = {}
        self._arrays: dict[str, MatchArrays] = {}
        self._sigs: dict[str, np.ndarray] = {}
        self._roles: dict[str, Roles] = {}
        self._digests: dict[str, bytes] = {}  # architecture per model, for the implausible-accuracy rule
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
        for d in (self._graphs, self._arrays, self._sigs, self._roles, self._digests):
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
        self._digests.pop(name, None)

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

    # -- who
    def _principal(self, client: Client | None, doing: str, model: str | None = None, owner: str | None = None, *,
                   write: bool = True) -> Principal:
        return self.guard.principal(client, doing, model, owner, write=write)

    def readable(self, client: Client | None = None) -> list[str]:
        """The models ``client`` (default: this zoo's) may see and warm from: all but other teams' private ones."""
        return self.guard.readable(self.names(), client)

    def _log(self, action: str, rec: ModelRecord, principal: Principal, **details: Any) -> None:
        self.guard.log(action, rec, principal, **details)

    # -- register / remove
    def register(self, model: ModelInput, accuracy: float, name: str | None = None, *,
                 weights: WeightsInput | None = None, lineage: Mapping[str, Any] | None = None,
                 alias: bool = False, update_accuracy: bool = False, record_again: bool = False,
                 team: str | None = None, private: bool = False, client: Client | None = None) -> ModelRecord:
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

        ``team``: the owning team to record (default: the client's; only an operator names another team);
        ``private``: only that team (and operators) may see and warm from it; ``client``: who registers (default:
        this zoo's). In a zoo with teams, updating, aliasing or recording on a stored model is its team's right.

        Raises:
            AdmissionError: bad name or accuracy, an accuracy outlier (below the zoo, or implausibly above every
                model of its architecture: :class:`~keeper.errors.ImplausibleAccuracyError`), a name taken by other
                content, content already stored under other terms (see above), or a model larger than the team's
                (or the zoo's) whole budget. Nothing is stored then.
            AccessError: refused by the team rules (:mod:`keeper.teams`: a read-only client, a missing or wrong
                secret, another team named, another team's model, the team's rate spent). Nothing is stored.
            InvalidModelError: the model is not a safe, readable ONNX model.
            InvalidWeightsError: ``weights`` is unreadable, or lacks or mis-shapes a tensor the graph leaves
                without data (the message names it). Nothing is stored then.

        Example:
            >>> zoo.register("graph.onnx", 0.91, "gpt-a", weights="model.safetensors")  # doctest: +SKIP
        """
        what = f"model {name!r}" if name else "model"
        # the rules first: a refused client costs no parse of its model
        principal = self._principal(client, "registering", name if isinstance(name, str) else None)
        owner = self.access.check_register(principal, name if isinstance(name, str) else "(unnamed)", team)
        self.access.check_rate(principal, name if isinstance(name, str) else None)
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
                                  update_accuracy=update_accuracy, record_again=record_again, wsum=wsum,
                                  principal=principal, owner=owner, private=private)

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
                  wsum: str | None = None, principal: Principal | None = None, owner: str | None = None,
                  private: bool = False) -> ModelRecord:
        """``wsum``: the sha256 of ``wpath`` when the caller hashed it as it wrote it; ``principal`` and ``owner``:
        who registers and for which team, as :meth:`register` checked them."""
        if principal is None:
            principal = self._principal(None, "registering", name)
            owner = self.access.check_register(principal, name or "(unnamed)", owner)
        owner = principal.team if owner is None else owner
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
                return self._record_again(stored or same[0], name, acc, lineage, principal)
            if stored is not None:
                return self._again(stored, acc, update_accuracy, principal)
            if not alias and name not in self.store:  # a name taken by other content: the store refuses it
                raise AdmissionError(
                    f"model {name!r}: this content is already stored as {same[0].name!r} (accuracy "
                    f"{same[0].accuracy:.4f}) in the zoo at {self.uri}; use that name, or register with --alias "
                    f"(Python: alias=True) to list it under {name!r} too")
            if alias and name not in self.store:  # a second listing of the stored model: its team's to make
                self.access.check_change(principal, same[0], "alias")
                owner, private = same[0].owner, same[0].private
        interface = interface_of(proto)
        self._check_outlier(acc, name, interface)
        self._check_implausible(acc, name, graph)
        size = len(blob) + (0 if wpath is None else os.path.getsize(wpath))
        cap = self.access.budget(owner, self.config.capacity_bytes, {r.owner for r in self.store.records()})
        if cap is not None and size > cap:
            if self.access.has_teams:
                raise AdmissionError(f"model {name!r}: {size} bytes exceeds the budget of team {owner!r}, {cap} bytes "
                                     "(its capacity_bytes, or its share of the zoo's); ask the operator to raise it, "
                                     "or remove models of the team")
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
                                      known_checksums={WEIGHTS_EXTRA: wsum} if wsum is not None else None,
                                      owner=owner, user=self.access.recorded_user(principal), private=private)
        if created:
            self._cache(name, graph)
            self._log("alias" if same else "register", rec, principal, accuracy=rec.accuracy,
                      checksum=rec.checksum, weights=rec.extra_checksums.get(WEIGHTS_EXTRA), private=rec.private,
                      **({"of": same[0].name} if same else {}))
            self._evict(protect=name, principal=principal)
        return rec

    def _record_again(self, stored: ModelRecord, name: str, acc: float,
                      lineage: dict[str, Any] | None, principal: Principal) -> ModelRecord:
        """``stored`` registered again as ``name`` with ``acc`` (see ``record_again`` in :meth:`register`)."""
        summary = dict(stored.summary)
        again = [dict(e) for e in summary.get("again", ()) if isinstance(e, dict)]
        if name == stored.name or any(e.get("name") == name for e in again):  # a retry of a recorded registration
            if acc <= stored.accuracy:
                return stored
            self.access.check_change(principal, stored, "record-again")
            rec = self.store.update(stored.name, accuracy=acc)
            self._log("record-again", rec, principal, accuracy=acc, before=stored.accuracy, trial=name)
            return rec
        self.access.check_change(principal, stored, "record-again")
        again.append({"name": name, "accuracy": acc, "parent": (lineage or {}).get("parent")})
        summary["again"] = again[-16:]  # the latest registrations, a record stays small
        summary["trained"] = int(summary.get("trained", 1)) + 1
        rec = self.store.update(stored.name, accuracy=max(stored.accuracy, acc), summary=summary)
        self._log("record-again", rec, principal, accuracy=rec.accuracy, before=stored.accuracy, trial=name)
        return rec

    def _again(self, stored: ModelRecord, acc: float, update_accuracy: bool, principal: Principal) -> ModelRecord:
        """Stored content registered again under its own name: the stored record when the accuracy agrees, the
        record with the new accuracy when ``update_accuracy`` (its team's right), refused otherwise."""
        if acc == stored.accuracy:
            return stored
        if not update_accuracy:
            raise AdmissionError(f"model {stored.name!r}: this content is already stored with accuracy "
                                 f"{stored.accuracy:.4f}, not {acc:.4f}; register with --update-accuracy "
                                 "(Python: update_accuracy=True) to record the new accuracy")
        self.access.check_change(principal, stored, "update")
        rec = self.store.update(stored.name, accuracy=acc)
        self._log("update", rec, principal, accuracy=acc, before=stored.accuracy)
        return rec

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

    def _check_implausible(self, acc: float, name: str, graph: LayerGraph) -> None:
        """In a zoo with teams, refuse an accuracy above every model of its architecture by more than the team
        table's ``outlier_above_gap``, once the architecture has ``outlier_min_models`` models: a model that
        claims to beat all of them by that much would become everyone's parent on a claim alone."""
        gap = self.access.outlier_above_gap()
        if gap is None:
            return
        digest = architecture_digest(match_arrays(graph))
        peers = [r.accuracy for r in self.store.records() if r.name != name and self._digest_of(r.name) == digest]
        if len(peers) < self.config.outlier_min_models or acc <= max(peers) + gap:
            return
        raise ImplausibleAccuracyError(
            f"model {name!r}: accuracy {acc:.4f} is above every one of the {len(peers)} models of its architecture "
            f"in the zoo (best {max(peers):.4f}) by more than the outlier rule allows ({gap:g}, the team table's "
            "outlier_above_gap); check the metric, or have an operator raise outlier_above_gap (`keeper team "
            "policy --outlier-above-gap ...`). Nothing was stored")

    def _digest_of(self, name: str) -> bytes | None:
        if name not in self._digests and name in self._arrays:
            self._digests[name] = architecture_digest(self._arrays[name])
        return self._digests.get(name)

    def remove(self, name: str, *, client: Client | None = None) -> Held:
        """Move a model to the holding area (its team's or an operator's right in a zoo with teams), from where
        :meth:`restore` brings it back until :meth:`gc` deletes it once ``retention_s`` has passed. Returns the
        hold.

        Raises:
            ModelNotFoundError: no such model. AccessError: refused by the team rules; nothing changed.
        """
        if name not in self.store:
            raise ModelNotFoundError(f"model {name!r} is not in the zoo at {self.uri}; `keeper zoo ls` lists them")
        _, held = self.guard.remove(name, client)
        self._forget(name)
        return held

    def restore(self, name: str, hold_id: str | None = None, *, as_name: str | None = None,
                client: Client | None = None) -> ModelRecord:
        """Bring a held model back with the record it had (weights hash, lineage, accuracy, hits); under
        ``as_name`` when its name is live again. The team's budget is kept as a registration keeps it (the team's
        other models may be evicted).

        Raises:
            HeldModelNotFoundError: no such hold. RestoreConflictError: the name is live again (nothing changed).
            AccessError: the hold is another team's (nothing changed).

        Example:
            >>> zoo.remove("r18"); zoo.restore("r18").checksum == before.checksum    # doctest: +SKIP
            True
        """
        rec, principal = self.guard.restore(name, hold_id, as_name, client)
        self._load(rec)
        self._evict(protect=rec.name, principal=principal)
        return rec

    def held(self, client: Client | None = None) -> list[Held]:
        """The models in the holding area that ``client`` may see (not other teams' private ones), oldest first."""
        return self.guard.held(client)

    def update(self, name: str, *, accuracy: float | None = None, private: bool | None = None,
               client: Client | None = None) -> ModelRecord:
        """Change a model's accuracy or privacy (its team's or an operator's right in a zoo with teams).

        Raises:
            ModelNotFoundError: no such model. AdmissionError: an accuracy outside [0, 1]. AccessError: refused
            by the team rules; nothing changed.
        """
        return self.guard.update(name, accuracy=accuracy, private=private, client=client)

    def log(self, *, model: str | None = None, since: float | None = None, last: int | None = None) -> list[LogEntry]:
        """The audit log, oldest first (:meth:`keeper.store.audit.AuditLog.entries`)."""
        return self.guard.entries(model=model, since=since, last=last)

    def gc(self, min_age_s: float = 3600.0, *, client: Client | None = None) -> tuple[int, list[Held]]:
        """Delete the holds whose retention has ended (``retention_s``: the team table's, else this zoo's config)
        and what killed writers left (:meth:`ModelStore.gc`). Returns ``(leftover files removed, holds deleted)``.

        Raises:
            AccessError: a read-only client, or in a zoo with teams a client without its team's secret.
        """
        return self.guard.gc(self.config.retention_s, min_age_s, client)

    def value(self, rec: ModelRecord, now: float | None = None, best: float | None = None) -> float:
        """Eviction value: accuracy plus parent hits decayed with the configured half-life; with ``best`` (the best
        accuracy among the model's peers, the models of its task interface), the accuracy relative to it, so models
        of tasks measured on other scales compete on equal terms."""
        now = time.time() if now is None else now
        age = max(0.0, now - float(rec.summary.get("hit_time", rec.created)))
        accuracy = rec.accuracy / best if best else rec.accuracy
        return accuracy + rec.hits * 0.5 ** (age / self.config.hit_half_life_s)

    def _evict(self, protect: str, principal: Principal | None = None) -> list[str]:
        """Hold the least valuable models of ``protect``'s team until the team fits its budget
        (:meth:`keeper.teams.Access.budget`; in a zoo without teams every model, under ``capacity_bytes``)."""
        recs = {r.name: r for r in self.store.records()}
        if protect not in recs:
            return []
        team = recs[protect].owner
        cap = self.access.budget(team, self.config.capacity_bytes, {r.owner for r in recs.values()})
        if cap is None:
            return []
        if self.access.has_teams:  # a team's admission evicts only that team's models
            recs = {n: r for n, r in recs.items() if r.owner == team}
        total = sum(r.nbytes for r in recs.values())
        if total <= cap:
            return []
        principal = principal or self._principal(None, "evicting", protect, team, write=False)
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
            self.guard.remove(n, reason="evicted", by=principal)
            self._forget(n)
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
        pool = names if names is not None else self.readable()
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

    def hit(self, name: str, client: Client | dict | None = None) -> None:
        """Count one use of ``name`` as a parent (decayed value for eviction) by ``client`` (default: this zoo's;
        any team's use counts, a read-only client's too: a hit is no change to the model). Best-effort: a zoo
        this process may not write to (a read-only volume or bucket) warns once and counts nothing; nothing else
        changes."""
        rec = self.store.record(name)
        now = time.time()
        summary = dict(rec.summary)
        summary["hit_time"] = now
        if self.access.has_teams:  # whose hits: every team's count toward the value, this says which
            team = (self.client if client is None else Client.from_wire(client)).team
            by = dict(summary.get("hits_by") or {})
            by[team] = int(by.get(team, 0)) + 1
            summary["hits_by"] = by
        try:
            self.store.update(name, hits=self.value(rec, now) - rec.accuracy + 1.0, summary=summary)
        except StoreError as exc:
            if not self._hits_failed:
                log.warning("usage counts of the zoo at %s are not updated (%s)", self.uri, exc)
            self._hits_failed = True
