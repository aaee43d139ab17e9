"""The shared queue sharded per tenant: the pumps still see every tenant, in queue order.

Each tenant's queue is its own hash slot (``air:{q:<tenant>}:*``); the index of tenants
with work (``air:{air}:squeue:tenants``) is how pumps find them. These tests prove the
pumps' view stays whole: a batch takes the oldest items over all tenants, many pumps
racing over many tenants claim each item exactly once, and enqueues racing with the
pumps' retiring of empty tenants never strand an item. Concurrency starts at a
barrier; nothing waits on a sleep for ordering.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest
from redis.asyncio import Redis

from airuntime.control_plane.queue_tenants import QueueTenants
from airuntime.control_plane.reconciler import Reconciler
from airuntime.control_plane.shared_queue import ClaimedItem, QueueItemStatus, SharedQueue
from airuntime.control_plane.shared_runs import SharedRun, SharedRunStatus, SharedRunStore
from airuntime.core import keys
from airuntime.core.redis_client import server_ms
from airuntime.core.scripts import library
from tests.control_plane.support import TINY_PIPELINE, manual_cp, snap, wait_for
from tests.round_trips import RoundTripCounting

TENANTS = 40
PER_TENANT = 25
PUMPS = 8


def _srid(tenant: int, n: int) -> str:
    return f"sr-{tenant:016x}{n:016x}"


async def _enqueue_round_robin(queue: SharedQueue, tenants: int, per_tenant: int) -> list[str]:
    """Items enqueued tenant by tenant in turn: t0#0, t1#0, ..., t0#1, t1#1, ..."""
    order = []
    for n in range(per_tenant):
        for t in range(tenants):
            assert await queue.enqueue(_srid(t, n), f"tenant-{t}")
            order.append(_srid(t, n))
    return order


async def test_a_batch_takes_the_oldest_items_over_every_tenants_queue(redis: Redis) -> None:
    queue = SharedQueue(redis)
    order = await _enqueue_round_robin(queue, tenants=12, per_tenant=3)
    first = await queue.claim_batch("pump", 12)
    # One item of each tenant: the twelve oldest, in queue order.
    assert [i.shared_run_id for i in first] == order[:12]
    assert {i.tenant_id for i in first} == {f"tenant-{t}" for t in range(12)}
    # A skipped tenant's items stay; the others' next-oldest come instead.
    second = await queue.claim_batch("pump", 12, skip_tenants=frozenset({"tenant-0"}))
    tenant_0 = {_srid(0, n) for n in range(3)}
    assert [i.shared_run_id for i in second] == [s for s in order[12:] if s not in tenant_0][:12]
    assert await queue.status(_srid(0, 1), "tenant-0") is QueueItemStatus.PENDING
    # claim_next picks the oldest head over all tenants too.
    nxt = await queue.claim_next("pump")
    assert nxt is not None and nxt.shared_run_id == _srid(0, 1)


async def test_a_tenant_with_a_long_backlog_gets_its_whole_share_of_the_oldest(
    redis: Redis,
) -> None:
    # One tenant queued 60 runs first, then 20 tenants one each: the 64 oldest are the
    # backlog's 60 and 4 of the others, though a first read sees a few per tenant only.
    queue = SharedQueue(redis)
    backlog = [f"sr-big-{n:03d}" for n in range(60)]
    for srid in backlog:
        await queue.enqueue(srid, "tenant-big")
    others = [f"sr-small-{t:03d}" for t in range(20)]
    for t, srid in enumerate(others):
        await queue.enqueue(srid, f"tenant-{t}")
    batch = await queue.claim_batch("pump", 64)
    assert [c.shared_run_id for c in batch] == backlog + others[:4]


