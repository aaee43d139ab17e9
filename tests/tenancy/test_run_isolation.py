"""Run status / cancel isolation between tenants (docs/architecture.md §8).

By SharedRunId (control plane) and by RunId (runtime queue control): the caller's
tenant is checked against the stored snapshot / tenant-aware run index *before*
anything else is touched; an invisible run answers None ("not found"), never
another tenant's RunState or ExecutionId.
"""

from __future__ import annotations

from redis.asyncio import Redis

from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.shared_runs import SharedRunStatus
from airuntime.core import keys
from airuntime.fleet.registry import Registry
from airuntime.fleet.runs import RunRequest, RunStatus
from runtime_pod.host import RuntimeHost
from tests.control_plane.support import (
    TENANT_A,
    TENANT_A_RUNTIME,
    TINY_PIPELINE,
    drain_until_finished,
    run_body,
    running_host,
    serving,
    snap,
)


async def test_tenant_b_cannot_get_or_cancel_tenant_a_shared_run(
    redis: Redis, cp: ControlPlane
) -> None:
    await Registry(redis).put_tenant(TENANT_A)
    host = RuntimeHost(redis, TENANT_A_RUNTIME, instances=1)
    async with serving(cp, host):
        run = await cp.submit(TINY_PIPELINE, snap("tenant-a", user_id="alice"))
        srid = run.shared_run_id

        # Queued: tenant A sees it, tenant B gets "not found" and cannot cancel it.
        assert (await run_body(cp, srid, "tenant-a")) is not None
        assert await run_body(cp, srid, "tenant-b") is None
        assert await cp.cancel(srid, "tenant-b") is None
        assert [r.shared_run_id for r in await cp.list("tenant-a")] == [srid]
        assert await cp.list("tenant-b") == []
        still = await cp.runs.get(srid)
        assert still is not None and still.status is SharedRunStatus.QUEUED_GLOBALLY
        assert (await cp.queue.item(srid, "tenant-a"))["status"] == "Pending"

        # Dispatched and completed: still invisible to B, B's cancel changes nothing.
        bodies = await drain_until_finished(cp, {srid: "tenant-a"})
        body_a = bodies[srid]
        assert body_a["assigned_instance_id"] == "tenant-a-runtime-1"
        assert body_a["run"]["status"] == "completed" and body_a["execution_id"]
        assert await run_body(cp, srid, "tenant-b") is None
        assert await cp.cancel(srid, "tenant-b") is None
        after = await run_body(cp, srid, "tenant-a")
        assert after is not None and after["run"]["status"] == "completed"
        assert after["reason"] is None  # B's cancel was never recorded

        # RunId-level reads under tenant B: nothing, and no ExecutionId anywhere.
        run_id = body_a["run_id"]
        assert await cp.run_index.get_for_tenant(run_id, "tenant-b") is None
        assert await cp.run_index.list_for_tenant("tenant-b") == []
        inst = host.instances[0]
        assert await inst.run_status(run_id, "tenant-b") is None
        mine = await inst.run_status(run_id, "tenant-a")
        assert mine is not None and mine.execution_id == body_a["execution_id"]


async def test_runtime_cancel_by_run_id_checks_tenant_index_before_the_local_controller(
    redis: Redis,
) -> None:
    host = RuntimeHost(redis, TENANT_A_RUNTIME, instances=1)
    async with running_host(host):
        inst = host.instances[0]
        request = RunRequest(
            shared_run_id="sr-isolation", pipeline=TINY_PIPELINE, snapshot=snap("tenant-a")
        )
        # Queued on a paused instance (written by the run index directly: a paused
        # intake refuses new runs), so the controller never starts it.
        inst.pause_queue()
        run_id, created = await inst.index.accept(inst.instance_id, request)
        assert created
        queue = keys.instance_queue(inst.instance_id)
        assert await redis.lrange(queue, 0, -1) == [run_id.encode()]

        # Tenant B: "not found" for status and cancel, and the local queue is untouched.
        assert await inst.run_status(run_id, "tenant-b") is None
        assert await inst.cancel_run(run_id, "tenant-b") is None
        assert await redis.lrange(queue, 0, -1) == [run_id.encode()]
        record = await inst.run_status(run_id, "tenant-a")
        assert record is not None and record.status is RunStatus.QUEUED

        # Tenant A: cancel reaches the local queue.
        cancelled = await inst.cancel_run(run_id, "tenant-a")
        assert cancelled is not None and cancelled.status is RunStatus.CANCELLED
        assert await redis.llen(queue) == 0
        assert cancelled.execution_id is None
