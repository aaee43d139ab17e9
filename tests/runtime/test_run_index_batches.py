"""The run index's batched steps: what each sends, and that merging them kept the rules.

A controller's start batch (the start scripts, the queue removals, the tenants' settings)
is one ordered pipeline; on a standalone server acceptance reads the queue's room and
pushes the run in the script that creates it, so concurrent accepts never overshoot.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.fleet.run_index import QueueFull
from airuntime.fleet.runs import RunStatus
from airuntime.fleet.tenancy import TenantSettings, default_settings
from tests.runtime.conftest import Runtime
from tests.runtime.support import pipeline, request

pytestmark = pytest.mark.timeout(60)


async def test_a_start_batch_starts_removes_and_reads_the_tenants_in_one_round_trip(
    runtime: Runtime, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's start: the start scripts, the queue removals (of started and
    refused runs alike) and the tenants' settings, in that order, in one pipeline."""
    index = runtime.index
    await runtime.registry.put_tenant(TenantSettings(tenant_id="tenant-a", max_instances=5))
    mine, _ = await index.accept("sb-1", request(pipeline(1)))
    other, _ = await index.accept("sb-1", request(pipeline(1), tenant="tenant-b"))
    assert await index.start("sb-1", other, "ex-earlier")  # no longer queued
    await redis.rpush(index.queue_key("sb-1"), other)  # a stale entry of it
    executed: list[int] = []
    real = type(redis.pipeline())

    class Counted(real):  # type: ignore[valid-type,misc]
        async def execute(self, raise_on_error: bool = True) -> Any:
            executed.append(len(self.command_stack))
            return await super().execute(raise_on_error)

    monkeypatch.setattr(
        redis,
        "pipeline",
        lambda transaction=True: Counted(
            redis.connection_pool, redis.response_callbacks, transaction, None
        ),
    )
    batch = await index.start_batch(
        "sb-1",
        [(mine, "ex-1"), (other, "ex-2")],
        tenant_ids=["tenant-b", "tenant-a", "tenant-z", "tenant-a"],
    )
    assert executed == [2 + 2 + 1], "two starts, two removals, one read: one round trip"
    assert batch.started == [True, False]
    assert batch.tenants["tenant-a"].max_instances == 5
    assert batch.tenants["tenant-b"] == await runtime.registry.tenant("tenant-b")
    assert batch.tenants["tenant-z"] == default_settings("tenant-z")  # nothing stored
    assert set(batch.tenants) == {"tenant-a", "tenant-b", "tenant-z"}
    assert await redis.lrange(index.queue_key("sb-1"), 0, -1) == []
    record = await index.get_for_tenant(other, "tenant-b")
    assert record is not None and record.execution_id == "ex-earlier"


async def test_concurrent_accepts_on_a_standalone_server_never_overshoot_the_queue(
    runtime: Runtime, redis: Redis
) -> None:
    """Where the local queue shares the runs' slot, acceptance reads the room and pushes
    the run in one script: 40 contenders released together on a queue of capacity 7
    get exactly 7 runs queued, each in the queue once, with no window between a run's
    record and its queue entry; the others are refused QueueFull with nothing written."""
    index = runtime.index
    assert index.buckets == 1
    contenders, capacity = 40, 7
    barrier = asyncio.Barrier(contenders)

    async def accept(i: int) -> tuple[str, bool] | QueueFull:
        await barrier.wait()
        try:
            return await index.accept(
                "sq-1", request(pipeline(1), shared_run_id=f"sr-q{i}"), queue_capacity=capacity
            )
        except QueueFull as exc:
            return exc

    answers = await asyncio.gather(*(accept(i) for i in range(contenders)))
    created = [a[0] for a in answers if isinstance(a, tuple) and a[1]]
    assert len(created) == capacity
    assert sum(isinstance(a, QueueFull) for a in answers) == contenders - capacity
    queue = [q.decode() for q in await redis.lrange(index.queue_key("sq-1"), 0, -1)]
    assert sorted(queue) == sorted(created)
    queued = await redis.zrange(keys.run_buckets(1)[0].in_state(RunStatus.QUEUED), 0, -1)
    assert sorted(q.decode() for q in queued) == sorted(created)
    for i, answer in enumerate(answers):
        if isinstance(answer, QueueFull):
            assert await index.run_for_shared(f"sr-q{i}") is None, "nothing written"
