"""The runtime run index sharded by RunId, on a real Valkey Cluster (3 masters + 3
replicas), and the repair of a crash between acceptance's two steps.

On a cluster a run belongs to one of 16 buckets (``crc32(RunId) % 16``, the RunId drawn
in its SharedRunId's bucket): its record, mapping, state / tenant / retention index
entries and outcome share the bucket's slot, while each instance's local queue has a
slot of its own. These tests show that acceptance stays idempotent under many
concurrent deliveries, that the runs spread over every master, that adoption, the
outcome reader's streams and the retention sweep see every bucket, and that a run
accepted by a caller that died before pushing it to its queue is repaired by its
owner's sweep (on a standalone server and on the cluster).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from airuntime.control_plane.outcomes import OUTCOME_GROUP, OutcomeReader
from airuntime.control_plane.shared_runs import SharedRunStore
from airuntime.core import keys
from airuntime.core.execution_layout import LayoutMismatch
from airuntime.core.redis_client import CountingRedisCluster, RedisClient
from airuntime.core.supervision import Supervisor
from airuntime.devstack.cluster import LocalCluster
from airuntime.fleet.run_index import RunIndex
from airuntime.fleet.runs import RunStatus
from tests.runtime.conftest import Runtime, runtime_with_tenants
from tests.runtime.support import eventually, pipeline, request

pytestmark = pytest.mark.timeout(180)

CONTENDERS = 60


@pytest_asyncio.fixture
async def cluster_runtime(cluster_redis: CountingRedisCluster) -> AsyncIterator[Runtime]:
    async with runtime_with_tenants(cluster_redis) as rt:
        yield rt


async def test_concurrent_deliveries_of_one_shared_run_create_one_run_on_the_cluster(
    cluster_runtime: Runtime, valkey_cluster: LocalCluster
) -> None:
    rt = cluster_runtime
    assert rt.index.buckets == keys.CLUSTER_RUN_BUCKETS
    instances = [rt.instance(f"crace-{n}", assist=False) for n in range(3)]
    req = request(pipeline(1))
    barrier = asyncio.Barrier(CONTENDERS)

    async def deliver(i: int) -> str:
        await barrier.wait()
        return await instances[i % 3].accept(req)

    run_ids = await asyncio.gather(*(deliver(i) for i in range(CONTENDERS)))
    assert len(set(run_ids)) == 1, set(run_ids)
    [run_id] = set(run_ids)
    queued = [await rt.index.queue_head(i.instance_id, 100) for i in instances]
    assert [r for q in queued for r in q] == [run_id], f"queued exactly once: {queued}"
    record_key = keys.run(run_id, rt.index.buckets)
    mapping_key = keys.shared_run_to_run(req.shared_run_id, rt.index.buckets)
    assert valkey_cluster.master_of(record_key) == valkey_cluster.master_of(mapping_key)
    assert await rt.index.in_state(RunStatus.QUEUED) == [run_id]

    for inst in instances:
        await inst.start()
    rt.gate.open()
    assert await rt.watcher.reached(run_id, "completed", "failed") == "completed"
    assert rt.watcher.states[run_id] == ["queued", "running", "completed"]
    bucket = keys.run_bucket_of(run_id, rt.index.buckets)
    outcomes = [await rt.redis.xlen(stream) for stream in rt.index.outcome_streams()]
    assert sum(outcomes) == 1 and await rt.redis.xlen(bucket.outcomes) == 1, outcomes


async def test_runs_spread_over_every_master_and_readers_see_every_bucket(
    cluster_runtime: Runtime, valkey_cluster: LocalCluster
) -> None:
    rt = cluster_runtime
    inst = rt.instance("spread-1", assist=False)
    accepted = [await inst.accept(request(pipeline(1))) for _ in range(48)]
    masters = {valkey_cluster.master_of(rt.index.run_key(r)) for r in accepted}
    assert len(masters) == 3, f"run records on {masters}"
    buckets = {keys.run_bucket_of(r, rt.index.buckets).index for r in accepted}
    assert len(buckets) > 8, buckets
    assert await rt.index.queue_head("spread-1", 100) == accepted, "FIFO across buckets"
    assert sorted(await rt.index.in_state(RunStatus.QUEUED)) == sorted(accepted)
    listed = [r.run_id for r in await rt.index.list_for_tenant("tenant-a", limit=100)]
    assert sorted(listed) == sorted(accepted)
    created = [r.created_at_ms for r in await rt.index.list_for_tenant("tenant-a", limit=100)]
    assert created == sorted(created, reverse=True), "newest first across buckets"
    assert len(await rt.index.list_for_tenant("tenant-a", limit=5)) == 5


async def test_a_live_instance_adopts_the_queued_runs_of_a_dead_one_on_the_cluster(
    cluster_runtime: Runtime,
) -> None:
    rt = cluster_runtime
    dead = rt.instance("gone-1", assist=False)  # never registered: dead to adoption
    orphans = [await dead.accept(request(pipeline(1))) for _ in range(12)]
    rt.gate.open()
    await rt.start("heir-1", assist=False)
    for run_id in orphans:
        assert await rt.watcher.reached(run_id, "completed", "failed") == "completed"
    for run_id in orphans:
        loaded = await rt.index.get_unchecked(run_id)
        assert loaded is not None and loaded[0].instance_id == "heir-1"
        assert await rt.redis.hget(rt.index.run_key(run_id), "adopted_from") == b"gone-1"
    assert await rt.index.queue_length("gone-1") == 0


async def test_prune_removes_expired_runs_of_every_bucket_on_the_cluster(
    cluster_redis: CountingRedisCluster,
) -> None:
    index = RunIndex(cluster_redis, retention_s=1)
    records = []
    for _ in range(24):
        run_id, _ = await index.accept("pruner", request(pipeline(1)))
        loaded = await index.get_unchecked(run_id)
        assert loaded is not None
        assert await index.finish(loaded[0], RunStatus.COMPLETED)
        records.append(loaded[0])
    assert len({keys.run_bucket_of(r.run_id, index.buckets).index for r in records}) > 6
    assert await index.queue_length("pruner") == 0, "finished queued runs left the queue"
    pruned: list[int] = []

    async def swept() -> bool:
        pruned.append(await index.prune())
        return sum(pruned) == len(records)

    await eventually(swept, "every run pruned (retention 1 s, Redis time)", timeout=30)
    assert await index.list_for_tenant("tenant-a") == []
    for record in records:
        assert await index.run_for_shared(record.shared_run_id) is None


@pytest.mark.parametrize("mode", ["passes", "loop"])
async def test_the_outcome_reader_reads_and_acknowledges_every_buckets_stream(
    cluster_redis: CountingRedisCluster, mode: str
) -> None:
    """``passes``: :meth:`OutcomeReader.read_new` as a test calls it; ``loop``: the
    supervised loop, one blocking reader per bucket stream, with outcomes written while
    it blocks (each must be seen, whichever stream it lands in)."""
    index = RunIndex(cluster_redis)
    reader = OutcomeReader(cluster_redis, SharedRunStore(cluster_redis), "cp-1", block_ms=500)
    assert len(reader.streams) == keys.CLUSTER_RUN_BUCKETS
    await reader.ensure_group()
    supervisor = Supervisor("outcomes-test")
    if mode == "loop":
        supervisor.start("outcomes", reader.run)
        await supervisor.wait_ok("outcomes")
    finished = []
    try:
        for _ in range(40):
            run_id, _ = await index.accept("outcomes-1", request(pipeline(1)))
            loaded = await index.get_unchecked(run_id)
            assert loaded is not None and await index.finish(loaded[0], RunStatus.COMPLETED)
            finished.append(run_id)
        used = {keys.run_bucket_of(r, index.buckets).outcomes for r in finished}
        assert len(used) > 8, used

        async def all_read() -> bool:
            if mode == "passes":
                await reader.read_new()
            return reader.handled >= len(finished)

        await eventually(all_read, "every outcome read", timeout=30)
    finally:
        await supervisor.stop()
    assert reader.handled == len(finished), "each outcome read once"
    for stream in used:
        pending = await cluster_redis.xpending(stream, OUTCOME_GROUP)
        assert pending["pending"] == 0, (stream, pending)


@pytest_asyncio.fixture
async def any_runtime(engine_redis: RedisClient) -> AsyncIterator[Runtime]:
    """Valkey, Redis 7 and the cluster (``engine_redis``'s parameters)."""
    async with runtime_with_tenants(engine_redis) as rt:
        yield rt


async def test_a_run_accepted_by_a_caller_that_died_before_the_queue_push_is_repaired(
    any_runtime: Runtime,
) -> None:
    """The crash: only acceptRun ran (record, mapping, indexes), the queue push did not."""
    rt = any_runtime
    inst = rt.instance("repair-1", assist=False)
    first = await inst.accept(request(pipeline(1)))
    lost = await rt.index.create_unqueued("repair-1", request(pipeline(1)))
    assert lost is not None
    assert await rt.index.queue_head("repair-1", 10) == [first], "the crash left it out"
    assert sorted(await rt.index.in_state(RunStatus.QUEUED)) == sorted([first, lost])
    rt.gate.open()
    await inst.start()
    for run_id in (first, lost):
        assert await rt.watcher.reached(run_id, "completed", "failed") == "completed"
        # (the crashed caller never announced ``lost`` as queued: no "queued" state)
        assert rt.watcher.states[run_id][-2:] == ["running", "completed"]
        assert rt.watcher.states[run_id].count("running") == 1, "started once"
    assert len(rt.gate.entered) == 2, "each run's one step ran once"
    assert await rt.index.queue_length("repair-1") == 0


async def test_a_layout_written_by_a_cluster_is_refused_on_a_standalone_server(
    redis: Redis,
) -> None:
    await redis.set(keys.run_layout(), str(keys.CLUSTER_RUN_BUCKETS))
    index = RunIndex(redis)
    with pytest.raises(
        LayoutMismatch, match=r"air:run-layout says the runs here were written with 16 bucket"
    ):
        await index.accept("layout-1", request(pipeline(1)))
    assert await redis.keys(keys.run("*")) == [], "nothing written"


async def test_the_repair_leaves_a_run_being_accepted_alone_and_pushes_a_lost_one_once(
    engine_redis: RedisClient,
) -> None:
    """A run queued in its bucket but not (yet) in its queue: young, it is probably
    being accepted right now and is left alone; old enough, it is pushed, once."""
    index = RunIndex(engine_redis)
    lost = await index.create_unqueued("repair-2", request(pipeline(1)))
    assert lost is not None
    own = await index.in_state(RunStatus.QUEUED)
    assert own == [lost]
    assert await index.repair_queue("repair-2", own, min_age_ms=60_000) == []
    assert await index.queue_length("repair-2") == 0, "an accept in flight is not doubled"
    assert await index.repair_queue("someone-else", own, min_age_ms=0) == [], "not its run"
    assert await index.repair_queue("repair-2", own, min_age_ms=0) == [lost]
    assert await index.repair_queue("repair-2", own, min_age_ms=0) == [], "pushed once"
    assert await index.queue_head("repair-2", 10) == [lost]
