"""The archive pipeline on real Valkey/Redis and real SQLite/PostgreSQL.

Finalization queues an execution on the outbox once and holds its keys with the
fallback TTL; the archiver writes exactly what Redis held, then settles (out of the
outbox, retention TTL); a crash between the write and the settle re-archives the same
rows; a history that is down blocks no execution and the archive catches up later.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.core.redis_client import CountingRedisCluster
from airuntime.core.supervision import Backoff, Supervisor
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.pipeline.plan import COMPRESSED_PREFIX
from airuntime.engine.worker_pool import PoolSettings, WorkerPool
from airuntime.history import HistoryStore, open_history_store
from airuntime.history import archiver as archiver_module
from airuntime.history.archiver import Captured, ExecutionArchiver, capture_execution
from airuntime.history.dsn import parse_dsn
from airuntime.history.migrate import upgrade
from tests.dags import fan, plan_of
from tests.history.conftest import settings
from tests.history.hot import assert_archived_equals, run_executions
from tests.postgres import POSTGRES_MISSING, PostgresServer, postgres_bin_dir, running_postgres
from tests.runtime.support import eventually

HOLD_S = 3600
RETENTION_S = 60


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server of this test's own: it is stopped and started again."""
    if postgres_bin_dir() is None:
        pytest.skip(POSTGRES_MISSING)
    with running_postgres() as server:
        yield server


@pytest.fixture
def history(store: HistoryStore) -> HistoryStore:
    """The durable store (SQLite and PostgreSQL: ``store`` is parametrized)."""
    return store


async def _outbox(redis: Redis) -> dict[str, float]:
    return {
        m.decode(): s for m, s in await redis.zrange(keys.archive_outbox(), 0, -1, withscores=True)
    }


async def test_finalization_queues_once_and_holds_the_keys(redis: Redis) -> None:
    store = ExecutionStore(redis)
    eid = await store.create(
        plan_of({"a": [], "b": ["a"]}), retention_s=RETENTION_S, archive_hold_s=HOLD_S
    )
    assert await _outbox(redis) == {}, "nothing is queued before finalization"
    await WorkerPool(store, settings=PoolSettings(workers=2)).run(eid)
    # Finalization is idempotent: more finalizing calls do not queue it again.
    for _ in range(3):
        assert await store.finalize(eid) == "Succeeded"
    outbox = await _outbox(redis)
    assert list(outbox) == [eid]
    assert outbox[eid] == (await store.info(eid)).finished_at_ms
    ttl = await redis.ttl(keys.execution_keys(eid).meta)
    assert RETENTION_S < ttl <= HOLD_S, "the fallback hold, not the retention window"


async def test_archiving_off_keeps_the_retention_ttl_and_queues_nothing(redis: Redis) -> None:
    store = ExecutionStore(redis)
    eid = await store.create(plan_of({"a": []}), retention_s=RETENTION_S)
    await WorkerPool(store, settings=PoolSettings(workers=1)).run(eid)
    assert await _outbox(redis) == {}
    assert 0 < await redis.ttl(keys.execution_keys(eid).meta) <= RETENTION_S


async def test_the_outbox_forgets_entries_older_than_the_hold(redis: Redis) -> None:
    """With no archiver at all the outbox stays bounded: a finalization trims entries
    whose keys' hold has passed (they can no longer be archived)."""
    store = ExecutionStore(redis)
    await redis.zadd(keys.archive_outbox(), {"ex-ancient": 1_000})
    eid = await store.create(plan_of({"a": []}), retention_s=1, archive_hold_s=5)
    await WorkerPool(store, settings=PoolSettings(workers=1)).run(eid)
    assert list(await _outbox(redis)) == [eid]


async def test_archive_equals_what_redis_held_then_settles(
    redis: Redis, history: HistoryStore
) -> None:
    eids = await run_executions(redis, 5, retention_s=RETENTION_S, hold_s=HOLD_S)
    hot = {eid: await capture_execution(redis, eid) for eid in eids}
    archiver = ExecutionArchiver(redis, history)
    assert await archiver.backlog() == 5
    assert await archiver.archive_once() == 5
    assert await archiver.backlog() == 0
    for eid in eids:
        await assert_archived_equals(history, hot[eid])
        assert 0 < await redis.ttl(keys.execution_keys(eid).events) <= RETENTION_S
    assert archiver.stats.archived == 5
    assert await archiver.archive_once() == 0, "settled entries are never archived again"


