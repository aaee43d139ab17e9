"""Descriptors carry Redis time, so reservations expire by Redis time only.

``reserveSlot-1.lua`` drops the reservations a descriptor already reflects (made before
its ``snapshot_at_ms``, minus a grace) and the expired ones (older than their TTL), by
its own ``TIME``. The descriptor is stamped by the publishing script with the same
clock: a runtime whose clock is an hour ahead can no longer make admission forget the
reservations it holds, and a reservation expires when Redis says so.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.core.redis_client import server_ms
from airuntime.core.scripts import library
from airuntime.fleet.registry import CapacityDescriptor, InstanceDescriptor, Registry
from tests.runtime.support import eventually

pytestmark = pytest.mark.timeout(60)

HOUR_MS = 3_600_000


def _descriptor(instance_id: str, stamp_ms: int, free_slots: int = 1) -> InstanceDescriptor:
    capacity = CapacityDescriptor.compute(
        worker_count=4,
        active_worker_count=0,
        max_local_workers_per_execution=4,
        queued_run_count=0,
        running_run_count=0,
        queue_capacity=10,
        max_concurrent_runs=free_slots,
        is_queue_paused=False,
    ).model_copy(update={"snapshot_at_ms": stamp_ms})
    return InstanceDescriptor(
        instance_id=instance_id,
        heartbeat_at_ms=stamp_ms,
        runtime_prefix="rt",
        capacity=capacity,
        unhealthy_loops=(),
    )


async def _reserve(redis: Redis, d: InstanceDescriptor, ttl_ms: int, grace_ms: int = 0) -> int:
    """Reserve as admission does: the descriptor's age is measured by Redis (its stamp is
    Redis time), never a runtime's clock; a stamp from the future counts as age 0."""
    age_ms = max(0, await server_ms(redis) - d.capacity.snapshot_at_ms)
    reply: Any = await library().call(
        redis,
        "reserveSlot",
        [keys.reservations(d.instance_id)],
        [uuid.uuid4().hex, d.capacity.available_run_slots, age_ms, ttl_ms, grace_ms, 64, 1],
    )
    return int(reply[0])


async def test_publication_stamps_the_descriptor_with_redis_time_not_the_runtimes_clock(
    redis: Redis,
) -> None:
    registry = Registry(redis)
    skewed = int(time.time() * 1000) + HOUR_MS  # a runtime whose clock is an hour ahead
    before = await server_ms(redis)
    stamped = await registry.publish(_descriptor("rt-1", skewed), ttl_ms=5000)
    after = await server_ms(redis)
    stored = await registry.get("rt-1")
    assert stored is not None
    assert before <= stamped <= after
    assert stored.capacity.snapshot_at_ms == stored.heartbeat_at_ms == stamped
    assert stored.unhealthy_loops == () and stored.capacity.available_run_slots == 1
    assert await redis.zscore(keys.instances(), "rt-1") == stamped + 5000
    assert [d.instance_id for d in await registry.list_all()] == ["rt-1"]


async def test_a_reservation_expires_by_redis_time_and_a_skewed_runtime_cannot_erase_it(
    redis: Redis,
) -> None:
    registry = Registry(redis)
    ttl_ms, grace_ms = 400, 2000
    await registry.publish(_descriptor("rt-1", 0), ttl_ms=60_000)
    published = await registry.get("rt-1")
    assert published is not None
    assert await _reserve(redis, published, ttl_ms, grace_ms) == 1, "the one free slot"
    assert await _reserve(redis, published, ttl_ms, grace_ms) == -7, "taken"

    # Republished by a runtime an hour ahead: stamped with Redis time all the same, so
    # the fresh reservation still counts.
    await registry.publish(_descriptor("rt-1", int(time.time() * 1000) + HOUR_MS), 60_000)
    republished = await registry.get("rt-1")
    assert republished is not None
    assert republished.capacity.snapshot_at_ms <= await server_ms(redis)
    assert await _reserve(redis, republished, ttl_ms, grace_ms) == -7, "still reserved"

    async def expired() -> bool:
        return await _reserve(redis, republished, ttl_ms, grace_ms) == 1

    await eventually(expired, "the reservation expired by Redis time")
    assert await redis.zcard(keys.reservations("rt-1")) == 1, "only the new reservation"

    # A descriptor stamped by a runtime an hour ahead cannot erase live reservations:
    # its age counts as 0, so what was reserved within the grace period still counts.
    client_stamped = _descriptor("rt-2", int(time.time() * 1000) + HOUR_MS)
    await registry.publish(_descriptor("rt-2", 0), ttl_ms=60_000)
    fresh = await registry.get("rt-2")
    assert fresh is not None
    assert await _reserve(redis, fresh, ttl_ms, grace_ms) == 1
    assert await _reserve(redis, client_stamped, ttl_ms, grace_ms) == -7, "not overfilled"


async def test_a_publication_with_a_guessed_queue_length_writes_only_if_it_holds(
    redis: Redis,
) -> None:
    """publishInstanceQueued-3: a descriptor made with the queue length the last
    publication found is written, stamped, only while the queue has that length; else
    nothing is written and the length now comes back."""
    registry = Registry(redis)
    queue = keys.instance_queue("rt-q")
    guessed = _descriptor("rt-q", 0)
    assert guessed.capacity.queued_run_count == 0
    published, stamp = await registry.publish_if_queued(guessed, 60_000, queue)
    assert published and abs(stamp - await server_ms(redis)) < 5_000
    stored = await registry.get("rt-q")
    assert stored is not None and stored.heartbeat_at_ms == stamp
    assert await redis.zscore(keys.instances(), "rt-q") == stamp + 60_000

    await redis.rpush(queue, "run-1", "run-2")
    before = await redis.get(keys.instance("rt-q"))
    assert await registry.publish_if_queued(guessed, 60_000, queue) == (False, 2)
    assert await redis.get(keys.instance("rt-q")) == before, "nothing written"

    right = guessed.model_copy(
        update={"capacity": guessed.capacity.model_copy(update={"queued_run_count": 2})}
    )
    published, _ = await registry.publish_if_queued(right, 60_000, queue)
    stored = await registry.get("rt-q")
    assert published and stored is not None and stored.capacity.queued_run_count == 2
