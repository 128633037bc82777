"""The residual stream of a graph: the nodes every path from the model's input to its output passes through, and
the blocks (fork-join regions: residual branches with their skip, attention with its products) between them.

A block boundary is a fact of the graph's shape, not of the ops that happen to sit next to a layer: the same
pre-RMSNorm transformer exported by TorchScript and by dynamo (which writes RMSNorm as Pow, ReduceMean, Rsqrt
and a two-input Mul before the norm's weight) has the same stream and the same blocks. Depth placement in
:mod:`keeper.matching` reads the boundaries from here.

How: the stream is the chain of dominators of the output, taken from the main input (the source with the longest
path ahead of it; side inputs such as a mask or a shared bias table join the blocks and do not cut the stream). Nodes
that lie on an input-to-output path but are not on the stream belong to the block between the two stream nodes
around them. Dominators come from one pass in topological order (Cooper, Harvey and Kennedy's intersection on a
DAG), which the canonical node order already is.

Invariant: layers of one block are contiguous in canonical order; two graphs of one model (any widths, either
exporter's spelling of its ops) get the same blocks: the same ``in_block``, ``residual`` and ``boundary_before``
per layer (segment numbers may differ: an exporter may put more single-input nodes on the stream).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from keeper.graph.types import LayerGraph
from keeper.kinds import Merge, kinds_where

__all__ = ["Stream", "residual_stream"]


@dataclass(frozen=True)
class Stream:
    """Per layer (canonical order): ``segment``, its place along the stream (``2k`` for a layer that is the
    ``k``-th stream node, ``2k + 1`` for one in the block after it; -1 when the layer is on no input-to-output
    path: a side input, a dead end), and ``in_block``, True when the layer sits inside a block (off the stream,
    between two stream nodes) rather than on the stream itself; ``residual``, True for a layer in a block whose
    closing stream node is a residual add (a branch that can add nothing), not a concatenation."""

    segment: np.ndarray  # int64 (num_layers,)
    in_block: np.ndarray  # bool (num_layers,)
    residual: np.ndarray  # bool (num_layers,): in a block that a residual add closes (zero its tail, it adds 0)

    def boundary_before(self) -> np.ndarray:
        """True where a block starts or ends right before the layer: the layer and the previous layer on the
        stream's paths lie in different segments and at least one of them inside a block. A chain of layers with
        no fork (conv, norm, conv) has no block boundary; their placement is left to local costs."""
        n = self.segment.shape[0]
        out = np.zeros(n, dtype=bool)
        prev = -1
        for i in range(n):
            if self.segment[i] < 0:
                continue
            if prev >= 0 and self.segment[i] != self.segment[prev] and (self.in_block[i] or self.in_block[prev]):
                out[i] = True
            prev = i
        return out


def residual_stream(graph: LayerGraph) -> Stream:
    """The stream and blocks of ``graph`` (see the module docstring).

    Example:
        >>> s = residual_stream(load_graph(model_bytes))  # doctest: +SKIP
        >>> s.segment[:6], s.in_block[:6]                 # doctest: +SKIP
    """
    n = graph.num_nodes
    nl = graph.num_layers
    none = Stream(np.full(nl, -1, dtype=np.int64), np.zeros(nl, dtype=bool), np.zeros(nl, dtype=bool))
    if n == 0:
        return none
    preds = graph.predecessor_lists()
    if any(p >= v for v in range(n) for p in preds[v]):
        return none  # not in topological order: no stream rather than a wrong one
    succs = graph.successors()
    source = _main_source(preds, succs)
    reach = np.zeros(n, dtype=bool)
    reach[source] = True
    for v in range(source + 1, n):
        reach[v] = any(reach[p] for p in preds[v])
    idom, depth = _dominators(preds, source, reach)
    # the output: of the reached nodes nothing follows, the one deepest in the dominator tree (a model's logits,
    # not a cache of keys that leaves from inside the first block)
    ends = [v for v in range(n) if reach[v] and not any(reach[s] for s in succs[v])]
    sink = max(ends, key=lambda v: (int(depth[v]), v))
    chain = [sink]
    while chain[-1] != source:
        chain.append(int(idom[chain[-1]]))
    chain.reverse()
    on_stream = np.zeros(n, dtype=bool)
    on_stream[chain] = True
    # nodes on some source-to-sink path: reached from the source and reaching the sink
    to_sink = np.zeros(n, dtype=bool)
    to_sink[sink] = True
    for v in range(sink - 1, source - 1, -1):
        to_sink[v] = reach[v] and any(to_sink[s] for s in succs[v])
    stream_nodes = np.asarray(chain, dtype=np.int64)
    nodes = graph.layer_node.astype(np.int64)
    on_path = to_sink[nodes]
    in_block = on_path & ~on_stream[nodes]
    # 2k on the k-th stream node, 2k + 1 in the block after it: a layer on the stream (an embedding, a post-LN
    # norm) and the block right after it are apart
    at = np.searchsorted(stream_nodes, nodes, side="right") - 1
    segment = np.where(on_path, 2 * at + in_block, -1).astype(np.int64)
    closing = stream_nodes[np.minimum(at + 1, len(stream_nodes) - 1)]
    residual = in_block & np.isin(graph.kind[closing], sorted(_RESIDUAL_KINDS))
    return Stream(segment, in_block, residual)


_RESIDUAL_KINDS = kinds_where(lambda t: t.merge is Merge.SUM)


def _main_source(preds: list[list[int]], succs: list[list[int]]) -> int:
    """The node without predecessors with the longest path ahead of it (the first such in order on ties): the
    model's input runs through every block, a side input (a mask, a bias table, a class token) joins later."""
    n = len(preds)
    ahead = np.zeros(n, dtype=np.int64)
    for v in range(n - 1, -1, -1):  # reverse topological order: successors are done
        if succs[v]:
            ahead[v] = 1 + max(int(ahead[w]) for w in succs[v])
    sources = [v for v in range(n) if not preds[v]]
    return max(sources, key=lambda v: (int(ahead[v]), -v))


def _dominators(preds: list[list[int]], source: int, reach: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Immediate dominators from ``source`` over the nodes it reaches, and their depth in the dominator tree (-1 and
    0 elsewhere). One pass in topological order: a node's predecessors come first."""
    n = len(preds)
    idom = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    idom[source] = source
    for v in range(source + 1, n):
        if not reach[v]:
            continue
        d = -1
        for p in preds[v]:
            if reach[p]:
                d = p if d < 0 else _intersect(idom, d, p)
        idom[v] = d
        depth[v] = depth[d] + 1
    return idom, depth


def _intersect(idom: np.ndarray, a: int, b: int) -> int:
    # walk the deeper (later in topological order) of the two up the dominator tree until they meet
    while a != b:
        while a > b:
            a = int(idom[a])
        while b > a:
            b = int(idom[b])
    return a
