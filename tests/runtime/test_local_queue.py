"""Local queue and background controller of one runtime instance (real Redis/Valkey).

Accepting a run creates its RunId; the controller starts it (ExecutionId) while a run
slot and a worker are free, restores the run's snapshot, and the run moves
queued -> running -> completed/failed/cancelled. Capacity (queue room, run slots,
workers, MaxLocalWorkersPerExecution) decides what the controller starts and what
the instance advertises. Handlers block on latches; "nothing started" is checked
after full heartbeat rounds (the controller is kicked on every heartbeat).
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.core.context import current_context
from airuntime.fleet.registry import InstanceDescriptor
from airuntime.fleet.runs import RunStatus
from runtime_pod.instance import RunRefused, RuntimeInstance
from tests.runtime.conftest import Runtime
from tests.runtime.support import HeartbeatProbe, pipeline, request, snapshot

pytestmark = pytest.mark.timeout(60)


async def test_accepting_creates_the_run_id_and_the_controller_creates_the_execution_id(
    runtime: Runtime,
) -> None:
    inst = runtime.instance("rq-1")
    req = request(pipeline(1))
    run_id = await inst.accept(req)
    queued = await inst.run_status(run_id, "tenant-a")
    assert queued is not None
    assert queued.status is RunStatus.QUEUED and queued.execution_id is None
    assert (queued.shared_run_id, queued.instance_id) == (req.shared_run_id, "rq-1")
    assert run_id.startswith("run-") and run_id != req.shared_run_id
    assert await runtime.index.queue_length("rq-1") == 1
    assert await runtime.redis.zcard(keys.executions_index()) == 0, "no execution before start"

    await inst.start()
    await runtime.gate.wait_entered(1)
    running = await inst.run_status(run_id, "tenant-a")
    assert running is not None and running.status is RunStatus.RUNNING
    eid = running.execution_id
    assert eid is not None and eid.startswith("ex-") and eid != run_id
    info = await runtime.store.info(eid)
    assert info.tenant_id == "tenant-a" and info.context == req.snapshot
    assert await runtime.index.queue_length("rq-1") == 0

    runtime.gate.open()
    assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
    done = await inst.run_status(run_id, "tenant-a")
    assert done is not None and done.status is RunStatus.COMPLETED
    assert done.execution_id == eid and done.finished_at_ms is not None
    assert runtime.watcher.states[run_id] == ["queued", "running", "completed"]


@pytest.mark.parametrize(
    ("snapshot_value", "named"),
    [
        pytest.param(None, "snapshot", id="missing-snapshot"),
        pytest.param({"user_id": "u1"}, "snapshot.tenant_id", id="snapshot-without-tenant"),
    ],
)
async def test_request_without_a_snapshot_is_refused_naming_it_and_nothing_is_written(
    runtime: Runtime, redis: Redis, snapshot_value: dict[str, str] | None, named: str
) -> None:
    inst = await runtime.start("rq-1")
    body = request(pipeline(1)).model_dump(mode="json")
    if snapshot_value is None:
        del body["snapshot"]
    else:
        body["snapshot"] = snapshot_value
    with pytest.raises(RunRefused) as refused:
        await inst.accept(body)
    assert refused.value.reason == "invalid"
    assert named in str(refused.value), str(refused.value)
    assert await redis.keys(keys.run("*")) == []
    assert await redis.keys(keys.shared_run_to_run("*")) == []
    assert await redis.keys(keys.RunBucket(0).in_state("*")) == []
    assert await redis.keys("air:{e:*") == []
    assert await runtime.index.queue_length("rq-1") == 0


async def test_handlers_run_inside_the_snapshot_of_their_own_run(runtime: Runtime) -> None:
    inst = await runtime.start("rq-1", max_concurrent_runs=2)
    a = await inst.accept(request(pipeline(1), tenant="tenant-a", group="group-1"))
    b = await inst.accept(request(pipeline(1), tenant="tenant-b"))
    await runtime.gate.wait_entered(2)
    eid_a = (await inst.run_status(a, "tenant-a")).execution_id  # type: ignore[union-attr]
    eid_b = (await inst.run_status(b, "tenant-b")).execution_id  # type: ignore[union-attr]
    assert runtime.gate.contexts[eid_a] == snapshot("tenant-a", "group-1")  # type: ignore[index]
    assert runtime.gate.contexts[eid_b] == snapshot("tenant-b")  # type: ignore[index]
    assert current_context() is None, "the controller's context does not leak into callers"
    runtime.gate.open()
    for run_id in (a, b):
        assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"


async def test_a_full_queue_refuses_the_run_with_reason_queue_full(runtime: Runtime) -> None:
    inst = await runtime.start("rq-1", max_concurrent_runs=1, queue_capacity=2, workers=2)
    first = await inst.accept(request(pipeline(1)))
    await runtime.gate.wait_entered(1)
    queued = [await inst.accept(request(pipeline(1))) for _ in range(2)]
    refused_req = request(pipeline(1))
    with pytest.raises(RunRefused) as refused:
        await inst.accept(refused_req)
    assert refused.value.reason == "queue_full"
    assert "full" in str(refused.value)
    assert await runtime.index.run_for_shared(refused_req.shared_run_id) is None
    capacity = await inst.capacity()
    assert (capacity.queued_run_count, capacity.can_accept_run) == (2, False)

    runtime.gate.open()
    for run_id in (first, *queued):
        assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
    assert (await inst.capacity()).queued_run_count == 0


async def test_max_concurrent_runs_keeps_further_runs_queued(runtime: Runtime) -> None:
    inst = runtime.instance(
        "rq-1", max_concurrent_runs=2, workers=6, max_local_workers_per_execution=2
    )
    probe = HeartbeatProbe(inst)
    await inst.start()
    runs = [await inst.accept(request(pipeline(1))) for _ in range(3)]
    await runtime.gate.wait_entered(2)
    await probe.rounds(2)
    third = await inst.run_status(runs[2], "tenant-a")
    assert third is not None and third.status is RunStatus.QUEUED
    assert len(runtime.gate.entered) == 2
    capacity = await inst.capacity()
    assert capacity.available_run_slots == 0 and capacity.available_worker_count == 2
    assert not capacity.can_accept_run

    runtime.gate.release(runtime.gate.entered[0])
    await runtime.gate.wait_entered(3, "the queued run starts once a run slot is free")
    runtime.gate.open()
    for run_id in runs:
        assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
    assert runtime.gate.max_total == 2


async def test_a_paused_queue_refuses_runs_and_starts_none_until_resumed(
    runtime: Runtime,
) -> None:
    inst = runtime.instance("rq-1")
    probe = HeartbeatProbe(inst)
    waiting = await inst.accept(request(pipeline(1)))
    inst.pause_queue()
    await inst.start()
    with pytest.raises(RunRefused) as refused:
        await inst.accept(request(pipeline(1)))
    assert refused.value.reason == "paused"
    await probe.rounds(2)
    record = await inst.run_status(waiting, "tenant-a")
    assert record is not None and record.status is RunStatus.QUEUED
    assert runtime.gate.entered == []
    published = await runtime.registry.get("rq-1")
    assert published is not None and published.capacity.is_queue_paused
    assert not published.capacity.can_accept_run

    inst.resume_queue()
    runtime.gate.open()
    assert await runtime.watcher.reached(waiting, "completed", "failed") == "completed"
    assert (await inst.capacity()).can_accept_run
    await inst.accept(request(pipeline(1)))


async def test_a_failing_step_ends_the_run_failed(runtime: Runtime) -> None:
    inst = await runtime.start("rq-1")
    run_id = await inst.accept(request(pipeline(1, uses="fail", with_={"fail_attempts": 9})))
    assert await runtime.watcher.reached(run_id, "completed", "failed") == "failed"
    assert runtime.watcher.states[run_id] == ["queued", "running", "failed"]
    record = await inst.run_status(run_id, "tenant-a")
    assert record is not None and record.status is RunStatus.FAILED
    assert record.failure_reason and record.finished_at_ms


async def test_cancelling_a_running_run_ends_it_cancelled(runtime: Runtime) -> None:
    inst = await runtime.start("rq-1")
    run_id = await inst.accept(request(pipeline(2)))
    await runtime.gate.wait_entered(2)
    record = await inst.cancel_run(run_id, "tenant-a")
    assert record is not None and record.status is RunStatus.RUNNING, "running steps drain"
    runtime.gate.open()
    assert await runtime.watcher.reached(run_id, "completed", "failed", "cancelled") == "cancelled"
    assert runtime.watcher.states[run_id] == ["queued", "running", "cancelled"]
    record = await inst.run_status(run_id, "tenant-a")
    assert record is not None and record.status is RunStatus.CANCELLED
    assert record.execution_id is not None
    events = await runtime.store.events(record.execution_id)
    assert [e.get("actor") for e in events if e.type == "cancel_requested"] == ["tenant tenant-a"]


async def test_cancelling_a_queued_run_removes_it_before_it_starts(runtime: Runtime) -> None:
    inst = await runtime.start("rq-1", max_concurrent_runs=1)
    first = await inst.accept(request(pipeline(1)))
    await runtime.gate.wait_entered(1)
    second = await inst.accept(request(pipeline(1)))
    record = await inst.cancel_run(second, "tenant-a")
    assert record is not None and record.status is RunStatus.CANCELLED
    assert record.execution_id is None
    assert await runtime.index.queue_length("rq-1") == 0
    runtime.gate.open()
    assert await runtime.watcher.reached(first, "completed", "failed") == "completed"
    record = await inst.run_status(second, "tenant-a")
    assert record is not None and record.status is RunStatus.CANCELLED
    assert record.execution_id is None and runtime.gate.entered[1:] == []
    assert runtime.watcher.states[second] == ["queued", "cancelled"]


# -- worker capacity ----------------------------------------------------------------------


async def test_saturated_workers_make_can_accept_run_false_although_the_queue_has_room(
    runtime: Runtime,
) -> None:
    inst = runtime.instance(
        "rq-1", workers=2, max_local_workers_per_execution=2, max_concurrent_runs=3
    )
    probe = HeartbeatProbe(inst)
    await inst.start()
    assert (await inst.capacity()).can_accept_run
    await inst.accept(request(pipeline(2)))
    await runtime.gate.wait_entered(2)
    capacity = await inst.capacity()
    assert capacity.available_worker_count == 0
    assert capacity.queued_run_count < capacity.queue_capacity
    assert capacity.available_run_slots == 2
    assert not capacity.can_accept_run
    await probe.rounds(2)
    published = await runtime.registry.get("rq-1")
    assert published is not None
    assert (published.capacity.available_worker_count, published.capacity.can_accept_run) == (
        0,
        False,
    )


async def test_max_local_workers_per_execution_caps_concurrent_handlers_of_one_execution(
    runtime: Runtime,
) -> None:
    inst = runtime.instance(
        "rq-1",
        workers=8,
        max_local_workers_per_execution=3,
        tenant_id="tenant-a",
        tenant_group_id="group-1",
    )
    probe = HeartbeatProbe(inst)
    await inst.start()
    run_id = await inst.accept(request(pipeline(12), tenant="tenant-a", group="group-1"))
    await runtime.gate.wait_entered(3)
    await probe.rounds(2)  # room for more claims, were the cap not enforced
    assert len(runtime.gate.inside()) == 3
    runtime.gate.open()
    assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
    record = await inst.run_status(run_id, "tenant-a")
    assert record is not None and record.execution_id is not None
    assert runtime.gate.max_active[record.execution_id] == 3
    assert len(runtime.gate.entered) == 12

    started = [
        e for e in await runtime.store.events(record.execution_id) if e.type == "run_started"
    ]
    assert len(started) == 1
    expected = {
        "run_id": run_id,
        "runtime.instance.id": "rq-1",
        "max.local.workers.per.execution": "3",
        "effective.worker.count.per.execution": "3",
        "tenant.id": "tenant-a",
        "tenant.groupId": "group-1",
        "runtime.isolation.mode": "Shared",
    }
    assert {k: started[0].get(k) for k in expected} == expected
    assert {k: v for k, v in record.metadata.items() if k in expected} == {
        k: v for k, v in expected.items() if "." in k
    }


async def test_effective_workers_are_limited_by_the_workers_still_available(
    runtime: Runtime,
) -> None:
    inst = await runtime.start(
        "rq-1", workers=4, max_local_workers_per_execution=3, max_concurrent_runs=2
    )
    a = await inst.accept(request(pipeline(3)))
    await runtime.gate.wait_entered(3)
    b = await inst.accept(request(pipeline(3)))
    await runtime.gate.wait_entered(4)
    record_b = await inst.run_status(b, "tenant-a")
    assert record_b is not None and record_b.execution_id is not None
    assert record_b.metadata["effective.worker.count.per.execution"] == "1"
    assert (await inst.capacity()).available_worker_count == 0
    runtime.gate.open()
    for run_id in (a, b):
        assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
    assert runtime.gate.max_active[record_b.execution_id] == 1


async def test_with_no_worker_free_the_next_run_waits_queued_and_then_completes(
    runtime: Runtime,
) -> None:
    inst = runtime.instance(
        "rq-1", workers=2, max_local_workers_per_execution=2, max_concurrent_runs=3
    )
    probe = HeartbeatProbe(inst)
    await inst.start()
    first = await inst.accept(request(pipeline(2)))
    await runtime.gate.wait_entered(2)
    second = await inst.accept(request(pipeline(1)))
    await probe.rounds(2)
    record = await inst.run_status(second, "tenant-a")
    assert record is not None and record.status is RunStatus.QUEUED
    assert len(runtime.gate.entered) == 2

    for key in list(runtime.gate.entered):
        runtime.gate.release(key)
    assert await runtime.watcher.reached(first, "completed", "failed") == "completed"
    await runtime.gate.wait_entered(3, "the waiting run starts once the workers are free")
    runtime.gate.open()
    assert await runtime.watcher.reached(second, "completed", "failed") == "completed"
    assert runtime.watcher.states[second] == ["queued", "running", "completed"]


async def test_a_publication_guesses_the_queue_length_and_never_publishes_a_wrong_one(
    runtime: Runtime, redis: Redis
) -> None:
    """On a standalone server an instance publishes its descriptor in one script call
    made with the queue length its last publication found; a queue that changed behind
    it (a run queued by another writer here) costs one more call, and the descriptor
    published names the queue's real length."""
    inst = runtime.instance("rq-pub")
    calls: list[tuple[int, bool]] = []
    original = inst.registry.publish_if_queued

    async def counted(descriptor: InstanceDescriptor, ttl_ms: int, queue: str) -> tuple[bool, int]:
        answer = await original(descriptor, ttl_ms, queue)
        calls.append((descriptor.capacity.queued_run_count, answer[0]))
        return answer

    inst.registry.publish_if_queued = counted  # type: ignore[method-assign]
    await inst._publish()
    assert calls == [(0, True)], "steady: one call"
    calls.clear()
    await redis.rpush(inst.index.queue_key("rq-pub"), "run-a", "run-b", "run-c")
    await inst._publish()
    assert calls == [(0, False), (3, True)]
    published = await runtime.registry.get("rq-pub")
    assert published is not None and published.capacity.queued_run_count == 3
    calls.clear()
    await inst._publish()
    assert calls == [(3, True)], "the length found is the next guess"


