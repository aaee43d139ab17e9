"""Cancelling shared runs: queued, and racing a pump that is dispatching them.

A queued run leaves the shared queue at once and is never dispatched. A cancel that
lands while a pump holds the claim (delivery in flight) or right after the runtime
accepted must not be lost: the runtime run ends cancelled and never executes. The
races are pinned with latches inside the delivery path, not with timing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from airuntime.control_plane.admission import AdmissionResult, Decision
from airuntime.control_plane.scale_out import FulfilledRunRequeuer, ScaleOutPhase
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.shared_queue import ClaimedItem, QueueItemStatus
from airuntime.control_plane.shared_runs import SharedRunStatus
from airuntime.fleet.registry import Registry
from airuntime.fleet.runs import RunRequest
from airuntime.fleet.tenancy import TenantSettings
from runtime_pod.host import RuntimeHost
from runtime_pod.instance import RuntimeInstance
from tests.control_plane.support import (
    LOCAL_RUNTIME,
    TENANT_A,
    TINY_PIPELINE,
    drain_until_finished,
    run_body,
    running_cp,
    running_host,
    serving,
    snap,
    wait_for,
)


async def test_cancelling_a_queued_run_takes_it_out_of_the_shared_queue(
    redis: Redis, cp: ControlPlane
) -> None:
    async with serving(cp, RuntimeHost(redis, LOCAL_RUNTIME, instances=1)):
        doomed = await cp.submit(TINY_PIPELINE, snap())
        kept = await cp.submit(TINY_PIPELINE, snap())

        cancelled = await cp.cancel(doomed.shared_run_id, "default")
        assert cancelled is not None and cancelled.status is SharedRunStatus.CANCELLED
        assert (await cp.queue.item(doomed.shared_run_id, "default"))["status"] == "Cancelled"
        assert await cp.queue.pending_count() == 1

        result = await cp.drain(10)
        assert [r.shared_run_id for r in result.results] == [kept.shared_run_id]
        await drain_until_finished(cp, {kept.shared_run_id: "default"})
        again = await cp.cancel(doomed.shared_run_id, "default")  # idempotent
        assert again is not None and again.status is SharedRunStatus.CANCELLED

    body = await run_body(cp, doomed.shared_run_id, "default")
    assert body is not None and body["status"] == "Cancelled"
    assert body["run_id"] is None and "run" not in body
    assert await cp.run_index.run_for_shared(doomed.shared_run_id) is None


class GatedTarget:
    """Delivers to a real instance, then holds its local queue (paused) and the pump."""

    def __init__(self, inner: RuntimeInstance) -> None:
        self.inner = inner
        self.instance_id = inner.instance_id
        self.entered = asyncio.Event()
        self.proceed = asyncio.Event()

    async def accept(self, request: RunRequest) -> str:
        self.entered.set()
        await self.proceed.wait()
        run_id = await self.inner.accept(request)
        # No await since accept() returned: the background controller has not popped
        # the run, so it stays in the local queue while the race is played out.
        self.inner.pause_queue()
        return run_id


@pytest.mark.parametrize(
    "moment",
    [
        pytest.param("delivery-in-flight", id="cancel-while-pump-delivers"),
        pytest.param("after-settle", id="cancel-after-item-settled-dispatched"),
    ],
)
async def test_cancel_racing_a_dispatch_is_not_lost(
    redis: Redis, cp: ControlPlane, monkeypatch: pytest.MonkeyPatch, moment: str
) -> None:
    host = RuntimeHost(redis, LOCAL_RUNTIME, instances=1)
    settled = asyncio.Event()
    release_pump = asyncio.Event()
    real_settle = cp.queue.settle

    async def settle(item: ClaimedItem, outcome: QueueItemStatus, detail: str = "") -> bool:
        ok = await real_settle(item, outcome, detail)
        if outcome is QueueItemStatus.DISPATCHED and moment == "after-settle":
            settled.set()
            await release_pump.wait()
        return ok

    monkeypatch.setattr(cp.queue, "settle", settle)
    async with running_host(host):
        inst = host.instances[0]
        target = GatedTarget(inst)
        cp.local.add(target)
        async with running_cp(cp):
            run = await cp.submit(TINY_PIPELINE, snap())
            srid = run.shared_run_id
            pump = asyncio.create_task(cp.drain(1))
            await target.entered.wait()
            if moment == "delivery-in-flight":
                answer = await cp.cancel(srid, "default")
                target.proceed.set()
            else:
                target.proceed.set()
                await settled.wait()
                answer = await cp.cancel(srid, "default")
                release_pump.set()
            result = await pump
            assert answer is not None
            assert not result.results[0].success or moment == "after-settle"

            run_id = await cp.run_index.run_for_shared(srid)
            assert run_id is not None  # the runtime did accept it

            inst.resume_queue()  # whatever is still queued may start now

            async def terminal() -> Any:
                rec = await cp.run_index.get_for_tenant(run_id, "default")
                return rec if rec is not None and rec.status.terminal else None

            record = await wait_for(terminal, timeout_s=10, what="the runtime run to end")
            assert record.status.value == "cancelled"
            assert record.execution_id is None  # it never started executing
            body = await run_body(cp, srid, "default")
            assert body is not None
            assert body["run"]["status"] == "cancelled"
            if moment == "delivery-in-flight":
                assert body["status"] == "Cancelled"
                assert body["queue_item"]["status"] == "Cancelled"
            else:
                assert body["status"] in ("Dispatched", "Cancelled")
                assert body["run_id"] == run_id


@pytest.mark.parametrize(
    ("tenant", "decision"),
    [
        pytest.param(TENANT_A, Decision.SCALE_OUT, id="admission-requests-scale-out"),
        pytest.param(
            TenantSettings(tenant_id="tenant-a", max_instances=0),
            Decision.REJECT,
            id="admission-rejects",
        ),
    ],
)
async def test_cancel_during_admission_is_not_overwritten_by_the_decision(
    redis: Redis,
    cp: ControlPlane,
    monkeypatch: pytest.MonkeyPatch,
    tenant: TenantSettings,
    decision: Decision,
) -> None:
    """No runtime at all: admission answers RequestScaleOut (or Reject) for a run that was
    cancelled meanwhile. The run stays Cancelled and is never requeued after fulfilment."""
    await Registry(redis).put_tenant(tenant)
    decided = asyncio.Event()
    proceed = asyncio.Event()
    real_admit = cp.admission.admit

    async def admit(**kwargs: Any) -> AdmissionResult:
        result = await real_admit(**kwargs)
        decided.set()
        await proceed.wait()
        return result

    monkeypatch.setattr(cp.admission, "admit", admit)
    async with running_cp(cp):
        run = await cp.submit(TINY_PIPELINE, snap("tenant-a"))
        pump = asyncio.create_task(cp.drain(1))
        await decided.wait()
        cancelled = await cp.cancel(run.shared_run_id, "tenant-a")
        assert cancelled is not None and cancelled.status is SharedRunStatus.CANCELLED
        proceed.set()
        [r] = (await pump).results
        assert r.decision is decision and not r.success

        stored = await cp.runs.get(run.shared_run_id)
        assert stored is not None and stored.status is SharedRunStatus.CANCELLED
        assert (await cp.queue.item(run.shared_run_id, "tenant-a"))["status"] == "Cancelled"
        # Even if capacity is created for it, the cancelled run is not requeued.
        requeuer = FulfilledRunRequeuer(cp.scale_outs, cp.runs, cp.queue)
        for req in await cp.scale_outs.list():
            await cp.scale_outs.transition(
                req.request_id, None, phase=ScaleOutPhase.FULFILLED, fulfilled_instance_id="x-1"
            )
        assert await requeuer.requeue_once() == 0
        assert await cp.queue.pending_count() == 0
        final = await cp.runs.get(run.shared_run_id)
        assert final is not None and final.status is SharedRunStatus.CANCELLED
