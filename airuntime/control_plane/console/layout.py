"""The run page's DAG drawing: a layered layout of a compiled plan, computed server-side.

Why this exists: a person reads a run as a graph, and a graph of 2,000 steps drawn node
by node is unreadable and slow to paint. Steps are placed by longest-path layering (a
step's layer is one more than its deepest dependency's, so every edge points right),
ordered inside a layer by the mean position of their dependencies (one barycentre
sweep: fewer crossings, deterministic). A layer wider than ``max_per_layer`` becomes
one summary node that stands for all its steps and shows their states as counts; edges
are drawn between the nodes that remain, each pair once. A graph that would still draw
more than ``MAX_DRAWN`` nodes (a long chain) is drawn as at most ``BANDS`` bands of
consecutive layers, one summary node each; the step table lists every step. The layout
depends only on the plan, so the live updates
(:mod:`~airuntime.control_plane.console.pages`) recompute which node a step belongs to
without sending the layout again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["Dag", "Node", "layout", "plan_deps"]

MAX_PER_LAYER: Final = 24
"""Widest layer drawn step by step; a wider one is one summary node."""
COLUMN_W: Final = 200
ROW_H: Final = 44
NODE_W: Final = 160
NODE_H: Final = 30
MARGIN: Final = 12
MAX_DRAWN: Final = 300
"""More nodes than this (a deep graph, e.g. a 2,000-step chain) and consecutive layers are
drawn as bands: one summary node per band, at most ``BANDS`` of them."""
BANDS: Final = 40


@dataclass
class Node:
    """One drawn box: a step, or the summary of a collapsed layer."""

    node_id: str
    label: str
    layer: int
    row: int
    steps: tuple[str, ...]
    """The steps it stands for (one, unless it is a summary)."""

    @property
    def summary(self) -> bool:
        return len(self.steps) != 1 or self.node_id != self.steps[0]

    @property
    def x(self) -> int:
        return MARGIN + self.layer * COLUMN_W

    @property
    def y(self) -> int:
        return MARGIN + self.row * ROW_H


@dataclass
class Dag:
    nodes: list[Node]
    edges: list[tuple[Node, Node]]
    node_of: dict[str, str] = field(default_factory=dict)
    """Step id -> the id of the node that draws it."""

    @property
    def width(self) -> int:
        layers = max((n.layer for n in self.nodes), default=0) + 1
        return 2 * MARGIN + (layers - 1) * COLUMN_W + NODE_W

    @property
    def height(self) -> int:
        rows = max((n.row for n in self.nodes), default=0) + 1
        return 2 * MARGIN + (rows - 1) * ROW_H + NODE_H

    def counts(self, states: Mapping[str, str]) -> dict[str, dict[str, int]]:
        """For each summary node, how many of its steps are in each state."""
        return {
            n.node_id: dict(Counter(states.get(s, "pending") for s in n.steps))
            for n in self.nodes
            if n.summary
        }


def plan_deps(plan: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Step id -> its dependencies, from a compiled plan's JSON (``Plan.to_json``), in
    declaration order; steps the plan does not describe are left out."""
    deps: dict[str, tuple[str, ...]] = {}
    for step in plan.get("steps") or ():
        if isinstance(step, Mapping) and isinstance(step.get("id"), str):
            deps[step["id"]] = tuple(str(d) for d in step.get("deps") or ())
    return deps


def _layers(deps: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Longest-path layer of every step (the plan is acyclic: it was compiled)."""
    layer: dict[str, int] = {}
    for root in deps:
        stack: list[tuple[str, bool]] = [(root, False)]
        while stack:
            step, expanded = stack.pop()
            if step in layer:
                continue
            parents = [d for d in deps.get(step, ()) if d in deps]
            if expanded:
                layer[step] = 1 + max((layer[p] for p in parents), default=-1)
                continue
            stack.append((step, True))
            stack.extend((p, False) for p in parents if p not in layer)
    return layer


def layout(
    deps: Mapping[str, Sequence[str]],
    max_per_layer: int = MAX_PER_LAYER,
    max_drawn: int = MAX_DRAWN,
) -> Dag:
    """The drawing of a DAG given as step -> dependencies."""
    layer = _layers(deps)
    by_layer: dict[int, list[str]] = {}
    for step in deps:
        by_layer.setdefault(layer[step], []).append(step)
    drawn = sum(1 if len(s) > max_per_layer else len(s) for s in by_layer.values())
    if drawn > max_drawn:
        return _banded(deps, by_layer)
    nodes: list[Node] = []
    node_of: dict[str, str] = {}
    position: dict[str, float] = {}
    for depth in sorted(by_layer):
        steps = by_layer[depth]
        if len(steps) > max_per_layer:
            node = Node(f"layer-{depth}", f"{len(steps)} steps", depth, 0, tuple(steps))
            nodes.append(node)
            node_of.update((s, node.node_id) for s in steps)
            position.update((s, 0.0) for s in steps)
            continue
        steps = sorted(steps, key=lambda s: _barycentre(s, deps, position))
        for row, step in enumerate(steps):
            nodes.append(Node(step, step, depth, row, (step,)))
            node_of[step] = step
            position[step] = float(row)
    return _joined(deps, nodes, node_of)


def _joined(deps: Mapping[str, Sequence[str]], nodes: list[Node], node_of: dict[str, str]) -> Dag:
    by_id = {n.node_id: n for n in nodes}
    pairs = {(node_of[d], node_of[s]) for s, ds in deps.items() for d in ds if d in node_of}
    edges = [(by_id[a], by_id[b]) for a, b in sorted(pairs) if a != b]
    return Dag(nodes, edges, node_of)


def _banded(deps: Mapping[str, Sequence[str]], by_layer: dict[int, list[str]]) -> Dag:
    """At most ``BANDS`` summary nodes, each for a run of consecutive layers."""
    depth = max(by_layer) + 1
    width = -(-depth // BANDS)
    nodes: list[Node] = []
    node_of: dict[str, str] = {}
    for band, first in enumerate(range(0, depth, width)):
        last = min(depth, first + width) - 1
        steps = tuple(s for d in range(first, last + 1) for s in by_layer.get(d, ()))
        span = f"layer {first}" if first == last else f"layers {first}-{last}"
        node = Node(f"layers-{first}-{last}", f"{len(steps)} steps, {span}", band, 0, steps)
        nodes.append(node)
        node_of.update((s, node.node_id) for s in steps)
    return _joined(deps, nodes, node_of)


def _barycentre(
    step: str, deps: Mapping[str, Sequence[str]], position: Mapping[str, float]
) -> tuple[float, str]:
    placed = [position[d] for d in deps.get(step, ()) if d in position]
    return (sum(placed) / len(placed) if placed else 0.0, step)
