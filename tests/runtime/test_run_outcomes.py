"""A run that ends is finished in the run index and announced on the outcome stream in
one step, with its step-slot evidence: the control plane reads ``air:{air}:run-outcomes`` to
end the shared run, and the evidence leaves the runtime's memory.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.fleet.outcomes import RunOutcome
from airuntime.fleet.runs import RunStatus
from tests.runtime.conftest import Runtime
from tests.runtime.support import pipeline, request

pytestmark = pytest.mark.timeout(60)


async def _outcomes(redis: Redis) -> list[RunOutcome]:
    return [RunOutcome.from_fields(f) for _, f in await redis.xrange(keys.RunBucket(0).outcomes)]


async def test_a_completed_run_has_one_outcome_and_its_evidence_in_record_and_ledger(
    runtime: Runtime, redis: Redis
) -> None:
    inst = await runtime.start("out-1", max_concurrent_step_tasks=1, workers=3)
    req = request(pipeline(3))
    run_id = await inst.accept(req)
    runtime.gate.open()
    assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
    record = await inst.run_status(run_id, "tenant-a")
    assert record is not None and record.execution_id is not None
    eid = record.execution_id

    [outcome] = await _outcomes(redis)
    assert outcome == RunOutcome(
        run_id=run_id,
        shared_run_id=req.shared_run_id,
        tenant_id="tenant-a",
        instance_id="out-1",
        status=RunStatus.COMPLETED,
        execution_id=eid,
        reason=None,
        finished_at_ms=record.finished_at_ms,
    )
    assert record.step_slots is not None
    assert {k: record.step_slots[k] for k in ("admitted", "succeeded", "failed", "cancelled")} == {
        "admitted": 3,
        "succeeded": 3,
        "failed": 0,
        "cancelled": 0,
    }
    [ledger] = [e for e in await runtime.store.events(eid) if e.type == "step_slots"]
    assert ledger.get("runtime.instance.id") == "out-1" and ledger.get("assisting") == "0"
    assert {k: int(ledger.get(k)) for k in record.step_slots} == record.step_slots
    assert inst.slots.evidence(eid).admitted == 0, "no longer held in memory"
    assert inst.slots._evidence == {}


async def test_a_failed_run_has_a_failed_outcome_with_its_reason(
    runtime: Runtime, redis: Redis
) -> None:
    inst = await runtime.start("out-1")
    run_id = await inst.accept(request(pipeline(1, uses="fail", with_={"fail_attempts": 5})))
    assert await runtime.watcher.reached(run_id, "completed", "failed") == "failed"
    [outcome] = await _outcomes(redis)
    assert (outcome.run_id, outcome.status, outcome.reason) == (run_id, RunStatus.FAILED, "Failed")


async def test_a_run_cancelled_before_it_started_has_a_cancelled_outcome(
    runtime: Runtime, redis: Redis
) -> None:
    inst = runtime.instance("out-1")  # not started: the run stays queued
    req = request(pipeline(1))
    run_id = await inst.accept(req)
    record = await inst.cancel_run(run_id, "tenant-a")
    assert record is not None and record.status is RunStatus.CANCELLED
    assert record.failure_reason == "cancelled while queued" and record.execution_id is None
    assert await runtime.index.queue_length("out-1") == 0
    [outcome] = await _outcomes(redis)
    assert (outcome.status, outcome.execution_id, outcome.shared_run_id) == (
        RunStatus.CANCELLED,
        None,
        req.shared_run_id,
    )
    assert runtime.watcher.states[run_id] == ["queued", "cancelled"]
    # Cancelling again, or the control plane's finish by RunId, changes nothing more.
    assert await inst.cancel_run(run_id, "tenant-a") is not None
    assert not await runtime.index.mark_finished(run_id, RunStatus.FAILED, "late")
    assert len(await _outcomes(redis)) == 1


async def test_a_run_cancelled_while_running_has_a_cancelled_outcome(
    runtime: Runtime, redis: Redis
) -> None:
    inst = await runtime.start("out-1")
    run_id = await inst.accept(request(pipeline(2)))
    await runtime.gate.wait_entered(2)
    await inst.cancel_run(run_id, "tenant-a")
    runtime.gate.open()
    assert await runtime.watcher.reached(run_id, "cancelled", "completed", "failed") == "cancelled"
    [outcome] = await _outcomes(redis)
    assert outcome.status is RunStatus.CANCELLED and outcome.execution_id is not None


async def test_finishing_is_idempotent_and_starting_a_finished_run_only_drops_its_entry(
    runtime: Runtime, redis: Redis
) -> None:
    index = runtime.index
    run_id, created = await index.accept("idx-1", request(pipeline(1)))
    assert created
    loaded = await index.get_unchecked(run_id)
    assert loaded is not None
    record = loaded[0]
    assert await index.finish(record, RunStatus.FAILED, reason="first")
    assert not await index.finish(record, RunStatus.COMPLETED)
    assert not await index.start("idx-1", run_id, "ex-late"), "a finished run never starts"
    final = await index.get_for_tenant(run_id, "tenant-a")
    assert final is not None and (final.status, final.failure_reason) == (RunStatus.FAILED, "first")
    assert final.execution_id is None
    assert len(await _outcomes(redis)) == 1
    assert await index.queue_length("idx-1") == 0
    assert await index.in_state(RunStatus.QUEUED) == []
