"""The archiver: finalized executions go from Redis to the durable history, once in effect.

Why this exists: Redis holds a finished execution only until its retention TTL; the
history keeps it for good. Finalization (the ``finalize`` Lua include) queues the
execution id on its bucket's archive outbox (``air:archive:outbox`` on a standalone
server; one per bucket on a cluster, see airuntime.core.keys) in the same atomic step and
gives the keys a long fallback TTL instead of the retention TTL. This loop:

1. leases due outbox entries (``claimArchive-1.lua``: score -> now + lease), so an
   archiver that dies mid-way loses nothing -- the entry is due again after the lease;
2. captures the executions as Redis holds them (meta, plan, terminal snapshot, the
   whole ledger; the runtime's run record for run id, shared run id and step-slot
   evidence), waiting while the runtime has not yet recorded the run's end (its
   evidence is appended to the ledger right after finalization);
3. ``upsert_executions`` for the batch in one transaction (idempotent: a second
   archive of the same execution is the same row set);
4. THEN settles (``settleArchives-1.lua``: out of the outbox, retention TTL on the
   keys, one step per bucket). A crash between 3 and 4 re-archives the same rows;
   after 4 nothing is archived again.

Steps 2 and 4 cost one reply per bucket, not per execution (``captureArchive-1.lua``
reads a bucket's batch in one call): the client's work per reply was most of the
archiver's CPU per run.

A history that is down never blocks execution: the entries stay in the outbox
(``backlog``), :class:`HistoryUnavailable` propagates to the supervisor, which backs
off and reports the loop in ``/readyz``; the entries are leased again once due.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from airuntime.core import keys
from airuntime.core.execution_layout import buckets_for
from airuntime.core.redis_client import RedisClient, server_ms
from airuntime.core.reply_text import reply_text as _s
from airuntime.core.run_layout import run_buckets_for
from airuntime.core.scripts import ScriptLibrary, library
from airuntime.core.supervision import LoopContext
from airuntime.engine.pipeline import plan_json_of
from airuntime.history.errors import HistoryError, HistoryUnavailable
from airuntime.history.records import (
    ArchivedEvent,
    ArchivedExecution,
    EncodedEvent,
    EncodedExecution,
)
from airuntime.history.store import HistoryStore

__all__ = [
    "ArchiveStats",
    "Captured",
    "ExecutionArchiver",
    "capture_execution",
    "capture_executions",
]

log = logging.getLogger(__name__)

UNOWNED_TENANT = "default"
"""Tenant of an execution created without a context (``airt run``)."""

_TERMINAL_RUN = {"completed", "failed", "cancelled"}


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
    """One execution as Redis held it, ready to archive: as the store writes it
    (:class:`EncodedExecution`, :class:`EncodedEvent` rows), and decoded
    (:attr:`record`, :attr:`events`) for whoever wants the values."""

    encoded: EncodedExecution
    ledger: list[EncodedEvent]

    @property
    def record(self) -> ArchivedExecution:
        return self.encoded.decoded()

    @property
    def events(self) -> list[ArchivedEvent]:
        return [entry.decoded() for entry in self.ledger]


_META_FIELDS = (
    "execution_id",
    "tenant_id",
    "pipeline_id",
    "terminal",
    "created_at",
    "finished_at",
    "inputs",
    "context",
)
"""What the archive keeps of an execution's meta hash (``execution_id`` tells whether
the keys are still there)."""


def _meta(values: list[Any]) -> dict[str, str] | None:
    """The meta fields ``captureArchive`` read (HMGET of :data:`_META_FIELDS`); None when
    the execution's keys are gone."""
    if values[0] is None:
        return None
    return {n: _s(v) for n, v in zip(_META_FIELDS, values, strict=True) if v is not None}


