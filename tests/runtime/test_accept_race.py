"""Accepting a run is one step: concurrent deliveries of one SharedRunId create one run.

Fifty deliveries of the same SharedRunId are released together by a barrier, spread
over several runtime instances, in-process and through the ``http`` and ``redis``
providers. Every delivery answers the same RunId; the run is queued once, started once
and has one execution (main created two: ``SET NX`` plus a separate transaction let the
losers "repair" a record the winner had not written yet).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.fleet.providers import HttpProvider, LocalProvider, RedisProvider
from airuntime.fleet.runs import RunStatus
from runtime_pod.instance import RuntimeInstance
from tests.runtime.conftest import MakeHost, Runtime
from tests.runtime.support import TEST_TOKEN, pipeline, request

pytestmark = pytest.mark.timeout(90)

CONTENDERS = 50


async def _together(calls: list[Any]) -> list[str]:
    """Run the zero-argument coroutine functions ``calls`` released by one barrier."""
    barrier = asyncio.Barrier(len(calls))

    async def contender(call: Any) -> str:
        await barrier.wait()
        return str(await call())

    return await asyncio.gather(*(contender(c) for c in calls))


async def _queued_everywhere(redis: Redis, instances: list[RuntimeInstance]) -> list[str]:
    out: list[str] = []
    for inst in instances:
        raw = await redis.lrange(keys.instance_queue(inst.instance_id), 0, -1)
        out += [r.decode() for r in raw]
    return out


async def test_fifty_concurrent_accepts_on_three_instances_create_one_run_and_one_queue_entry(
    runtime: Runtime, redis: Redis
) -> None:
    instances = [runtime.instance(f"race-{n}", assist=False) for n in range(3)]
    req = request(pipeline(1))
    run_ids = await _together([lambda i=i: instances[i % 3].accept(req) for i in range(CONTENDERS)])
    assert len(set(run_ids)) == 1, set(run_ids)
    [run_id] = set(run_ids)
    assert await _queued_everywhere(redis, instances) == [run_id], "queued exactly once"
    assert await runtime.index.in_state(RunStatus.QUEUED) == [run_id]
    assert [r.run_id for r in await runtime.index.list_for_tenant("tenant-a")] == [run_id]
    assert runtime.watcher.states[run_id] == ["queued"], "created once"

    for inst in instances:
        await inst.start()
    runtime.gate.open()
    assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
    assert runtime.watcher.states[run_id] == ["queued", "running", "completed"]
    assert await redis.zcard(keys.executions_index()) == 1, "one execution"


@pytest.mark.parametrize("provider", ["local", "http", "redis"])
async def test_fifty_concurrent_deliveries_through_a_provider_create_one_run_and_one_execution(
    runtime: Runtime, hosts: MakeHost, redis: Redis, provider: str
) -> None:
    host = await hosts(instances=3, provider=provider, runtime_prefix="race", assist=False)
    descriptors = [await runtime.registry.get(i.instance_id) for i in host.instances]
    assert all(d is not None for d in descriptors)
    req = request(pipeline(1))
    async with httpx.AsyncClient(timeout=30) as client:
        if provider == "local":
            delivery: Any = LocalProvider()
            for inst in host.instances:
                delivery.add(inst)
        elif provider == "http":
            delivery = HttpProvider(client, token=TEST_TOKEN)
        else:
            delivery = RedisProvider(redis, timeout_s=30)
        run_ids = await _together(
            [lambda i=i: delivery.deliver(descriptors[i % 3], req) for i in range(CONTENDERS)]
        )
    assert len(set(run_ids)) == 1, set(run_ids)
    [run_id] = set(run_ids)
    await runtime.gate.wait_entered(1)
    assert runtime.watcher.states[run_id] == ["queued", "running"], "queued and started once"
    assert await _queued_everywhere(redis, host.instances) == []
    assert await runtime.index.in_state(RunStatus.RUNNING) == [run_id]
    runtime.gate.open()
    assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
    assert runtime.watcher.states[run_id] == ["queued", "running", "completed"]
    assert await redis.zcard(keys.executions_index()) == 1, "one execution"
    assert len(runtime.gate.entered) == 1, "its step ran once"
    assert await redis.xlen(keys.RunBucket(0).outcomes) == 1, "one outcome"


async def test_a_redelivery_answers_the_run_id_even_when_the_instance_is_paused_or_full(
    runtime: Runtime,
) -> None:
    inst = runtime.instance("race-1", queue_capacity=1)
    req = request(pipeline(1))
    run_id = await inst.accept(req)
    inst.pause_queue()
    assert await inst.accept(req) == run_id, "paused"
    inst.resume_queue()
    assert await inst.accept(req.model_dump(mode="json")) == run_id, "full"
    assert await runtime.index.queue_length("race-1") == 1
