"""Small builders for test pipelines (plain dicts through the real pipeline compiler)."""

from __future__ import annotations

import random
from typing import Any

from airuntime.engine.handlers import HandlerRegistry
from airuntime.engine.pipeline import Plan, compile_pipeline, parse_pipeline


def plan_of(
    deps: dict[str, list[str]],
    *,
    pipeline_id: str = "t",
    failure_policy: str = "fail_fast",
    uses: str = "noop",
    steps: dict[str, dict[str, Any]] | None = None,
    throttle: list[dict[str, Any]] | None = None,
    registry: HandlerRegistry | None = None,
) -> Plan:
    """A plan whose step ``s`` depends on ``deps[s]``; ``steps[s]`` overrides fields."""
    specs = []
    for sid, ds in deps.items():
        spec: dict[str, Any] = {"id": sid, "uses": uses, "depends_on": list(ds)}
        spec.update((steps or {}).get(sid, {}))
        specs.append(spec)
    doc: dict[str, Any] = {"id": pipeline_id, "failure_policy": failure_policy, "steps": specs}
    if throttle:
        doc["throttle"] = throttle
    return compile_pipeline(parse_pipeline(doc), registry)


def fan(n: int) -> dict[str, list[str]]:
    """root -> n parallel steps -> sink."""
    d: dict[str, list[str]] = {"root": []}
    for i in range(n):
        d[f"s{i}"] = ["root"]
    d["sink"] = [f"s{i}" for i in range(n)]
    return d


def chain(n: int) -> dict[str, list[str]]:
    return {f"c{i}": ([f"c{i - 1}"] if i else []) for i in range(n)}


def random_dag(n: int, seed: int, max_parents: int = 3) -> dict[str, list[str]]:
    rng = random.Random(seed)
    d: dict[str, list[str]] = {}
    for i in range(n):
        k = rng.randint(0, min(i, max_parents))
        d[f"n{i}"] = sorted({f"n{j}" for j in rng.sample(range(i), k)}) if i else []
    return d