def _ledger(eid: str, raw: list[Any]) -> list[EncodedEvent]:
    """The ledger as ``captureArchive`` returns it: ``[entry id, type, fields JSON]``."""
    return [
        EncodedEvent(eid, seq, _s(entry_id), _s(kind), _s(fields_json))
        for seq, (entry_id, kind, fields_json) in enumerate(raw)
    ]


def _run_id(ledger: list[EncodedEvent]) -> str | None:
    """The RunId the ``run_started`` ledger entry names (the runtime's run record)."""
    started = next((e for e in ledger if e.type == "run_started"), None)
    if started is None:
        return None
    run_id = json.loads(started.fields_json).get("run_id")
    return run_id if isinstance(run_id, str) else None


_RUN_FIELDS = ["run_id", "status", "shared_run_id", "step_slots"]


def _run_record(run_id: str, values: list[Any]) -> dict[str, str]:
    """The run record's fields; only ``run_id`` when the record is gone."""
    if values[0] is None:
        return {"run_id": run_id}
    return {n: _s(v) for n, v in zip(_RUN_FIELDS, values, strict=True) if v is not None}


async def _read_run_records(redis: RedisClient, run_ids: list[str]) -> list[dict[str, str]]:
    """The runtime's run records (``<run bucket>:run:<RunId>``), one round trip."""
    buckets = run_buckets_for(redis)
    pipe = redis.pipeline(transaction=False)
    for rid in run_ids:
        pipe.hmget(keys.run(rid, buckets), _RUN_FIELDS)
    return [_run_record(rid, v) for rid, v in zip(run_ids, await pipe.execute(), strict=True)]


@dataclass
class _Hot:
    """What the first read of one execution found."""

    meta: dict[str, str]
    plan: bytes
    snapshot: bytes
    ledger: list[EncodedEvent]
    run: dict[str, str] | None = None


def _encoded(execution_id: str, hot: _Hot) -> EncodedExecution:
    m, run = hot.meta, hot.run or {}
    return EncodedExecution(
        execution_id=execution_id,
        tenant_id=m.get("tenant_id") or UNOWNED_TENANT,
        pipeline_id=m.get("pipeline_id", ""),
        status=m["terminal"],
        created_ms=int(m.get("created_at") or 0),
        finished_ms=_opt_int(m.get("finished_at")),
        plan_json=plan_json_of(hot.plan),
        inputs_json=m.get("inputs") or "{}",
        context_json=m.get("context") or "{}",
        snapshot_json=_s(hot.snapshot),
        step_slots_json=run.get("step_slots") or None,
        run_id=run.get("run_id"),
        shared_run_id=run.get("shared_run_id"),
    )


async def _capture_calls(
    redis: RedisClient, execution_ids: Sequence[str], what: Literal["all", "events"]
) -> dict[str, Any]:
    """``captureArchive`` of ``execution_ids``, one call per bucket, pipelined: each
    execution's reply item."""
    buckets = buckets_for(redis)
    by_bucket: dict[str, list[keys.ExecutionKeys]] = {}
    for eid in execution_ids:
        ek = keys.execution_keys(eid, buckets)
        by_bucket.setdefault(ek.bucket.outbox, []).append(ek)
    groups = list(by_bucket.items())
    fields: list[str | int] = [len(_META_FIELDS), *_META_FIELDS]
    calls: list[tuple[list[str], list[str | int]]] = [
        ([outbox], [what, *fields, *(ek.tag for ek in eks)]) for outbox, eks in groups
    ]
    replies = await library().call_many(redis, "captureArchive", calls)
    out: dict[str, Any] = {}
    for (_, eks), reply in zip(groups, replies, strict=True):
        if isinstance(reply, Exception):
            raise reply  # the batch stays leased; due again after the lease
        for ek, item in zip(eks, reply, strict=True):
            out[ek.execution_id] = item
    return out


