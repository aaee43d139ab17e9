"""Tenant-aware dispatch end to end with in-process runtimes (reference 000_*).

default -> shared ``runtime-instance-1``; tenant-a (Dedicated, no fallback) -> only
``tenant-a-runtime-1``, never the shared runtime even when that one is idle;
tenant-b (Hybrid) -> ``tenant-b-runtime-1`` when it exists, and falls back to the
visible shared runtime when it does not (fallback allowed).
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from airuntime.control_plane.admission import Decision
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import SubmitMode
from airuntime.control_plane.shared_runs import SharedRunStatus
from airuntime.fleet.registry import Registry
from airuntime.fleet.tenancy import IsolationMode
from runtime_pod.config import InstanceConfig
from runtime_pod.host import RuntimeHost
from tests.control_plane.support import (
    SHARED_RUNTIME,
    TENANT_A,
    TENANT_A_RUNTIME,
    TENANT_B,
    TINY_PIPELINE,
    drain_until_finished,
    manual_cp,
    serving,
    snap,
)

TENANT_B_RT = InstanceConfig(
    provider="local",
    tenant_id="tenant-b",
    isolation_mode=IsolationMode.HYBRID,
    runtime_prefix="tenant-b-runtime",
    heartbeat_s=0.5,
)


async def test_each_tenant_lands_on_its_own_runtime_when_all_exist(
    redis: Redis, cp: ControlPlane
) -> None:
    registry = Registry(redis)
    await registry.put_tenant(TENANT_A)
    await registry.put_tenant(TENANT_B)
    hosts = [
        RuntimeHost(redis, SHARED_RUNTIME, instance_ids=["runtime-instance-1"]),
        RuntimeHost(redis, TENANT_A_RUNTIME, instance_ids=["tenant-a-runtime-1"]),
        RuntimeHost(redis, TENANT_B_RT, instance_ids=["tenant-b-runtime-1"]),
    ]
    async with serving(cp, *hosts):
        runs = {
            t: (await cp.submit(TINY_PIPELINE, snap(t))).shared_run_id
            for t in ("default", "tenant-a", "tenant-b")
        }
        bodies = await drain_until_finished(cp, {srid: t for t, srid in runs.items()})

    placed = {t: bodies[srid]["assigned_instance_id"] for t, srid in runs.items()}
    assert placed == {
        "default": "runtime-instance-1",
        "tenant-a": "tenant-a-runtime-1",
        "tenant-b": "tenant-b-runtime-1",
    }
    assert {b["run"]["status"] for b in bodies.values()} == {"completed"}


@pytest.mark.parametrize(
    ("tenant", "placed"),
    [
        pytest.param("tenant-b", "runtime-instance-1", id="hybrid-falls-back-to-shared"),
        pytest.param("tenant-a", None, id="dedicated-never-falls-back"),
    ],
)
async def test_shared_fallback_only_when_the_tenant_allows_it(
    redis: Redis, tenant: str, placed: str | None
) -> None:
    """Only an idle shared runtime exists; scale-out is on but has no provider here."""
    registry = Registry(redis)
    await registry.put_tenant(TENANT_A)
    await registry.put_tenant(TENANT_B)
    cp = manual_cp(redis, submit_mode=SubmitMode.DIRECT_DISPATCH)
    shared = RuntimeHost(redis, SHARED_RUNTIME, instance_ids=["runtime-instance-1"])
    async with serving(cp, shared):
        run = await cp.submit(TINY_PIPELINE, snap(tenant))
        if placed is None:
            assert run.status is SharedRunStatus.SCALE_OUT_REQUESTED
            assert run.assigned_instance_id is None and run.run_id is None
            assert await cp.admit_preview(snap(tenant)) is Decision.SCALE_OUT
            assert await shared.instances[0].index.list_for_tenant(tenant) == []
            return
        bodies = await drain_until_finished(cp, {run.shared_run_id: tenant})
    assert run.status is SharedRunStatus.DISPATCHED
    assert bodies[run.shared_run_id]["assigned_instance_id"] == placed
    assert bodies[run.shared_run_id]["run"]["status"] == "completed"
