"""Helpers of the archive tests: run tiny executions on real Redis, capture what Redis
held while hot, and compare it with what the durable history has afterwards."""

from __future__ import annotations

from redis.asyncio import Redis

from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.worker_pool import PoolSettings, WorkerPool
from airuntime.history import HistoryStore
from airuntime.history.archiver import Captured
from tests.dags import plan_of

PLAN = plan_of({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]})


async def run_executions(
    redis: Redis, n: int, *, retention_s: int, hold_s: int, workers: int = 4
) -> list[str]:
    """``n`` finished executions of a four-step diamond (archiving on)."""
    store = ExecutionStore(redis)
    pool = WorkerPool(store, settings=PoolSettings(workers=workers))
    eids = [
        await store.create(PLAN, retention_s=retention_s, archive_hold_s=hold_s) for _ in range(n)
    ]
    for eid in eids:
        assert await pool.run(eid) == "Succeeded"
    return eids


async def assert_archived_equals(history: HistoryStore, hot: Captured | bool | None) -> None:
    """The archived execution and ledger are exactly what Redis held."""
    assert isinstance(hot, Captured), f"nothing captured while hot: {hot!r}"
    eid = hot.record.execution_id
    archived = await history.get_execution(eid, None)
    assert archived is not None, f"{eid} is not archived"
    for name in ("plan", "inputs", "context", "snapshot", "status", "tenant_id", "step_slots"):
        assert getattr(archived, name) == getattr(hot.record, name), f"{eid}: {name}"
    events = []
    after = None
    while True:
        page = await history.events(eid, None, after_seq=after, limit=500)
        assert page is not None
        events += page.events
        if page.next_after_seq is None:
            break
        after = page.next_after_seq
    assert events == hot.events, f"{eid}: ledger differs"
