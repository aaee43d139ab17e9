"""The run index's batched steps: what each sends, and that merging them kept the rules.

A controller's start batch (the start scripts, the queue removals, the tenants' settings)
is one ordered pipeline; on a standalone server acceptance reads the queue's room and
pushes the run in the script that creates it, so concurrent accepts never overshoot.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.fleet import run_index as run_index_module
from airuntime.fleet.run_index import QueueFull, RunIndex
from airuntime.fleet.runs import RunStatus
from airuntime.fleet.tenancy import TenantSettings, default_settings
from tests.round_trips import RoundTripCounting
from tests.runtime.conftest import Runtime
from tests.runtime.support import pipeline, request

pytestmark = pytest.mark.timeout(60)


async def test_a_start_batch_starts_removes_and_reads_the_tenants_in_one_round_trip(
    runtime: Runtime, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's start: the start scripts, the queue removals (of started and
    refused runs alike) and the tenants' settings, in that order, in one pipeline."""
    index = runtime.index
    await runtime.registry.put_tenant(TenantSettings(tenant_id="tenant-a", max_instances=5))
    mine, _ = await index.accept("sb-1", request(pipeline(1)))
    other, _ = await index.accept("sb-1", request(pipeline(1), tenant="tenant-b"))
    assert await index.start("sb-1", other, "ex-earlier")  # no longer queued
    await redis.rpush(index.queue_key("sb-1"), other)  # a stale entry of it
    executed: list[int] = []
    real = type(redis.pipeline())

    class Counted(real):  # type: ignore[valid-type,misc]
        async def execute(self, raise_on_error: bool = True) -> Any:
            executed.append(len(self.command_stack))
            return await super().execute(raise_on_error)

    monkeypatch.setattr(
        redis,
        "pipeline",
        lambda transaction=True: Counted(
            redis.connection_pool, redis.response_callbacks, transaction, None
        ),
    )
    batch = await index.start_batch(
        "sb-1",
        [(mine, "ex-1"), (other, "ex-2")],
        tenant_ids=["tenant-b", "tenant-a", "tenant-z", "tenant-a"],
    )
    assert executed == [2 + 2 + 1], "two starts, two removals, one read: one round trip"
    assert batch.started == [True, False]
    assert batch.tenants["tenant-a"].max_instances == 5
    assert batch.tenants["tenant-b"] == await runtime.registry.tenant("tenant-b")
    assert batch.tenants["tenant-z"] == default_settings("tenant-z")  # nothing stored
    assert set(batch.tenants) == {"tenant-a", "tenant-b", "tenant-z"}
    assert await redis.lrange(index.queue_key("sb-1"), 0, -1) == []
    record = await index.get_for_tenant(other, "tenant-b")
    assert record is not None and record.execution_id == "ex-earlier"


async def test_concurrent_accepts_on_a_standalone_server_never_overshoot_the_queue(
    runtime: Runtime, redis: Redis
) -> None:
    """Where the local queue shares the runs' slot, acceptance reads the room and pushes
    the run in one script: 40 contenders released together on a queue of capacity 7
    get exactly 7 runs queued, each in the queue once, with no window between a run's
    record and its queue entry; the others are refused QueueFull with nothing written."""
    index = runtime.index
    assert index.buckets == 1
    contenders, capacity = 40, 7
    barrier = asyncio.Barrier(contenders)

    async def accept(i: int) -> tuple[str, bool] | QueueFull:
        await barrier.wait()
        try:
            return await index.accept(
                "sq-1", request(pipeline(1), shared_run_id=f"sr-q{i}"), queue_capacity=capacity
            )
        except QueueFull as exc:
            return exc

    answers = await asyncio.gather(*(accept(i) for i in range(contenders)))
    created = [a[0] for a in answers if isinstance(a, tuple) and a[1]]
    assert len(created) == capacity
    assert sum(isinstance(a, QueueFull) for a in answers) == contenders - capacity
    queue = [q.decode() for q in await redis.lrange(index.queue_key("sq-1"), 0, -1)]
    assert sorted(queue) == sorted(created)
    queued = await redis.zrange(keys.run_buckets(1)[0].in_state(RunStatus.QUEUED), 0, -1)
    assert sorted(q.decode() for q in queued) == sorted(created)
    for i, answer in enumerate(answers):
        if isinstance(answer, QueueFull):
            assert await index.run_for_shared(f"sr-q{i}") is None, "nothing written"