async def capture_executions(
    redis: RedisClient, execution_ids: Sequence[str]
) -> dict[str, Captured | Literal[False] | None]:
    """Each execution as Redis holds it (:func:`capture_execution`), in three round
    trips for the whole batch: the executions' keys (``captureArchive``, one reply per
    bucket); the run records of those that have one; their ledgers again for those
    whose run is seen finished."""
    out: dict[str, Captured | Literal[False] | None] = {}
    raw = await _capture_calls(redis, execution_ids, "all")
    hot: dict[str, _Hot] = {}
    for eid in execution_ids:
        raw_meta, plan, snapshot, raw_events = raw[eid]
        m = _meta(raw_meta)
        if m is None:
            out[eid] = None
            continue
        # `terminal` and the snapshot are written by the same finalize script, so a
        # meta that says terminal has its snapshot; the plan is written at creation.
        if not m.get("terminal") or snapshot is None or plan is None:
            out[eid] = False
            continue
        hot[eid] = _Hot(m, plan, snapshot, _ledger(eid, raw_events))
    with_runs = {eid: rid for eid, h in hot.items() if (rid := _run_id(h.ledger))}
    if with_runs:
        records = await _read_run_records(redis, list(with_runs.values()))
        for eid, record in zip(with_runs, records, strict=True):
            hot[eid].run = record
    # The runtime appends its step-slot evidence to the ledger before it finishes the
    # run: a run not finished yet is not ready; for one seen finished, read the ledger
    # again, or an entry written between the first read and the finish would be lost.
    reread: list[str] = []
    for eid, h in hot.items():
        status = (h.run or {}).get("status")
        if status and status not in _TERMINAL_RUN:
            out[eid] = False
        elif h.run:
            reread.append(eid)
    if reread:
        ledgers = await _capture_calls(redis, reread, "events")
        for eid in reread:
            hot[eid].ledger = _ledger(eid, list(ledgers[eid] or []))
    for eid, h in hot.items():
        out.setdefault(eid, Captured(_encoded(eid, h), h.ledger))
    return {eid: out[eid] for eid in execution_ids}


async def capture_execution(
    redis: RedisClient, execution_id: str
) -> Captured | Literal[False] | None:
    """The execution as Redis holds it; None when its keys are gone; False when it is
    not ready to archive (not finalized, or its runtime has not finished the run)."""
    return (await capture_executions(redis, [execution_id]))[execution_id]


