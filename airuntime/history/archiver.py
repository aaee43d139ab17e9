"""The archiver: finalized executions go from Redis to the durable history, once in effect.

Why this exists: Redis holds a finished execution only until its retention TTL; the
history keeps it for good. Finalization (the ``finalize`` Lua include) queues the
execution id on the archive outbox (``air:archive:outbox``) in the same atomic step and
gives the keys a long fallback TTL instead of the retention TTL. This loop:

1. leases due outbox entries (``claimArchive-1.lua``: score -> now + lease), so an
   archiver that dies mid-way loses nothing -- the entry is due again after the lease;
2. captures the execution as Redis holds it (meta, plan, terminal snapshot, the whole
   ledger in one MULTI; the runtime's run record for run id, shared run id and step-slot
   evidence), waiting while the runtime has not yet recorded the run's end (its
   evidence is appended to the ledger right after finalization);
3. ``upsert_execution`` (idempotent: a second archive of the same execution is the
   same row set);
4. THEN settles (``settleArchive-22.lua``: out of the outbox, retention TTL on the
   keys, one step). A crash between 3 and 4 re-archives the same rows; after 4 nothing
   is archived again.

A history that is down never blocks execution: the entries stay in the outbox
(``backlog``), :class:`HistoryUnavailable` propagates to the supervisor, which backs
off and reports the loop in ``/readyz``; the entries are leased again once due.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Literal

from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.core.scripts import ScriptLibrary, library
from airuntime.core.supervision import LoopContext
from airuntime.history.records import ArchivedEvent, ArchivedExecution
from airuntime.history.store import HistoryStore

__all__ = ["ArchiveStats", "Captured", "ExecutionArchiver", "capture_execution"]

log = logging.getLogger(__name__)

UNOWNED_TENANT = "default"
"""Tenant of an execution created without a context (``airt run``)."""

_TERMINAL_RUN = {"completed", "failed", "cancelled"}


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _opt_int(value: str | None) -> int | None:
    return int(value) if value else None


@dataclass
class ArchiveStats:
    """What this archiver did since it started (for metrics)."""

    archived: int = 0
    rows: int = 0
    errors: int = 0
    deferred: int = 0
    vanished: int = 0
    """Outbox entries whose execution's keys expired before anyone archived them."""


@dataclass(frozen=True, slots=True)
class Captured:
    """One execution as Redis held it, ready to archive."""

    record: ArchivedExecution
    events: list[ArchivedEvent]


def _events(eid: str, raw: list[Any]) -> list[ArchivedEvent]:
    out: list[ArchivedEvent] = []
    for seq, (entry_id, fields) in enumerate(raw):
        f = {_s(k): _s(v) for k, v in fields.items()}
        out.append(ArchivedEvent(eid, seq, _s(entry_id), f.get("type", ""), f))
    return out


async def _run_record(redis: Redis, events: list[ArchivedEvent]) -> dict[str, str] | None:
    """The runtime's run record (``air:run:<RunId>``) of the execution, if it has one:
    the ``run_started`` ledger entry names the RunId. ``{}``: the record is gone."""
    run_id = next((e.fields.get("run_id") for e in events if e.type == "run_started"), None)
    if not run_id:
        return None
    names = ["run_id", "status", "shared_run_id", "step_slots"]
    values = await redis.hmget(keys.run(run_id), names)
    if values[0] is None:
        return {"run_id": run_id}
    return {n: _s(v) for n, v in zip(names, values, strict=True) if v is not None}


