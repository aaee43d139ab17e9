"""No double dispatch: many pumps over one shared queue, and pumps that die mid-cycle.

Eight control planes (separate objects, Redis clients, dispatchers and pump
identities) are released together by one ``asyncio.Event`` over 1,000 queued runs
and drain into real in-process runtime instances. Every delivery is counted at the
provider boundary (a double dispatch would show there even though the runtime's
SharedRunId idempotency would hide it in the run index), and the run index is
checked too: one RunId per SharedRunId, every run completed once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from redis.asyncio import Redis

from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.control_plane.shared_queue import SharedQueue
from airuntime.control_plane.shared_runs import SharedRunStatus
from airuntime.core import keys
from airuntime.core.context import ExecutionContextSnapshot
from airuntime.fleet.runs import RunRequest
from runtime_pod.config import InstanceConfig
from runtime_pod.host import RuntimeHost
from runtime_pod.instance import RuntimeInstance
from tests.control_plane.support import (
    LOCAL_RUNTIME,
    TINY_PIPELINE,
    manual_cp,
    run_body,
    running_host,
    serving,
    snap,
    wait_for,
)

RUNS = 1_000
PUMPS = 8


class CountingTarget:
    """Forwards deliveries to a real runtime instance and counts them per SharedRunId."""

    def __init__(self, inner: RuntimeInstance, deliveries: Counter[str]) -> None:
        self.inner = inner
        self.instance_id = inner.instance_id
        self.deliveries = deliveries

    async def accept(self, request: RunRequest) -> str:
        self.deliveries[request.shared_run_id] += 1
        return await self.inner.accept(request)


async def test_concurrent_pumps_dispatch_each_shared_run_exactly_once(
    valkey: Redis, valkey_url: str
) -> None:
    config = InstanceConfig(
        provider="local",
        workers=300,
        max_local_workers_per_execution=1,
        max_concurrent_runs=300,
        queue_capacity=10_000,
        heartbeat_s=0.5,
    )
    host = RuntimeHost(valkey, config, instances=2)
    deliveries: Counter[str] = Counter()
    clients = [Redis.from_url(valkey_url) for _ in range(PUMPS)]
    pumps = [
        ControlPlane(
            clients[i],
            ControlPlaneSettings(background_pump=False, control_plane_id=f"cp-{i}"),
            worker_id=f"pump-{i}",
        )
        for i in range(PUMPS)
    ]
    gate = asyncio.Event()
    dispatched_by: Counter[str] = Counter()

    async def pump(cp: ControlPlane) -> None:
        await gate.wait()
        while sum(dispatched_by.values()) < RUNS:
            result = await cp.drain(20)
            dispatched_by[cp.identity.worker_id] += result.dispatched
            if result.dispatched == 0:
                await asyncio.sleep(0.005)  # queue empty or runtimes full: poll again

    try:
        async with running_host(host):
            for cp in pumps:
                for inst in host.instances:
                    cp.local.add(CountingTarget(inst, deliveries))
            srids = await _submit_runs(pumps[0])

            tasks = [asyncio.create_task(pump(cp)) for cp in pumps]
            gate.set()  # all eight pumps start together
            await asyncio.wait_for(asyncio.gather(*tasks), 90)

            async def all_finished() -> bool:
                return await valkey.zcard(keys.RunBucket(0).in_state("queued")) == 0 and (
                    await valkey.zcard(keys.RunBucket(0).in_state("running")) == 0
                )

            await wait_for(all_finished, timeout_s=60, what="1,000 runs to finish")
    finally:
        for c in clients:
            await c.aclose()

    # Provider boundary: each SharedRunId delivered exactly once, nothing else delivered.
    assert sum(deliveries.values()) == RUNS
    assert set(deliveries) == set(srids)
    assert max(deliveries.values()) == 1
    assert sum(dispatched_by.values()) == RUNS
    assert len([p for p, n in dispatched_by.items() if n > 0]) >= 2  # really concurrent

    await _assert_one_run_id_per_shared_run(valkey, pumps[0], srids, dispatched_by)


async def _submit_runs(cp: ControlPlane) -> list[str]:
    srids: list[str] = []
    for start in range(0, RUNS, 100):
        batch = await asyncio.gather(
            *(cp.submit(TINY_PIPELINE, snap()) for _ in range(start, start + 100))
        )
        srids += [r.shared_run_id for r in batch]
    assert await cp.queue.pending_count() == RUNS
    return srids


async def _assert_one_run_id_per_shared_run(
    valkey: Redis, cp: ControlPlane, srids: list[str], dispatched_by: Counter[str]
) -> None:
    """Shared runs, queue items and the run index agree: one RunId per SharedRunId."""
    runs = await cp.runs.list("default", limit=RUNS + 10)
    assert len(runs) == RUNS
    assert all(r.status is SharedRunStatus.DISPATCHED and r.run_id for r in runs)
    pumped_by = Counter(r.pump_worker_id for r in runs)
    assert pumped_by == +dispatched_by
    run_ids = [r.run_id for r in runs]
    assert len(set(run_ids)) == RUNS
    raw_ids = await valkey.zrange(keys.RunBucket(0).by_tenant("default"), 0, -1)
    index_ids = [rid.decode() for rid in raw_ids if isinstance(rid, bytes)]
    assert sorted(index_ids) == sorted(str(r) for r in run_ids)
    pipe = valkey.pipeline(transaction=False)
    for srid in srids:
        pipe.hmget(keys.squeue_item("default", srid), ["status", "claims"])
    items = await pipe.execute()
    assert {(s.decode(), c.decode()) for s, c in items} == {("Dispatched", "1")}
    pipe = valkey.pipeline(transaction=False)
    for rid in run_ids:
        pipe.hget(keys.run(rid), "status")  # type: ignore[arg-type]
    assert {s.decode() for s in await pipe.execute()} == {"completed"}
    assert await valkey.zcard("air:executions") == RUNS


@pytest.mark.parametrize(
    "delivered_before_death",
    [
        pytest.param(True, id="died-after-runtime-accepted"),
        pytest.param(False, id="died-before-delivery"),
    ],
)
async def test_pump_dying_between_claim_and_settle_is_recovered_without_double_dispatch(
    redis: Redis, delivered_before_death: bool
) -> None:
    lease_ms = 300
    cp = manual_cp(redis, claim_lease_ms=lease_ms, control_plane_id="cp-live")
    host = RuntimeHost(redis, LOCAL_RUNTIME, instances=1)
    snapshot: ExecutionContextSnapshot = snap("default", user_id="u")
    async with serving(cp, host):
        run = await cp.submit(TINY_PIPELINE, snapshot)
        srid = run.shared_run_id

        # The dead pump: claims, maybe delivers, and never settles.
        dead = SharedQueue(redis, claim_lease_ms=lease_ms)
        claimed = await dead.claim_next("cp-dead/pump-0")
        assert claimed is not None and claimed.shared_run_id == srid
        first_run_id = None
        if delivered_before_death:
            first_run_id = await host.instances[0].accept(
                RunRequest(shared_run_id=srid, pipeline=run.pipeline, snapshot=snapshot)
            )

        # While its claim lease runs, the item is nobody else's.
        blocked = await cp.drain(10)
        assert blocked.dispatched == 0 and blocked.stopped == "empty"
        assert (await cp.queue.item(srid, "default"))["status"] == "Claimed"

        # After the lease expired, the live pump recovers the item: it delivers it, or
        # (the runtime already ran the dead pump's delivery and its outcome ended the
        # shared run) retires it as Dispatched without delivering it again.
        async def recovered() -> bool:
            await cp.drain(10)
            return (await cp.queue.item(srid, "default"))["status"] == "Dispatched"

        await wait_for(recovered, timeout_s=10, what="claim lease expiry and recovery")
        item = await cp.queue.item(srid, "default")
        assert item["claims"] == "2"
        # The dead pump's late settle is refused: its claim token is stale.
        assert await dead.settle(claimed, "Pending", "zombie") is False
        assert (await cp.queue.item(srid, "default"))["status"] == "Dispatched"

        async def ended() -> dict[str, Any] | None:
            body = await run_body(cp, srid, "default")
            return body if body is not None and body["status"] == "Succeeded" else None

        body = await wait_for(ended, timeout_s=30, what="the shared run to end Succeeded")

    if first_run_id is not None:
        assert body["run_id"] == first_run_id  # the runtime's SharedRunId idempotency
    else:
        assert body["pump_worker_id"] == "cp-live/pump-0"
    assert await redis.zcard(keys.RunBucket(0).by_tenant("default")) == 1
    assert await redis.zcard("air:executions") == 1
    assert body["run"]["status"] == "completed"
