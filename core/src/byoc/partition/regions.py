"""Cycle-free region formation on an index graph (no IR objects, no plugins).

The graph is given as node indices ``0..n-1`` in topological order with predecessor lists.
*Units* are sets of nodes that must stay together (an existing region, a composite match, or a
single node). :func:`form_regions` groups the candidate units of one target into maximal
regions such that contracting every unit and region keeps the graph a DAG.

The algorithm is linear in nodes + edges. In topological order of the unit graph, each
candidate unit ``u`` gets a label

    d(u) = max over predecessors v of:  d(v)        if v is a candidate
                                        up(v) + 1   otherwise

where ``up(v)`` is the largest label among candidates that reach ``v`` (``-1`` if none). A path
that leaves a candidate group and comes back always passes a non-candidate, which raises the
label, so it can never return to a unit of the same label: the groups of equal label are
cycle-free, and splitting them into connected components keeps them so.
"""

from __future__ import annotations

import heapq
from typing import Sequence


class CycleError(Exception):
    """Contracting the given units would create a cycle."""

    def __init__(self, units: list[int]):
        super().__init__(f"cycle through units {units[:10]}")
        self.units = units


def unit_graph(n: int, preds: Sequence[Sequence[int]], unit_of: Sequence[int], n_units: int):
    """Predecessor sets and a topological order of the contracted graph; raises CycleError."""
    upreds: list[set[int]] = [set() for _ in range(n_units)]
    for c in range(n):
        uc = unit_of[c]
        for p in preds[c]:
            up = unit_of[p]
            if up != uc:
                upreds[uc].add(up)
    indeg = [len(s) for s in upreds]
    usuccs: list[list[int]] = [[] for _ in range(n_units)]
    for u, ps in enumerate(upreds):
        for p in ps:
            usuccs[p].append(u)
    # start with units in order of their first node so the result is deterministic
    first = [n] * n_units
    for i in range(n - 1, -1, -1):
        first[unit_of[i]] = i
    order = []
    heap = [(first[u], u) for u in range(n_units) if indeg[u] == 0]
    heapq.heapify(heap)
    while heap:
        _, u = heapq.heappop(heap)
        order.append(u)
        for s in usuccs[u]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (first[s], s))
    if len(order) != n_units:
        raise CycleError([u for u in range(n_units) if indeg[u] > 0])
    return upreds, usuccs, order


def form_regions(
    n: int,
    preds: Sequence[Sequence[int]],
    unit_of: Sequence[int],
    n_units: int,
    candidate: Sequence[bool],
) -> list[list[int]]:
    """Group candidate units into maximal cycle-free regions; returns lists of unit ids.

    Regions come out ordered by their first node, units within a region in topological order.
    """
    upreds, usuccs, order = unit_graph(n, preds, unit_of, n_units)
    label = [0] * n_units
    up = [-1] * n_units
    for u in order:
        if candidate[u]:
            d = 0
            for v in upreds[u]:
                d = max(d, label[v] if candidate[v] else up[v] + 1)
            label[u] = d
            up[u] = d
        else:
            m = -1
            for v in upreds[u]:
                m = max(m, up[v])
            up[u] = m
    # connected components among candidates with equal labels (union-find)
    parent = list(range(n_units))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for u in order:
        if not candidate[u]:
            continue
        for v in upreds[u]:
            if candidate[v] and label[v] == label[u]:
                ru, rv = find(u), find(v)
                if ru != rv:
                    parent[max(ru, rv)] = min(ru, rv)
    groups: dict[int, list[int]] = {}
    for u in order:
        if candidate[u]:
            groups.setdefault(find(u), []).append(u)
    return list(groups.values())


def is_acyclic(n: int, preds: Sequence[Sequence[int]], unit_of: Sequence[int], n_units: int) -> bool:
    try:
        unit_graph(n, preds, unit_of, n_units)
    except CycleError:
        return False
    return True
