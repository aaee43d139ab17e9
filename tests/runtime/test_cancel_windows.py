"""A cancel keeps in every window of a run's start (airuntime.fleet.run_cancel).

A cancel reads the run record, then acts. Each test pins the start's next step
between the two (a wrapped read runs it there) and checks the cancel held and told
no lie: a run that started is not marked Cancelled while it runs on, and its
execution is created cancelled, so no handler runs.
"""

from __future__ import annotations

import uuid
from typing import Any

from airuntime.engine.status import ExecutionStatus
from airuntime.fleet.run_cancel import CancelOutcome, cancel_run
from airuntime.fleet.run_index import RunIndex
from airuntime.fleet.runs import RunStatus
from tests.dags import plan_of
from tests.runtime.conftest import Runtime
from tests.runtime.support import pipeline, request

TENANT = "tenant-a"


def started_after_the_first_read(index: RunIndex, instance_id: str, execution_id: str) -> None:
    """The cancel's first read of the record returns it queued; right after it, the
    runtime starts the run (``startRun``), as its controller does."""
    original = index.get_for_tenant
    reads = 0

    async def get_for_tenant(run_id: str, tenant_id: str) -> Any:
        nonlocal reads
        reads += 1
        loaded = await original(run_id, tenant_id)
        if reads == 1:
            assert loaded is not None and loaded.status is RunStatus.QUEUED
            assert await index.start_many(instance_id, [(run_id, execution_id)]) == [True]
        return loaded

    index.get_for_tenant = get_for_tenant  # type: ignore[method-assign]


async def test_a_run_started_between_the_cancels_read_and_act_is_cancelled_not_mislabelled(
    runtime: Runtime,
) -> None:
    inst = runtime.instance("cancel-window-1")  # not started: the test plays its controller
    run_id = await inst.accept(request(pipeline(1)))
    eid = f"ex-{uuid.uuid4().hex}"
    started_after_the_first_read(runtime.index, inst.instance_id, eid)
    outcome = await cancel_run(runtime.index, runtime.store, run_id, TENANT)
    assert outcome is CancelOutcome.REQUESTED
    record = await RunIndex(runtime.redis).get_for_tenant(run_id, TENANT)
    assert record is not None
    # Not "cancelled" while the runtime that started it goes on to execute it.
    assert record.status is RunStatus.RUNNING and record.execution_id == eid
    _, batch = await runtime.store.create_and_claim(
        plan_of({"s0": []}), ("pool", 1, 30_000), execution_id=eid
    )
    assert batch is not None and batch.claims == [] and batch.status is ExecutionStatus.CANCELLED


async def test_a_queued_run_leaves_its_queue_cancelled_and_another_tenant_reaches_nothing(
    runtime: Runtime,
) -> None:
    inst = runtime.instance("cancel-window-2")
    run_id = await inst.accept(request(pipeline(1)))
    assert await cancel_run(runtime.index, runtime.store, run_id, "tenant-b") is (
        CancelOutcome.NOT_FOUND
    )
    assert await cancel_run(runtime.index, runtime.store, run_id, TENANT) is (
        CancelOutcome.CANCELLED_QUEUED
    )
    record = await runtime.index.get_for_tenant(run_id, TENANT)
    assert record is not None and record.status is RunStatus.CANCELLED
    assert await runtime.redis.llen(runtime.index.queue_key(inst.instance_id)) == 0
    assert await cancel_run(runtime.index, runtime.store, run_id, TENANT) is CancelOutcome.ENDED