async def test_a_large_plan_stored_compressed_is_archived_as_its_json(
    redis: Redis, history: HistoryStore
) -> None:
    store = ExecutionStore(redis)
    plan = plan_of(fan(600))  # ~150 KB of plan JSON: stored compressed
    eid = await store.create(plan, retention_s=RETENTION_S, archive_hold_s=HOLD_S)
    assert (await redis.get(store.keys_of(eid).plan) or b"").startswith(COMPRESSED_PREFIX)
    assert await WorkerPool(store, settings=PoolSettings(workers=64)).run(eid) == "Succeeded"
    hot = await capture_execution(redis, eid)
    assert await ExecutionArchiver(redis, history).archive_once() == 1
    await assert_archived_equals(history, hot)
    archived = await history.get_execution(eid, None)
    assert archived is not None and archived.plan == json.loads(plan.to_json())


async def test_a_refused_execution_holds_back_only_itself(
    redis: Redis, history: HistoryStore
) -> None:
    """A batch is one transaction; when the store refuses one execution of it (here:
    its id is archived for another tenant), the others are archived and settled, the
    refused one stays in the outbox, counted as an error, and is never overwritten."""
    eids = await run_executions(redis, 4, retention_s=RETENTION_S, hold_s=HOLD_S)
    poisoned = await capture_execution(redis, eids[2])
    assert poisoned
    squatter = dataclasses.replace(poisoned.record, tenant_id="tenant-squatter")
    await history.upsert_execution(squatter, [])
    archiver = ExecutionArchiver(redis, history, lease_ms=60_000)
    assert await archiver.archive_once() == 4
    assert archiver.stats.archived == 3
    assert archiver.stats.errors == 1
    assert list(await _outbox(redis)) == [eids[2]]
    for eid in (eids[0], eids[1], eids[3]):
        assert await history.get_execution(eid, None) is not None
    kept = await history.get_execution(eids[2], None)
    assert kept is not None and kept.tenant_id == "tenant-squatter"


class _EvidenceDuringWrite(ExecutionArchiver):
    """An assisting instance appends its evidence while the batch is being written."""

    async def _write(self, ready: list[Captured]) -> list[Captured]:
        written = await super()._write(ready)
        for c in ready:
            store = ExecutionStore(self.redis)
            assert await store.record_event(c.record.execution_id, "step_slots", {"w": "1"})
        return written


async def test_evidence_appended_during_the_write_is_archived_by_the_next_lease(
    redis: Redis, history: HistoryStore
) -> None:
    (eid,) = await run_executions(redis, 1, retention_s=RETENTION_S, hold_s=HOLD_S)
    archiver = _EvidenceDuringWrite(redis, history, lease_ms=60_000)
    assert await archiver.archive_once() == 1
    assert archiver.stats.deferred == 1, "not settled: the ledger grew after the capture"
    assert list(await _outbox(redis)) == [eid], "due again now, not after the lease"
    assert await redis.ttl(keys.execution_keys(eid).meta) > RETENTION_S
    plain = ExecutionArchiver(redis, history)
    assert await plain.archive_once() == 1
    assert await _outbox(redis) == {}
    page = await history.events(eid, None, limit=500)
    assert page is not None and page.events[-1].type == "step_slots"
    await assert_archived_equals(history, await capture_execution(redis, eid))


async def test_evidence_recorded_after_the_archive_queues_the_execution_again(
    redis: Redis, history: HistoryStore
) -> None:
    """An assisting instance that stops after the run was archived and settled: its
    evidence queues the execution again, and the archive gets the entry."""
    archived, _other = await run_executions(redis, 2, retention_s=RETENTION_S, hold_s=HOLD_S)
    archiver = ExecutionArchiver(redis, history)
    assert await archiver.archive_once() == 2
    assert await _outbox(redis) == {}
    store = ExecutionStore(redis)
    assert await store.record_event(archived, "step_slots", {"runtime.instance.id": "helper"})
    assert list(await _outbox(redis)) == [archived]
    assert await archiver.archive_once() == 1
    await assert_archived_equals(history, await capture_execution(redis, archived))
    # Not finalized yet, or archiving off: the entry is only appended.
    running = await store.create(plan_of({"a": []}), retention_s=RETENTION_S, archive_hold_s=HOLD_S)
    off = await store.create(plan_of({"a": []}), retention_s=RETENTION_S)
    await WorkerPool(store, settings=PoolSettings(workers=1)).run(off)
    for eid in (running, off):
        assert await store.record_event(eid, "step_slots", {"runtime.instance.id": "helper"})
    assert await _outbox(redis) == {}
    assert not await store.record_event("ex-gone", "step_slots", {"a": "1"})
    assert not await redis.exists(keys.execution_keys("ex-gone").events), "never recreated"


