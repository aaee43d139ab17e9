"""Scale-out through real ``airt runtime`` processes started by the local scaler.

DirectDispatch with no runtime capacity: admission answers RequestScaleOut, the run
becomes ScaleOutRequested and a Redis scale-out request carries the tenant's runtime
settings; the watcher hands it to :class:`LocalScaler`, which starts an
``airt runtime`` subprocess named after the tenant's runtime prefix and marks the
request Fulfilled; the requeuer puts the run back into the shared queue (the watcher
never dispatches) and the background pump dispatches it, under the restored
snapshot, to the new tenant-visible instance, where it completes.

The scaler counts instances per runtime prefix (a visible shared runtime neither
serves a dedicated tenant nor counts against its maximum) and never goes beyond the
tenant's ``max_instances``: a request at the maximum is Rejected with a reason.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from airuntime.control_plane.scale_out import LocalScaler, ScaleOutPhase, ScaleOutWatcher
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import ControlPlaneSettings, SubmitMode
from airuntime.control_plane.shared_runs import SharedRunStatus
from airuntime.core import keys
from airuntime.core.context import ExecutionContextSnapshot
from airuntime.fleet.registry import Registry
from airuntime.fleet.tenancy import TenantSettings, default_settings
from airuntime.history import open_history_store
from airuntime.history.records import PayloadRef
from runtime_pod.config import InstanceConfig
from runtime_pod.host import RuntimeHost
from tests.control_plane.support import (
    LOCAL_RUNTIME,
    TENANT_A,
    TENANT_B,
    TINY_PIPELINE,
    manual_cp,
    running_host,
    serving,
    snap,
    wait_ended,
    wait_finished,
    wait_for,
)

# Smaller process footprint for the spawned runtimes (2 cores, several processes).
SMALL_A = TENANT_A.model_copy(update={"workers_per_instance": 4})
SMALL_B = TENANT_B.model_copy(update={"workers_per_instance": 4})


@pytest_asyncio.fixture
async def scaler(valkey: Redis, valkey_url: str) -> AsyncIterator[LocalScaler]:
    scaler = LocalScaler(valkey, valkey_url, ready_timeout_s=60, heartbeat_s=0.5)
    try:
        yield scaler
    finally:
        await scaler.close()  # idempotent; ControlPlane.stop closes it too
        assert all(p.returncode is not None for p in scaler.processes.values())


@pytest.mark.parametrize(
    ("tenant", "settings", "with_shared_runtime", "expected_instance"),
    [
        pytest.param("default", None, False, "runtime-instance-1", id="default-shared"),
        pytest.param(
            "tenant-a", SMALL_A, True, "tenant-a-runtime-1", id="tenant-a-dedicated-no-fallback"
        ),
        pytest.param("tenant-b", SMALL_B, False, "tenant-b-runtime-1", id="tenant-b-hybrid"),
    ],
)
async def test_direct_dispatch_without_capacity_scales_out_requeues_and_completes(
    valkey: Redis,
    scaler: LocalScaler,
    tenant: str,
    settings: TenantSettings | None,
    with_shared_runtime: bool,
    expected_instance: str,
) -> None:
    registry = Registry(valkey)
    if settings is not None:
        await registry.put_tenant(settings)
    expected_settings = settings or default_settings(tenant)
    cp = ControlPlane(
        valkey,
        ControlPlaneSettings(submit_mode=SubmitMode.DIRECT_DISPATCH, background_pump=True),
        scale_out_provider=scaler,
    )
    # A ready shared runtime, visible to default tenants (not to tenant-a).
    shared = RuntimeHost(valkey, LOCAL_RUNTIME, instance_ids=["shared-rt-1"])
    snapshot = snap(tenant, user_id=f"user-of-{tenant}", context_key="mcp-request-1")
    async with serving(cp, *([shared] if with_shared_runtime else [])):
        assert [d.instance_id for d in await registry.list_all()] == (
            ["shared-rt-1"] if with_shared_runtime else []
        )

        run = await cp.submit(TINY_PIPELINE, snapshot)

        # Admission said RequestScaleOut; the request carries the tenant's settings.
        assert run.status is SharedRunStatus.SCALE_OUT_REQUESTED
        assert run.run_id is None and run.scale_out_request_id is not None
        request = await cp.scale_outs.get(run.scale_out_request_id)
        assert request is not None and request.shared_run_id == run.shared_run_id
        assert request.tenant_id == tenant
        assert request.tenant_settings == expected_settings
        assert request.runtime_prefix == expected_settings.runtime_prefix

        await wait_finished(cp, run.shared_run_id, tenant, timeout_s=90)
        body = await wait_ended(cp, run.shared_run_id, tenant)

        request = await cp.scale_outs.get(run.scale_out_request_id)
        assert request is not None
        assert request.phase is ScaleOutPhase.FULFILLED and request.provider == "local"
        assert request.fulfilled_instance_id == expected_instance
        assert request.requeued
        descriptor = await registry.get(expected_instance)
        assert descriptor is not None  # a real airt runtime process registered it
        assert descriptor.runtime_prefix == expected_settings.runtime_prefix
        assert descriptor.isolation_mode is expected_settings.isolation_mode
        assert descriptor.tenant_id == (None if tenant == "default" else tenant)
        assert scaler.started_for(expected_settings.runtime_prefix) == [expected_instance]
        assert len(scaler.processes) == 1  # ActiveLocalInstances = 1

    await _assert_requeued_and_completed_on(cp, body, expected_instance, snapshot)
    if with_shared_runtime:
        assert await shared_runs_on(valkey, "shared-rt-1") == 0  # never fell back


async def _assert_requeued_and_completed_on(
    cp: ControlPlane, body: dict[str, Any], instance_id: str, snapshot: ExecutionContextSnapshot
) -> None:
    tenant = snapshot.tenant_id
    assert body["status"] == "Succeeded"
    assert body["assigned_instance_id"] == instance_id
    assert body["queue_item"]["status"] == "Dispatched"
    assert body["queue_item"]["enqueues"] == "2"  # submitted, then requeued after fulfilment
    assert body["run_id"] and body["execution_id"]
    assert body["run"]["status"] == "completed"
    assert body["run"]["instance_id"] == instance_id
    assert body["run"]["metadata"]["tenant.id"] == tenant
    assert body["pump_worker_id"] == cp.identity.worker_id  # the pump dispatched it
    record = await cp.run_index.get_for_tenant(body["run_id"], tenant)
    assert record is not None and record.snapshot == snapshot  # restored and carried


async def shared_runs_on(redis: Redis, instance_id: str) -> int:
    from airuntime.fleet.run_index import RunIndex

    count = 0
    for tenant in ("default", "tenant-a", "tenant-b"):
        for rec in await RunIndex(redis).list_for_tenant(tenant):
            count += rec.instance_id == instance_id
    return count


async def test_local_scaler_counts_per_runtime_prefix_and_rejects_beyond_tenant_max(
    valkey: Redis, scaler: LocalScaler
) -> None:
    """A registered shared runtime does not count against tenant-a's maximum of 1; a
    second tenant-a request at the maximum is Rejected with a reason, no process started."""
    tenant = SMALL_A.model_copy(update={"max_instances": 1})
    shared = RuntimeHost(
        valkey,
        InstanceConfig(provider="local", heartbeat_s=0.5),
        instance_ids=["runtime-instance-1"],
    )
    cp = manual_cp(valkey)
    watcher = ScaleOutWatcher(cp.scale_outs, scaler)
    async with running_host(shared):
        first = await cp.scale_outs.create(tenant, "sr-first")
        assert await watcher.observe_once() == 1
        await watcher.wait_idle()
        done = await cp.scale_outs.get(first.request_id)
        assert done is not None and done.phase is ScaleOutPhase.FULFILLED, done
        assert done.fulfilled_instance_id == "tenant-a-runtime-1"

        second = await cp.scale_outs.create(tenant, "sr-second")
        assert await watcher.observe_once() == 1
        await watcher.wait_idle()
        rejected = await cp.scale_outs.get(second.request_id)
        assert rejected is not None and rejected.phase is ScaleOutPhase.REJECTED
        assert rejected.reason is not None
        assert "1 of max 1 tenant-a-runtime" in rejected.reason
        assert rejected.fulfilled_instance_id is None

        assert list(scaler.processes) == ["tenant-a-runtime-1"]
        assert scaler.started_for("tenant-a-runtime") == ["tenant-a-runtime-1"]
        assert scaler.started_for("runtime-instance") == []
        live = sorted(d.instance_id for d in await Registry(valkey).list_all())
        assert live == ["runtime-instance-1", "tenant-a-runtime-1"]
    await scaler.close()

    async def unregistered() -> bool:
        return await Registry(valkey).get("tenant-a-runtime-1") is None

    await wait_for(unregistered, timeout_s=20, what="the stopped runtime to unregister")


async def test_runtimes_the_local_scaler_starts_offload_large_outputs_to_the_history(
    valkey: Redis, valkey_url: str, tmp_path: Path
) -> None:
    """The local stack's runtimes get the control plane's history DSN: a step output
    over the payload threshold goes to the (shared SQLite) history, Redis keeps only a
    reference, the dependent step still gets the value."""
    dsn = f"sqlite:///{tmp_path / 'history.db'}"
    scaler = LocalScaler(valkey, valkey_url, ready_timeout_s=60, heartbeat_s=0.5, history_dsn=dsn)
    cp = ControlPlane(
        valkey,
        ControlPlaneSettings(submit_mode=SubmitMode.DIRECT_DISPATCH, background_pump=True),
        scale_out_provider=scaler,
    )
    big = "x" * (80 * 1024)  # over the default 64 KiB threshold
    pipeline = {
        "id": "big-output",
        "steps": [
            {"id": "big", "uses": "echo", "with": {"value": big}},
            {"id": "size", "uses": "echo", "with": {"value": "${steps.big.output}"},
             "depends_on": ["big"]},
        ],
    }  # fmt: skip
    try:
        async with serving(cp):
            run = await cp.submit(pipeline, snap("default"))
            await wait_finished(cp, run.shared_run_id, "default", timeout_s=90)
            body = await wait_ended(cp, run.shared_run_id, "default")
    finally:
        await scaler.close()
    assert body["status"] == "Succeeded", body
    raw = await valkey.get(keys.execution_keys(body["execution_id"]).snapshot)
    held = {step: rec["output"] for step, rec in json.loads(raw)["steps"].items()}
    refs = {step: PayloadRef.from_json(value) for step, value in held.items()}
    assert refs["big"] is not None and refs["size"] is not None, held
    async with await open_history_store(dsn) as history:
        for ref in refs.values():
            assert ref is not None
            payload = await history.get_payload(ref.payload_id, "default")
            assert payload is not None and json.loads(payload.data) == big
