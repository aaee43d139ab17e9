"""Resharding under a running execution: its slot moves to another master while a
worker pool drives it. The cluster client follows ASK during the move and MOVED after
it (redis-py's, not ours), a script that meets the slot half moved gets TRYAGAIN and is
retried, and the execution finishes with every step completed once."""

from __future__ import annotations

import asyncio
from collections import Counter

from redis.crc import key_slot

from airuntime.core.redis_client import CountingRedisCluster
from airuntime.devstack.cluster import LocalCluster
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import HandlerRegistry, StepContext
from airuntime.engine.worker_pool import PoolSettings, WorkerPool
from tests.dags import fan, plan_of


async def test_an_execution_survives_its_slot_moving_to_another_master(
    valkey_cluster: LocalCluster, cluster_redis: CountingRedisCluster
) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def step(ctx: StepContext) -> str:
        started.set()
        if ctx.step_id == "s0":
            await release.wait()  # one step outlives the move: its completion goes to the new owner
        return ctx.step_id

    reg = HandlerRegistry(autoload=True)
    reg.register("step", step)
    plan = plan_of(fan(40), uses="step", registry=reg)
    store = ExecutionStore(cluster_redis)
    eid = await store.create(plan)
    meta = store.keys_of(eid).meta
    slot = key_slot(meta.encode())
    before = cluster_redis.get_node_from_key(meta).port
    target = next(p for p in valkey_cluster.masters() if p != before)

    pool = WorkerPool(store, reg, PoolSettings(workers=4, lease_ms=20_000))
    run = asyncio.create_task(pool.run(eid))
    await started.wait()
    moved_from = await asyncio.to_thread(valkey_cluster.move_slot, slot, target, batch=1)
    release.set()
    assert await asyncio.wait_for(run, 60) == "Succeeded"

    assert moved_from == before
    assert cluster_redis.get_node_from_key(meta).port == target, "the client learned the move"
    events = await store.events(eid)
    completed = Counter(e.get("step") for e in events if e.type == "step_completed")
    assert completed == Counter({s.id: 1 for s in plan.steps})
    assert pool.stats.crashed_steps == 0
