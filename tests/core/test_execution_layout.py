"""The execution slot layout: every execution script single-slot on a cluster, buckets
spread evenly over slot ranges, standalone key names unchanged, and a deployment that
switches layouts with data in place is refused."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from airuntime.core import keys
from airuntime.core.execution_layout import LayoutGuard, LayoutMismatch, buckets_for, check_layout
from airuntime.core.redis_client import CountingRedisCluster
from airuntime.core.scripts import library
from airuntime.engine.execution_store import ExecutionStore
from tests.dags import plan_of

B = keys.CLUSTER_EXECUTION_BUCKETS


@pytest.mark.parametrize("eid", ["ex-1", "ex-" + "f" * 32, "sr-9d7a12", "ü-ünicode", "x"])
def test_every_execution_script_stays_in_one_slot_on_a_cluster(eid: str) -> None:
    ek = keys.execution_keys(eid, B)
    for script in library().scripts.values():
        if script.num_keys < len(keys.EXECUTION_KEY_SUFFIXES):
            continue
        slots = {key_slot(k.encode()) for k in ek.for_script(script.num_keys)}
        assert len(slots) == 1, f"{script.name} spans slots {slots}"
    assert key_slot(ek.bucket.executions.encode()) == key_slot(ek.meta.encode())


def test_buckets_spread_evenly_over_three_equal_slot_ranges() -> None:
    shards = Counter(key_slot(b.outbox.encode()) * 3 // 16384 for b in keys.execution_buckets(B))
    assert sorted(shards.values()) in ([42, 43, 43], [43, 43, 42])
    ids = Counter(keys.bucket_of(f"ex-{i}", B).index for i in range(B * 100))
    assert len(ids) == B and max(ids.values()) < 2 * min(ids.values())


def test_a_standalone_server_keeps_the_single_set_of_indexes() -> None:
    ek = keys.execution_keys("ex-1")
    assert ek.meta == "air:{e:ex-1}:meta"
    assert ek.for_script(25)[21:] == [
        "air:executions:active",
        "air:archive:outbox",
        "air:executions",
        "air:early-cancels",
    ]


async def test_switching_layout_with_data_in_place_is_refused(
    redis: Redis, cluster_redis: CountingRedisCluster
) -> None:
    assert buckets_for(redis) == 1 and buckets_for(cluster_redis) == B
    assert await check_layout(redis) == 1
    assert await check_layout(redis) == 1
    await cluster_redis.set(keys.execution_layout(), "1")  # as if data had moved over
    with pytest.raises(LayoutMismatch, match=f"written with 1 bucket.*uses {B}"):
        await check_layout(cluster_redis)
    with pytest.raises(LayoutMismatch):
        await ExecutionStore(cluster_redis).create(plan_of({"a": []}), execution_id="e1")
    assert await cluster_redis.exists(*keys.execution_keys("e1", B).for_script(25)) == 0


async def test_concurrent_first_writers_share_one_layout_check(redis: Redis) -> None:
    """Fifty writers arrive while the first check is in flight (held open by a latch):
    the check is made once; a failed check is made again by the next writer."""
    checks = 0
    entered, release = asyncio.Event(), asyncio.Event()
    failing = True

    async def check() -> int:
        nonlocal checks
        checks += 1
        entered.set()
        await release.wait()
        if failing:
            raise LayoutMismatch("recorded with another count")
        return await check_layout(redis)

    guard = LayoutGuard(check)
    first = [asyncio.ensure_future(guard.ensure()) for _ in range(50)]
    await entered.wait()
    release.set()
    outcomes = await asyncio.gather(*first, return_exceptions=True)
    # Each writer that found the check undone made it again, one at a time (the lock),
    # and each was refused: nobody wrote past a failed check.
    assert all(isinstance(o, LayoutMismatch) for o in outcomes) and checks == 50

    failing, checks = False, 0
    await asyncio.gather(*(guard.ensure() for _ in range(50)))
    assert checks == 1
    await guard.ensure()
    assert checks == 1
    assert await redis.get(keys.execution_layout()) == b"1"
