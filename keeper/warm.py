"""A warm start: the one orchestrator every way in ends in, and the result it builds once.

Every entry warms through :func:`warm`: a torch module (:func:`keeper.warm_start`, in any process, a Tune trial or a
Ray Train worker), the embedded zoo (:meth:`keeper.Zoo.warm`, behind the ``keeper warm`` command) and the service's
front door (``handle.warm.remote(onnx)``). They differ only in their :class:`ParentSource`: who chooses (the zoo in
this process, or the service) and where the child inherits from the chosen parent (here, reading the parent from
the store, or in the service's transfer task). A trial restored from a checkpoint of another architecture (an
exploit of population-based training) goes through :func:`restore`, the same step with the checkpoint as parent.

Invariants:
    * a result is frozen when made: its report (``candidates``, ``reason``, ``probe``) is written here, once, from
      the choice, the probe and the caller's ``note`` (why a checkpoint was not restored); loading it into a module
      adds a :class:`LoadReport` in a new result instead of patching it;
    * a warm aligns the child and its parent once: the choice's alignment and assessment of the chosen parent
      (``Candidate.assessment``) travel with the choice to :func:`inherit`, through Ray and to Ray Train's ranks too;
    * a parent hit is counted once per warm, for the parent the result came from, never for a cold result;
    * a parent removed between its choice and its transfer is chosen again, once, on a fresh choice;
    * with a probe, only qualifying candidates are scored (the first ``probe_top`` in rank order), and the cold
      init wins unless a candidate scores strictly better (:func:`keeper.choice.probe_choice`).

A model reaches :func:`inherit` as its graph (ONNX) and its weights: inline in the ONNX (models under protobuf's
2 GiB), or apart in safetensors (any size; the graph's initializers then hold no data). Weights from a file are
memory-mapped and checked against the graph before any transform; the transform streams tensor by tensor.

Weights in a WarmResult: a plain dict of child initializer name -> numpy array. Arrays are in memory, or
read-only memory-mapped views of a safetensors file the warm wrote (``out=``), or, for tensors the child keeps, the
child's own arrays. A WarmResult holds plain data only (strings, floats, numpy arrays, the child's graph bytes), so
Ray moves it with its zero-copy numpy path (arrays travel as out-of-band buffers; memory-mapped ones are read
into the object store, never pickled as objects) and no user object is pickled on the wire. A child too large to
travel whole is warmed where it is needed: :func:`inherit_stored` reads the parent straight from the store there.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

import numpy as np
import onnx

from keeper.choice.selection import SHOWN, ParentChoice, reason_of
from keeper.errors import InvalidModelError, ModelNotFoundError, PartialWarmWarning
from keeper.graph import LayerGraph, graph_from_proto
from keeper.onnx_safety import MAX_MODEL_BYTES, ModelInput, load_model
from keeper.onnx_weights import apart_specs, model_weights, write_weights
from keeper.recipe import Recipe, recipe_for
from keeper.store import ModelStore, read_parent, stored_weights
from keeper.weights import SafeTensors, SafeTensorsWriter, WeightsInput, save_weights

if TYPE_CHECKING:  # loaded where a parent is transformed or probed: a cold trial's process needs none of them
    from keeper.choice.preservation import Assessment
    from keeper.choice.probe import ProbeReport, ResultScore
    from keeper.matching import Alignment
    from keeper.transforms.compose import Transfer

__all__ = ["WarmResult", "LoadReport", "ParentSource", "warm", "restore", "restored", "inherit", "inherit_stored",
           "cold_result", "DEFAULT_NOISE"]

#: Relative std of the symmetry-breaking noise added to warmed weights unless the caller says otherwise.
DEFAULT_NOISE = 0.01


@dataclass(frozen=True)
class LoadReport:
    """What loading a warm result into a module found, as transformers' loading report says it.

    Attributes:
        missing: the module's float state_dict entries the result did not fill: they keep the module's values.
        unexpected: the result's tensors with no state_dict entry in the module: not loaded.
        mismatched: state_dict entries whose warmed value holds another number of elements than the module's
            tensor (a result warmed for another architecture): not loaded, they keep the module's values.
        reason: why the lists hold what they hold where that is expected ("" when every list is empty).
    """

    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    reason: str = ""


@dataclass(frozen=True)
class WarmResult:
    """The outcome of a warm start, frozen when made: :func:`warm` (or :func:`restore`) builds it whole, report
    included; loading it into a module adds a :class:`LoadReport` in a new result (``load``), never by patching.

    Attributes:
        parent: name of the parent model in the zoo, or None when the child keeps its own weights.
        score: similarity of the parent to the child (fraction of child parameter elements inherited).
        weights: child ONNX initializer name -> array, for every initializer (and every untied alias), except
            those named in ``unset``. Arrays may be read-only memory-mapped views (see the module docstring).
        mapping: child tensor -> (parent tensor or None, operator), operators such as ``copy``, ``widen``,
            ``kernel-pad``, ``identity``, ``zero``, ``init``.
        model: the child's ONNX bytes as given (its graph, with its own initial weights when they were inline).
        missing: tensors not inherited: the child's learned initializers that no layer holds
            (``LayerGraph.unread``: read by ops keeper has no rule for), which keep the child's values (what a
            module's loading left, in state_dict keys, is ``load.missing``).
        unset: child tensors with no value: the child came as a graph without weights and the parent supplies
            none of them (operator ``init``); the caller's own initialisation fills them.
        preserved: the child is a function-preserving growth of the parent (see :mod:`keeper.choice.preservation`).
        structure: share of the inherited elements mapped block onto block (0 without a parent).
        candidates: what the choice used on each candidate, best ranked first (``Candidate.as_dict()``: name,
            score, coverage, preserved, structure, fit, accuracy, clean).
        probe: the data probe's report (``ProbeReport.as_dict()``) when one ran, else None.
        reason: why this parent, or why none (one sentence).
        shrink: the share of the parent's weights a restart kept (shrink and perturb: ``restart_shrink`` of
            :func:`inherit`); 1.0 when the whole of them was kept, and for every warm that is not a restart.
        load: what loading the result into a torch module found (:class:`LoadReport`), None until it is loaded.
        seconds: where ``warm_start``'s time went, by phase (``connect``: the config, the example input and finding
            the zoo or service, ``trace``, ``choose``: the parent choice, its wait for registrations in flight
            included, ``inherit``: restoring a checkpoint or the transfer and any probe, ``load``, ``save``: the
            files a trial leaves); they sum to the call's time; empty for a result not made by ``warm_start``.
    """

    parent: str | None
    score: float
    weights: dict[str, np.ndarray]
    mapping: dict[str, tuple[str | None, str]]
    model: bytes = b""
    missing: list[str] = field(default_factory=list)
    unset: list[str] = field(default_factory=list)
    preserved: bool = False
    structure: float = 0.0
    candidates: list[dict[str, Any]] = field(default_factory=list)
    probe: dict[str, Any] | None = None
    reason: str = ""
    shrink: float = 1.0
    load: LoadReport | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    def lineage(self) -> dict[str, Any]:
        """How this child was obtained, for :meth:`keeper.Zoo.register` (``lineage=``): its parent, whether
        the warm preserved the parent's function, its structure score, and whether a data probe chose it over the
        cold init."""
        given = next((c.get("accuracy") for c in self.candidates if c.get("name") == self.parent), None)
        return {"parent": self.parent, "preserved": bool(self.preserved), "structure": float(self.structure),
                "probed": bool(self.probe and self.probe.get("chosen") is not None),
                "parent_accuracy": None if given is None else float(given)}

    def recipe(self, total_steps: int, ramp: float | None = None) -> Recipe:
        """The learning-rate recipe of this warm start for a run of ``total_steps`` optimizer steps
        (:mod:`keeper.recipe`): for a restart on the parent's own architecture a factor that starts low and ramps
        back to the caller's schedule; 1.0 at every step otherwise."""
        return recipe_for(self.parent, self.score, self.preserved, total_steps, ramp)

    def lr_factor(self, step: int, total_steps: int) -> float:
        """The factor to multiply into the learning rate at optimizer step ``step`` (0-based) of a run of
        ``total_steps``: 1.0 at every step of a cold result. See :meth:`recipe`."""
        return self.recipe(total_steps).factor(step)

    def to_onnx(self) -> onnx.ModelProto:
        """The child model with the warmed initializers (models under protobuf's 2 GiB; larger ones:
        :meth:`save_weights` next to the graph in ``model``).

        Raises:
            InvalidModelError: the weights exceed what one ONNX file can hold, or some tensors are ``unset``.
        """
        if self.unset:
            raise InvalidModelError(f"warm result: {len(self.unset)} tensors have no value (first: {self.unset[0]!r})"
                                    ": the child came without weights; save_weights() writes the warmed ones")
        size = sum(int(np.asarray(v).nbytes) for v in self.weights.values())
        if size > MAX_MODEL_BYTES:
            raise InvalidModelError(f"warm result: {size} bytes of weights do not fit one ONNX file (protobuf's "
                                    "2 GiB); write them with save_weights(path) and keep the graph apart")
        return write_weights(load_model(self.model, what="child model"), self.weights)

    def save_weights(self, path: str | os.PathLike) -> None:
        """Write ``weights`` as a safetensors file, one tensor at a time (any size, dtypes kept)."""
        save_weights(self.weights, path)

    def summary(self) -> dict[str, Any]:
        """Counts of child tensors per operator, and the share of tensors that came from the parent."""
        ops = Counter(op for _, op in self.mapping.values())
        inherited = sum(1 for src, _ in self.mapping.values() if src is not None)
        return {"parent": self.parent, "score": round(float(self.score), 6), "tensors": len(self.mapping),
                "from_parent": inherited, "operators": dict(sorted(ops.items())), "preserved": bool(self.preserved),
                "structure": round(float(self.structure), 6), "reason": self.reason}