async def test_many_pumps_over_many_tenants_claim_each_item_exactly_once_in_order(
    valkey: Redis, valkey_url: str
) -> None:
    await valkey.flushall()
    order = await _enqueue_round_robin(SharedQueue(valkey), TENANTS, PER_TENANT)
    position = {srid: i for i, srid in enumerate(order)}
    clients = [Redis.from_url(valkey_url) for _ in range(PUMPS)]
    barrier = asyncio.Barrier(PUMPS)
    batches: list[list[ClaimedItem]] = []

    async def pump(i: int) -> None:
        queue = SharedQueue(clients[i])
        await barrier.wait()
        while batch := await queue.claim_batch(f"pump-{i}", 16):
            batches.append(batch)
            await queue.settle_many([(c, QueueItemStatus.DISPATCHED, f"pump-{i}") for c in batch])

    try:
        await asyncio.gather(*(pump(i) for i in range(PUMPS)))
    finally:
        for client in clients:
            await client.aclose()

    claimed = Counter(c.shared_run_id for batch in batches for c in batch)
    assert set(claimed) == set(order) and set(claimed.values()) == {1}
    assert len({c.split("#")[0] for b in batches for c in (b[0].token,)}) > 1, "pumps shared"
    for batch in batches:
        ranks = [position[c.shared_run_id] for c in batch]
        assert ranks == sorted(ranks), "a batch is claimed in queue order"
        # Round-robin enqueue: 16 consecutive items span 16 tenants, so a batch that
        # saw every tenant's head holds at most one item per tenant (give or take the
        # items other pumps took meanwhile, which only shorten a tenant's run).
        assert max(Counter(c.tenant_id for c in batch).values()) <= 2
    queue = SharedQueue(valkey)
    assert await queue.pending_count() == 0 and await queue.claimed_count() == 0
    # Every tenant found empty was retired from the index.
    assert await queue.claim_batch("pump-last", 16) == []
    assert await QueueTenants(valkey, library()).listed() == []


async def test_enqueues_racing_with_retiring_pumps_never_strand_an_item(
    valkey: Redis, valkey_url: str
) -> None:
    """Enqueuers keep adding items to a few tenants while pumps drain them and retire
    the tenants they find empty. If a retire could drop a tenant whose item had just
    been queued, that item would stay Pending with nobody to see it."""
    await valkey.flushall()
    enqueuers, pumps, per_enqueuer, tenants = 6, 6, 60, 3
    clients = [Redis.from_url(valkey_url) for _ in range(enqueuers + pumps)]
    barrier = asyncio.Barrier(enqueuers + pumps)
    done = asyncio.Event()
    claimed: Counter[str] = Counter()
    expected: set[str] = set()

    async def enqueuer(i: int) -> None:
        queue = SharedQueue(clients[i])
        await barrier.wait()
        for n in range(per_enqueuer):
            srid = _srid(i, n)
            expected.add(srid)
            await queue.enqueue(srid, f"tenant-{n % tenants}")
            await asyncio.sleep(0)  # let the pumps in between enqueues

    async def pump(i: int) -> None:
        queue = SharedQueue(clients[enqueuers + i])
        await barrier.wait()
        while True:
            finished = done.is_set()  # read before the claim: an empty claim after it ends
            batch = await queue.claim_batch(f"pump-{i}", 4)
            claimed.update(c.shared_run_id for c in batch)
            await queue.settle_many([(c, QueueItemStatus.DISPATCHED, "") for c in batch])
            if not batch and finished:
                return
            await asyncio.sleep(0)

    async def enqueue_all() -> None:
        await asyncio.gather(*(enqueuer(i) for i in range(enqueuers)))
        done.set()

    try:
        await asyncio.gather(enqueue_all(), *(pump(i) for i in range(pumps)))
    finally:
        for client in clients:
            await client.aclose()
    assert len(expected) == enqueuers * per_enqueuer
    assert set(claimed) == expected and set(claimed.values()) == {1}


async def test_a_retire_loses_to_an_announce_in_either_order(redis: Redis) -> None:
    queue = SharedQueue(redis)
    index = queue.tenants
    await queue.enqueue("sr-a", "tenant-a")
    item = await queue.claim_next("pump")
    assert item is not None
    await queue.settle(item, QueueItemStatus.DISPATCHED)
    # A pump reads tenant-a's (empty) head; an enqueue lands before its retire.
    [head] = await index.heads(4)
    assert head.empty
    await queue.enqueue("sr-b", "tenant-a")
    assert await index.retire(head) is False
    assert [t for t, _ in await index.listed()] == ["tenant-a"]
    # The enqueue's item lands, the retire wins first, the announce puts it back.
    got = await queue.claim_next("pump")
    assert got is not None and got.shared_run_id == "sr-b"
    await queue.settle(got, QueueItemStatus.DISPATCHED)
    [head] = await index.heads(4)
    await library().call(
        redis,
        "enqueueSharedRun",
        [keys.squeue_pending("tenant-a"), keys.squeue_claimed("tenant-a")],
        [keys.squeue_item_prefix("tenant-a"), "sr-c", "0", "tenant-a"],
    )
    assert await index.retire(head) is True
    assert await queue.claim_next("pump") is None  # the item's announce is yet to come
    await index.announce("tenant-a")
    got = await queue.claim_next("pump")
    assert got is not None and got.shared_run_id == "sr-c"