class ExecutionArchiver:
    """Drains the archive outbox into a :class:`HistoryStore` (a supervised loop)."""

    def __init__(
        self,
        redis: RedisClient,
        store: HistoryStore,
        *,
        batch: int = 256,
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
        self.buckets = buckets_for(redis)
        self._per_bucket = max(1, -(-batch // self.buckets))
        self._saturated = False

    async def run(self, ctx: LoopContext) -> None:
        while True:
            try:
                await self.archive_once()
            except Exception:
                self.stats.errors += 1
                raise
            ctx.ok()
            if not self._saturated:  # caught up: let the next batch gather
                await asyncio.sleep(self.idle_s)

    async def backlog(self) -> int:
        """Finalized executions not archived yet (the outboxes' length)."""
        pipe = self.redis.pipeline(transaction=False)
        for bucket in keys.execution_buckets(self.buckets):
            pipe.zcard(bucket.outbox)
        return sum(int(n) for n in await pipe.execute())

    async def lease(self) -> list[str]:
        """Lease up to ``batch`` due entries: one ``claimArchive`` per bucket (one on a
        standalone server), ``batch / buckets`` each, pipelined. ``_saturated`` tells
        whether some bucket had more (then the next batch follows at once)."""
        calls: list[tuple[list[str], list[str | int]]] = [
            ([bucket.outbox], [self._per_bucket, self.lease_ms])
            for bucket in keys.execution_buckets(self.buckets)
        ]
        replies = await self.scripts.call_many(self.redis, "claimArchive", calls)
        leased: list[str] = []
        self._saturated = False
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply  # what the other buckets leased is due again after the lease
            leased += [_s(x) for x in reply]
            self._saturated = self._saturated or len(reply) >= self._per_bucket
        return leased

    def _by_outbox(self, ids: Sequence[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for eid in ids:
            out.setdefault(keys.bucket_of(eid, self.buckets).outbox, []).append(eid)
        return out

    async def archive_once(self) -> int:
        """Lease one batch and archive it; how many entries were settled or deferred.

        The whole batch costs a constant number of round trips and one durable
        transaction: capture (:func:`capture_executions`), one upsert of every ready
        execution, then one pipelined settle. A crash anywhere before the settle leaves
        the batch leased, to be archived again (idempotently) once the lease is due."""
        ids = await self.lease()
        if not ids:
            return 0
        captured = await capture_executions(self.redis, ids)
        ready = [c for c in captured.values() if c]
        deferred = [eid for eid, c in captured.items() if c is False]
        vanished = [eid for eid, c in captured.items() if c is None]
        if deferred:
            self.stats.deferred += len(deferred)
            due = await self._redis_ms() + self.defer_ms
            for outbox, ids_ in self._by_outbox(deferred).items():
                await self.redis.zadd(outbox, dict.fromkeys(ids_, due), xx=True)
        if vanished:
            self.stats.vanished += len(vanished)
            log.warning("executions %s expired before they were archived", ", ".join(vanished))
            for outbox, ids_ in self._by_outbox(vanished).items():
                await self.redis.zrem(outbox, *ids_)
        if ready:
            ready = await self._write(ready)
            regrown = await self.settle([(c.encoded.execution_id, len(c.ledger)) for c in ready])
            self.stats.deferred += regrown
            self.stats.archived += len(ready)
            self.stats.rows += sum(1 + len(c.ledger) for c in ready)
        return len(ids)

    async def _write(self, ready: list[Captured]) -> list[Captured]:
        """Upsert the batch in one transaction; when the store refuses it (not a
        connection problem: e.g. an execution archived for another tenant), write one
        by one so a poisoned entry holds back only itself. It stays leased, reported in
        the log and the error count, and is tried again when its lease is due."""
        try:
            await self.store.upsert_executions([(c.encoded, c.ledger) for c in ready])
            return ready
        except HistoryUnavailable:
            raise
        except HistoryError:
            pass
        written: list[Captured] = []
        for c in ready:
            try:
                await self.store.upsert_execution(c.encoded, c.ledger)
                written.append(c)
            except HistoryUnavailable:
                raise
            except HistoryError as error:
                self.stats.errors += 1
                log.error("execution %s not archived: %s", c.encoded.execution_id, error)
        return written

    async def settle(self, archived: Sequence[tuple[str, int]]) -> int:
        """Out of the outbox, retention TTL on the keys (after the durable write): one
        ``settleArchives`` per bucket for its ``(execution id, ledger entries archived)``
        pairs, pipelined. Returns how many were not settled because their ledger grew
        meanwhile (due again now, to be archived with the new entries)."""
        by_outbox: dict[str, list[str | int]] = {}
        for eid, entries in archived:
            ek = keys.execution_keys(eid, self.buckets)
            by_outbox.setdefault(ek.bucket.outbox, []).extend((eid, ek.tag, entries))
        suffixes: list[str | int] = [
            len(keys.EXECUTION_RECORD_SUFFIXES),
            *keys.EXECUTION_RECORD_SUFFIXES,
        ]
        calls: list[tuple[list[str], list[str | int]]] = [
            ([outbox], [*suffixes, *args]) for outbox, args in by_outbox.items()
        ]
        results = await self.scripts.call_many(self.redis, "settleArchives", calls)
        for reply in results:
            if isinstance(reply, Exception):
                raise reply  # the rest settled; the failed ones are leased again when due
        return sum(1 for reply in results for r in reply if int(r[0]) == 2)

    async def _redis_ms(self) -> int:
        return await server_ms(self.redis)
