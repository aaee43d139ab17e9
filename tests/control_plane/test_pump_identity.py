"""Pump identity vs assigned runtime identity, and admission under the restored snapshot.

PumpRuntimeInstanceId / PumpWorkerId say who drained; AssignedRuntimeInstanceId
comes from dispatch-time admission. A pump-local dispatch happens only when the
caller injects the admission target explicitly. Admission lists registry/capacity
under the run's restored ExecutionContextSnapshot, never the caller's ambient one.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from airuntime.control_plane.admission import Decision
from airuntime.control_plane.instance_view import InstanceView
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.control_plane.shared_runs import SharedRunStatus
from airuntime.core.context import ExecutionContextSnapshot, current_context, use_context
from airuntime.fleet.registry import Registry
from runtime_pod.config import InstanceConfig
from runtime_pod.host import RuntimeHost
from tests.control_plane.support import (
    SHARED_RUNTIME,
    TENANT_A,
    TENANT_A_RUNTIME,
    TINY_PIPELINE,
    drain_until_finished,
    manual_cp,
    serving,
    snap,
)

NARROW = InstanceConfig(provider="local", max_concurrent_runs=1, heartbeat_s=0.5)


@pytest.mark.parametrize(
    ("pump_instance", "pump_host_config"),
    [
        pytest.param("runtime-instance-1", NARROW, id="pump-runs-on-a-ready-runtime"),
        pytest.param("tenant-a-runtime-1", TENANT_A_RUNTIME, id="pump-runs-on-invisible-runtime"),
    ],
)
async def test_pump_identity_is_recorded_but_never_becomes_the_assigned_instance(
    redis: Redis, pump_instance: str, pump_host_config: InstanceConfig
) -> None:
    """The pump runs as (and on) ``pump_instance``, a registered runtime; admission still
    picks the best tenant-visible target, here ``runtime-instance-2``."""
    cp = ControlPlane(
        redis,
        ControlPlaneSettings(background_pump=False, control_plane_id=pump_instance),
        worker_id="w7",
    )
    pump_host = RuntimeHost(redis, pump_host_config, instance_ids=[pump_instance])
    other = RuntimeHost(redis, SHARED_RUNTIME, instance_ids=["runtime-instance-2"])
    async with serving(cp, pump_host, other):
        run = await cp.submit(TINY_PIPELINE, snap())
        result = await cp.drain(1)
        bodies = await drain_until_finished(cp, {run.shared_run_id: "default"})

    [dispatched] = result.results
    assert dispatched.success and dispatched.instance_id == "runtime-instance-2"
    body = bodies[run.shared_run_id]
    assert body["assigned_instance_id"] == "runtime-instance-2"
    assert body["pump_runtime_instance_id"] == pump_instance
    assert body["pump_worker_id"] == f"{pump_instance}/w7"
    assert body["run"]["instance_id"] == "runtime-instance-2"
    assert body["run"]["status"] == "completed"


async def test_pump_local_dispatch_requires_an_explicitly_injected_admission_target(
    redis: Redis,
) -> None:
    await Registry(redis).put_tenant(TENANT_A)
    cp = manual_cp(redis, control_plane_id="runtime-instance-1")
    narrow = RuntimeHost(redis, NARROW, instance_ids=["runtime-instance-1"])
    wide = RuntimeHost(redis, SHARED_RUNTIME, instance_ids=["runtime-instance-2"])
    dedicated = RuntimeHost(redis, TENANT_A_RUNTIME, instance_ids=["tenant-a-runtime-1"])
    async with serving(cp, narrow, wide, dedicated):
        local = await cp.submit(TINY_PIPELINE, snap())
        # Injected target = the pump's own instance, although admission alone would
        # choose runtime-instance-2 (more free run slots).
        result = await cp.drain(1, target="runtime-instance-1")
        assert result.results[0].instance_id == "runtime-instance-1"

        # A target invisible to the run's tenant is not a loophole: the run stays queued.
        foreign = await cp.submit(TINY_PIPELINE, snap())
        refused = await cp.drain(1, target="tenant-a-runtime-1")
        [r] = refused.results
        assert not r.success and r.decision is Decision.QUEUE
        assert "tenant-a-runtime-1" in r.reason
        stored = await cp.runs.get(foreign.shared_run_id)
        assert stored is not None and stored.status is SharedRunStatus.QUEUED_GLOBALLY
        assert (await cp.queue.item(foreign.shared_run_id, "default"))["status"] == "Pending"

        bodies = await drain_until_finished(
            cp, {local.shared_run_id: "default", foreign.shared_run_id: "default"}
        )
    assert bodies[local.shared_run_id]["assigned_instance_id"] == "runtime-instance-1"
    assert bodies[foreign.shared_run_id]["assigned_instance_id"] != "tenant-a-runtime-1"


async def test_admission_lists_capacity_under_the_restored_snapshot_not_the_ambient_context(
    redis: Redis, cp: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    await Registry(redis).put_tenant(TENANT_A)
    listed: list[tuple[str, ExecutionContextSnapshot | None]] = []
    real_read = cp.admission.views.read

    async def read(tenant_id: str, **kwargs: Any) -> InstanceView:
        listed.append((tenant_id, current_context()))
        return await real_read(tenant_id, **kwargs)

    monkeypatch.setattr(cp.admission.views, "read", read)
    shared = RuntimeHost(redis, SHARED_RUNTIME, instance_ids=["runtime-instance-1"])
    dedicated = RuntimeHost(redis, TENANT_A_RUNTIME, instance_ids=["tenant-a-runtime-1"])
    snap_a = snap("tenant-a", user_id="alice", project="proj-a", context_key="rbac-a")
    snap_d = snap("default", user_id="dan", context_key="rbac-d", namespaces=("trn:x",))
    ambient = snap("tenant-b", user_id="mallory")
    async with serving(cp, shared, dedicated):
        run_a = await cp.submit(TINY_PIPELINE, snap_a)
        run_d = await cp.submit(TINY_PIPELINE, snap_d)
        with use_context(ambient):
            result = await cp.drain(10)
            assert current_context() == ambient
        assert current_context() is None
        bodies = await drain_until_finished(
            cp, {run_a.shared_run_id: "tenant-a", run_d.shared_run_id: "default"}
        )

    assert result.dispatched == 2
    assert listed == [("tenant-a", snap_a), ("default", snap_d)]
    assert bodies[run_a.shared_run_id]["assigned_instance_id"] == "tenant-a-runtime-1"
    assert bodies[run_d.shared_run_id]["assigned_instance_id"] == "runtime-instance-1"
    # The runtime received (and ran under) the very same snapshot.
    for run, snapshot in ((run_a, snap_a), (run_d, snap_d)):
        body: dict[str, Any] = bodies[run.shared_run_id]
        record = await cp.run_index.get_for_tenant(body["run_id"], snapshot.tenant_id)
        assert record is not None and record.snapshot == snapshot
        assert record.metadata["tenant.id"] == snapshot.tenant_id
