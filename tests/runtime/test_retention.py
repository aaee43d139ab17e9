"""Nothing a runtime writes stays in Redis for good.

Runs go through a runtime with a one-second retention (delivered through its inbox,
completed, failed and cancelled before start); once the retention has passed, none of
the keys the runtime wrote for them is left: run records, SharedRunId mappings,
tenant/state/retention index entries, queues, replies, executions. What remains is what
lives as long as the instance (its registration and inbox, which go when it stops), the
tenant settings, the capped outcome stream, and the engine's execution listing.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.fleet.outcomes import OUTCOMES_MAXLEN
from airuntime.fleet.providers import RedisProvider
from airuntime.fleet.run_index import RunIndex
from airuntime.fleet.runs import RunStatus
from tests.runtime.conftest import Runtime
from tests.runtime.support import eventually, pipeline, request

pytestmark = pytest.mark.timeout(60)

N = 6


async def _keys(redis: Redis) -> set[str]:
    return {k.decode() for k in await redis.keys("*")}


async def test_finished_runs_leave_no_runtime_key_once_their_retention_has_passed(
    runtime: Runtime, redis: Redis
) -> None:
    inst = await runtime.start(
        "ret-1", provider="redis", run_retention_s=1, max_concurrent_runs=1, workers=2
    )
    desc = await runtime.registry.get("ret-1")
    assert desc is not None
    delivery = RedisProvider(redis)
    held = await delivery.deliver(desc, request(pipeline(1)))  # holds the only run slot
    await runtime.gate.wait_entered(1)
    cancelled = await delivery.deliver(desc, request(pipeline(1)))
    assert (await inst.cancel_run(cancelled, "tenant-a")).status == "cancelled"  # type: ignore[union-attr]
    runs = [await delivery.deliver(desc, request(pipeline(2, uses="noop"))) for _ in range(N)]
    failing = await delivery.deliver(
        desc, request(pipeline(1, uses="fail", with_={"fail_attempts": 9}))
    )
    runtime.gate.open()
    for run_id in (held, *runs):
        assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
    assert await runtime.watcher.reached(failing, "completed", "failed") == "failed"
    assert await redis.xlen(keys.RunBucket(0).outcomes) == N + 3
    # The record got the run retention (1 s) as its TTL: at most 1000 ms left, never
    # "no TTL" (-1); on a slow machine it may already have expired (-2).
    left_ms = await redis.pttl(keys.run(held))
    assert left_ms != -1 and left_ms <= 1000, left_ms

    lives_with_the_instance = {
        keys.instances(),
        keys.instance("ret-1"),
        keys.instance_inbox("ret-1"),
    }
    kept = {
        keys.tenants(),
        keys.tenant_settings("tenant-a"),
        keys.tenant_settings("tenant-b"),
        keys.RunBucket(0).outcomes,  # capped (MAXLEN ~ OUTCOMES_MAXLEN), read by the control plane
        keys.executions_index(),  # the engine's listing of executions (the engine's to bound)
        keys.archive_outbox(),  # no archiver here: trimmed by finalizations past the hold
        keys.execution_layout(),  # one small marker per deployment: the bucket count
        keys.run_layout(),  # ... and the run index's bucket count
    }

    async def only_kept_keys() -> bool:
        return await _keys(redis) <= lives_with_the_instance | kept

    try:
        await eventually(only_kept_keys, "every run key expired or was swept", timeout=30)
    except AssertionError:
        left = await _keys(redis) - lives_with_the_instance - kept
        raise AssertionError(f"left behind: {sorted(left)}") from None
    assert OUTCOMES_MAXLEN > 0
    await inst.stop()
    assert not (await _keys(redis)) & lives_with_the_instance, "the instance's own keys go too"


async def test_the_sweep_alone_removes_what_a_finished_runs_retention_leaves(
    redis: Redis,
) -> None:
    """``RunIndex.prune`` as the control plane's retention loop would call it: no runtime."""
    index = RunIndex(redis, retention_s=1)
    accepted = [await index.accept("gone-1", request(pipeline(1))) for _ in range(3)]
    records = []
    for run_id, _ in accepted:
        loaded = await index.get_unchecked(run_id)
        assert loaded is not None
        records.append(loaded[0])
    for record in records[:2]:
        assert await index.finish(record, RunStatus.COMPLETED)
    assert await index.prune() == 0, "nothing is due before the retention has passed"
    swept: list[int] = []

    async def due() -> bool:
        swept.append(await index.prune())
        return sum(swept) == 2

    await eventually(due, "both finished runs swept")
    still = records[2].run_id
    assert [r.run_id for r in await index.list_for_tenant("tenant-a")] == [still]
    assert await redis.zrange(keys.RunBucket(0).by_tenant("tenant-a"), 0, -1) == [still.encode()]
    assert await redis.zcard(keys.RunBucket(0).retention) == 0
    for record in records[:2]:
        assert not await redis.exists(keys.run(record.run_id))
        assert not await redis.exists(keys.shared_run_to_run(record.shared_run_id))
    assert await index.queue_length("gone-1") == 1, "the unfinished run is untouched"
