"""Test aid: archive a finished run exactly as Redis holds it, then drop its hot keys.

The archiver (issue 12's write side) is not this suite's subject; this helper applies
its contract by hand so the read side can be tested against it: ArchivedExecution's
plan/inputs/context/snapshot are the JSON Redis held (plan key, meta inputs, meta
context, terminal snapshot), ArchivedEvent rows are the ledger stream's entries in
order (seq 0..n, entry id, type, the other fields), ArchivedSharedRun.run is the
SharedRun JSON. Then the keys retention would remove are deleted.
"""

from __future__ import annotations

import json
from typing import Any

from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.history import ArchivedEvent, ArchivedExecution, ArchivedSharedRun, HistoryStore


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def capture_execution(
    redis: Redis, execution_id: str, *, shared_run_id: str | None, run_id: str | None
) -> tuple[ArchivedExecution, list[ArchivedEvent]]:
    ek = keys.execution_keys(execution_id)
    meta = {_s(k): _s(v) for k, v in (await redis.hgetall(ek.meta)).items()}
    plan, snap = await redis.get(ek.plan), await redis.get(ek.snapshot)
    assert meta and plan is not None and snap is not None, f"{execution_id} is not finalized"
    snapshot = json.loads(snap)
    events = []
    for seq, (entry_id, fields) in enumerate(await redis.xrange(ek.events)):
        f = {_s(k): _s(v) for k, v in fields.items()}
        events.append(ArchivedEvent(execution_id, seq, _s(entry_id), f.pop("type"), f))
    slots = [e.fields for e in events if e.type == "step_slots"]
    record = ArchivedExecution(
        execution_id=execution_id,
        tenant_id=meta["tenant_id"],
        pipeline_id=meta["pipeline_id"],
        status=snapshot["status"],
        created_ms=int(meta["created_at"]),
        finished_ms=int(meta["finished_at"]),
        plan=json.loads(plan),
        inputs=json.loads(meta.get("inputs") or "{}"),
        context=json.loads(meta.get("context") or "{}"),
        snapshot=snapshot,
        step_slots=dict(slots[-1]) if slots else None,
        run_id=run_id,
        shared_run_id=shared_run_id,
    )
    return record, events


async def archive_and_expire(redis: Redis, store: HistoryStore, shared_run_id: str) -> None:
    """Archive the shared run and its execution, then delete every hot key of both."""
    raw = await redis.get(keys.shared_run(shared_run_id))
    assert raw is not None, f"{shared_run_id} is not in Redis"
    run = json.loads(raw)
    tenant = run["snapshot"]["tenant_id"]
    eid, run_id = run.get("execution_id"), run.get("run_id")
    if eid:
        record, events = await capture_execution(
            redis, eid, shared_run_id=shared_run_id, run_id=run_id
        )
        await store.upsert_execution(record, events)
        await redis.delete(*keys.execution_keys(eid).all())
    await store.upsert_shared_run(
        ArchivedSharedRun(
            shared_run_id=shared_run_id,
            tenant_id=tenant,
            pipeline_id=run["pipeline_id"],
            status=run["status"],
            created_ms=run["created_at_ms"],
            finished_ms=run.get("finished_at_ms"),
            run=run,
        )
    )
    await redis.delete(keys.shared_run(shared_run_id))
    if run_id:
        await redis.delete(keys.run(run_id), keys.shared_run_to_run(shared_run_id))
    for index in (keys.shared_runs(), keys.shared_runs_by_tenant(tenant)):
        await redis.zrem(index, shared_run_id)
    await redis.zrem(keys.shared_runs_finished(), shared_run_id)
