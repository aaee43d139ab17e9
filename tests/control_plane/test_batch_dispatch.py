"""Batch dispatch: a pump cycle claims, admits and delivers many runs at once.

Placement by free capacity is checked two ways: :func:`plan_placement` on its own
(deterministic), and through the whole batch path (claim, admission with real
``reserveSlot`` reservations, delivery) onto in-process recording instances whose
static descriptors make every count exact. Each run is delivered once, to an instance
its tenant may use, and recorded Dispatched only once accepted; runs that found no
room stay Pending.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from airuntime.control_plane.admission import plan_placement
from airuntime.control_plane.pump import PumpStop
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.shared_runs import SharedRunStatus
from airuntime.core import keys
from airuntime.fleet.providers import DeliveryError
from airuntime.fleet.registry import Registry
from airuntime.fleet.tenancy import IsolationMode
from tests.control_plane.support import (
    TENANT_A,
    TINY_PIPELINE,
    RecordingInstance,
    descriptor,
    manual_cp,
    publish,
    running_cp,
    snap,
)


def test_identical_instances_get_equal_shares_whatever_the_batch_sizes() -> None:
    same = [descriptor(f"i-{n}", max_concurrent_runs=1000) for n in range(3)]
    totals = dict.fromkeys((d.instance_id for d in same), 0)
    for rotation, count in enumerate([1, 2, 5, 64, 7, 1, 1, 3, 100, 13] * 5):
        for iid, n in plan_placement([same], count, rotation).items():
            totals[iid] += n
    assert sum(totals.values()) == 5 * 197
    assert max(totals.values()) <= 1.3 * min(totals.values()), totals
    assert plan_placement([same], 300) == {"i-0": 100, "i-1": 100, "i-2": 100}


def test_runs_go_where_most_room_is_left_and_never_past_the_room() -> None:
    small, mid, big = (
        descriptor("small", max_concurrent_runs=10),
        descriptor("mid", max_concurrent_runs=40),
        descriptor("big", max_concurrent_runs=70),
    )
    # Water-filling: big alone down to 40, then big and mid down to 10, then all three.
    assert plan_placement([[small, mid, big]], 30) == {"big": 30}
    assert plan_placement([[small, mid, big]], 90) == {"big": 60, "mid": 30}
    assert plan_placement([[small, mid, big]], 105) == {"big": 65, "mid": 35, "small": 5}
    assert plan_placement([[small, mid, big]], 500) == {"big": 70, "mid": 40, "small": 10}
    # A later group (shared fallback) only gets what the preferred one has no room for.
    assert plan_placement([[small], [big]], 25) == {"small": 10, "big": 15}


async def _recording(redis: Redis, cp: ControlPlane, iid: str, **kw: object) -> RecordingInstance:
    inst = RecordingInstance(iid)
    cp.local.add(inst)
    await publish(redis, descriptor(iid, **kw))  # type: ignore[arg-type]
    return inst


async def test_a_batch_spreads_runs_over_identical_instances_and_dispatches_each_once(
    redis: Redis,
) -> None:
    cp = manual_cp(redis, scale_out_enabled=False)
    targets = [await _recording(redis, cp, f"runtime-instance-{n}") for n in (1, 2, 3)]
    async with running_cp(cp):
        runs = [await cp.submit(TINY_PIPELINE, snap(user_id=f"u{n}")) for n in range(150)]
        result = await cp.pump.pump_batches(1000, batch=64)

    assert result.dispatched == 150 and result.failed == 0
    counts = [len(t.deliveries) for t in targets]
    assert sum(counts) == 150 and max(counts) <= 1.3 * min(counts), counts
    delivered = [r.shared_run_id for t in targets for r in t.deliveries]
    assert sorted(delivered) == sorted(r.shared_run_id for r in runs)  # each exactly once
    for target in targets:
        for request in target.deliveries:
            stored = await cp.runs.require(request.shared_run_id)
            assert stored.status is SharedRunStatus.DISPATCHED
            assert stored.assigned_instance_id == target.instance_id
            assert stored.run_id == target.run_ids[request.shared_run_id]
            assert stored.snapshot == request.snapshot  # the stored snapshot travelled
            item = await cp.queue.item(request.shared_run_id, "default")
            assert item["status"] == "Dispatched" and "failed_dispatches" not in item
    assert await cp.queue.pending_count() == 0
    assert await cp.queue.claimed_count() == 0


async def test_runs_without_room_stay_pending_and_only_the_tried_one_counts_a_failure(
    redis: Redis,
) -> None:
    cp = manual_cp(redis, scale_out_enabled=False)
    target = await _recording(redis, cp, "runtime-instance-1", max_concurrent_runs=5)
    async with running_cp(cp):
        runs = [await cp.submit(TINY_PIPELINE, snap()) for _ in range(20)]
        result = await cp.pump.pump_batches(1000, batch=64)

    assert result.dispatched == 5 == len(target.deliveries)
    assert [r.shared_run_id for r in target.deliveries] == [r.shared_run_id for r in runs[:5]]
    assert await cp.queue.pending_count() == 15
    # The first run without room went through the single-run decision (QueueGlobally,
    # counted); the others were released untried, in their places.
    sixth = await cp.queue.item(runs[5].shared_run_id, "default")
    assert sixth["status"] == "Pending" and sixth["failed_dispatches"] == "1"
    for run in runs[6:]:
        item = await cp.queue.item(run.shared_run_id, "default")
        assert item["status"] == "Pending" and "failed_dispatches" not in item
        stored = await cp.runs.require(run.shared_run_id)
        assert stored.status is SharedRunStatus.QUEUED_GLOBALLY and stored.run_id is None
    pending = [i.decode() for i in await redis.zrange(keys.squeue_pending("default"), 0, -1)]
    assert pending == [r.shared_run_id for r in runs[5:]]  # queue order kept


async def test_a_refused_delivery_in_a_batch_puts_only_its_runs_back(redis: Redis) -> None:
    cp = manual_cp(redis, scale_out_enabled=False)
    good = await _recording(redis, cp, "runtime-instance-1")
    bad = await _recording(redis, cp, "runtime-instance-2")
    bad.fail = DeliveryError("queue full", reason="queue_full")
    async with running_cp(cp):
        runs = [await cp.submit(TINY_PIPELINE, snap()) for _ in range(10)]
        result = await cp.pump.pump_batches(10, batch=10)

    assert result.dispatched == len(good.deliveries) == 5 and result.failed == 5
    assert len(bad.contexts) == 5  # tried, each under its own run's snapshot
    assert all(c is not None and c.tenant_id == "default" for c in bad.contexts)
    ok = {r.shared_run_id for r in good.deliveries}
    for run in runs:
        stored = await cp.runs.require(run.shared_run_id)
        item = await cp.queue.item(run.shared_run_id, "default")
        if run.shared_run_id in ok:
            assert stored.status is SharedRunStatus.DISPATCHED
        else:
            assert stored.status is SharedRunStatus.QUEUED_GLOBALLY and stored.run_id is None
            assert item["status"] == "Pending" and item["failed_dispatches"] == "1"
    # The refused runs' reservations were given back.
    assert await redis.zcard(keys.reservations("runtime-instance-2")) == 0


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "grouped"])
async def test_a_mixed_batch_puts_each_tenants_runs_only_where_it_may_run(
    redis: Redis, interleaved: bool
) -> None:
    await Registry(redis).put_tenant(TENANT_A)  # Dedicated, no shared fallback
    cp = manual_cp(redis, scale_out_enabled=False)
    shared = await _recording(redis, cp, "runtime-instance-1")
    own = await _recording(
        redis,
        cp,
        "tenant-a-runtime-1",
        isolation_mode=IsolationMode.DEDICATED,
        tenant_id="tenant-a",
        runtime_prefix="tenant-a-runtime",
    )
    order = ["tenant-a", "default"] * 10 if interleaved else ["tenant-a"] * 10 + ["default"] * 10
    async with running_cp(cp):
        for tenant in order:
            await cp.submit(TINY_PIPELINE, snap(tenant))
        result = await cp.pump.pump_batches(100, batch=64)

    assert result.dispatched == 20
    assert {r.snapshot.tenant_id for r in own.deliveries} == {"tenant-a"}
    assert {r.snapshot.tenant_id for r in shared.deliveries} == {"default"}
    assert len(own.deliveries) == len(shared.deliveries) == 10


async def test_a_pass_that_claimed_fewer_runs_than_it_asked_for_stops_without_another_claim(
    redis: Redis,
) -> None:
    cp = manual_cp(redis, scale_out_enabled=False)
    target = await _recording(redis, cp, "runtime-instance-1")
    claims: list[int] = []
    real = cp.queue.claim_and_read

    async def counted(*args: Any, **kwargs: Any) -> Any:
        claimed = await real(*args, **kwargs)
        claims.append(len(claimed))
        return claimed

    cp.queue.claim_and_read = counted  # type: ignore[method-assign]
    async with running_cp(cp):
        for _ in range(70):
            await cp.submit(TINY_PIPELINE, snap())
        result = await cp.pump.pump_batches(1000, batch=64)

    assert result.dispatched == 70 == len(target.deliveries)
    assert result.stopped is PumpStop.EMPTY
    assert claims == [64, 6], "a full batch, then the rest; no claim that finds nothing"
    assert await cp.queue.pending_count() == 0
