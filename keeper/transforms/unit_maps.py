"""Which parent unit each child unit copies, chosen once per channel group: a child group and the parent group it
corresponds to (:mod:`keeper.transforms.correspondence`) get one unit map (:func:`keeper.transforms.width.unit_map`)
that every tensor sharing the group reads, so residual streams, concatenations, norms and depthwise convs agree.

Per kind of group: a plain group is mapped whole (Net2Net growth, importance-ranked shrink); a composite group
(a concatenation) part by part, each part's map offset into the whole; a packed q/k/v projection part by part and
head by head, whole heads cloned when the child has a multiple of the parent's heads of the same size, parts joined
by a dot product sharing one map, with per-unit factors that keep q . k (:meth:`GroupMaps.factors`); a residual
stream grown by a factor that does not divide maps its copied units only (the transfer appends the filled units,
:class:`~keeper.transforms.stream_width.StreamGrowth`).

Invariant: a map is computed once per group and never changes; a part of a packed projection reads its slice of
the composite's map, so the projection and the layers reading each part agree.
"""

from __future__ import annotations

import numpy as np

from keeper.graph import LayerGraph
from keeper.transforms.correspondence import group_correspondence, packed_groups
from keeper.transforms.stream_width import StreamGrowth, stream_growth
from keeper.transforms.width import unit_map

__all__ = ["GroupMaps"]


