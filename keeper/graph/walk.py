"""The walk from a node to its nearest neighbour of interest, upstream or downstream, along a single path.

Matching and preservation both ask, per layer, what sits next to it once the ops in between are looked through: the
nearest weighted layer upstream (or a merge, or the graph input), the nearest one downstream (or a merge, a fork, the
output). They ask with different rules of what to look through, so the rule is the caller's: ``passes[v]`` says
whether the walk goes on through node ``v``.

A walk leaves ``start`` by its only neighbour in the walk's direction (``neighbours[start]``: its predecessors for an
upstream walk, its successors downstream) and goes on from node to node. It passes through a node when
``passes[node]`` holds and the node has exactly one neighbour to go on to. It stops at:

* a node that does not pass (``Reach.stopped``): a layer, a merge, whatever the caller stops at; or
* a node with no neighbour (a graph input upstream, an output downstream) or several (a node with several inputs
  upstream, a fork downstream): ``stopped`` is False there, and the caller reads which from the neighbour count.
  When ``start`` itself has not exactly one neighbour, the walk ends where it began.

``start`` is never tested against ``passes``. Invariant: a walk follows edges of a DAG, so it ends, after at most one
visit per node; it never branches.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

__all__ = ["Reach", "walk"]


class Reach(NamedTuple):
    """Where a :func:`walk` ended."""

    node: int              # the node it ended at (``start`` when it never left)
    stopped: bool          # True: ``node`` does not pass; False: ``node`` has no or several neighbours onward
    passed: list[int]      # the nodes passed through, in walking order (``start`` and ``node`` excluded)


def walk(start: int, neighbours: Sequence[Sequence[int]], passes: Sequence[bool],
         first: Sequence[int] | None = None) -> Reach:
    """Walk from ``start`` along single edges to the nearest node that stops the walk (see the module docstring).

    Args:
        start: the node to walk from (not tested against ``passes``).
        neighbours: per node, the nodes the walk may step to from it (predecessors, or successors).
        passes: per node, whether the walk goes on through it.
        first: the neighbours to leave ``start`` by, when they are not ``neighbours[start]``.

    Example:
        >>> preds = [[], [0], [1], [2]]            # a chain 0 -> 1 -> 2 -> 3
        >>> walk(3, preds, [False, True, True, False])
        Reach(node=0, stopped=True, passed=[2, 1])
        >>> walk(3, preds, [True, True, True, False])
        Reach(node=0, stopped=False, passed=[2, 1])
    """
    cur = start
    ahead = neighbours[start] if first is None else first
    passed: list[int] = []
    while len(ahead) == 1:
        if cur != start:
            passed.append(cur)
        cur = int(ahead[0])
        if not passes[cur]:
            return Reach(cur, True, passed)
        ahead = neighbours[cur]
    return Reach(cur, False, passed)
