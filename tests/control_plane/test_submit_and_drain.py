"""Submit modes and manual drain, against real Redis and in-process runtime instances.

Reference (000_*): queue-first submit -> QueuedGlobally + Pending item, snapshot
persisted, no RunId, no ExecutionId; manual drain -> snapshot restored, dispatch,
Dispatched + RunId + ExecutionId, completion; direct dispatch keeps the real
admission decision; pump switches (manual drain allowed / background off).
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
from redis.asyncio import Redis

from airuntime.control_plane.admission import Decision
from airuntime.control_plane.scale_out import ScaleOutPhase
from airuntime.control_plane.service import (
    ControlPlane,
    ControlPlaneError,
    ControlPlaneSettings,
    SubmitMode,
)
from airuntime.control_plane.shared_runs import SharedRunStatus
from airuntime.core import keys
from airuntime.fleet.registry import Registry
from airuntime.fleet.tenancy import TenantSettings
from runtime_pod.host import RuntimeHost
from tests.control_plane.support import (
    SHARED_RUNTIME,
    TENANT_A,
    TINY_PIPELINE,
    drain_until_finished,
    manual_cp,
    run_body,
    running_cp,
    running_host,
    serving,
    snap,
    wait_ended,
    wait_finished,
    wait_for,
)


async def test_queue_first_submit_leaves_run_queued_globally_with_pending_item_and_no_ids(
    redis: Redis, cp: ControlPlane
) -> None:
    snapshot = snap("tenant-a", user_id="u-1", project="p", context_key="ctx-9", namespaces=("ns",))
    async with running_cp(cp):
        run = await cp.submit(TINY_PIPELINE, snapshot, metadata={"tenant.id": "spoofed"})

        assert run.status is SharedRunStatus.QUEUED_GLOBALLY
        assert run.run_id is None
        assert run.execution_id is None
        assert run.assigned_instance_id is None
        stored = await cp.runs.get(run.shared_run_id)
        assert stored is not None and stored.snapshot == snapshot  # snapshot persisted
        body = await run_body(cp, run.shared_run_id, "tenant-a")
        assert body is not None
        assert body["queue_item"]["status"] == "Pending"
        assert "run" not in body
        assert body["run_id"] is None and body["execution_id"] is None
        # No local run, no DAG state anywhere.
        assert await cp.run_index.run_for_shared(run.shared_run_id) is None
        assert await redis.zcard(keys.RunBucket(0).by_tenant("tenant-a")) == 0
        assert await redis.zcard("air:executions") == 0
        assert await cp.queue.pending_count() == 1


async def test_manual_drain_with_local_provider_dispatches_and_runs_to_completion(
    redis: Redis, cp: ControlPlane
) -> None:
    host = RuntimeHost(redis, SHARED_RUNTIME, instances=2)
    snapshot = snap("default", user_id="u-7", context_key="rbac-key")
    async with serving(cp, host):
        runs = [await cp.submit(TINY_PIPELINE, snapshot) for _ in range(4)]
        assert all(r.status is SharedRunStatus.QUEUED_GLOBALLY for r in runs)

        await drain_until_finished(cp, {r.shared_run_id: "default" for r in runs})
        bodies = {r.shared_run_id: await wait_ended(cp, r.shared_run_id, "default") for r in runs}

    instance_ids = {i.instance_id for i in host.instances}
    for r in runs:
        body = bodies[r.shared_run_id]
        assert body["status"] == "Succeeded"
        assert body["queue_item"]["status"] == "Dispatched"
        assert body["assigned_instance_id"] in instance_ids
        assert body["run_id"] and body["run"]["run_id"] == body["run_id"]
        assert body["execution_id"], "ExecutionId exists once the runtime started the run"
        assert body["run"]["status"] == "completed"
        assert body["execution"]["status"] == "Succeeded"
        # The local queue received the same snapshot, and the ledger metadata names
        # the assigned instance and the tenant.
        record = await cp.run_index.get_for_tenant(body["run_id"], "default")
        assert record is not None and record.snapshot == snapshot
        md = record.metadata
        assert md["assigned.runtime.instance.id"] == body["assigned_instance_id"]
        assert md["runtime.instance.id"] == body["assigned_instance_id"]
        assert md["tenant.id"] == "default"
        assert md["runtime.isolation.mode"] == "Shared"
        assert {"max.local.workers.per.execution", "effective.worker.count.per.execution"} <= set(
            md
        )


async def test_background_pump_disabled_keeps_runs_queued_until_manual_drain(
    redis: Redis,
) -> None:
    cp = manual_cp(redis, pump_enabled=True)
    host = RuntimeHost(redis, SHARED_RUNTIME, instances=1)
    async with serving(cp, host):
        assert "pump" not in cp.supervisor.loops
        run = await cp.submit(TINY_PIPELINE, snap())
        registry = Registry(redis)
        first = await registry.get(host.instances[0].instance_id)
        assert first is not None and first.capacity.can_accept_run

        # A ready runtime keeps heartbeating; nobody dispatches the queued run.
        async def heartbeat_moved() -> bool:
            d = await registry.get(host.instances[0].instance_id)
            return d is not None and d.heartbeat_at_ms > first.heartbeat_at_ms + 1000

        await wait_for(heartbeat_moved, timeout_s=10, what="two runtime heartbeats")
        still = await cp.runs.get(run.shared_run_id)
        assert still is not None and still.status is SharedRunStatus.QUEUED_GLOBALLY
        assert (await cp.queue.item(run.shared_run_id, "default"))["status"] == "Pending"
        assert not cp.background.ready.is_set()

        bodies = await drain_until_finished(cp, {run.shared_run_id: "default"})
        assert bodies[run.shared_run_id]["run"]["status"] == "completed"


async def test_manual_drain_is_refused_when_the_pump_is_disabled(redis: Redis) -> None:
    cp = ControlPlane(redis, ControlPlaneSettings(pump_enabled=False))
    async with running_cp(cp):
        assert "pump" not in cp.supervisor.loops
        run = await cp.submit(TINY_PIPELINE, snap())
        with pytest.raises(ControlPlaneError) as err:
            await cp.drain(10)
        assert err.value.status == 409
        assert (await cp.queue.item(run.shared_run_id, "default"))["status"] == "Pending"


@pytest.mark.parametrize(
    ("case", "expected_status", "expected_item"),
    [
        pytest.param("capacity", SharedRunStatus.DISPATCHED, "Dispatched", id="assign-to-instance"),
        pytest.param(
            "no-capacity-no-scale-out",
            SharedRunStatus.QUEUED_GLOBALLY,
            "Pending",
            id="queue-globally",
        ),
        pytest.param(
            "no-capacity", SharedRunStatus.SCALE_OUT_REQUESTED, "ScaleOutRequested", id="scale-out"
        ),
        pytest.param("max-instances-zero", SharedRunStatus.REJECTED, "Rejected", id="reject"),
    ],
)
async def test_direct_dispatch_keeps_the_real_admission_decision(
    redis: Redis, case: str, expected_status: SharedRunStatus, expected_item: str
) -> None:
    settings = ControlPlaneSettings(
        submit_mode=SubmitMode.DIRECT_DISPATCH,
        background_pump=False,
        scale_out_enabled=case != "no-capacity-no-scale-out",
    )
    cp = ControlPlane(redis, settings)
    tenant = "tenant-a"
    await Registry(redis).put_tenant(
        TENANT_A
        if case != "max-instances-zero"
        else TenantSettings(tenant_id="tenant-a", max_instances=0)
    )
    if case == "capacity":
        tenant = "default"
    async with AsyncExitStack() as stack:
        if case == "capacity":
            await stack.enter_async_context(
                running_host(RuntimeHost(redis, SHARED_RUNTIME, instances=1), cp)
            )
        await stack.enter_async_context(running_cp(cp))
        # The expected decision, previewed under the tenant's snapshot.
        preview = await cp.admit_preview(snap(tenant))
        run = await cp.submit(TINY_PIPELINE, snap(tenant))
        if case == "capacity":
            await wait_finished(cp, run.shared_run_id, tenant)

    assert run.status is expected_status
    assert (await cp.queue.item(run.shared_run_id, tenant))["status"] == expected_item
    if case == "capacity":
        assert preview is Decision.ASSIGN
        assert run.run_id is not None and run.assigned_instance_id == "runtime-instance-1"
        return
    assert run.run_id is None and run.execution_id is None
    if case == "no-capacity":
        assert preview is Decision.SCALE_OUT
        assert run.scale_out_request_id is not None
        req = await cp.scale_outs.get(run.scale_out_request_id)
        assert req is not None and req.phase is ScaleOutPhase.PENDING
        assert req.shared_run_id == run.shared_run_id
        assert req.tenant_id == "tenant-a" and req.runtime_prefix == "tenant-a-runtime"
        assert req.tenant_settings == TENANT_A  # tenant runtime settings persisted
    elif case == "max-instances-zero":
        assert preview is Decision.REJECT
        assert run.reason and "max_instances 0" in run.reason
    else:
        assert preview is Decision.QUEUE
        assert await cp.queue.pending_count() == 1
