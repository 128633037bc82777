"""Which parent channel group each child group copies, read from the two graphs and an alignment's pairs.

The transfer (:mod:`keeper.transforms.compose`) builds its unit maps on this correspondence and
:mod:`keeper.transforms.exact_width` judges the growth it implies; both read it from here so that what is judged
is what is done.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from keeper.graph import LayerGraph
from keeper.kinds import traits

__all__ = ["group_correspondence", "group_heads", "group_unit_axes", "packed_groups", "square_identity"]


def group_correspondence(parent: LayerGraph, child: LayerGraph, pairs: np.ndarray) -> dict[int, int]:
    """Child channel group -> the parent group its units copy: the parent group most of the child group's matched
    layers (weighted by their elements) read or write there. A new square layer that can be an identity passes
    its units through: its other side copies the same parent group (so VGG blocks inserted back to back all line
    up). Depends on the graphs and the alignment's pairs only (no weight is read)."""
    pairs = np.asarray(pairs)
    votes: dict[int, Counter] = defaultdict(Counter)
    for c, p in enumerate(pairs.tolist()):
        if p < 0:
            continue
        for cg, pg in ((child.in_group[c], parent.in_group[p]), (child.out_group[c], parent.out_group[p])):
            if cg >= 0 and pg >= 0:
                votes[int(cg)][int(pg)] += int(child.params[c])
    # ties go to the lower parent group id so the choice is deterministic
    corr = {cg: min(v.items(), key=lambda kv: (-kv[1], kv[0]))[0] for cg, v in votes.items()}
    square = [i for i in range(child.num_layers) if pairs[i] < 0 and square_identity(int(child.layer_kind[i]))
              and child.shape[i, 0] == child.shape[i, 1] and child.in_group[i] >= 0 and child.out_group[i] >= 0]
    for seq, (a, b) in ((square, (0, 1)), (square[::-1], (1, 0))):  # forward, then backward
        for i in seq:
            ends = (int(child.in_group[i]), int(child.out_group[i]))
            src, dst = ends[a], ends[b]
            if src in corr and dst not in corr:
                corr[dst] = corr[src]
    return corr


def packed_groups(g: LayerGraph) -> dict[int, dict]:
    """Output group -> "packed" attrs, for the layers whose output :mod:`keeper.graph` found unpacked into parts."""
    out = {}
    for i, a in enumerate(g.attrs):
        grp = int(g.out_group[i])
        if "packed" in a and grp >= 0 and len(g.group_of_parts(grp)):
            out[grp] = a["packed"]
    return out


def group_heads(g: LayerGraph) -> dict[int, int]:
    """Output group -> heads, for the projections whose output :mod:`keeper.graph` saw reshaped into heads (q, k or
    v computed apart; ``attrs["heads"]``)."""
    return {int(g.out_group[i]): int(a["heads"]) for i, a in enumerate(g.attrs) if a.get("heads")}


def group_unit_axes(g: LayerGraph) -> dict[int, tuple[int, ...]]:
    """Output group -> the axes its units are reshaped into, for the projections whose output :mod:`keeper.graph`
    saw spread over three or more axes and not unpacked in a way it follows (``attrs["unit_axes"]``)."""
    return {int(g.out_group[i]): tuple(int(x) for x in a["unit_axes"]) for i, a in enumerate(g.attrs)
            if a.get("unit_axes")}


def square_identity(kind: int) -> bool:
    """Layers of the kind start as the identity when they have as many output as input units (conv, linear)."""
    ident = traits(kind).identity
    return ident is not None and ident.needs_square