class GroupMaps:
    """Child channel group -> parent unit index per child unit, chosen once per group (and cached), with the
    per-unit factors of packed attention projections."""

    def __init__(self, parent: LayerGraph, child: LayerGraph, pairs: np.ndarray, parent_layers: list):
        self.parent, self.child = parent, child
        self.parent_layers = parent_layers
        self.corr = group_correspondence(parent, child, pairs)
        # groups grown by a factor that does not divide under LayerNorms: copied units first, then mean units
        self.streams: dict[int, StreamGrowth] = stream_growth(parent, child, pairs, self.corr)
        self._maps: dict[int, np.ndarray | None] = {}
        self._importance: dict[int, np.ndarray | None] = {}
        self._factors: dict[int, np.ndarray | None] = {}
        # packed projections (q, k, v from one layer): composite group -> the "packed" attrs of its layer
        self.child_packed, self.parent_packed = packed_groups(child), packed_groups(parent)
        self._owner = {int(p): g for g in self.child_packed for p in child.group_of_parts(g).tolist()}

    def parent_size(self, cg: int) -> int:
        pg = self.corr.get(cg)
        return int(self.parent.group_size[pg]) if pg is not None else -1

    def map(self, cg: int) -> np.ndarray | None:
        if cg < 0:
            return None
        if cg in self._owner and cg not in self._maps:
            self.map(self._owner[cg])  # a part of a packed projection: its map is the composite's slice
        if cg not in self._maps:
            self._maps[cg] = self._build(cg)
        return self._maps[cg]

    def factors(self, cg: int) -> np.ndarray | None:
        """Per-output-unit factors for the layer producing packed group ``cg`` (None: all 1).

        For each dot-product pair of parts (q, k) sharing one map, k's copies are divided by their replication
        count (so q . k sums each parent term once) and q is scaled by sqrt(child head size / parent head size)
        (the child's attention divides by the square root of its own head size)."""
        if cg not in self._factors:
            self.map(cg)
            self._factors.setdefault(cg, None)
        return self._factors[cg]

    def _build(self, cg: int) -> np.ndarray | None:
        pg = self.corr.get(cg)
        if pg is None:
            return None
        if cg in self.streams:  # the copied units only: the transfer appends the mean units (StreamGrowth)
            return self.streams[cg].copied()
        cparts, pparts = self.child.group_of_parts(cg), self.parent.group_of_parts(pg)
        if cg in self.child_packed and pg in self.parent_packed and len(cparts) == len(pparts):
            return self._packed_map(cg, pg, cparts.tolist(), pparts.tolist())
        if len(cparts) and len(cparts) == len(pparts):
            maps, offset = [], 0
            for cp, pp in zip(cparts.tolist(), pparts.tolist()):
                cs, ps = int(self.child.group_size[cp]), int(self.parent.group_size[pp])
                if cs <= 0 or ps <= 0:
                    return None
                maps.append(unit_map(ps, cs, self._ranking(pp, cs, ps)) + offset)
                offset += ps
            return np.concatenate(maps)
        cs, ps = int(self.child.group_size[cg]), int(self.parent.group_size[pg])
        if cs <= 0 or ps <= 0 or len(cparts) or len(pparts):
            return None
        return unit_map(ps, cs, self._ranking(pg, cs, ps))

    def _packed_map(self, cg: int, pg: int, cparts: list[int], pparts: list[int]) -> np.ndarray | None:
        """Per-part maps of a packed projection, head by head when both sides have the same number of heads, whole
        heads cloned when the child has an integer multiple of the parent's heads of the same size; parts joined
        by a dot product share one map. Each part's own group gets its slice of the map."""
        ca, pa = self.child_packed[cg], self.parent_packed[pg]
        csz = [int(self.child.group_size[g]) for g in cparts]
        psz = [int(self.parent.group_size[g]) for g in pparts]
        if min(csz + psz) <= 0:
            return None
        partner = {b: a for a, b in ca.get("dots", []) if [a, b] in pa.get("dots", [])}
        imp = self.importance(pg) if any(c < p for c, p in zip(csz, psz)) else None
        offs = np.concatenate([[0], np.cumsum(psz)]).astype(np.int64)
        maps: list[np.ndarray] = []
        heads: list[int] = []
        cloned: set[int] = set()
        for j, (cs, ps) in enumerate(zip(csz, psz)):
            hc, hp = int(ca["heads"][j]), int(pa["heads"][j])
            h = hc if hc == hp and hc >= 1 and cs % hc == 0 and ps % hc == 0 else 1
            heads.append(h)
            if hp >= 1 and hc > hp and ps % hp == 0 and cs * hp == ps * hc:
                # more heads, each of the parent's size: whole heads are cloned (child head i is parent head
                # i mod hp; with a factor that does not divide, the first heads once more than the others), each
                # computes its parent head's attention as it is, so q and k need no factor; the projection
                # reading the heads divides by each head's number of copies
                cloned.add(j)
                maps.append(np.resize(np.arange(ps), cs))
                continue
            if j in partner:
                maps.append(maps[partner[j]])
                continue
            rank = None
            if imp is not None:
                rank = imp[offs[j]:offs[j + 1]].copy()
                for second, first in partner.items():  # a dot product keeps the units that matter to both
                    if first == j:
                        rank += imp[offs[second]:offs[second + 1]]
            hs, hcs = ps // h, cs // h
            if rank is None or hcs >= hs:  # growing (or equal): one map serves every head, one generator drawn
                head = unit_map(hs, hcs)
                maps.append(np.concatenate([head + k * hs for k in range(h)]))
            else:  # shrinking: each head keeps its own most important units
                maps.append(np.concatenate([unit_map(hs, hcs, rank[k * hs:(k + 1) * hs]) + k * hs
                                            for k in range(h)]))
        f = np.ones(sum(csz))
        coffs = np.concatenate([[0], np.cumsum(csz)]).astype(np.int64)
        for b, a in partner.items():
            if a in cloned and b in cloned:
                continue
            f[coffs[b]:coffs[b + 1]] = 1.0 / np.bincount(maps[b], minlength=psz[b])[maps[b]]
            f[coffs[a]:coffs[a + 1]] *= np.sqrt((csz[a] / heads[a]) / (psz[a] / heads[a]))
        self._factors[cg] = None if np.all(f == 1.0) else f
        for g, m in zip(cparts, maps):
            self._maps[g] = m
        return np.concatenate([m + o for m, o in zip(maps, offs[:-1])])

    def _ranking(self, pg: int, cs: int, ps: int) -> np.ndarray | None:
        # only shrinking ranks units: importance reads every weight producing the group in float64, a large part of
        # a grown child's transfer time that growth does not need
        return self.importance(pg) if cs < ps else None

    def importance(self, pg: int) -> np.ndarray | None:
        """L2 norm of each unit's outgoing weights over the parent layers producing the group."""
        if pg not in self._importance:
            total = None
            for p in np.flatnonzero(self.parent.out_group == pg).tolist():
                w = self.parent_layers[p].get("weight", self.parent_layers[p].get("scale"))
                if w is None or w.shape[0] != self.parent.group_size[pg]:
                    continue
                sq = np.square(w.astype(np.float64)).reshape(w.shape[0], -1).sum(axis=1)
                total = sq if total is None else total + sq
            self._importance[pg] = None if total is None else np.sqrt(total)
        return self._importance[pg]

    def copies_alike(self, c: int) -> bool:
        """Whether child layer ``c``'s input and output units copy the same parent units: only then can a new
        layer there be an identity that keeps the function."""
        child = self.child
        gi, go = int(child.in_group[c]), int(child.out_group[c])
        if gi == go:
            return True
        mi, mo = self.map(gi), self.map(go)
        if mi is None or mo is None:
            if gi < 0 or go < 0:
                return False
            return mi is None and mo is None and child.group_size[gi] == child.group_size[go]
        return len(mi) == len(mo) and bool(np.all(mi == mo))