async def capture_execution(redis: Redis, execution_id: str) -> Captured | Literal[False] | None:
    """The execution as Redis holds it; None when its keys are gone; False when it is
    not ready to archive (not finalized, or its runtime has not finished the run)."""
    ek = keys.execution_keys(execution_id)
    pipe = redis.pipeline(transaction=True)
    pipe.hgetall(ek.meta)
    pipe.get(ek.plan)
    pipe.get(ek.snapshot)
    pipe.xrange(ek.events)
    raw_meta, plan, snapshot, raw_events = await pipe.execute()
    if not raw_meta:
        return None
    m = {_s(k): _s(v) for k, v in raw_meta.items()}
    if not m.get("terminal") or snapshot is None or plan is None:
        return False
    events = _events(execution_id, raw_events)
    run = await _run_record(redis, events)
    if run is not None and run.get("status") and run["status"] not in _TERMINAL_RUN:
        return False
    if run:
        # The runtime appends its step-slot evidence to the ledger before it finishes
        # the run: read the ledger again now that the run is seen finished, or an entry
        # written between the first read and the finish would be lost to the archive.
        events = _events(execution_id, list(await redis.xrange(ek.events) or []))
    run = run or {}
    record = ArchivedExecution(
        execution_id=execution_id,
        tenant_id=m.get("tenant_id") or UNOWNED_TENANT,
        pipeline_id=m.get("pipeline_id", ""),
        status=m["terminal"],
        created_ms=int(m.get("created_at") or 0),
        finished_ms=_opt_int(m.get("finished_at")),
        plan=json.loads(plan),
        inputs=json.loads(m.get("inputs") or "{}"),
        context=json.loads(m["context"]) if m.get("context") else {},
        snapshot=json.loads(snapshot),
        step_slots=json.loads(run["step_slots"]) if run.get("step_slots") else None,
        run_id=run.get("run_id"),
        shared_run_id=run.get("shared_run_id"),
    )
    return Captured(record, events)


class ExecutionArchiver:
    """Drains the archive outbox into a :class:`HistoryStore` (a supervised loop)."""

    def __init__(
        self,
        redis: Redis,
        store: HistoryStore,
        *,
        batch: int = 64,
        lease_ms: int = 30_000,
        defer_ms: int = 500,
        idle_s: float = 0.5,
        scripts: ScriptLibrary | None = None,
    ) -> None:
        self.redis = redis
        self.store = store
        self.batch = batch
        self.lease_ms = lease_ms
        self.defer_ms = defer_ms
        self.idle_s = idle_s
        self.scripts = scripts or library()
        self.stats = ArchiveStats()

    async def run(self, ctx: LoopContext) -> None:
        while True:
            try:
                done = await self.archive_once()
            except Exception:
                self.stats.errors += 1
                raise
            ctx.ok()
            if done == 0:
                await asyncio.sleep(self.idle_s)

    async def backlog(self) -> int:
        """Finalized executions not archived yet (the outbox's length)."""
        return int(await self.redis.zcard(keys.archive_outbox()))

    async def lease(self) -> list[str]:
        raw = await self.scripts.call(
            self.redis, "claimArchive", [keys.archive_outbox()], [self.batch, self.lease_ms]
        )
        return [_s(x) for x in raw]

    async def archive_once(self) -> int:
        """Lease one batch and archive it; how many entries were settled or deferred."""
        ids = await self.lease()
        for eid in ids:
            await self.archive(eid)
        return len(ids)

    async def archive(self, execution_id: str) -> bool:
        """Archive one leased execution; True when it is archived and settled."""
        captured = await capture_execution(self.redis, execution_id)
        if captured is False:
            self.stats.deferred += 1
            due = await self._redis_ms() + self.defer_ms
            await self.redis.zadd(keys.archive_outbox(), {execution_id: due}, xx=True)
            return False
        if captured is None:
            self.stats.vanished += 1
            log.warning("execution %s expired before it was archived", execution_id)
            await self.redis.zrem(keys.archive_outbox(), execution_id)
            return False
        await self.store.upsert_execution(captured.record, captured.events)
        await self.settle(execution_id)
        self.stats.archived += 1
        self.stats.rows += 1 + len(captured.events)
        return True

    async def settle(self, execution_id: str) -> None:
        """Out of the outbox, retention TTL on the keys (after the durable write)."""
        script_keys = [*keys.execution_keys(execution_id).all(), keys.archive_outbox()]
        await self.scripts.call(self.redis, "settleArchive", script_keys, [execution_id])

    async def _redis_ms(self) -> int:
        sec, usec = await self.redis.time()
        return int(sec) * 1000 + int(usec) // 1000