class ParentSource(Protocol):
    """Where parents come from: it chooses, makes the child inherit from a named parent, and counts hits.

    Implemented by :class:`keeper.Zoo` (all in this process), :class:`keeper.actors.ServiceClient` (the service
    chooses, the child inherits in this process from the store), the front door itself (its transfer task), and a
    trial's stand-in for an empty zoo before the service has started (``torch_support.start._EmptyZoo``: nothing to
    choose from).
    """

    def choose(self, graph: LayerGraph, fresh: bool = False, search: str = "") -> ParentChoice:
        """The parent choice for the child ``graph`` of a trial of ``search`` ("" outside a search), under the
        search rule (:mod:`keeper.choice.inheritance`); ``fresh``: re-read the zoo first. Counts no hit."""

    def inherit(self, choice: ParentChoice, parent: str | None, child: ModelInput, graph: LayerGraph, *,
                weights: WeightsInput | None, noise: float, out: str | os.PathLike | None) -> WarmResult:
        """``child`` warmed from ``parent`` (its own weights when None) along the choice's alignment of it, with no
        report yet (:func:`warm` writes it). Counts no hit.

        Raises:
            ModelNotFoundError: ``parent`` is no longer in the zoo.
        """

    def hit(self, parent: str) -> None:
        """Count one use of ``parent`` (best effort)."""


