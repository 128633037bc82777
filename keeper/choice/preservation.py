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
  growth only), every matched pair agrees in structure (and a layer run on a constant table reads one of its
  parent's shape: another is the child's own), neither model has a learned tensor no layer reads (it is never
  transferred), the child keeps at least the parent's merges, and every
  child layer without a parent can start as the identity (square, stride 1, odd kernel; norms) or belongs to a
  residual branch made only of new layers (its last layer starts at zero). Roles look through both, so a deepened
  plain chain keeps its roles (a VGG stage's old conv that fed the head now feeds the new conv). A new identity in a
  chain brings no nonlinearity the parent has not: what follows it up to the next layer is what followed the
  inherited layer before it, once a ReLU that only repeats a ReLU is dropped (:func:`inserted_why`: a
  conv-BatchNorm-ReLU after a ReLU is the identity, after a GELU or on the raw input it is not). Every channel
  group grows in a way the width operators keep exact where its units are read
  (:mod:`keeper.transforms.exact_width`: a factor that does not divide is refused where a norm, attention or a
  slice reads the units, unless the stream grows LEMON's way under pre-norms or the units are whole heads cloned;
  heads must keep their size). These are the cases :mod:`keeper.transforms` makes
  exact, so the child then computes the parent's function (with ``noise=0``).

Invariant: ``assess(p, c, align(p, c))`` is ``preserved`` for a child that only widens (by integer factors, or by
any factor where nothing reads the units together), deepens by new residual blocks or by identity-able layers that
bring no activation or a ReLU onto a ReLU's outputs, or grows odd kernels relative to ``p``; it is never
``preserved`` when some parent element is not inherited or some growth is not exact by construction (then the
warmed child does not compute the parent's function).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple

import numpy as np

from keeper.graph import INPUT_ROLE, LayerGraph
from keeper.graph.walk import walk
from keeper.kinds import Identity, Kind, kinds_where, traits
from keeper.matching import Alignment
from keeper.transforms.depth import fresh_branches
from keeper.transforms.exact_width import inexact_width

__all__ = ["Assessment", "Roles", "assess", "layer_roles"]

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
        alignment: the alignment assessed. A parent choice keeps it with its candidate, so the transfer from the
            chosen parent reads it instead of aligning the two graphs again.
    """

    preserved: bool
    structure: float
    why: str = ""
    alignment: Alignment | None = field(default=None, compare=False, repr=False)

    def to_plain(self) -> dict[str, Any]:
        """Plain data (JSON-able: the pairs as a list), for :meth:`from_plain`."""
        al = self.alignment
        return {"preserved": bool(self.preserved), "structure": float(self.structure), "why": self.why,
                "alignment": None if al is None else {"score": float(al.score), "inherited": int(al.inherited),
                                                      "child_total": int(al.child_total),
                                                      "pairs": np.asarray(al.pairs).tolist()}}

    @classmethod
    def from_plain(cls, d: Mapping[str, Any]) -> "Assessment":
        al = d.get("alignment")
        alignment = None if al is None else Alignment(float(al["score"]), int(al["inherited"]),
                                                      int(al["child_total"]), np.asarray(al["pairs"], np.int64))
        return cls(bool(d["preserved"]), float(d["structure"]), str(d.get("why", "")), alignment)

    def fits(self, parent: LayerGraph, child: LayerGraph) -> bool:
        """Whether the kept alignment can be one of ``parent`` and ``child`` (a layer index per child layer, matched
        layers of one kind): False for one made on other graphs (a model registered again under the name between
        its choice and its transfer), which the transfer then aligns afresh."""
        al = self.alignment
        if al is None:
            return False
        pairs = np.asarray(al.pairs)
        if pairs.shape != (child.num_layers,) or (pairs.size and int(pairs.max(initial=-1)) >= parent.num_layers):
            return False
        matched = pairs >= 0
        kinds = parent.kind[parent.layer_node[pairs[matched]]], child.kind[child.layer_node[matched]]
        return bool(np.array_equal(*kinds))


class Roles(NamedTuple):
    """Per layer of one graph, what feeds it and what it feeds (:func:`layer_roles`)."""

    feeds: np.ndarray
    fed: np.ndarray


def layer_roles(g: LayerGraph, fresh: tuple[set[int], set[int]] = (set(), set()),
                inserted: frozenset[int] = frozenset()) -> Roles:
    """Per layer: (what feeds it, what it feeds) as codes equal across graphs when the layers sit alike.

    Feeds: the kind of the nearest non-norm layer upstream (through norms, activations, pools, reshapes), or a
    token for the graph input, a merge, or several inputs. Fed: a token for a merge (the layer ends a residual
    branch or a concatenated path), a fork or the output, or the kind of the next non-norm layer. Widths and kernels
    are not part of a role: widening and kernel growth keep every role.

    ``fresh``: (residual adds, nodes of their branches) for branches made only of new layers (they add zero): the
    walks pass through such an add along its skip input and ignore the branch, so a new residual block leaves its
    neighbours' roles as they were in the parent.

    ``inserted``: nodes of new layers that start as the identity in a chain (a deepened VGG stage's new conv): the
    walks pass through them as through norms, so the layers around them keep their parent roles.
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
    for v in inserted:
        up_through[v] = True
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
    return Roles(feed, into)


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
           roles: tuple[Roles, Roles] | None = None) -> Assessment:
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
    inserted = frozenset(int(child.layer_node[c]) for c in np.flatnonzero(new).tolist()
                         if c not in fresh and _identity_able(child, c))
    proles, croles = roles if roles is not None else (layer_roles(parent), layer_roles(child))
    if adds:  # new residual blocks: the child's roles as if they were not there
        croles = layer_roles(child, (adds, nodes))
    structure, why = _pairs_fit(parent, child, pairs, proles, croles)
    looked = (1.0, "")
    if inserted:
        # new identities in chains are looked through too, so the layers around them keep their parent roles; an
        # alignment that does not keep the function keeps the structure it had without (slicing fits do not move)
        looked = _pairs_fit(parent, child, pairs, proles, layer_roles(child, (adds, nodes), inserted))
        why = looked[1]
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
    if not why and inserted:
        why = inserted_why(parent, child, pairs, inserted)
    if not why:
        why = inexact_width(parent, child, pairs)
    if not why and (child.unread or parent.unread):
        # a learned tensor no layer holds is never transferred: the child's keeps its init, the parent's is lost
        side, unread = ("child", child.unread) if child.unread else ("parent", parent.unread)
        why = f"the {side}'s learned tensor {sorted(unread)[0]!r} is read by no layer (an op keeper has no rule for)"
    if not why and inserted:
        structure = looked[0]
    return Assessment(not why, float(structure), why, alignment)


def _pairs_fit(parent: LayerGraph, child: LayerGraph, pairs: np.ndarray, proles: Roles,
               croles: Roles) -> tuple[float, str]:
    """(structure, the first reason a matched pair breaks the function or "") of the alignment ``pairs`` under
    the two graphs' layer roles."""
    (pf, pi), (cf, ci) = proles, croles
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
        if not why and _table_shape(child, c) != _table_shape(parent, p):  # the child keeps its own table
            why = f"child layer {_name(child, c)} runs on another table than parent layer {_name(parent, p)}"
    return (agreed / total if total > 0 else 0.0), why


def _table_shape(g: LayerGraph, i: int) -> tuple[int, ...] | None:
    """The shape of the constant table layer ``i`` reads as its input (an ``INPUT_ROLE`` ref), None if none."""
    return next((r.source_shape for r in g.tensors[i] if r.role == INPUT_ROLE), None)


def inserted_why(parent: LayerGraph, child: LayerGraph, pairs: np.ndarray, inserted: frozenset[int]) -> str:
    """Why new identity layers in chains (``inserted``: their nodes) do not leave the parent's function ("" when
    they do).

    A new layer that starts as the identity is a wire, but the nodes it brings along may not be: a deepened VGG
    stage's conv-BatchNorm-ReLU puts a second ReLU after the stage's first, which changes nothing only because a
    ReLU's outputs are >= 0; a GELU there would change them. So, from the nearest inherited layer upstream of each
    new one (its *anchor*, reached along a single path), what the values meet up to the next layer (:func:`_tail`)
    must be what they meet after the anchor's parent layer, once the new layers are looked through and a rectifier
    that only repeats one before it is dropped. A new layer with no such anchor (after a fork, a merge or the graph
    input) may bring along nothing that is not dropped.
    """
    cg, pg = _Chain(child, inserted), _Chain(parent, frozenset())
    for v in sorted(inserted):
        anchor = cg.anchor(v)
        if anchor is None or pairs[cg.layer_of[anchor]] < 0:
            if cg.tail(v, cg.rectified(v)):
                return f"new child layer {_name(child, int(cg.layer_of[v]))} brings a nonlinearity the parent has not"
            continue
        p = int(pairs[cg.layer_of[anchor]])
        if cg.tail(anchor) != pg.tail(int(parent.layer_node[p])):
            return (f"new child layer {_name(child, int(cg.layer_of[v]))} brings a nonlinearity after child layer "
                    f"{_name(child, int(cg.layer_of[anchor]))} that parent layer {_name(parent, p)} is not followed by")
    return ""


_RECTIFIES = kinds_where(lambda t: t.rectifies)
_KEEPS_SIGN = kinds_where(lambda t: t.keeps_sign)
_SHAPE_ONLY = kinds_where(lambda t: t.keeps_sign and not t.nonlinear)  # reshapes, transposes: no trace in a tail


class _Chain:
    """The single-path walks of :func:`inserted_why` over one graph; ``looked_through``: nodes of new identity
    layers, which leave no trace."""

    def __init__(self, g: LayerGraph, looked_through: frozenset[int]):
        self.layer_of = np.full(g.num_nodes, -1, dtype=np.int64)
        self.layer_of[g.layer_node] = np.arange(g.num_layers)
        self.kind = g.kind.tolist()
        self.preds, self.succs = g.predecessor_lists(), g.successors()
        self.through = looked_through

    def _layer(self, v: int) -> bool:  # an inherited layer other than a norm
        return self.layer_of[v] >= 0 and v not in self.through and self.kind[v] not in _NORMS

    def anchor(self, v: int) -> int | None:
        """The node of the nearest inherited non-norm layer upstream of ``v`` whose output reaches ``v`` along a
        single path (norms, weightless nodes and looked-through layers passed); None at a fork, a merge or an
        input first."""
        while len(self.preds[v]) == 1:
            v = self.preds[v][0]
            if len(self.succs[v]) != 1 or self.kind[v] in _MERGES:
                return None
            if self._layer(v):
                return v
        return None

    def rectified(self, v: int) -> bool:
        """Whether ``v``'s input is a rectifier's output, through sign-keeping nodes and looked-through layers."""
        while len(self.preds[v]) == 1:
            v = self.preds[v][0]
            if self.kind[v] in _RECTIFIES:
                return True
            if not (v in self.through or (self.layer_of[v] < 0 and self.kind[v] in _KEEPS_SIGN)):
                return False
        return False

    def tail(self, v: int, rectified: bool = False) -> tuple[int, ...]:
        """The kinds of the norms and weightless nodes that ``v``'s output meets, in order, up to the next
        inherited non-norm layer, a merge, a fork or the output. Shape ops and looked-through layers leave no
        trace, nor does a rectifier after a rectifier with only sign-keeping nodes between (``rectified``: ``v``'s
        own input counts as a rectifier's output)."""
        out: list[int] = []
        signed = rectified  # the values are a rectifier's outputs, sign-keeping nodes since
        while len(self.succs[v]) == 1 and len(self.preds[self.succs[v][0]]) == 1:
            v = self.succs[v][0]
            k = self.kind[v]
            if self._layer(v):
                break
            if v in self.through or (k in _SHAPE_ONLY and self.layer_of[v] < 0):
                continue
            if k in _RECTIFIES and signed:
                continue
            out.append(k)
            signed = k in _RECTIFIES or (signed and k in _KEEPS_SIGN and self.layer_of[v] < 0)
        return tuple(out)


def _name(g: LayerGraph, i: int) -> str:
    return repr(g.layer_names[i]) if i < len(g.layer_names) else f"#{i}"