class AnnounceProbe(Redis):
    """A real client that, when a tenant is announced, reads the state of the item the
    enqueue is about: the protocol needs it Pending already."""

    item_key = ""
    seen: list[bytes | None]

    async def zincrby(self, name: Any, amount: float, value: Any) -> Any:
        self.seen.append(await self.hget(self.item_key, "status"))
        return await super().zincrby(name, amount, value)


async def test_an_enqueue_announces_its_tenant_only_after_its_item_is_pending(
    redis: Redis, redis_server: Any
) -> None:
    probe = AnnounceProbe.from_url(redis_server.url)
    probe.item_key, probe.seen = keys.squeue_item("tenant-p", "sr-p"), []
    try:
        assert await SharedQueue(probe).enqueue("sr-p", "tenant-p")
    finally:
        await probe.aclose()
    assert probe.seen == [b"Pending"]


async def test_an_expired_claim_of_a_tenant_with_nothing_pending_is_recovered(
    redis: Redis,
) -> None:
    dead = SharedQueue(redis, claim_lease_ms=1)
    await dead.enqueue("sr-x", "tenant-x")
    lost = await dead.claim_next("dead-pump")
    assert lost is not None
    expiry = await redis.zscore(keys.squeue_claimed("tenant-x"), "sr-x")
    assert expiry is not None

    async def lease_expired() -> bool:  # Redis time past the 1 ms lease: a clock, not order
        return await server_ms(redis) > expiry

    await wait_for(lease_expired, timeout_s=5, interval_s=0.001, what="the claim lease to pass")
    live = SharedQueue(redis)
    again = await live.claim_next("live-pump")
    assert again is not None and again.shared_run_id == "sr-x"
    assert again.token != lost.token
    assert await dead.settle(lost, QueueItemStatus.DISPATCHED) is False


def _queued_run(tenant: str) -> SharedRun:
    now = int(time.time() * 1000)
    return SharedRun(
        shared_run_id=SharedRunStore.new_id(),
        status=SharedRunStatus.QUEUED_GLOBALLY,
        pipeline_id=TINY_PIPELINE["id"],
        pipeline=TINY_PIPELINE,
        snapshot=snap(tenant),
        created_at_ms=now,
        updated_at_ms=now,
    )


async def test_a_submit_that_died_between_record_and_item_is_requeued(redis: Redis) -> None:
    """The submit is two steps (record in the control slot, item in the tenant's): a
    submitter dying after the first leaves a QueuedGlobally run the reconciler queues."""
    cp = manual_cp(redis)
    run = _queued_run("tenant-r")
    await cp.runs.create_queued(run)
    srid = run.shared_run_id
    assert await cp.queue.status(srid, "tenant-r") is None
    assert await cp.queue.claim_next("pump") is None
    reconciler = Reconciler(cp.runs, cp.queue, cp.run_index, stale_after_ms=0)
    assert await reconciler.reconcile_once() == 1
    assert await cp.queue.status(srid, "tenant-r") is QueueItemStatus.PENDING
    claimed = await cp.queue.claim_next("pump")
    assert claimed is not None and claimed.shared_run_id == srid