def warm(source: ParentSource, child: ModelInput, graph: LayerGraph, *, weights: WeightsInput | None = None,
         noise: float | None = None, seed: int | None = None, out: str | os.PathLike | None = None,
         probe: ResultScore | None = None, choice: ParentChoice | None = None, count: bool = True,
         note: str = "", search: str = "") -> WarmResult:
    """``child`` (its ONNX, and its LayerGraph ``graph``) warmed from the parent ``source`` chooses.

    Args:
        weights: the child's initial weights when ``child`` is its graph alone.
        noise: relative std of symmetry-breaking noise (None: the choice's, i.e. the zoo's setting).
        seed: the transfer's seed (None: the choice's).
        out: stream the warmed weights into this safetensors file.
        probe: a score over WarmResults (lower is better): the qualifying candidates the choice ranks first and
            the cold init are scored and the best kept (see :mod:`keeper.choice.probe`).
        choice: a choice already made (a Ray Train rank receives rank 0's); None: ``source.choose(graph)``.
        count: count the parent hit (False on all but one rank of a Ray Train trial).
        note: what the reason says first (why a trial's checkpoint was not restored), joined by "; ".
        search: the search the child's trial belongs to ("" outside a search; see :meth:`ParentSource.choose`).

    Example:
        >>> result = warm(zoo, onnx_bytes, keeper.load_graph(onnx_bytes))  # doctest: +SKIP
        >>> result.parent, result.reason                                   # doctest: +SKIP
    """
    for attempt in (0, 1):
        choice = choice if choice is not None else source.choose(graph, fresh=attempt > 0, search=search)
        if seed is not None:
            choice = dataclasses.replace(choice, seed=int(seed))
        try:
            result = _warm_chosen(source, choice, child, graph, weights, noise, out, probe, note)
            break
        except ModelNotFoundError:
            if attempt:
                raise
            choice = None  # removed or evicted after it was chosen: choose again on a fresh view of the zoo
    if count and result.parent is not None:
        source.hit(result.parent)
    return result


