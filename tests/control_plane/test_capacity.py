"""Worker capacity as the control plane sees it (docs/architecture.md §8).

A latch handler holds steps open, so the state is observed, not timed: the capacity
descriptor in the registry shows WorkerCount / ActiveWorkerCount /
AvailableWorkerCount / MaxLocalWorkersPerExecution; CanAcceptRun turns false when
the workers are saturated even though run slots are free, and admission then queues;
each execution gets min(WorkerCount, MaxLocalWorkersPerExecution, AvailableWorkerCount)
workers, so at most that many of its steps run at once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from redis.asyncio import Redis

from airuntime.control_plane.admission import Decision
from airuntime.control_plane.shared_runs import SharedRunStatus
from airuntime.core import keys
from airuntime.engine.handlers import HandlerRegistry, StepContext
from airuntime.fleet.registry import CapacityDescriptor, Registry
from airuntime.fleet.tenancy import DEFAULT_ALLOWED_HANDLERS, TenantSettings
from runtime_pod.config import InstanceConfig
from runtime_pod.host import RuntimeHost
from tests.control_plane.support import (
    drain_until_finished,
    manual_cp,
    run_body,
    serving,
    snap,
    wait_for,
)

BLOCKING: dict[str, Any] = {
    "id": "blocking",
    "steps": [{"id": f"b{i}", "uses": "latch"} for i in range(4)],
}


class Latch:
    """A step handler that holds until released, counting running steps per execution."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.changed = asyncio.Event()
        self.active: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()

    async def __call__(self, ctx: StepContext) -> None:
        self.active[ctx.execution_id] += 1
        self.peak[ctx.execution_id] = max(
            self.peak[ctx.execution_id], self.active[ctx.execution_id]
        )
        self.changed.set()
        try:
            await self.release.wait()
        finally:
            self.active[ctx.execution_id] -= 1

    async def until_running(self, total: int) -> None:
        async def reached() -> None:
            while sum(self.active.values()) < total:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(reached(), 10)


FOUR_WORKERS = InstanceConfig(
    provider="local",
    workers=4,
    max_local_workers_per_execution=3,
    max_concurrent_runs=5,
    heartbeat_s=0.5,
    assist=False,
)


async def _capacity_when(
    registry: Registry, instance_id: str, active_workers: int, running_runs: int
) -> CapacityDescriptor:
    """The instance's published capacity, once it shows ``active_workers`` busy workers
    and ``running_runs`` running runs. The descriptor is published on a change, so one
    written between a run taking its workers and the run being marked running shows
    the first and not yet the second; the next one shows both."""

    async def probe() -> CapacityDescriptor | None:
        d = await registry.get(instance_id)
        ok = (
            d is not None
            and d.capacity.active_worker_count == active_workers
            and d.capacity.running_run_count == running_runs
        )
        return d.capacity if ok and d is not None else None

    return await wait_for(
        probe, timeout_s=10, what=f"{active_workers} active workers, {running_runs} runs"
    )


async def test_worker_capacity_is_visible_and_saturated_workers_stop_admission(
    redis: Redis,
) -> None:
    latch = Latch()
    handlers = HandlerRegistry(autoload=True)
    handlers.register("latch", latch)
    # The default tenant may use the test's handler (runtimes check the allowlist).
    await Registry(redis).put_tenant(
        TenantSettings(tenant_id="default", allowed_handlers=(*DEFAULT_ALLOWED_HANDLERS, "latch"))
    )
    host = RuntimeHost(redis, FOUR_WORKERS, instances=1, handlers=handlers)
    cp = manual_cp(redis, handlers=handlers, scale_out_enabled=False)

    async def capacity_when(active_workers: int, running_runs: int) -> CapacityDescriptor:
        iid = host.instances[0].instance_id
        return await _capacity_when(Registry(redis), iid, active_workers, running_runs)

    # The default tenant may use the test's handler (tenants get the built-ins only).
    allowed = (*DEFAULT_ALLOWED_HANDLERS, "latch")
    await Registry(redis).put_tenant(TenantSettings(tenant_id="default", allowed_handlers=allowed))
    async with serving(cp, host):
        idle = await capacity_when(0, 0)
        assert (idle.worker_count, idle.available_worker_count) == (4, 4)
        assert idle.max_local_workers_per_execution == 3 and idle.can_accept_run

        # Run 1: capped by MaxLocalWorkersPerExecution = 3 of the 4 workers.
        run1 = await cp.submit(BLOCKING, snap())
        assert (await cp.drain(1)).dispatched == 1
        await latch.until_running(3)
        one = await capacity_when(3, 1)
        assert (one.active_worker_count, one.available_worker_count) == (3, 1)
        assert one.running_run_count == 1 and one.can_accept_run

        # Run 2: min(4, 3, available 1) = 1 worker; now every worker is taken.
        run2 = await cp.submit(BLOCKING, snap())
        assert (await cp.drain(1)).dispatched == 1
        await latch.until_running(4)
        full = await capacity_when(4, 2)
        assert (full.active_worker_count, full.available_worker_count) == (4, 0)
        assert full.running_run_count == 2 and full.available_run_slots == 3
        assert not full.can_accept_run  # run slots free, workers saturated

        # Admission sees it: the third run stays QueuedGlobally.
        run3 = await cp.submit(BLOCKING, snap())
        [r3] = (await cp.drain(1)).results
        assert not r3.success and r3.decision is Decision.QUEUE
        stored = await cp.runs.get(run3.shared_run_id)
        assert stored is not None and stored.status is SharedRunStatus.QUEUED_GLOBALLY

        # While workers are held, each execution's running steps never exceed its share.
        b1 = await run_body(cp, run1.shared_run_id, "default")
        b2 = await run_body(cp, run2.shared_run_id, "default")
        assert b1 is not None and b2 is not None
        e1, e2 = b1["execution_id"], b2["execution_id"]
        assert await redis.zcard(keys.execution_keys(e1).running) == 3
        assert await redis.zcard(keys.execution_keys(e2).running) == 1

        latch.release.set()
        bodies = await drain_until_finished(
            cp, {r.shared_run_id: "default" for r in (run1, run2, run3)}
        )
        back = await capacity_when(0, 0)
        assert back.available_worker_count == 4 and back.can_accept_run

    assert {b["run"]["status"] for b in bodies.values()} == {"completed"}
    assert latch.peak[e1] == 3 and latch.peak[e2] == 1
    md1 = bodies[run1.shared_run_id]["run"]["metadata"]
    md2 = bodies[run2.shared_run_id]["run"]["metadata"]
    assert md1["max.local.workers.per.execution"] == "3"
    assert md1["effective.worker.count.per.execution"] == "3"
    assert md2["effective.worker.count.per.execution"] == "1"