async def test_a_run_accepted_here_is_loaded_from_memory_as_the_acceptance_wrote_it(
    runtime: Runtime, redis: Redis
) -> None:
    """The controller's load of runs this index just accepted needs no round trip, and
    gives exactly what reading the records back gives (with and without a tenant group
    and metadata); a run loaded once, or accepted by another index, is read back."""
    index = runtime.index
    with_group = request(pipeline(2), group="group-1", tenant="tenant-b")
    with_group = with_group.model_copy(update={"metadata": {"origin": "api", "n": "2"}})
    ids = [
        (await index.accept("mem-1", req))[0]
        for req in (request(pipeline(1)), with_group, request(pipeline(3), tenant="tenant-c"))
    ]
    counting = RoundTripCounting.sharing(redis)
    index.redis = counting
    remembered = await index.load_queued(ids)
    assert counting.taken() == 0, "runs accepted here: no round trip"
    read_back = await index.load_many(ids)
    assert counting.taken() == 1
    assert remembered == read_back
    assert all(r is not None and not isinstance(r, ValueError) for r in remembered)
    again = await index.load_queued(ids)
    assert counting.taken() == 1, "loaded once already: read back, in one round trip"
    assert again == read_back
    elsewhere = RunIndex(redis)
    other, _ = await elsewhere.accept("mem-1", request(pipeline(1)))
    mixed = await index.load_queued([ids[0], other])
    assert counting.taken() == 1 and mixed == await elsewhere.load_many([ids[0], other])


async def test_a_remembered_run_cancelled_since_is_refused_by_the_start_and_leaves_the_queue(
    runtime: Runtime, redis: Redis
) -> None:
    """Memory may be stale -- the run was cancelled after it was accepted, through
    another process's index (the control plane's) -- and that is safe: startRun reads
    the status itself, refuses the start, and the run only leaves the queue; its record
    stays Cancelled. A cancel through this very index forgets the run at once."""
    index = runtime.index
    run_id, _ = await index.accept("mem-2", request(pipeline(1)))
    record = await index.get_for_tenant(run_id, "tenant-a")
    assert record is not None
    assert await RunIndex(redis).cancel_queued(record, "cancelled by its tenant")
    [stale] = await index.load_queued([run_id])
    assert stale is not None and not isinstance(stale, ValueError)
    assert stale[0].status is RunStatus.QUEUED, "what memory says"
    await redis.rpush(index.queue_key("mem-2"), run_id)  # as if still queued
    batch = await index.start_batch("mem-2", [(run_id, "ex-late")])
    assert batch.started == [False]
    assert await redis.lrange(index.queue_key("mem-2"), 0, -1) == []
    now = await index.get_for_tenant(run_id, "tenant-a")
    assert now is not None and now.status is RunStatus.CANCELLED and now.execution_id is None

    here, _ = await index.accept("mem-2", request(pipeline(1)))
    mine = await index.get_for_tenant(here, "tenant-a")
    assert mine is not None and await index.cancel_queued(mine, "cancelled here")
    [read] = await index.load_queued([here])
    assert read is not None and not isinstance(read, ValueError)
    assert read[0].status is RunStatus.CANCELLED, "read back, not remembered"


async def test_an_index_remembers_a_bounded_number_of_accepted_runs(
    runtime: Runtime, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs accepted but never loaded (adopted elsewhere, say) do not pile up: past the
    bound the oldest is forgotten and read back when asked for."""
    monkeypatch.setattr(run_index_module, "REMEMBERED_ACCEPTS", 2)
    index = runtime.index
    ids = [(await index.accept("mem-3", request(pipeline(1))))[0] for _ in range(3)]
    counting = RoundTripCounting.sharing(redis)
    index.redis = counting
    newest = await index.load_queued(ids[1:])
    assert counting.taken() == 0
    oldest = await index.load_queued(ids[:1])
    assert counting.taken() == 1
    assert [*oldest, *newest] == await index.load_many(ids)