def _warm_chosen(source: ParentSource, choice: ParentChoice, child: ModelInput, graph: LayerGraph,
                 weights: WeightsInput | None, noise: float | None, out: str | os.PathLike | None,
                 probe: ResultScore | None, note: str) -> WarmResult:
    level = choice.noise if noise is None else float(noise)

    def make(name: str | None, to: Any = None) -> WarmResult:
        return source.inherit(choice, name, child, graph, weights=weights, noise=level, out=to)

    ranked = choice.ranked()
    if probe is None or not ranked:
        return _reported(make(choice.parent, out), choice, None, note)
    from keeper.choice.probe import probe_choice

    result, measured = probe_choice(ranked, make, lambda: make(None), probe, choice.probe_top)
    if out is not None:  # the probe ran in memory; the winner is made again into the file
        result = make(result.parent, out)
    return _reported(result, choice, measured, note)


def _reported(result: WarmResult, choice: ParentChoice, probe: ProbeReport | None, note: str) -> WarmResult:
    """The result as it leaves :func:`warm`: the transfer's, with the report of the choice and the probe (the one
    place a report is written)."""
    reason = probe.reason if probe is not None else reason_of(choice)
    return dataclasses.replace(result, candidates=[c.as_dict() for c in choice.candidates[:SHOWN]],
                               reason=f"{note}; {reason}" if note else reason,
                               probe=probe.as_dict() if probe is not None else None)


def restore(checkpoint: ModelInput, name: str, child: ModelInput, graph: LayerGraph, *,
            checkpoint_weights: WeightsInput | None = None, weights: WeightsInput | None = None, noise: float,
            seed: int = 0, note: str = "") -> WarmResult:
    """``child`` warmed from a trial's checkpoint of another architecture (its ``checkpoint`` graph and
    ``checkpoint_weights``, labelled ``name``), not from a zoo parent: what population-based training's exploit
    across architectures needs. The checkpoint is not chosen, so it is aligned here, once; ``note`` comes first in
    the reason, as for :func:`warm`."""
    result = inherit(checkpoint, child, parent_weights=checkpoint_weights, parent_name=name, child_weights=weights,
                     child_graph=graph, noise=noise, seed=seed)
    reason = (f"restored from {name}, another architecture, by keeper's transforms (similarity {result.score:.2f}"
              f"{', function preserved' if result.preserved else ''})")
    return dataclasses.replace(result, reason=f"{note}; {reason}" if note else reason)