# -- controller wake-ups ------------------------------------------------------------------


def _counting_queue_reads(inst: RuntimeInstance) -> list[int]:
    """The controller's reads of the local queue head, each as the number of runs it
    found (the real read runs)."""
    reads: list[int] = []
    read = inst.index.queue_head

    async def counted(instance_id: str, count: int) -> list[str]:
        found = await read(instance_id, count)
        reads.append(len(found))
        return found

    inst.index.queue_head = counted  # type: ignore[method-assign]
    return reads


async def test_a_run_ending_with_nothing_queued_behind_it_reads_no_empty_queue(
    runtime: Runtime,
) -> None:
    """Heartbeats 30 s apart, so after the first one only the run's own wake-ups count:
    its accept reads the queue (and starts it); its end, the queue having been taken
    whole, wakes nothing and reads nothing."""
    inst = await runtime.start("rq-1", heartbeat_s=30.0)
    await inst.supervisor.wait_ok("heartbeat")  # its first round's kick is given
    reads = _counting_queue_reads(inst)
    first = await inst.accept(request(pipeline(1)))
    await runtime.gate.wait_entered(1)
    assert 1 in reads, "the accept's wake-up read the queue and found the run"
    before = len(reads)
    participation = inst.participations[first].task
    runtime.gate.open()
    await participation  # its end's callback ran before this returns
    # Had the end woken the controller, the kick would be set still, or consumed by a read.
    assert not inst._kick.is_set()
    assert len(reads) == before
    assert await runtime.watcher.reached(first, "completed", "failed") == "completed"
    second = await inst.accept(request(pipeline(1)))
    assert await runtime.watcher.reached(second, "completed", "failed") == "completed"
    assert len(reads) == before + 1, "the next accept reads it again"


async def test_runs_left_queued_when_workers_ran_out_start_when_a_run_ends(
    runtime: Runtime,
) -> None:
    """Two runs in one delivery, workers for one: the controller reads both, starts the
    first and must come back for the second when the first ends, not a heartbeat
    (30 s, beyond the test's deadline) later."""
    inst = await runtime.start(
        "rq-1", heartbeat_s=30.0, workers=2, max_local_workers_per_execution=2
    )
    await inst.supervisor.wait_ok("heartbeat")
    reads = _counting_queue_reads(inst)
    first, second = await inst.accept_many([request(pipeline(2)), request(pipeline(1))])
    assert isinstance(first, str) and isinstance(second, str)
    await runtime.gate.wait_entered(2)
    assert 2 in reads, "one read found both"
    record = await inst.run_status(second, "tenant-a")
    assert record is not None and record.status is RunStatus.QUEUED
    runtime.gate.open()
    assert await runtime.watcher.reached(first, "completed", "failed") == "completed"
    assert await runtime.watcher.reached(second, "completed", "failed") == "completed"
