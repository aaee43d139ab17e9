"""Soak: 5,000 runs through Redis into the durable history, and Redis back to baseline.

Tiny pipelines (a diamond of four ``noop`` steps) are driven in-process on a real
Valkey with archiving on and a one-second retention window; the archiver writes them
to a SQLite history file. What Redis held while hot is captured before retention and
compared, run by run, with the archive afterwards (execution + every ledger entry, in
order). Once the window has passed and the engine's index is pruned, ``DBSIZE`` and
``used_memory`` are back to the baseline measured after a warm-up (never more than
5% above it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.worker_pool import PoolSettings, WorkerPool
from airuntime.history import HistoryStore, open_history_store
from airuntime.history.archiver import Captured, ExecutionArchiver, capture_execution
from tests.history.conftest import settings
from tests.history.hot import PLAN, assert_archived_equals
from tests.runtime.support import eventually

pytestmark = pytest.mark.timeout(300)

RUNS = 5_000
WARMUP = 100
CONCURRENCY = 30
RETENTION_S = 1


@pytest_asyncio.fixture
async def valkey(valkey_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(valkey_url)
    await client.flushall()
    try:
        yield client
    finally:
        await client.flushall()
        await client.aclose()


async def _run_batch(redis: Redis, n: int) -> dict[str, Captured]:
    """``n`` executions run to their end, ``CONCURRENCY`` at a time, captured hot."""
    store = ExecutionStore(redis)
    pool = WorkerPool(store, settings=PoolSettings(workers=4, control_feed=False))
    hot: dict[str, Captured] = {}

    async def one() -> None:
        eid = await store.create(PLAN, retention_s=RETENTION_S, archive_hold_s=3600)
        assert await pool.run(eid) == "Succeeded"
        captured = await capture_execution(redis, eid)
        assert isinstance(captured, Captured)
        hot[eid] = captured

    for start in range(0, n, CONCURRENCY):
        await asyncio.gather(*(one() for _ in range(min(CONCURRENCY, n - start))))
    return hot


async def _archive_all(archiver: ExecutionArchiver) -> None:
    while await archiver.backlog():
        await archiver.archive_once()


async def _settled(redis: Redis) -> tuple[int, int]:
    """Expire what is due (a SCAN touches every key), prune the engine's index, and
    read DBSIZE and used_memory."""
    async for _ in redis.scan_iter(count=1000):
        pass
    await ExecutionStore(redis).prune_index()
    info = await redis.info("memory")
    return int(await redis.dbsize()), int(info["used_memory"])


async def _back_to(redis: Redis, baseline: tuple[int, int]) -> tuple[int, int]:
    last: list[tuple[int, int]] = []

    async def settled() -> bool:
        last[:] = [await _settled(redis)]
        keys_now, memory_now = last[0]
        return keys_now <= baseline[0] and memory_now <= baseline[1] * 1.05

    try:
        await eventually(settled, "Redis back to its baseline", timeout=60)
    except AssertionError:
        raise AssertionError(f"baseline {baseline}, now {last}") from None
    return last[0]


async def _check(history: HistoryStore, hot: dict[str, Captured]) -> None:
    for captured in hot.values():
        await assert_archived_equals(history, captured)


async def test_five_thousand_runs_are_archived_and_redis_returns_to_baseline(
    valkey: Redis, tmp_path: Path
) -> None:
    history = await open_history_store(f"sqlite:///{tmp_path / 'h.db'}", settings=settings())
    archiver = ExecutionArchiver(valkey, history, batch=256)
    try:
        warm = await _run_batch(valkey, WARMUP)
        await _archive_all(archiver)
        await _check(history, warm)
        # Everything of the warm-up expires but the execution layout marker (kept on
        # purpose: it records the bucket count once, for good).
        await _back_to(valkey, (1, 1 << 62))
        assert await valkey.keys("*") == [keys.execution_layout().encode()]
        baseline = await _settled(valkey)

        hot = await _run_batch(valkey, RUNS)
        assert len(hot) == RUNS
        assert await archiver.backlog() == RUNS
        await _archive_all(archiver)
        assert archiver.stats.archived == WARMUP + RUNS
        assert archiver.stats.vanished == 0
        await _check(history, hot)
        keys_after, memory_after = await _back_to(valkey, baseline)
        # Below the baseline is fine (Valkey shrinks its tables lazily after the
        # warm-up); above it by more than 5% would be a leak.
        print(f"soak: baseline {baseline}, after {RUNS} runs {(keys_after, memory_after)}")
    finally:
        await history.close()
