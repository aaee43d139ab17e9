"""Shared runs end: Succeeded / Failed / Cancelled, and no cancel is ever written over.

* The outcome reader ends a run from the runtime's outcome (a ``RunOutcome`` entry on
  ``air:{air}:run-outcomes``, written here exactly as a runtime writes it), acknowledges the
  entry only after that, and re-reads what it read but did not acknowledge after a
  restart. Outcomes of another tenant or another RunId change nothing.
* The reconciler ends a dispatched run whose runtime run is terminal when no outcome
  was seen (a runtime of this branch writes none), fails one whose run record is gone,
  and records a dispatch the pump did not.
* Real runs through a started control plane end Succeeded / Failed with no one
  draining or reconciling by hand; a cancelled dispatched run ends Cancelled.
* The two races: a cancel landing between submit's create and its queueing, or
  between the requeuer's read and its write, stands (latches pin the moment).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.asyncio import Redis

from airuntime.control_plane.outcomes import OUTCOME_GROUP, OutcomeReader
from airuntime.control_plane.scale_out import FulfilledRunRequeuer, ScaleOutPhase
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.shared_runs import SharedRun, SharedRunStatus, SharedRunStore
from airuntime.core import keys
from airuntime.core.supervision import LoopContext, LoopHealth
from airuntime.core.tasks import cancel_and_wait
from airuntime.fleet.outcomes import RunOutcome
from airuntime.fleet.registry import Registry
from airuntime.fleet.runs import RunStatus
from runtime_pod.host import RuntimeHost
from tests.control_plane.support import (
    LOCAL_RUNTIME,
    TENANT_A,
    TINY_PIPELINE,
    drain_until_finished,
    manual_cp,
    serving,
    snap,
    wait_for,
)

FAILING = {"id": "failing", "steps": [{"id": "a", "uses": "fail", "with": {"times": 99}}]}


async def _dispatched(cp: ControlPlane, tenant: str = "default") -> SharedRun:
    """A shared run recorded as Dispatched to a (pretend) runtime run."""
    run = await cp.submit(TINY_PIPELINE, snap(tenant))
    moved = await cp.runs.transition(
        run.shared_run_id,
        SharedRunStatus.DISPATCHED,
        run_id=f"run-{run.shared_run_id[3:]}",
        assigned_instance_id="runtime-instance-1",
    )
    assert moved.moved
    return moved.run


def _outcome(run: SharedRun, status: RunStatus, **extra: Any) -> RunOutcome:
    fields: dict[str, Any] = {
        "run_id": run.run_id,
        "shared_run_id": run.shared_run_id,
        "tenant_id": run.snapshot.tenant_id,
        "instance_id": "runtime-instance-1",
        "status": status,
        "execution_id": "ex-1",
        "reason": "step a failed" if status is RunStatus.FAILED else None,
        "finished_at_ms": int(time.time() * 1000),
        **extra,
    }
    return RunOutcome(**fields)


async def _write(redis: Redis, outcome: RunOutcome) -> None:
    await redis.xadd(keys.RunBucket(0).outcomes, outcome.fields())  # type: ignore[arg-type]


def _ctx() -> LoopContext:
    return LoopContext(LoopHealth("outcomes"))


@pytest.mark.parametrize(
    ("runtime_status", "shared_status"),
    [
        (RunStatus.COMPLETED, SharedRunStatus.SUCCEEDED),
        (RunStatus.FAILED, SharedRunStatus.FAILED),
        (RunStatus.CANCELLED, SharedRunStatus.CANCELLED),
    ],
)
async def test_an_outcome_ends_the_shared_run_once_and_is_acknowledged(
    redis: Redis, cp: ControlPlane, runtime_status: RunStatus, shared_status: SharedRunStatus
) -> None:
    run = await _dispatched(cp)
    reader = OutcomeReader(redis, cp.runs, "cp-test", block_ms=10)
    await reader.ensure_group()
    await _write(redis, _outcome(run, runtime_status))
    await _write(redis, _outcome(run, runtime_status))  # a duplicate changes nothing

    assert await reader.read_new() == 2
    ended = await cp.runs.require(run.shared_run_id)
    assert ended.status is shared_status and ended.execution_id == "ex-1"
    assert ended.finished_at_ms is not None
    assert ended.reason == ("step a failed" if runtime_status is RunStatus.FAILED else None)
    pending = await redis.xpending(keys.RunBucket(0).outcomes, OUTCOME_GROUP)
    assert pending["pending"] == 0, "acknowledged only after the run was ended"
    assert await redis.zscore(keys.shared_runs_open(), run.shared_run_id) is None
    assert await redis.zscore(keys.shared_runs_finished(), run.shared_run_id) is not None


async def test_outcomes_of_another_tenant_or_run_change_nothing(
    redis: Redis, cp: ControlPlane
) -> None:
    run = await _dispatched(cp)
    reader = OutcomeReader(redis, cp.runs, "cp-test", block_ms=10)
    await reader.ensure_group()
    await _write(redis, _outcome(run, RunStatus.COMPLETED, tenant_id="tenant-b"))
    await _write(redis, _outcome(run, RunStatus.COMPLETED, run_id="run-someone-else"))

    assert await reader.read_new() == 2
    assert (await cp.runs.require(run.shared_run_id)).status is SharedRunStatus.DISPATCHED


async def test_a_restarted_reader_handles_what_it_read_but_did_not_acknowledge(
    redis: Redis, cp: ControlPlane
) -> None:
    first, second = await _dispatched(cp), await _dispatched(cp)
    reader = OutcomeReader(redis, cp.runs, "cp-test", block_ms=10)
    await reader.ensure_group()
    await _write(redis, _outcome(first, RunStatus.COMPLETED))
    # The reader died after reading, before ending the run and acknowledging:
    await redis.xreadgroup(OUTCOME_GROUP, "cp-test", {keys.RunBucket(0).outcomes: ">"}, count=10)
    assert (await cp.runs.require(first.shared_run_id)).status is SharedRunStatus.DISPATCHED
    await _write(redis, _outcome(second, RunStatus.FAILED))

    restarted = OutcomeReader(redis, cp.runs, "cp-test", block_ms=10)
    task = asyncio.create_task(restarted.run(_ctx()))
    try:

        async def both_ended_and_acknowledged() -> bool:
            a, b = await cp.runs.get_many([first.shared_run_id, second.shared_run_id])
            pending = await redis.xpending(keys.RunBucket(0).outcomes, OUTCOME_GROUP)
            return a.status.terminal and b.status.terminal and pending["pending"] == 0

        await wait_for(both_ended_and_acknowledged, what="both runs ended, entries acked")
    finally:
        await cancel_and_wait([task])  # a cancel landing inside redis-py may need repeating
    assert (await cp.runs.require(first.shared_run_id)).status is SharedRunStatus.SUCCEEDED
    assert (await cp.runs.require(second.shared_run_id)).status is SharedRunStatus.FAILED


async def _abandoned_outcome(redis: Redis, cp: ControlPlane) -> SharedRun:
    """A dispatched run whose outcome a control plane read, then died before applying."""
    run = await _dispatched(cp)
    dead = OutcomeReader(redis, cp.runs, "cp-dead", block_ms=10)
    await dead.ensure_group()
    await _write(redis, _outcome(run, RunStatus.COMPLETED))
    await redis.xreadgroup(OUTCOME_GROUP, "cp-dead", {keys.RunBucket(0).outcomes: ">"}, count=10)
    return run


async def test_an_outcome_left_unacknowledged_by_a_dead_control_plane_is_taken_over(
    redis: Redis, cp: ControlPlane
) -> None:
    run = await _abandoned_outcome(redis, cp)

    alive = OutcomeReader(redis, cp.runs, "cp-alive", block_ms=10, claim_idle_ms=0)
    assert await alive.take_over_abandoned() == 1
    assert (await cp.runs.require(run.shared_run_id)).status is SharedRunStatus.SUCCEEDED


async def test_a_following_reader_takes_over_an_abandoned_outcome_once_it_is_due(
    redis: Redis, cp: ControlPlane
) -> None:
    run = await _abandoned_outcome(redis, cp)

    alive = OutcomeReader(redis, cp.runs, "cp-alive", block_ms=10, claim_idle_ms=200)
    task = asyncio.create_task(alive.run(_ctx()))
    try:

        async def ended() -> bool:
            return (await cp.runs.require(run.shared_run_id)).status.terminal

        await wait_for(ended, what="the abandoned outcome taken over and applied")
    finally:
        await cancel_and_wait([task])
    assert (await cp.runs.require(run.shared_run_id)).status is SharedRunStatus.SUCCEEDED
    pending = await redis.xpending(keys.RunBucket(0).outcomes, OUTCOME_GROUP)
    assert pending["pending"] == 0


async def test_a_reader_looks_for_abandoned_outcomes_once_per_quarter_idle_time(
    redis: Redis, cp: ControlPlane
) -> None:
    reader = OutcomeReader(redis, cp.runs, "cp-test", block_ms=10)  # idle time 60 s
    await reader.ensure_group()
    stream = keys.RunBucket(0).outcomes

    async def autoclaims() -> int:
        stats = await redis.info("commandstats")
        return int(stats.get("cmdstat_xautoclaim", {}).get("calls", 0))

    before = await autoclaims()
    for _ in range(20):  # a reader's loop: a look when due, then a read
        await reader._take_over_when_due(stream)
        await reader._read(stream, None)
    assert await autoclaims() - before == 1, "one look per 15 s, not one per read"


async def test_real_runs_end_succeeded_or_failed_with_nobody_draining(redis: Redis) -> None:
    cp = ControlPlane(
        redis,
        manual_cp(redis).settings.model_copy(
            update={"background_pump": True, "reconcile_interval_s": 0.2}
        ),
    )
    async with serving(cp, RuntimeHost(redis, LOCAL_RUNTIME, instances=1)):
        good = await cp.submit(TINY_PIPELINE, snap())
        bad = await cp.submit(FAILING, snap())

        async def ended() -> list[SharedRun] | None:
            runs = await cp.runs.get_many([good.shared_run_id, bad.shared_run_id])
            return runs if all(r.status.terminal for r in runs) else None

        done = await wait_for(ended, what="both shared runs to end")
    assert [r.status for r in done] == [SharedRunStatus.SUCCEEDED, SharedRunStatus.FAILED]
    assert all(r.run_id and r.execution_id and r.finished_at_ms for r in done)
    assert await redis.zcard(keys.shared_runs_open()) == 0


async def test_reconciler_ends_fails_and_records_what_the_event_path_missed(
    redis: Redis, cp: ControlPlane
) -> None:
    # The event path misses: the control plane reads no outcomes.
    cp.outcomes.run = _reads_nothing  # type: ignore[method-assign]
    async with serving(cp, RuntimeHost(redis, LOCAL_RUNTIME, instances=1)):
        finished = await cp.submit(TINY_PIPELINE, snap())
        await drain_until_finished(cp, {finished.shared_run_id: "default"})
        lost = await _dispatched(cp)  # its run record never existed
        assert (await cp.runs.require(finished.shared_run_id)).status is (
            SharedRunStatus.DISPATCHED
        )
        cp.reconciler.stale_after_ms = 0
        assert await cp.reconciler.reconcile_once() == 2
    assert (await cp.runs.require(finished.shared_run_id)).status is SharedRunStatus.SUCCEEDED
    gone = await cp.runs.require(lost.shared_run_id)
    assert gone.status is SharedRunStatus.FAILED and "no longer exists" in (gone.reason or "")
    assert await cp.reconciler.reconcile_once() == 0, "nothing left to do"


async def test_cancelling_a_dispatched_run_ends_it_cancelled(
    redis: Redis, cp: ControlPlane
) -> None:
    slow = {"id": "slow", "steps": [{"id": "a", "uses": "sleep", "with": {"seconds": 2}}]}
    async with serving(cp, RuntimeHost(redis, LOCAL_RUNTIME, instances=1)):
        run = await cp.submit(slow, snap())
        assert (await cp.drain(1)).dispatched == 1

        async def executing() -> bool:
            body = await cp.get(run.shared_run_id, "default")
            return body is not None and body.execution_id is not None

        await wait_for(executing, what="the execution to start")
        answer = await cp.cancel(run.shared_run_id, "default")
        assert answer is not None and answer.reason == "cancel requested"
        cp.reconciler.stale_after_ms = 0

        async def cancelled() -> bool:
            await cp.reconciler.reconcile_once()
            return (await cp.runs.require(run.shared_run_id)).status.terminal

        await wait_for(cancelled, what="the shared run to end")
    assert (await cp.runs.require(run.shared_run_id)).status is SharedRunStatus.CANCELLED


async def test_a_cancel_between_the_runs_start_and_its_execution_stands(
    redis: Redis, cp: ControlPlane
) -> None:
    """The run record names its ExecutionId (startRun) a moment before the runtime
    creates the execution: a cancel in that window once found no execution, was
    dropped, and the run ran to Succeeded. A latch holds the creation in the window."""
    slow = {"id": "slow", "steps": [{"id": "a", "uses": "sleep", "with": {"seconds": 30}}]}
    host = RuntimeHost(redis, LOCAL_RUNTIME, instances=1)
    async with serving(cp, host):
        store = host.instances[0].store
        create = store.create_and_claim
        in_window, go_on = asyncio.Event(), asyncio.Event()

        async def held(*args: Any, **kwargs: Any) -> Any:
            in_window.set()
            await go_on.wait()
            return await create(*args, **kwargs)

        store.create_and_claim = held  # type: ignore[method-assign]
        run = await cp.submit(slow, snap())
        assert (await cp.drain(1)).dispatched == 1
        await asyncio.wait_for(in_window.wait(), 30)
        body = await cp.get(run.shared_run_id, "default")
        assert body is not None and body.execution_id is not None and body.execution is None
        answer = await cp.cancel(run.shared_run_id, "default")
        assert answer is not None and answer.reason == "cancel requested"
        go_on.set()

        async def ended() -> bool:
            return (await cp.runs.require(run.shared_run_id)).status.terminal

        await wait_for(ended, what="the shared run to end")
        details = await cp.get(run.shared_run_id, "default")
    assert details is not None and details.status is SharedRunStatus.CANCELLED
    assert details.steps is not None and details.steps["a"] == "cancelled"


async def test_submit_creates_the_queued_run_and_its_queue_item_in_one_step_and_a_cancel_stands(
    redis: Redis, cp: ControlPlane
) -> None:
    """Submit has no window between the record and its queueing (one script): right
    after it the run is QueuedGlobally with a Pending item; a cancel then takes both."""
    run = await cp.submit(TINY_PIPELINE, snap())
    stored = await cp.runs.require(run.shared_run_id)
    assert stored.status is SharedRunStatus.QUEUED_GLOBALLY == run.status
    item = await cp.queue.item(run.shared_run_id, "default")
    assert item["status"] == "Pending" and item["tenant_id"] == "default"
    assert await redis.zscore(keys.shared_runs_open(), run.shared_run_id) is not None

    answer = await cp.cancel(run.shared_run_id, "default")

    assert answer is not None and answer.status is SharedRunStatus.CANCELLED
    assert (await cp.runs.require(run.shared_run_id)).status is SharedRunStatus.CANCELLED
    assert await cp.queue.pending_count() == 0
    assert (await cp.queue.item(run.shared_run_id, "default"))["status"] == "Cancelled"


async def test_a_cancel_between_the_requeuers_read_and_write_stands(
    redis: Redis, cp: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    await Registry(redis).put_tenant(TENANT_A)  # no runtime: admission asks for scale-out
    run = await cp.submit(TINY_PIPELINE, snap("tenant-a"))
    await cp.drain(1)
    assert (await cp.runs.require(run.shared_run_id)).status is (
        SharedRunStatus.SCALE_OUT_REQUESTED
    )
    [request] = await cp.scale_outs.list()
    await cp.scale_outs.transition(
        request.request_id, None, phase=ScaleOutPhase.FULFILLED, fulfilled_instance_id="x-1"
    )
    requeuer = FulfilledRunRequeuer(cp.scale_outs, cp.runs, cp.queue)
    real_transition = cp.scale_outs.transition

    async def marked_then_cancelled(*args: Any, **kwargs: Any) -> Any:
        marked = await real_transition(*args, **kwargs)
        await cp.cancel(run.shared_run_id, "tenant-a")  # lands after the read
        return marked

    monkeypatch.setattr(cp.scale_outs, "transition", marked_then_cancelled)
    assert await requeuer.requeue_once() == 0
    assert (await cp.runs.require(run.shared_run_id)).status is SharedRunStatus.CANCELLED
    assert await cp.queue.pending_count() == 0


async def test_the_store_refuses_a_move_the_table_does_not_allow(redis: Redis) -> None:
    store = SharedRunStore(redis)
    cp = manual_cp(redis)
    run = await cp.submit(TINY_PIPELINE, snap())
    await store.transition(run.shared_run_id, SharedRunStatus.CANCELLED)
    refused = await store.transition(run.shared_run_id, SharedRunStatus.DISPATCHED)
    assert not refused.moved and refused.run.status is SharedRunStatus.CANCELLED
    with pytest.raises(KeyError):
        await store.transition("sr-" + "0" * 32, SharedRunStatus.CANCELLED)


async def _reads_nothing(ctx: LoopContext) -> None:
    """An outcome reader that reports healthy and never reads (until cancelled)."""
    ctx.ok()
    await asyncio.Event().wait()


async def test_the_pumps_record_after_the_outcome_keeps_the_end_and_names_the_pump(
    redis: Redis, cp: ControlPlane
) -> None:
    """The outcome reader can end a run before the pump records its dispatch (the
    runtime finished first). The pump's record then keeps the end (status, reason) and
    adds who dispatched it; a run cancelled while queued, or ended under another RunId,
    is left as it is, and a run still queued moves to Dispatched."""
    won, cancelled, other, queued = [await cp.submit(TINY_PIPELINE, snap()) for _ in range(4)]
    reader = OutcomeReader(redis, cp.runs, "cp-test", block_ms=10)
    await reader.ensure_group()
    for run in (won, other):
        ran = run.model_copy(update={"run_id": f"run-{run.shared_run_id[3:]}"})
        await _write(redis, _outcome(ran, RunStatus.FAILED))
    assert await reader.read_new() == 2
    await cp.runs.transition(cancelled.shared_run_id, SharedRunStatus.CANCELLED)
    await redis.delete(keys.shared_run_archive_outbox())

    def changes(run: SharedRun, run_id: str | None = None) -> dict[str, Any]:
        rid = run_id or f"run-{run.shared_run_id[3:]}"
        return cp.dispatcher.dispatched_changes("runtime-instance-1", rid, 1234)

    recorded = await cp.runs.record_dispatched(
        [
            (won.shared_run_id, changes(won)),
            (cancelled.shared_run_id, changes(cancelled)),
            (other.shared_run_id, changes(other, "run-another")),
            (queued.shared_run_id, changes(queued)),
        ]
    )
    assert [r is not None and r.moved for r in recorded] == [False, False, False, True]

    ended = await cp.runs.require(won.shared_run_id)
    assert ended.status is SharedRunStatus.FAILED and ended.reason == "step a failed"
    assert ended.execution_id == "ex-1" and ended.finished_at_ms is not None
    assert ended.assigned_instance_id == "runtime-instance-1"
    assert ended.dispatched_at_ms == 1234
    assert ended.pump_worker_id == cp.dispatcher.identity.worker_id
    assert ended.pump_worker_id is not None
    outbox = await redis.zrange(keys.shared_run_archive_outbox(), 0, -1)
    assert outbox == [won.shared_run_id.encode()], "the archive upserts the fuller record"

    untouched = await cp.runs.require(cancelled.shared_run_id)
    assert untouched.status is SharedRunStatus.CANCELLED and untouched.pump_worker_id is None
    elsewhere = await cp.runs.require(other.shared_run_id)
    assert elsewhere.status is SharedRunStatus.FAILED and elsewhere.pump_worker_id is None
    moved = await cp.runs.require(queued.shared_run_id)
    assert moved.status is SharedRunStatus.DISPATCHED and moved.dispatched_at_ms == 1234


async def test_one_read_ends_its_runs_together_and_a_broken_record_costs_only_its_outcome(
    redis: Redis, cp: ControlPlane
) -> None:
    """The outcomes of one read are applied in one transaction and acknowledged
    together; a shared run record that no longer parses makes the reader fall back to
    one by one, dropping only that outcome, so the others still end and nothing stays
    pending to be read forever."""
    runs = [await _dispatched(cp) for _ in range(5)]
    broken = runs[2]
    await redis.set(keys.shared_run(broken.shared_run_id), b'{"not": "a shared run"}')
    reader = OutcomeReader(redis, cp.runs, "cp-test", block_ms=10)
    await reader.ensure_group()
    for run in runs:
        await _write(redis, _outcome(run, RunStatus.COMPLETED))
    await _write(redis, _outcome(runs[0], RunStatus.COMPLETED, tenant_id="tenant-b"))

    assert await reader.read_new() == 6
    for run in runs:
        if run is not broken:
            ended = await cp.runs.require(run.shared_run_id)
            assert ended.status is SharedRunStatus.SUCCEEDED, run.shared_run_id
    assert await redis.get(keys.shared_run(broken.shared_run_id)) == b'{"not": "a shared run"}'
    pending = await redis.xpending(keys.RunBucket(0).outcomes, OUTCOME_GROUP)
    assert pending["pending"] == 0


async def test_runs_ended_together_leave_the_open_index_and_join_finished_and_the_outbox(
    redis: Redis, cp: ControlPlane
) -> None:
    """A batch's records are written together and its index upkeep is a few multi-key
    commands: every run ended in it moves, a run named twice moves once with its last
    change, and a run the batch leaves open stays listed as open."""
    runs = [await cp.submit(TINY_PIPELINE, snap()) for _ in range(5)]
    ending, staying = runs[:4], runs[4]
    ids = [r.shared_run_id for r in ending] + [ending[0].shared_run_id, staying.shared_run_id]
    await redis.delete(keys.shared_run_archive_outbox())

    def decide(i: int, run: SharedRun) -> tuple[SharedRunStatus, dict[str, Any]] | None:
        if i == len(ids) - 1:
            return None  # left as it is
        return SharedRunStatus.CANCELLED, {"reason": f"ended by entry {i}"}

    moved = await cp.runs.transition_each(ids, decide)
    assert [t is not None and t.moved for t in moved] == [True] * 5 + [False]

    ended = await cp.runs.get_many([r.shared_run_id for r in ending])
    assert all(r.status is SharedRunStatus.CANCELLED and r.finished_at_ms for r in ended)
    assert ended[0].reason == "ended by entry 4", "the last change of a run named twice"
    open_ids = {m.decode() for m in await redis.zrange(keys.shared_runs_open(), 0, -1)}
    assert open_ids == {staying.shared_run_id}
    assert await redis.hkeys(keys.shared_runs_open_tenants()) == [staying.shared_run_id.encode()]
    finished = dict(await redis.zrange(keys.shared_runs_finished(), 0, -1, withscores=True))
    assert finished == {r.shared_run_id.encode(): float(r.finished_at_ms or 0) for r in ended}
    outbox = await redis.zrange(keys.shared_run_archive_outbox(), 0, -1)
    assert sorted(outbox) == sorted(r.shared_run_id.encode() for r in ending)
    assert (await cp.runs.require(staying.shared_run_id)).status is (
        SharedRunStatus.QUEUED_GLOBALLY
    )


class _AckRecording(Redis):
    """A real client recording its lone XACKs and the XACKs queued in transactions."""

    lone_acks = 0
    acks_in_transactions = 0

    async def xack(self, *args: Any, **kwargs: Any) -> Any:
        self.lone_acks += 1
        return await super().xack(*args, **kwargs)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute

        async def recorded(*args: Any, **kwargs: Any) -> Any:
            if transaction:
                names = [str(cmd[0]).upper() for cmd, _ in pipe.command_stack]
                self.acks_in_transactions += names.count("XACK")
            return await execute(*args, **kwargs)

        pipe.execute = recorded  # type: ignore[method-assign]
        return pipe


async def test_a_standalone_reader_acknowledges_in_the_transaction_that_ends_the_runs(
    redis: Redis, cp: ControlPlane
) -> None:
    """On a standalone server the outcome stream shares the shared runs' slot, so the
    XACK rides in the transaction that ends the runs (both land or neither, one round
    trip fewer); an entry with no outcome to apply (malformed) is acknowledged alone."""
    client = _AckRecording(connection_pool=redis.connection_pool)
    runs = [await _dispatched(cp) for _ in range(3)]
    store = SharedRunStore(client)
    reader = OutcomeReader(client, store, "cp-test", block_ms=10)
    await reader.ensure_group()
    for run in runs:
        await _write(redis, _outcome(run, RunStatus.COMPLETED))

    assert await reader.read_new() == 3
    assert (client.lone_acks, client.acks_in_transactions) == (0, 1)
    for run in runs:
        assert (await cp.runs.require(run.shared_run_id)).status is SharedRunStatus.SUCCEEDED
    pending = await redis.xpending(keys.RunBucket(0).outcomes, OUTCOME_GROUP)
    assert pending["pending"] == 0

    await redis.xadd(keys.RunBucket(0).outcomes, {"run_id": "run-x"})  # no outcome in it
    assert await reader.read_new() == 1
    assert (client.lone_acks, client.acks_in_transactions) == (1, 1)
    pending = await redis.xpending(keys.RunBucket(0).outcomes, OUTCOME_GROUP)
    assert pending["pending"] == 0