def restored(name: str, note: str = "") -> WarmResult:
    """The result of a checkpoint ``name`` of the child's own architecture, which the caller loads exactly (a
    plain copy, as Tune's PBT does; nothing to transform): its whole function kept."""
    reason = f"restored from {name}: the same architecture, loaded exactly"
    return WarmResult(name, 1.0, {}, {}, preserved=True, structure=1.0,
                      reason=f"{note}; {reason}" if note else reason)


def _read(model: ModelInput, weights: WeightsInput | None, what: str,
          child: bool = True) -> tuple[onnx.ModelProto, dict, list[str]]:
    """The checked proto, its weights, and, for a child, the data-less initializers that got no value (a zero
    broadcast to the shape stands in, so the transform sees shape and dtype; it takes no memory). A parent's
    weights must all be there."""
    proto = load_model(model, what=what, weights_apart=weights is not None)
    if weights is not None or not child or not apart_specs(proto):
        return proto, model_weights(proto, weights, what), []
    arrays = model_weights(_without_apart(proto), None, what)
    specs = apart_specs(proto)
    arrays.update({k: np.broadcast_to(np.zeros((), dtype), shape) for k, (dtype, shape) in specs.items()})
    return proto, arrays, sorted(specs)


def _without_apart(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A model holding only ``proto``'s initializers that have data (to read them)."""
    apart = apart_specs(proto)
    light = onnx.ModelProto()
    light.graph.initializer.extend(t for t in proto.graph.initializer if t.name not in apart)
    return light


def cold_result(child: ModelInput, child_weights: WeightsInput | None = None, *,
                out: str | os.PathLike | None = None, graph: LayerGraph | None = None) -> WarmResult:
    """The child's own weights, no parent (``out``: also written there as safetensors, ``unset`` ones as zeros,
    as :func:`inherit` writes them; ``graph``: the child's, when the caller has extracted it)."""
    proto, weights, unset = _read(child, child_weights, "child model")
    graph = graph if graph is not None else graph_from_proto(proto)
    mapping = {r.key: (None, "init") for refs in graph.tensors for r in refs}
    _add_aliases(graph, weights)
    if out is not None:
        specs = {k: (v.dtype, v.shape) for k, v in weights.items()}
        with SafeTensorsWriter(out, specs, missing_as_zeros=bool(unset)) as w:
            for k, v in weights.items():
                if k not in unset:
                    w.write(k, v)
        weights = dict(SafeTensors(out, "child weights"))
    for k in unset:
        weights.pop(k, None)
    return WarmResult(None, 0.0, weights, mapping, proto.SerializeToString(), unset=unset)


def inherit(parent: ModelInput, child: ModelInput, *, parent_weights: WeightsInput | None = None,
            child_weights: WeightsInput | None = None, parent_name: str | None = None,
            parent_graph: LayerGraph | None = None, child_graph: LayerGraph | None = None,
            alignment: Alignment | None = None, assessment: Assessment | None = None, noise: float = DEFAULT_NOISE,
            seed: int = 0, out: str | os.PathLike | None = None, restart_shrink: float = 1.0) -> WarmResult:
    """``child`` warmed from the given ``parent`` (ONNX bytes, paths or ModelProtos, each with its weights inline
    or apart): the step after a choice, with no report (:func:`warm` writes it).

    Args:
        parent_weights / child_weights: safetensors bytes, a path (memory-mapped) or a mapping of arrays, for the
            initializers a graph holds without data; checked against the graph (names, dtypes, dims) first. A
            child given as a graph without weights keeps nothing of its own: tensors the parent does not supply
            are listed in ``unset``.
        alignment: the two graphs' alignment when the caller has it (aligned here otherwise).
        assessment: the choice's assessment of the pair (:attr:`keeper.choice.Candidate.assessment`): its alignment
            and what it keeps are used as they are, so the pair is neither aligned nor assessed again; one made on
            other graphs than these (:meth:`~keeper.choice.Assessment.fits`) is not used.
        out: write the child's weights to this safetensors file as they are made (peak memory: one tensor);
            the result's ``weights`` are then memory-mapped views of it.
        restart_shrink: for a restart only (the child is the parent's own architecture, its whole function
            inherited), the share of the parent's weights kept: each learned tensor becomes ``restart_shrink x
            parent + (1 - restart_shrink) x the child's own`` (shrink and perturb, :mod:`keeper.transforms.shrink`);
            the result is then not ``preserved`` and reports ``shrink``. 1.0 keeps the whole function.

    Raises:
        InvalidWeightsError: a weights file is unreadable or does not fit its graph (nothing is transformed).

    Example:
        >>> r = inherit(parent_bytes, child_bytes, noise=0.0)  # doctest: +SKIP
        >>> r.score, r.summary()["operators"]                  # doctest: +SKIP
    """
    from keeper.choice.preservation import assess
    from keeper.matching import align
    from keeper.transforms import transfer
    from keeper.transforms.shrink import mixer

    if not (noise >= 0.0 and np.isfinite(noise)):
        raise ValueError(f"noise must be a finite relative std >= 0, got {noise!r}")
    pproto, pweights, _ = _read(parent, parent_weights, "parent model", child=False)
    cproto, cweights, unset = _read(child, child_weights, "child model")
    pg = parent_graph or graph_from_proto(pproto)
    cg = child_graph or graph_from_proto(cproto)
    if assessment is not None and assessment.fits(pg, cg):
        al, fit = assessment.alignment, assessment
    else:
        al = alignment or align(pg, cg)
        fit = assess(pg, cg, al)
    model = cproto.SerializeToString()
    shrink = float(restart_shrink) if fit.preserved and al.score >= 1.0 - 1e-9 and restart_shrink < 1.0 else 1.0
    # a restart inherits every tensor it has, so the mix needs no provenance and can run as the transfer streams
    mix = mixer(cg, cweights, shrink, lambda key: True) if shrink < 1.0 else None
    if out is None:
        moved = transfer(pg, pweights, cg, cweights, al, noise=noise, seed=seed)
        weights = dict(cweights)
        weights.update({k: mix(k, v) for k, v in moved.weights.items()} if mix else moved.weights)
    else:
        moved = _transfer_to_file(pg, pweights, cg, cweights, al, noise, seed, out, set(unset), mix)
        weights = dict(SafeTensors(out, "warmed weights"))  # read-only memory-mapped views
    unset = [k for k in unset if moved.provenance.get(k, (None, "init"))[1] == "init"]
    for k in unset:
        weights.pop(k, None)
    if moved.unkept:  # constant zeros of a bias built from pieces could not take the transform's values
        warnings.warn(PartialWarmWarning(
            f"warm: the transform gave non-zero values to the constant zero rows of {len(moved.unkept)} layers' "
            f"biases built from pieces ({', '.join(moved.unkept[:3])}); those rows stay zero, so the warmed "
            "child does not compute the transform's function"))
    # learned tensors no layer holds (an op keeper has no rule for) keep the child's values: say which
    return WarmResult(parent_name, al.score, weights, moved.provenance, model, missing=sorted(cg.unread),
                      unset=unset, preserved=fit.preserved and not moved.unkept and shrink == 1.0,
                      structure=fit.structure, shrink=shrink)


def inherit_stored(store: ModelStore | str, parent: str | None, child: ModelInput, *,
                   child_graph: LayerGraph | dict[str, np.ndarray] | None = None,
                   child_weights: WeightsInput | None = None, parent_graph: LayerGraph | None = None,
                   noise: float = DEFAULT_NOISE, seed: int = 0, out: str | os.PathLike | None = None,
                   restart_shrink: float = 1.0, assessment: Assessment | None = None) -> WarmResult:
    """:func:`inherit` from the zoo model ``parent`` as ``store`` holds it (the child's own weights when None),
    wherever the caller runs: the embedded zoo, a Tune trial, the service's transfer task. The parent's weights are
    memory-mapped there (a local file for a local store, a verified copy streamed from an object store), so they
    never pass through an actor.

    Args:
        store: the zoo's :class:`~keeper.store.ModelStore`, or its URI (one store per URI and process; a model
            missing from it is looked up once more in a fresh one, as it may have been registered since).
        child_graph: the child's LayerGraph (or its ``to_arrays()``, as a Ray task receives it) when the caller
            has extracted it, so it is not extracted twice.
        parent_graph: the parent's LayerGraph when the caller holds it (read from the store otherwise).
        assessment: the choice's assessment of the pair (see :func:`inherit`).

    Raises:
        ModelNotFoundError: ``parent`` is not in the store (removed or evicted since it was chosen).
    """
    if isinstance(child_graph, dict):
        child_graph = LayerGraph.from_arrays(child_graph)
    if parent is None:
        return cold_result(child, child_weights, out=out, graph=child_graph)
    if isinstance(store, ModelStore):
        blob, graph, weights = store.get(parent), parent_graph, stored_weights(store, parent)
    else:
        blob, graph, weights = read_parent(store, parent)
        graph = parent_graph if parent_graph is not None else graph
    return inherit(blob, child, parent_weights=weights, child_weights=child_weights, parent_name=parent,
                   parent_graph=graph, child_graph=child_graph, assessment=assessment, noise=noise, seed=seed,
                   out=out, restart_shrink=restart_shrink)


def _transfer_to_file(pg, pweights, cg, cweights: Mapping[str, np.ndarray], al, noise, seed,
                      out, unset: set[str], mix: Callable[[str, np.ndarray], np.ndarray] | None = None) -> Transfer:
    """The transfer with each child tensor written to ``out`` as it is made (through ``mix`` when given); tensors
    no layer reads (not in the LayerGraph) are copied from the child afterwards. ``unset`` tensors the parent does
    not supply are left as zeros in the file (never materialised)."""
    from keeper.transforms import transfer

    specs = {k: (np.asarray(v).dtype, np.shape(v)) for k, v in cweights.items()}
    for refs in cg.tensors:
        for r in refs:
            if r.key not in specs and r.source in specs:  # an untied alias gets a tensor of its own
                specs[r.key] = (specs[r.source][0], _op_shape(r))
    written: set[str] = set()
    with SafeTensorsWriter(out, specs, missing_as_zeros=bool(unset)) as w:
        def sink(key: str, value: np.ndarray) -> None:
            written.add(key)
            if not (key in unset and value is cweights[key]):  # the placeholder: its bytes stay zero
                w.write(key, mix(key, value) if mix else value)
        moved = transfer(pg, pweights, cg, cweights, al, noise=noise, seed=seed, sink=sink)
        for k in specs.keys() - written - unset:
            w.write(k, cweights[k])
    return moved


def _op_shape(ref) -> tuple[int, ...]:
    """The shape the op reads ``ref`` in (what an untied alias is stored as), from the chain alone."""
    shape = tuple(int(d) for d in ref.source_shape)
    for op, arg in ref.chain:
        shape = tuple(shape[p] for p in arg) if op == "T" else tuple(int(d) for d in arg)
    return shape


def _add_aliases(graph: LayerGraph, weights: dict[str, np.ndarray]) -> None:
    for refs in graph.tensors:
        for r in refs:
            if r.key not in weights and r.source in weights:
                weights[r.key] = weights[r.source]