class _CrashAfterWrite(ExecutionArchiver):
    """Dies between the durable write and the settle (a killed process)."""

    async def settle(self, archived: Sequence[tuple[str, int]]) -> int:
        raise asyncio.CancelledError


async def test_a_crash_between_write_and_settle_rearchives_idempotently(
    redis: Redis, history: HistoryStore
) -> None:
    (eid,) = await run_executions(redis, 1, retention_s=RETENTION_S, hold_s=HOLD_S)
    hot = await capture_execution(redis, eid)
    crashing = _CrashAfterWrite(redis, history, lease_ms=200)
    with pytest.raises(asyncio.CancelledError):
        await crashing.archive_once()
    assert await history.get_execution(eid, None) is not None, "written before the crash"
    assert list(await _outbox(redis)) == [eid], "not settled: still in the outbox"
    assert await redis.ttl(keys.execution_keys(eid).meta) > RETENTION_S
    survivor = ExecutionArchiver(redis, history, lease_ms=200)
    assert await survivor.lease() == [], "leased by the dead archiver until its lease ends"
    deadline = asyncio.get_running_loop().time() + 10
    while await survivor.archive_once() == 0:
        assert asyncio.get_running_loop().time() < deadline, "the lease never ran out"
        await asyncio.sleep(0.05)
    await assert_archived_equals(history, hot)
    page = await history.events(eid, None, limit=1000)
    assert page is not None
    assert len(page.events) == len(hot.events), "one row set, not two"  # type: ignore[union-attr]
    assert await _outbox(redis) == {}
    assert 0 < await redis.ttl(keys.execution_keys(eid).meta) <= RETENTION_S


async def _archived(history: HistoryStore, eids: list[str]) -> bool:
    return all([await history.get_execution(e, None) is not None for e in eids])


async def test_history_down_blocks_nothing_and_the_archive_catches_up(
    redis: Redis, tmp_path: Path
) -> None:
    """A SQLite file held by another writer (a real lock, not a fake store): runs still
    complete, the backlog grows, the loop reports unhealthy, then catches up."""
    path = tmp_path / "history.db"
    history = await open_history_store(
        f"sqlite:///{path}", settings=settings(history_timeout_s=0.2)
    )
    archiver = ExecutionArchiver(redis, history, lease_ms=300, idle_s=0.05)
    supervisor = Supervisor("test", backoff=Backoff(0.05, 0.2))
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        supervisor.start("archiver", archiver.run)
        eids = await run_executions(redis, 4, retention_s=RETENTION_S, hold_s=HOLD_S)
        hot = [await capture_execution(redis, e) for e in eids]
        assert await archiver.backlog() == 4, "the outbox holds the work"
        await eventually(lambda: _errors(archiver), "the archiver failed against the lock")
        assert "archiver" in supervisor.unhealthy()
        other.execute("ROLLBACK")
        await eventually(lambda: _drained(archiver), "the archive caught up", timeout=30)
        for captured in hot:
            await assert_archived_equals(history, captured)
        assert supervisor.unhealthy() == []
    finally:
        other.close()
        await supervisor.stop()
        await history.close()


async def _errors(archiver: ExecutionArchiver) -> bool:
    return archiver.stats.errors > 0


async def _drained(archiver: ExecutionArchiver) -> bool:
    return await archiver.backlog() == 0


async def test_stopped_postgresql_blocks_nothing_and_the_archive_catches_up(
    redis: Redis, own_postgres: PostgresServer
) -> None:
    dsn = own_postgres.create_database("history")
    upgrade(parse_dsn(dsn))
    history = await open_history_store(dsn, settings=settings(history_timeout_s=1.0))
    archiver = ExecutionArchiver(redis, history, lease_ms=300, idle_s=0.05)
    supervisor = Supervisor("test", backoff=Backoff(0.05, 0.5))
    try:
        own_postgres.stop()
        supervisor.start("archiver", archiver.run)
        eids = await run_executions(redis, 3, retention_s=RETENTION_S, hold_s=HOLD_S)
        hot = [await capture_execution(redis, e) for e in eids]
        await eventually(lambda: _errors(archiver), "the archiver failed: server stopped")
        assert await archiver.backlog() == 3
        own_postgres.start()
        await eventually(lambda: _drained(archiver), "the archive caught up", timeout=90)
        for captured in hot:
            await assert_archived_equals(history, captured)
    finally:
        await supervisor.stop()
        await history.close()


