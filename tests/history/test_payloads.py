"""Large step outputs go to the durable payload store; Redis keeps a reference; the
dependent's handler gets the value. Real Valkey/Redis and real SQLite/PostgreSQL."""

from __future__ import annotations

import json

from redis.asyncio import Redis

from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import HandlerRegistry, StepContext
from airuntime.engine.worker_pool import PoolSettings, WorkerPool
from airuntime.history import HistoryStore
from airuntime.history.payloads import payload_offload
from airuntime.history.records import PayloadRef
from tests.dags import plan_of
from tests.history.conftest import settings

THRESHOLD = 1024
BIG = ["x" * 100] * 50  # ~5 KB of JSON


async def test_a_large_output_is_offloaded_and_resolved_for_its_dependent(
    redis: Redis, store: HistoryStore
) -> None:
    seen: list[object] = []
    registry = HandlerRegistry(autoload=True)

    @registry.handler("seen")
    def record(ctx: StepContext) -> int:
        seen.append(ctx.inputs["value"])
        return len(ctx.inputs["value"])

    plan = plan_of(
        {"big": [], "small": [], "use": ["big", "small"]},
        steps={
            "big": {"uses": "echo", "with": {"value": BIG}},
            "small": {"uses": "echo", "with": {"value": [1, 2]}},
            "use": {"uses": "seen", "with": {"value": "${steps.big.output}"}},
        },
        registry=registry,
    )
    engine = ExecutionStore(redis)
    offload = payload_offload(store, settings(payload_threshold_bytes=THRESHOLD))
    pool = WorkerPool(engine, registry, PoolSettings(workers=2), payloads=offload)
    eid = await engine.create(plan)
    assert await pool.run(eid) == "Succeeded"

    assert seen == [BIG], "the dependent's handler received the value, not the reference"
    snapshot = await engine.snapshot(eid)
    assert snapshot is not None
    held = snapshot["steps"]["big"]["output"]
    ref = PayloadRef.from_json(held)
    assert ref is not None, f"Redis keeps a reference (the terminal snapshot): {held!r}"
    assert ref.size == len(json.dumps(BIG, separators=(",", ":"))) > THRESHOLD
    assert snapshot["steps"]["small"]["output"] == [1, 2]
    payload = await store.get_payload(ref.payload_id, "default")
    assert payload is not None and json.loads(payload.data) == BIG
    assert await store.get_payload(ref.payload_id, "tenant-b") is None, "tenant boundary"
    assert offload.offloaded == 1
