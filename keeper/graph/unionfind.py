"""Union-find over channel groups, with sizes and composite (concatenation) groups.

Invariants: a group's size is its unit count, -1 while unknown, -2 once two merged groups disagreed (compacted to
-1); a composite group (the concatenation of its parts, in order) is never merged into another group, so its
parts keep their own indexing. Group ids are handed out in order of :meth:`UnionFind.new` calls and compacted in
that order, so the numbering, which stored graphs keep, depends only on the order of the calls.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["UnionFind", "Compacted"]


@dataclass(frozen=True)
class Compacted:
    """Groups renumbered 0.. over roots: ``ids`` maps any group to its compact id."""

    ids: dict[int, int]
    sizes: list[int]
    parts_indptr: list[int]
    parts: list[int]


class UnionFind:
    """Channel groups under construction (see the module docstring)."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.size: list[int] = []
        self.parts: dict[int, list[int]] = {}  # composite group -> its part groups, in order

    def new(self, sz: int = -1, comp: list[int] | None = None) -> int:
        """A fresh group of ``sz`` units (-1: unknown), composite of ``comp`` when given."""
        self.parent.append(len(self.parent))
        self.size.append(sz)
        if comp:
            self.parts[len(self.parent) - 1] = comp
        return len(self.parent) - 1

    def find(self, g: int) -> int:
        parent = self.parent
        while parent[g] != g:
            parent[g] = parent[parent[g]]
            g = parent[g]
        return g

    def union(self, a: int, b: int) -> int:
        """One group for ``a`` and ``b``; a composite never merges (``a``'s root is kept, the one readers asked
        for)."""
        a, b = self.find(a), self.find(b)
        if a == b:
            return a
        if a in self.parts or b in self.parts:
            return a
        sa, sb = self.size[a], self.size[b]
        self.parent[b] = a
        self.size[a] = sa if sb < 0 else (sb if sa < 0 else (sa if sa == sb else -2))  # -2: inconsistent
        return a

    def sized(self, g: int, sz: int) -> int:
        """``g`` when it has (or may take) ``sz`` units, else a fresh group of ``sz`` units."""
        g = self.find(g)
        if g in self.parts:
            total = sum(max(self.size[self.find(p)], 0) for p in self.parts[g])
            return g if total == sz else self.new(sz)
        if self.size[g] == -1:
            self.size[g] = sz
        return g if self.size[g] == sz else self.new(sz)

    def compact(self) -> Compacted:
        """Roots renumbered in order of creation; sizes (-1 when unknown or inconsistent) and parts in CSR form."""
        roots: dict[int, int] = {}
        sizes: list[int] = []
        for g in range(len(self.parent)):
            r = self.find(g)
            if r not in roots:
                roots[r] = len(sizes)
                sizes.append(self.size[r] if self.size[r] >= 0 else -1)
        indptr, flat = [0], []
        for r, _ in sorted(roots.items(), key=lambda kv: kv[1]):
            flat.extend(roots[self.find(p)] for p in self.parts.get(r, []))
            indptr.append(len(flat))
        ids = {g: roots[self.find(g)] for g in range(len(self.parent))}
        return Compacted(ids, sizes, indptr, flat)