async def test_a_pass_reads_no_run_younger_than_stale_after_and_repairs_it_once_old(
    redis: Redis,
) -> None:
    """A control plane starting behind a backlog: its reconciler's pass costs one index
    read, not one record read per run; the same stranded runs, once older than
    ``stale_after_ms``, are repaired (so the pass still reaches every open run)."""
    from airuntime.core.redis_client import CountingRedis

    cp = manual_cp(redis)
    young = [_queued_run("tenant-y") for _ in range(30)]
    old = [
        r.model_copy(
            update={
                "created_at_ms": r.created_at_ms - 120_000,
                "updated_at_ms": r.updated_at_ms - 120_000,
            }
        )
        for r in (_queued_run("tenant-o") for _ in range(3))
    ]
    for run in [*young, *old]:
        await cp.runs.create_queued(run)  # records only: every one is stranded
    counting = CountingRedis(connection_pool=redis.connection_pool)
    reconciler = Reconciler(
        SharedRunStore(counting), cp.queue, cp.run_index, stale_after_ms=60_000, page=10
    )
    assert await reconciler.reconcile_once() == len(old)
    # Through the run store: the old runs' page (index and records) and the empty page
    # that ends the pass. The thirty young runs cost nothing (reading them took three
    # more pages of two round trips each).
    assert counting.round_trips == 3
    for run in old:
        assert await cp.queue.status(run.shared_run_id, "tenant-o") is QueueItemStatus.PENDING
    for run in young:
        assert await cp.queue.status(run.shared_run_id, "tenant-y") is None
    reconciler.stale_after_ms = 0
    assert await reconciler.reconcile_once() == len(young)


async def test_a_submit_sent_again_after_a_lost_reply_is_the_same_submit(redis: Redis) -> None:
    """A client resends a command whose reply a failover lost (redis-py retries on a
    closed connection): the record is written, so the resent submit must succeed, not
    refuse the run as a duplicate; another submission under the same id still is."""
    cp = manual_cp(redis)
    run = _queued_run("tenant-l")
    await cp.runs.create_queued(run)
    await cp.runs.create_queued(run)  # the resend
    assert await cp.runs.require(run.shared_run_id) == run
    assert await redis.zcard(keys.shared_runs_by_tenant("tenant-l")) == 1
    other = run.model_copy(update={"created_at_ms": run.created_at_ms + 1})
    with pytest.raises(ValueError, match="exists already"):
        await cp.runs.create_queued(other)
    assert await cp.runs.require(run.shared_run_id) == run


async def test_an_enqueue_that_died_before_its_announce_is_found_by_the_reconciler(
    redis: Redis,
) -> None:
    cp = manual_cp(redis)
    run = _queued_run("tenant-s")
    await cp.runs.create_queued(run)
    srid = run.shared_run_id
    # The item's half of the enqueue only (the process died before the announce).
    await library().call(
        redis,
        "enqueueSharedRun",
        [keys.squeue_pending("tenant-s"), keys.squeue_claimed("tenant-s")],
        [keys.squeue_item_prefix("tenant-s"), srid, "0", "tenant-s"],
    )
    assert await cp.queue.claim_next("pump") is None  # nobody sees it yet
    reconciler = Reconciler(cp.runs, cp.queue, cp.run_index, stale_after_ms=0)
    await reconciler.reconcile_once()
    claimed = await cp.queue.claim_next("pump")
    assert claimed is not None and claimed.shared_run_id == srid


async def test_a_cancel_between_the_two_halves_of_a_submit_wins(redis: Redis) -> None:
    cp = manual_cp(redis)
    run = _queued_run("tenant-c")
    await cp.runs.create_queued(run)
    cancelled = await cp.cancel(run.shared_run_id, "tenant-c")
    assert cancelled is not None and cancelled.status is SharedRunStatus.CANCELLED
    await cp.queue.enqueue(run.shared_run_id, "tenant-c")  # the submit's second half
    result = await cp.drain(5)
    assert result.dispatched == 0
    assert await cp.queue.status(run.shared_run_id, "tenant-c") is QueueItemStatus.CANCELLED
    stored = await cp.runs.require(run.shared_run_id)
    assert stored.status is SharedRunStatus.CANCELLED


