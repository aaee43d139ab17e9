"""Run-index scripts answer a command sent again as the call it repeats.

redis-py sends a command again when the connection it was on closed before the reply
came (a failover, a dropped link): the script may have run. A resent start or
adoption must not be taken for a refusal -- the run would be running (or adopted)
with nobody driving it -- while a different call is still refused.
"""

from __future__ import annotations

import time

import pytest
from redis.asyncio import Redis

from airuntime.fleet.runs import RunStatus
from tests.runtime.conftest import Runtime
from tests.runtime.support import pipeline, request

pytestmark = pytest.mark.timeout(60)


async def test_a_resent_start_is_the_same_start_and_another_start_is_refused(
    runtime: Runtime,
) -> None:
    index = runtime.index
    run_id, _ = await index.accept("rs-1", request(pipeline(1)))
    assert await index.start("rs-1", run_id, "ex-first")
    record = await index.get_for_tenant(run_id, "tenant-a")
    assert record is not None and record.started_at_ms is not None
    assert await index.start("rs-1", run_id, "ex-first"), "the resend is answered as started"
    again = await index.get_for_tenant(run_id, "tenant-a")
    assert again == record, "nothing written again"
    assert not await index.start("rs-1", run_id, "ex-second"), "a second start attempt"
    assert not await index.start("rs-2", run_id, "ex-first"), "another instance"
    final = await index.get_for_tenant(run_id, "tenant-a")
    assert final is not None
    assert (final.status, final.execution_id) == (RunStatus.RUNNING, "ex-first")


async def test_a_resent_adoption_is_the_same_adoption_and_another_is_refused(
    runtime: Runtime, redis: Redis
) -> None:
    index = runtime.index
    run_id, _ = await index.accept("dead-1", request(pipeline(1)))
    now = int(time.time() * 1000)

    async def adopt(dead: str, adopter: str, at_ms: int) -> int:
        return int(
            await index.scripts.call(
                redis, "adoptRun", [index.run_key(run_id)], [dead, adopter, at_ms, "queued"]
            )
        )

    assert await adopt("dead-1", "live-1", now) == 1
    assert await adopt("dead-1", "live-1", now) == 1, "the resend is answered as adopted"
    fields = await redis.hgetall(index.run_key(run_id))
    assert fields[b"instance_id"] == b"live-1" and fields[b"adopted_from"] == b"dead-1"
    assert await adopt("dead-1", "live-1", now + 1) == 0, "a later decision on old news"
    assert await adopt("dead-1", "live-2", now) == 0, "another adopter"
    assert await adopt("live-1", "live-2", now) == 1, "live-1 died in turn: adopted again"
    fields = await redis.hgetall(index.run_key(run_id))
    assert fields[b"adopted_from"] == b"dead-1,live-1"
    assert await adopt("dead-1", "live-2", now) == 0, "live-2 did not adopt it from dead-1"
    assert await redis.exists(index.run_key(run_id)) == 1


async def test_a_queued_run_its_owner_started_after_the_adopters_look_stays_the_owners(
    runtime: Runtime, redis: Redis
) -> None:
    """The adopter saw the run queued under an unregistered owner; the owner registered
    and started it before the adopter's compare-and-set landed: the run is running
    now, so the adoption is refused and the run keeps one participation, its owner's.
    A running run whose owner is dead is still adopted when the adopter saw it
    running."""
    index = runtime.index
    run_id, _ = await index.accept("back-1", request(pipeline(1)))
    assert await index.start("back-1", run_id, "ex-owner")
    assert not await index.adopt(run_id, "back-1", "live-1", RunStatus.QUEUED)
    record = await index.get_for_tenant(run_id, "tenant-a")
    assert record is not None
    assert (record.instance_id, record.status) == ("back-1", RunStatus.RUNNING)
    assert b"adopted_from" not in await redis.hgetall(index.run_key(run_id))
    assert await index.adopt(run_id, "back-1", "live-1", RunStatus.RUNNING)
    record = await index.get_for_tenant(run_id, "tenant-a")
    assert record is not None and record.instance_id == "live-1"


async def test_a_start_merges_the_runners_metadata_once_and_a_refused_start_writes_none(
    runtime: Runtime,
) -> None:
    """The start script writes who runs the run into its metadata (no second write
    after it), keeping what the submitter gave; a resend changes nothing, and a start
    that is refused leaves the metadata as it was."""
    index = runtime.index
    sent = request(pipeline(1)).model_copy(update={"metadata": {"team": "blue", "a.b": "old"}})
    run_id, _ = await index.accept("rs-1", sent)
    runner = {"runtime.instance.id": "rs-1", "a.b": "new"}
    assert await index.start_many("rs-1", [(run_id, "ex-first")], [runner]) == [True]
    record = await index.get_for_tenant(run_id, "tenant-a")
    assert record is not None
    assert record.metadata == {"team": "blue", "a.b": "new", "runtime.instance.id": "rs-1"}
    assert await index.start_many("rs-1", [(run_id, "ex-first")], [{"x.y": "1"}]) == [True]
    refused = await index.start_many("rs-2", [(run_id, "ex-other")], [{"x.y": "2"}])
    assert refused == [False]
    final = await index.get_for_tenant(run_id, "tenant-a")
    assert final is not None and final.metadata == record.metadata
