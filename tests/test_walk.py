"""The neighbour walk: where it stops and what it passes, on hand-made adjacency lists and on a real graph."""

from __future__ import annotations

import numpy as np

from keeper.graph import Kind, graph_from_proto
from keeper.graph.walk import Reach, walk

import nets


def test_a_chain_stops_at_the_first_node_that_does_not_pass():
    preds = [[], [0], [1], [2], [3]]  # 0 -> 1 -> 2 -> 3 -> 4
    passes = [True, True, False, True, False]
    assert walk(4, preds, passes) == Reach(2, True, [3])
    assert walk(2, preds, passes) == Reach(0, False, [1])  # the input: nothing further up
    assert walk(0, preds, passes) == Reach(0, False, [])  # never leaves a node without neighbours
    assert walk(4, preds, [False] * 5) == Reach(3, True, [])  # the start itself is never tested


def test_several_neighbours_end_the_walk_where_they_are():
    # 0 -> 1 -> {2, 3} -> 4 -> 5: upstream from 5 ends at the join 4, downstream from 0 at the fork 1
    preds = [[], [0], [1], [1], [2, 3], [4]]
    succs = [[1], [2, 3], [4], [4], [5], []]
    everything = [True] * 6
    assert walk(5, preds, everything) == Reach(4, False, [])
    assert walk(0, succs, everything) == Reach(1, False, [])
    assert walk(4, preds, everything) == Reach(4, False, [])  # two inputs: it never leaves
    assert walk(2, succs, everything) == Reach(5, False, [4])


def test_first_replaces_the_start_neighbours_only():
    preds = [[], [0], [], [1, 2]]  # 0 -> 1 -> 3 <- 2
    assert walk(3, preds, [True] * 4) == Reach(3, False, [])
    assert walk(3, preds, [True] * 4, first=[1]) == Reach(0, False, [1])
    assert walk(3, preds, [True, False, True, True], first=[1]) == Reach(1, True, [])


def test_on_a_residual_block_the_walks_find_the_merge_and_the_next_layer():
    g = graph_from_proto(nets.cnn_onnx([("conv", 8, 3, True), ("res", 3), ("conv", 4, 3, True)]))
    layer_of = np.full(g.num_nodes, -1)
    layer_of[g.layer_node] = np.arange(g.num_layers)
    merge = {int(Kind.ADD), int(Kind.CONCAT), int(Kind.MUL)}
    through = [bool(layer_of[v] < 0 and int(g.kind[v]) not in merge) for v in range(g.num_nodes)]
    convs = [li for li in range(g.num_layers) if int(g.layer_kind[li]) == int(Kind.CONV)]
    after_block = int(g.layer_node[convs[3]])  # conv, 2 in the block, then this one after Add -> Relu
    up = walk(after_block, g.predecessor_lists(), through)
    assert up.stopped and int(g.kind[up.node]) == int(Kind.ADD)
    assert [int(g.kind[v]) for v in up.passed] == [int(Kind.RECTIFIER)]
    stem_norm = int(g.layer_node[convs[0] + 1])  # the stem's BatchNorm feeds a Relu, then forks into the block
    down = walk(stem_norm, g.successors(), through)
    assert not down.stopped and len(g.successors()[down.node]) == 2
