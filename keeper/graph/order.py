"""The canonical order of a graph's data nodes: a topological order that does not depend on the file.

Invariant: two files holding the same graph (nodes listed in any order, same output names) get the same order,
and widening a model (other shapes, same structure) does not reorder it.
"""

from __future__ import annotations

import heapq
import re
from typing import Sequence

import onnx

__all__ = ["canonical_order"]


def canonical_order(keep: list[int], preds: dict[int, list[int]], kinds: Sequence[int],
                    nodes: Sequence[onnx.NodeProto]) -> list[int]:
    """Topological order independent of file order.

    Ready nodes are taken by (longest-path level, the input slot their branch takes at the merge it ends in,
    structural hash, kind, output name); the hash is a two-round Weisfeiler-Lehman label over kinds and input
    slots without shapes, so widening a model does not reorder it, and only structurally identical nodes fall
    back to their output names (unique in a valid model, so the order never depends on where a node sits in the
    file).
    """
    # plain ints: the structural hashes below are persisted through the order, whatever type a kind comes in
    kind = {i: int(kinds[i]) for i in keep}
    succs: dict[int, list[tuple[int, int]]] = {i: [] for i in keep}
    for i in keep:
        for slot, j in enumerate(preds[i]):
            succs[j].append((i, slot))
    level: dict[int, int] = {}
    indeg = {i: len(preds[i]) for i in keep}
    stack = [i for i in keep if indeg[i] == 0]
    topo = []
    while stack:
        i = stack.pop()
        topo.append(i)
        for j, _ in succs[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                stack.append(j)
    for i in topo:
        level[i] = 1 + max((level[j] for j in preds[i]), default=-1)
    label = {i: kind[i] for i in keep}
    for _ in range(2):
        label = {i: hash((label[i], tuple(label[j] for j in preds[i]),
                          tuple(sorted((label[s], slot) for s, slot in succs[i])))) & 0xFFFFFFFF
                 for i in keep}
    # Where a node's branch ends: following single-successor links down to the first merge, the input slot the
    # branch takes there (-1 when it forks or ends first). Parallel branches of one concatenation or residual
    # add are ordered by that slot, which editing the model above or below the merge does not change (the
    # hashed labels of siblings all change together there, and their order with them).
    exit_slot: dict[int, int] = {}
    for i in reversed(topo):
        if len(succs[i]) != 1:
            exit_slot[i] = -1
        else:
            j, slot = succs[i][0]
            exit_slot[i] = exit_slot[j] if len(preds[j]) == 1 else slot
    indeg = {i: len(preds[i]) for i in keep}
    # last tie-break: the node's first output name (unique in a valid model), never the position in the file;
    # numbers in it compare as numbers, so an exporter's val_99 comes before its val_100 as it was written
    name = {i: _natural(nodes[i].output[0] if nodes[i].output else "") for i in keep}
    heap = [(level[i], exit_slot[i], label[i], kind[i], name[i], i) for i in keep if indeg[i] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        *_, i = heapq.heappop(heap)
        order.append(i)
        for j, _ in succs[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(heap, (level[j], exit_slot[j], label[j], kind[j], name[j], j))
    return order


def _natural(name: str) -> tuple:
    """``name`` as a sort key whose digit runs compare as numbers ("val_99" < "val_100"); text and number parts
    alternate, so two keys always compare part by part without mixing types."""
    parts = re.split(r"(\d+)", name)
    return tuple(int(s) if i % 2 else s for i, s in enumerate(parts))