async def test_the_heads_of_the_tenants_listed_last_time_come_with_the_index(
    valkey: Redis, valkey_url: str
) -> None:
    """On a standalone server the queues of the tenants listed at the last look are read
    in the index's round trip; a tenant listed or retired since is seen in a second."""
    queue = SharedQueue(valkey)
    for tenant in ("tenant-a", "tenant-b"):
        await queue.enqueue(f"sr-{tenant}", tenant)
    counting = RoundTripCounting.from_url(valkey_url)
    index = QueueTenants(counting, library())
    try:
        for expected_trips in (2, 1, 1):
            heads = await index.heads(4)
            assert counting.taken() == expected_trips
            assert {h.tenant_id: [s for s, _ in h.pending] for h in heads} == {
                "tenant-a": ["sr-tenant-a"],
                "tenant-b": ["sr-tenant-b"],
            }
        await queue.enqueue("sr-tenant-c", "tenant-c")  # listed since the last look
        heads = await index.heads(4)
        assert counting.taken() == 2
        assert sorted(h.tenant_id for h in heads) == ["tenant-a", "tenant-b", "tenant-c"]
        # Skipping a tenant narrows the guess: still one round trip, the tenant left out.
        heads = await index.heads(4, skip=frozenset({"tenant-a"}))
        assert counting.taken() == 1
        assert sorted(h.tenant_id for h in heads) == ["tenant-b", "tenant-c"]
        # tenant-b drained and retired: the index lists it no more, the guess misses.
        item = await queue.claim_next("pump", frozenset({"tenant-a", "tenant-c"}))
        assert item is not None and item.tenant_id == "tenant-b"
        await queue.settle(item, QueueItemStatus.DISPATCHED)
        [empty] = [h for h in await index.heads(4) if h.tenant_id == "tenant-b"]
        assert empty.empty and await index.retire(empty)
        counting.taken()
        heads = await index.heads(4)
        assert counting.taken() == 2
        assert sorted(h.tenant_id for h in heads) == ["tenant-a", "tenant-c"]
        assert counting.taken() == 0 and len(await index.heads(4)) == 2
        assert counting.taken() == 1
        # Every queue drained and retired, the idle pump polling an empty index: the
        # tenant that comes back is read with the index again.
        for _ in range(2):
            item = await queue.claim_next("pump")
            assert item is not None
            await queue.settle(item, QueueItemStatus.DISPATCHED)
        for head in await index.heads(4):
            assert head.empty and await index.retire(head)
        assert await index.heads(4) == [] and await index.listed() == []
        counting.taken()
        await queue.enqueue("sr-tenant-c-2", "tenant-c")
        [head] = await index.heads(4)
        assert head.tenant_id == "tenant-c" and [s for s, _ in head.pending] == ["sr-tenant-c-2"]
        assert counting.taken() == 1
    finally:
        await counting.aclose()


async def test_a_claim_reads_the_records_of_the_items_it_saw_in_the_same_round_trip(
    valkey: Redis, valkey_url: str
) -> None:
    """On a standalone server the pump's claim carries the read of the records of the
    items the heads showed, after the claims; an item another pump took between the
    heads and the claim makes this one take the next item, read in one more round
    trip, and every record comes with its own item."""
    seed = SharedQueue(valkey)
    for n in range(4):
        await seed.enqueue(_srid(1, n), "tenant-1")
        await valkey.set(f"record:{_srid(1, n)}", f"value-{n}")
    counting = RoundTripCounting.from_url(valkey_url)
    queue = SharedQueue(counting)
    try:
        await queue.tenants.heads(4)  # the tenant is listed: the guess holds from now
        counting.taken()
        claimed = await queue.claim_and_read("pump-1", 2, record_key=lambda s: f"record:{s}")
        assert [(i.shared_run_id, v) for i, v in claimed] == [
            (_srid(1, 0), b"value-0"),
            (_srid(1, 1), b"value-1"),
        ]
        assert counting.taken() == 2, "the heads, then the claim with its read"

        real_heads = queue.tenants.heads

        async def heads_then_a_rival(*args: Any, **kwargs: Any) -> Any:
            heads = await real_heads(*args, **kwargs)
            rival = await SharedQueue(valkey).claim_next("pump-2")  # takes the oldest seen
            assert rival is not None and rival.shared_run_id == _srid(1, 2)
            return heads

        queue.tenants.heads = heads_then_a_rival  # type: ignore[method-assign]
        claimed = await queue.claim_and_read("pump-1", 1, record_key=lambda s: f"record:{s}")
        assert [(i.shared_run_id, v) for i, v in claimed] == [(_srid(1, 3), b"value-3")]
        assert counting.taken() == 3, "the heads, the claim with its read, the unseen item"
        assert await seed.status(_srid(1, 3), "tenant-1") is QueueItemStatus.CLAIMED
    finally:
        await counting.aclose()
