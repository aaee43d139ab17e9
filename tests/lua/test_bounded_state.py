"""Engine state stays bounded: the active index loses an execution in the script that
finalizes it, the listing index is pruned of executions whose keys expired, and every
per-execution key (never an index) carries the retention TTL after finalization. On the
embedded Valkey, redis-server 7 and a 3-shard cluster (where the indexes are one set
per execution bucket: read here as their union)."""

from __future__ import annotations

import asyncio

import pytest

from airuntime.core import keys
from airuntime.core.redis_client import RedisClient
from airuntime.engine.execution_store import ExecutionStore
from tests.dags import plan_of


@pytest.fixture
def store(engine_redis: RedisClient) -> ExecutionStore:
    return ExecutionStore(engine_redis)


async def _members(store: ExecutionStore, index: str) -> set[str]:
    """Members of ``index`` (``executions`` | ``active``) over every bucket."""
    out: set[str] = set()
    for bucket in keys.execution_buckets(store.buckets):
        key = bucket.executions if index == "executions" else bucket.active
        out |= {m.decode() for m in await store.redis.zrange(key, 0, -1)}
    return out


async def test_create_lists_the_execution_in_both_indexes(store: ExecutionStore) -> None:
    eid = await store.create(plan_of({"a": []}), execution_id="e1")
    assert await _members(store, "executions") == {eid}
    assert await _members(store, "active") == {eid}
    created = (await store.info(eid)).created_at_ms
    assert await store.redis.zscore(store.keys_of(eid).bucket.executions, eid) == created


@pytest.mark.parametrize("how", ["complete", "fail", "cancel", "cancel-with-nothing-running"])
async def test_the_finalizing_script_removes_the_execution_from_the_active_index(
    store: ExecutionStore, how: str
) -> None:
    eid = await store.create(plan_of({"a": []}))
    other = await store.create(plan_of({"a": []}))
    if how == "cancel-with-nothing-running":
        assert await store.cancel(eid) == "Cancelled"
    else:
        (a,) = (await store.claim(eid, "w", 1, 30_000)).claims
        if how == "complete":
            assert (await store.complete(eid, "w", [("a", a.token, "w", "1")])).status == (
                "Succeeded"
            )
        elif how == "fail":
            assert (await store.fail(eid, "w", "a", a.token, "x", retryable=False)).status == (
                "Failed"
            )
        else:
            assert await store.cancel(eid) == "Cancelling"
            assert eid in await _members(store, "active")
            assert (await store.stop(eid, [("a", a.token, "w")])).status == "Cancelled"
    assert await _members(store, "active") == {other}
    assert await _members(store, "executions") == {eid, other}


async def test_retention_applies_to_every_execution_key_and_never_to_an_index(
    store: ExecutionStore,
) -> None:
    eid = await store.create(plan_of({"a": []}), retention_s=60)
    await store.create(plan_of({"a": []}))  # keeps both indexes non-empty
    assert await store.cancel(eid) == "Cancelled"
    present = [k for k in store.keys_of(eid).all() if await store.redis.exists(k)]
    ek = store.keys_of(eid)
    assert present == [ek.key(s) for s in keys.EXECUTION_RECORD_SUFFIXES], (
        "a finalized execution keeps its meta, plan, ledger and snapshot, nothing else"
    )
    for key in present:
        assert 0 < await store.redis.ttl(key) <= 60, key
    bucket = store.keys_of(eid).bucket
    assert await store.redis.ttl(bucket.executions) == -1, "the listing index never expires"
    # The active index of the execution's bucket: no TTL (-1), or no key at all (-2) when
    # the finalized execution was its only member (on a cluster, one of 128 buckets).
    assert await store.redis.ttl(bucket.active) in (-1, -2), "the active index never expires"


async def test_prune_removes_executions_whose_keys_expired_and_nothing_else(
    store: ExecutionStore,
) -> None:
    expiring = [await store.create(plan_of({"a": []}), retention_s=1) for _ in range(7)]
    for eid in expiring:
        assert await store.cancel(eid) == "Cancelled"
    kept_finished = await store.create(plan_of({"a": []}), retention_s=3600)
    assert await store.cancel(kept_finished) == "Cancelled"
    running = await store.create(plan_of({"a": []}))
    await store.claim(running, "w", 1, 30_000)
    assert (await store.prune_index(batch=3)).unlisted == 0, "nothing has expired yet"
    for _ in range(400):  # the server expires the keys after 1 s (its own clock)
        if not await store.redis.exists(store.keys_of(expiring[-1]).meta):
            break
        await asyncio.sleep(0.01)
    result = await store.prune_index(batch=3)
    assert result.unlisted == len(expiring)
    assert await _members(store, "executions") == {kept_finished, running}
    assert await _members(store, "active") == {running}
    again = await store.prune_index()
    assert (again.unlisted, again.deactivated) == (0, 0)


async def test_prune_clears_active_entries_left_by_older_writers(store: ExecutionStore) -> None:
    """Entries written before finalization removed them itself: a finalized execution and
    one whose keys are gone leave the active index; a running one stays."""
    done = await store.create(plan_of({"a": []}))
    assert await store.cancel(done) == "Cancelled"
    running = await store.create(plan_of({"a": []}))
    await store.redis.zadd(store.keys_of(done).bucket.active, {done: 1})
    await store.redis.zadd(keys.bucket_of("vanished", store.buckets).active, {"vanished": 2})
    result = await store.prune_index()
    assert result.deactivated == 2
    assert await _members(store, "active") == {running}


async def test_concurrent_prunes_agree(store: ExecutionStore) -> None:
    eids = [await store.create(plan_of({"a": []}), retention_s=1) for _ in range(20)]
    for eid in eids:
        await store.cancel(eid)
    for eid in eids[:10]:
        await store.redis.delete(store.keys_of(eid).meta)
    gate = asyncio.Event()

    async def prune() -> int:
        await gate.wait()
        return (await store.prune_index(batch=4)).unlisted

    tasks = [asyncio.create_task(prune()) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    assert sum(await asyncio.gather(*tasks)) == 10, "each entry is removed exactly once"
    assert await _members(store, "executions") == set(eids[10:])
