"""The final result does not depend on which worker ran what, how many workers ran,
or on recoveries: random DAGs with random transient failures and random worker
crashes give identical terminal snapshots for 1, 3 and 8 workers (timings, worker
ids and claim tokens aside)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import HandlerRegistry, StepContext
from airuntime.engine.worker_pool import PoolSettings, WorkerPool
from tests.conftest import RedisServerInfo
from tests.dags import plan_of

VOLATILE = {"claimed_at_ms", "finished_at_ms", "worker"}


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(min_value=1, max_value=200))
    deps: dict[str, list[str]] = {}
    for i in range(n):
        parents = draw(st.sets(st.integers(0, i - 1), max_size=min(i, 3))) if i else set()
        deps[f"n{i}"] = sorted(f"n{j}" for j in parents)
    ids = list(deps)
    # (step, attempt) pairs that raise a transient error; attempts 1..3 with a budget of 3,
    # so some steps recover through retries and some exhaust their budget.
    failing = draw(st.sets(st.tuples(st.sampled_from(ids), st.integers(1, 3)), max_size=n // 2))
    crashing = draw(st.sets(st.sampled_from(ids), max_size=min(6, n)))
    return {"deps": deps, "failing": failing, "crashing": crashing}


def _normalised(snapshot: dict[str, Any]) -> dict[str, Any]:
    steps = {
        sid: {k: v for k, v in st.items() if k not in VOLATILE}
        for sid, st in snapshot["steps"].items()
    }
    top = {
        k: v
        for k, v in snapshot.items()
        if k not in {"execution_id", "created_at_ms", "started_at_ms", "finished_at_ms", "steps"}
    }
    return {**top, "steps": steps}


async def _run_once(
    store: ExecutionStore, scenario: dict[str, Any], workers: int, tag: str, *, crashes: bool = True
) -> dict[str, Any]:
    crashed: set[str] = set() if crashes else set(scenario["crashing"])

    async def step(ctx: StepContext) -> str:
        await asyncio.sleep(0)
        if ctx.step_id in scenario["crashing"] and ctx.step_id not in crashed:
            crashed.add(ctx.step_id)
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # the worker is killed mid-step
            await asyncio.Event().wait()
        if (ctx.step_id, ctx.attempt) in scenario["failing"]:
            raise RuntimeError(f"transient failure of {ctx.step_id} attempt {ctx.attempt}")
        digest = hashlib.sha256(json.dumps([ctx.step_id, ctx.inputs], sort_keys=True).encode())
        return digest.hexdigest()[:16]

    reg = HandlerRegistry(autoload=True)
    reg.register("det", step)
    deps = scenario["deps"]
    overrides = {
        sid: {
            "with": {"up": [f"${{steps.{p}.output}}" for p in ps]},
            "retry": {
                "max_attempts": 3,
                "backoff_initial_s": 0.001,
                "backoff_max_s": 0.005,
                "jitter": 0.5,
            },
        }
        for sid, ps in deps.items()
    }
    plan = plan_of(deps, uses="det", failure_policy="continue", steps=overrides, registry=reg)
    eid = await store.create(plan, execution_id=f"det-{tag}-{workers}-{crashes}")
    pool = WorkerPool(store, reg, PoolSettings(workers=workers, lease_ms=100, idle_poll_max_ms=20))
    await asyncio.wait_for(pool.run(eid), timeout=120)
    if crashes:
        ran = {s for s, st in (await store.step_states(eid)).items() if st != "skipped"}
        assert crashed == set(scenario["crashing"]) & ran, "every crash scenario was exercised"
    snapshot = await store.snapshot(eid)
    assert snapshot is not None
    return snapshot


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(scenario=scenarios())
async def test_terminal_snapshot_is_independent_of_worker_count_failures_and_crashes(
    redis_server: RedisServerInfo, scenario: dict[str, Any]
) -> None:
    redis = Redis.from_url(redis_server.url)
    try:
        store = ExecutionStore(redis)
        tag = uuid.uuid4().hex[:10]
        baseline = _normalised(await _run_once(store, scenario, 1, tag, crashes=False))
        results = {w: await _run_once(store, scenario, w, tag) for w in (1, 3, 8)}
        for w in (1, 3, 8):
            assert _normalised(results[w]) == baseline, (
                f"{w} workers with crashes diverged from 1 worker without crashes"
            )
        expected_failed = {
            s for s in scenario["deps"] if {(s, 1), (s, 2), (s, 3)} <= scenario["failing"]
        }
        failed = {s for s, st in results[1]["steps"].items() if st["status"] == "failed"}
        assert failed == expected_failed
    finally:
        await redis.aclose()