async def test_evidence_the_runtime_writes_while_the_archiver_looks_is_archived(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime appends its step-slot evidence, then finishes the run; an archiver
    that read the ledger just before and sees the run finished just after still
    archives the evidence (it reads the ledger again once the run is finished)."""
    (eid,) = await run_executions(redis, 1, retention_s=RETENTION_S, hold_s=HOLD_S)
    store = ExecutionStore(redis)
    assert await store.record_event(eid, "run_started", {"run_id": "run-late"})
    await redis.hset(keys.run("run-late"), mapping={"run_id": "run-late", "status": "running"})
    real = archiver_module._read_run_records
    acted = asyncio.Event()

    async def runtime_acts_in_between(r: Redis, run_ids: list[str]) -> list[dict[str, str]]:
        # Between the archiver's ledger read and its run-record read: evidence, finish.
        assert run_ids == ["run-late"]
        assert await store.record_event(eid, "step_slots", {"admitted": "4"})
        await redis.hset(keys.run("run-late"), "status", "completed")
        acted.set()
        return await real(r, run_ids)

    monkeypatch.setattr(archiver_module, "_read_run_records", runtime_acts_in_between)
    captured = await capture_execution(redis, eid)
    assert acted.is_set()
    assert captured, captured
    types = [e.type for e in captured.events]
    assert types[-2:] == ["run_started", "step_slots"], types
    assert [e.seq for e in captured.events] == list(range(len(types)))


async def test_an_entry_written_with_the_creation_is_recorded_like_late_evidence(
    redis: Redis,
) -> None:
    """``create(then_record=...)`` (the runtime's ``run_started``, in the same call as
    the creation) appends the entry after the creation's own; on an execution that
    exists and was archived meanwhile (a resumed run) it appends it again and queues
    the execution for the archiver once more, as recordEvent does."""
    store = ExecutionStore(redis)
    plan = plan_of({"a": [], "b": ["a"]})

    async def create(eid: str | None, run_id: str) -> str:
        return await store.create(
            plan,
            execution_id=eid,
            retention_s=RETENTION_S,
            archive_hold_s=HOLD_S,
            then_record=("run_started", {"run_id": run_id}),
        )

    eid = await create(None, "run-1")
    events = await store.events(eid)
    assert [e.type for e in events] == ["execution_created", "run_started"]
    assert events[1].get("run_id") == "run-1"
    assert await _outbox(redis) == {}, "not finalized: nothing queued"
    await WorkerPool(store, settings=PoolSettings(workers=2)).run(eid)
    assert list(await _outbox(redis)) == [eid]
    await redis.zrem(keys.archive_outbox(), eid)  # archived and settled
    assert await create(eid, "run-1") == eid
    started = [e.get("run_id") for e in await store.events(eid) if e.type == "run_started"]
    assert started == ["run-1", "run-1"]
    assert list(await _outbox(redis)) == [eid], "queued again for the new entry"
    assert (await store.info(eid)).status == "Succeeded", "nothing else changed"


async def test_the_archiver_drains_every_bucket_of_a_cluster(
    cluster_redis: CountingRedisCluster, history: HistoryStore
) -> None:
    """On a cluster each execution is queued on its own bucket's outbox (its slot); the
    archiver leases from all buckets in one pipelined round, archives exactly what Redis
    held, settles each in its bucket, and late evidence re-queues it there."""
    eids = await run_executions(cluster_redis, 12, retention_s=RETENTION_S, hold_s=HOLD_S)
    buckets = {keys.bucket_of(e, keys.CLUSTER_EXECUTION_BUCKETS).outbox for e in eids}
    assert len(buckets) > 1, "the executions landed in several buckets"
    hot = {eid: await capture_execution(cluster_redis, eid) for eid in eids}
    archiver = ExecutionArchiver(cluster_redis, history)
    assert await archiver.backlog() == 12
    # batch / 128 buckets = 2 a bucket per round: a bucket holding 3 needs a second one.
    rounds = [await archiver.archive_once()]
    while rounds[-1] and len(rounds) <= 12:
        rounds.append(await archiver.archive_once())
    assert sum(rounds) == 12 and rounds[-1] == 0
    assert await archiver.backlog() == 0
    for eid in eids:
        await assert_archived_equals(history, hot[eid])
        events = keys.execution_keys(eid, keys.CLUSTER_EXECUTION_BUCKETS).events
        assert 0 < await cluster_redis.ttl(events) <= RETENTION_S
    store = ExecutionStore(cluster_redis)
    assert await store.record_event(eids[0], "step_slots", {"runtime.instance.id": "helper"})
    assert await archiver.backlog() == 1
    assert await archiver.lease() == [eids[0]]
