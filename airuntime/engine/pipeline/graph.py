"""The dependency graph of a pipeline: deterministic topological order, and a cycle to
report when there is none."""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def find_cycle(
    candidates: Sequence[int], deps: Sequence[Sequence[int]], done: Sequence[bool]
) -> list[int]:
    """A cycle among the nodes Kahn's algorithm could not order.  Each such node has a dep
    that is not done either, so walking those deps must revisit a node: O(V + E)."""
    start = min(i for i in candidates if not done[i])
    position: dict[int, int] = {}
    path: list[int] = []
    node = start
    while node not in position:
        position[node] = len(path)
        path.append(node)
        node = next(d for d in deps[node] if not done[d])
    cycle = path[position[node] :]
    first = cycle.index(min(cycle))
    return cycle[first:] + cycle[:first]


def topological_order(nodes: Sequence[int], deps: Sequence[Sequence[int]]) -> list[int]:
    """Kahn's algorithm; among ready steps the earliest declared goes first."""
    indegree = {i: len(deps[i]) for i in nodes}
    children: dict[int, list[int]] = {i: [] for i in nodes}
    for i in nodes:
        for d in deps[i]:
            children[d].append(i)
    ready = [i for i in nodes if indegree[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for c in children[i]:
            indegree[c] -= 1
            if indegree[c] == 0:
                heapq.heappush(ready, c)
    return order
