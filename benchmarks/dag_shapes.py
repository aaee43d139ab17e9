"""The DAG shapes the throughput benchmarks drain, as ``step -> parents`` mappings.

Why a module of its own: the engine run (:mod:`benchmarks.dag_throughput`) and the
floor (:mod:`benchmarks.floor`) must drain exactly the same DAGs, and the size sweep
builds its shapes by name (``fanout-<n>`` is 1 -> n -> 1, ``chain-<n>`` a chain).
Steps are listed in topological order.
"""

from __future__ import annotations

import random
import re

from airuntime.engine.pipeline import PipelineLimits, Plan, compile_pipeline, parse_pipeline

__all__ = ["Deps", "deps_of", "plan_of", "steps_of"]

RANDOM_SEED = 7
Deps = dict[str, list[str]]
_NAME = re.compile(r"^(?P<kind>fanout|chain|random)-(?P<n>\d+)$")


def fan(n: int) -> Deps:
    """root -> n parallel steps -> sink."""
    d: Deps = {"root": []}
    for i in range(n):
        d[f"s{i}"] = ["root"]
    d["sink"] = [f"s{i}" for i in range(n)]
    return d


def chain(n: int) -> Deps:
    return {f"c{i}": ([f"c{i - 1}"] if i else []) for i in range(n)}


def random_dag(n: int, seed: int = RANDOM_SEED, max_parents: int = 3) -> Deps:
    """n steps, each with 0-3 random earlier parents."""
    rng = random.Random(seed)
    d: Deps = {}
    for i in range(n):
        k = rng.randint(0, min(i, max_parents))
        d[f"n{i}"] = sorted({f"n{j}" for j in rng.sample(range(i), k)}) if i else []
    return d


def deps_of(shape: str) -> Deps:
    """The DAG named ``fanout-<n>``, ``chain-<n>`` or ``random-<n>``."""
    m = _NAME.match(shape)
    if m is None:
        raise ValueError(f"unknown shape {shape!r} (fanout-<n>, chain-<n>, random-<n>)")
    n = int(m.group("n"))
    if m.group("kind") == "fanout":
        return fan(n)
    if m.group("kind") == "chain":
        return chain(n)
    return random_dag(n)


def steps_of(shape: str) -> int:
    """How many steps the shape has (a fan-out has its root and sink besides n)."""
    m = _NAME.match(shape)
    if m is None:
        raise ValueError(f"unknown shape {shape!r}")
    return int(m.group("n")) + (2 if m.group("kind") == "fanout" else 0)


def plan_of(deps: Deps, pipeline_id: str) -> Plan:
    """The compiled pipeline of ``deps``: every step ``uses: noop``. The step limit is
    raised to the shape's size: it is a policy for submitted pipelines (50,000 by
    default), and the sweep's 100,000-step point is above it."""
    steps = [{"id": sid, "uses": "noop", "depends_on": ds} for sid, ds in deps.items()]
    limits = PipelineLimits(max_steps=max(PipelineLimits.max_steps, len(steps)))
    return compile_pipeline(parse_pipeline({"id": pipeline_id, "steps": steps}), limits=limits)
