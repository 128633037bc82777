"""What an alignment preserves: whether warming along it computes the parent's function, and how well it maps
blocks onto blocks.

Similarity counts inherited elements; it cannot tell a child that *grows* its parent (every parent element kept,
new units replicated, new layers identities) from one that merely finds enough elements to slice in an unrelated
parent. This module reads that from the alignment and the two graphs alone, without transforming any weight:

* **structure** (in [0, 1]): the share of the inherited elements whose two layers sit alike in their blocks. Each
  layer gets a role: what feeds it (the kind of the nearest non-norm layer upstream, the graph input, or a merge)
  and what it feeds (a merge such as a residual add, another layer, or the output), norms passed through. A pair
  whose roles differ (a plain chain's conv on a residual branch's last conv, whose output meets the skip input), or
  whose parent kernel is cut down to the child's pointwise one (a full 3x3 conv into a 1x1), inherits elements that
  compute something else there, so it does not count; a pair alike on one side only counts half.
* **preserved**: every parent layer is matched and inherited whole (no element sliced away: widening and odd kernel
  growth only), every matched pair agrees in structure, the child keeps at least the parent's merges, and every
  child layer without a parent can start as the identity (square, stride 1, odd kernel; norms) or belongs to a
  residual branch made only of new layers (its last layer starts at zero), and every channel group grows in a way
  the width operators keep exact where its units are read (:mod:`keeper.transforms.exact_width`: a factor that
  does not divide is refused where a norm, attention or a slice reads the units; attention heads must clone
  whole). These are the cases :mod:`keeper.transforms` makes exact, so the child then computes the parent's
  function (with ``noise=0``).

Invariant: ``assess(p, c, align(p, c))`` is ``preserved`` for a child that only widens (by integer factors, or by
any factor where nothing reads the units together), deepens by identity-able layers or new residual blocks, or
grows odd kernels relative to ``p``; it is never ``preserved`` when some parent element is not inherited or some
growth is not exact by construction (then the warmed child does not compute the parent's function).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from keeper.graph import LayerGraph
from keeper.graph.walk import walk
from keeper.kinds import Identity, Kind, kinds_where, traits
from keeper.matching import Alignment, MatchArrays, align
from keeper.selection import Candidate, coverage
from keeper.transforms.depth import fresh_branches
from keeper.transforms.exact_width import inexact_width

__all__ = ["Assessment", "assess", "layer_roles", "may_qualify", "assess_candidate"]

_NORMS = frozenset(int(k) for k in (Kind.BATCHNORM, Kind.LAYERNORM, Kind.PARAM))
_MERGES = kinds_where(lambda t: t.merge is not None)
# role tokens (kinds are >= 1, so these never collide with a kind code)
_INPUT, _MERGE, _MANY, _OUTPUT, _FORK = -1, -2, -3, -4, -5


@dataclass(frozen=True)
class Assessment:
    """What warming along one alignment keeps.

    Attributes:
        preserved: the warmed child computes the parent's function (see the module docstring).
        structure: share of inherited elements whose layers sit alike in their blocks, in [0, 1] (0 when nothing
            is inherited).
        why: the first reason it is not preserved ("" when it is), for reports and logs.
    """

    preserved: bool
    structure: float
    why: str = ""


def layer_roles(g: LayerGraph, fresh: tuple[set[int], set[int]] = (set(), set())) -> tuple[np.ndarray, np.ndarray]:
    """Per layer: (what feeds it, what it feeds) as codes equal across graphs when the layers sit alike.

    Feeds: the kind of the nearest non-norm layer upstream (through norms, activations, pools, reshapes), or a
    token for the graph input, a merge, or several inputs. Fed: a token for a merge (the layer ends a residual
    branch or a concatenated path), a fork or the output, or the kind of the next non-norm layer. Widths and kernels
    are not part of a role: widening and kernel growth keep every role.

    ``fresh``: (residual adds, nodes of their branches) for branches made only of new layers (they add zero): the
    walks pass through such an add along its skip input and ignore the branch, so a new residual block leaves its
    neighbours' roles as they were in the parent.
    """
    adds, skip = fresh
    layer_of = np.full(g.num_nodes, -1, dtype=np.int64)
    layer_of[g.layer_node] = np.arange(g.num_layers)
    kind = g.kind.tolist()
    preds = g.predecessor_lists()
    up = [[u for u in p if u not in skip] for p in preds]
    succ = [[n for n in nxt if n not in skip] for nxt in g.successors()]
    # the walks pass through weightless nodes and norms, not merges; a fresh branch joins at its add, whose skip
    # input is the path
    up_through = [k not in _MERGES and (at < 0 or k in _NORMS) for k, at in zip(kind, layer_of.tolist())]
    down_through = list(up_through)
    for a in adds:
        up_through[a], down_through[a] = len(up[a]) == 1, True

    def stop(end: int) -> int:  # where a walk stopped: a layer other than a norm, or a merge
        return kind[end] if layer_of[end] >= 0 and kind[end] not in _NORMS else _MERGE

    feed = np.empty(g.num_layers, dtype=np.int64)
    into = np.empty(g.num_layers, dtype=np.int64)
    for li, node in enumerate(g.layer_node.tolist()):
        # a layer leaves by all its inputs, those of a fresh branch included
        end, stopped, _ = walk(node, up, up_through, first=preds[node])
        inputs = preds[node] if end == node else up[end]  # none or several: where the walk ended
        feed[li] = stop(end) if stopped else (_MANY if inputs else _INPUT)
        end, stopped, _ = walk(node, succ, down_through)
        into[li] = stop(end) if stopped else (_FORK if succ[end] else _OUTPUT)
    return feed, into


def _elements(g: LayerGraph, i: int) -> int:
    return int(np.prod(g.shape[i])) + int(g.vectors[i]) * int(g.shape[i, 0])


def _gain(c: LayerGraph, i: int, p: LayerGraph, j: int) -> int:
    m = np.minimum(c.shape[i], p.shape[j])
    return int(np.prod(m)) + min(int(c.vectors[i]), int(p.vectors[j])) * int(m[0])


def _identity_able(g: LayerGraph, i: int) -> bool:
    """A new layer that :func:`keeper.transforms.depth.identity_fill` can make the identity."""
    how = traits(int(g.layer_kind[i])).identity
    if how is None:
        return False
    if how is Identity.UNIT_NORM:
        return True
    attrs = g.attrs[i] if i < len(g.attrs) else {}
    if any(int(s) != 1 for s in (attrs.get("strides") or [])):
        return False
    shape = g.shape[i]
    if how.needs_square and shape[0] != shape[1]:
        return False
    if how is Identity.DIRAC_DEPTHWISE and shape[1] != 1:
        return False
    return all(int(k) % 2 == 1 for k in shape[2:])  # unused kernel axes are 1


def _fresh_branches(g: LayerGraph, new: np.ndarray) -> tuple[set[int], set[int], set[int]]:
    """(layers, adds, nodes) of residual branches made only of new layers (the branch's tails start at zero, so
    the others may hold anything): :func:`keeper.transforms.depth.fresh_branches`, every layer and node of each
    branch and its add."""
    layers: set[int] = set()
    adds: set[int] = set()
    nodes: set[int] = set()
    for b in fresh_branches(g, new):
        layers.update(b.layers)
        nodes.update(b.nodes)
        adds.add(b.add)
    return layers, adds, nodes


def assess(parent: LayerGraph, child: LayerGraph, alignment: Alignment,
           roles: tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None) -> Assessment:
    """Whether warming ``child`` from ``parent`` along ``alignment`` preserves the parent's function, and the
    alignment's structure score (see the module docstring).

    Args:
        roles: ``(layer_roles(parent), layer_roles(child))`` when the caller has them (a zoo keeps them per model).

    Example:
        >>> a = assess(parent_graph, child_graph, keeper.align(parent_graph, child_graph))  # doctest: +SKIP
        >>> a.preserved, a.structure                                                        # doctest: +SKIP
        (True, 1.0)
    """
    pairs = np.asarray(alignment.pairs)
    new = pairs < 0
    fresh, adds, nodes = _fresh_branches(child, new) if new.any() else (set(), set(), set())
    (pf, pi), (cf, ci) = roles if roles is not None else (layer_roles(parent), layer_roles(child))
    if adds:  # new residual blocks: the child's roles as if they were not there
        cf, ci = layer_roles(child, (adds, nodes))
    total, agreed = 0, 0.0
    why = ""
    for c, p in enumerate(pairs.tolist()):
        if p < 0:
            continue
        g = _gain(child, c, parent, p)
        total += g
        ck, pk = child.shape[c, 2:], parent.shape[p, 2:]
        cropped = bool(np.all(ck == 1) and np.any(pk > 1))  # a full conv cut to a pointwise one
        # a pair agreeing on one side of its block (fed alike, or feeding alike) counts half
        agree = 0.0 if cropped else (int(cf[c] == pf[p]) + int(ci[c] == pi[p])) / 2.0
        agreed += g * agree
        if agree < 1.0 and not why:
            what = "its kernel is cut to a pointwise one" if cropped else "it sits elsewhere in its block"
            why = f"child layer {_name(child, c)} takes parent layer {_name(parent, p)} but {what}"
        if not why and g != _elements(parent, p):
            why = f"parent layer {_name(parent, p)} is sliced into child layer {_name(child, c)}"
        if not why and np.any(ck < pk):
            why = f"child layer {_name(child, c)} crops parent layer {_name(parent, p)}'s kernel"
        if not why and np.any((ck - pk) % 2 == 1):
            why = f"child layer {_name(child, c)} grows its kernel by an even amount (no centre to keep)"
    structure = agreed / total if total > 0 else 0.0
    if not why:
        unmatched = np.setdiff1d(np.arange(parent.num_layers), pairs[pairs >= 0])
        if unmatched.size:
            why = f"parent layer {_name(parent, int(unmatched[0]))} has no counterpart in the child"
    if not why and int(np.isin(child.kind, sorted(_MERGES)).sum()) < int(np.isin(parent.kind, sorted(_MERGES)).sum()):
        why = "the child has fewer merges (residual adds, concatenations) than the parent"
    if not why:
        for c in np.flatnonzero(new).tolist():
            if c not in fresh and not _identity_able(child, c):
                why = f"new child layer {_name(child, c)} cannot start as the identity"
                break
    if not why:
        why = inexact_width(parent, child, pairs)
    return Assessment(not why, float(structure), why)


def _name(g: LayerGraph, i: int) -> str:
    return repr(g.layer_names[i]) if i < len(g.layer_names) else f"#{i}"


def may_qualify(bound: float, parent_total: int, child_total: int, floor: float, preserve: bool) -> bool:
    """Whether a parent with score bound ``bound`` may qualify for a child: by fit (bound at or above the floor)
    or, with ``preserve``, by preserved function, which needs every parent element inherited (the parent's element
    count at most the child's and covered by the bound). Used by the embedded zoo and the service alike."""
    return bound >= floor or (preserve and parent_total <= child_total
                              and bound * child_total >= parent_total * (1.0 - 1e-9))  # the bound is a rounded ratio


def assess_candidate(name: str, score: float, accuracy: float, clean: bool, floor: float,
                     child: tuple[LayerGraph, MatchArrays, tuple[np.ndarray, np.ndarray]],
                     parent: tuple[LayerGraph, MatchArrays, tuple[np.ndarray, np.ndarray]]) -> Candidate:
    """One parent's :class:`~keeper.selection.Candidate` for a child: its exact ``score`` and coverage, and, when
    it may qualify (score at or above ``floor``, or every parent element inherited), what its alignment keeps.

    ``child`` / ``parent``: (graph, match arrays, :func:`layer_roles`) of each. Invariant: ``preserved`` is True
    only when the whole parent is inherited and :func:`assess` finds the alignment function-preserving.
    """
    cg, ca, croles = child
    pg, pa, proles = parent
    whole = int(round(float(score) * ca.total)) >= pa.total  # every parent element inherited
    preserved, structure = False, 1.0
    if score >= floor or whole:
        fit = assess(pg, cg, align(pa, ca), (proles, croles))
        preserved, structure = fit.preserved and whole, fit.structure
    return Candidate(name, float(score), float(accuracy), coverage(score, ca.total, pa.total),
                     preserved=bool(preserved), structure=float(structure), clean=bool(clean))
