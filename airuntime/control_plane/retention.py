"""Retention: Redis holds what the control plane wrote for a bounded time, not forever.

Why this module exists: every shared run leaves a record, index entries, a queue item
and possibly scale-out records; without pruning Redis grows with every submission.
:class:`Retention` (a supervised loop) removes, once they are older than the window
(``retention_s``, default 7 days):

* terminal shared runs (by the time they finished: ``air:{air}:sruns:finished``) with every
  index entry (``air:{air}:sruns``, ``air:{air}:sruns:tenant:<t>``, open/finished) and their queue
  item (``air:{q:<tenant>}:item:<SRID>``) and its archive-queue entry; with archiving on
  (:class:`~airuntime.control_plane.archive.ArchivingRetentionPolicy`) only once the
  durable history has the run;
* scale-out requests filed before the window that are finished (or whose run is gone),
  with their index entry; requests that failed or were fulfilled and requeued count as
  finished;
* entries of ``air:executions`` whose execution's keys have expired;
* outcome-stream entries older than the window;
* (call site) the runtime's run records, through the runtime's prune function.

What may be deleted is the :class:`RetentionPolicy`'s decision: its
:meth:`~RetentionPolicy.may_delete` hook sees each shared run before it goes, so an
"archive first" step (a durable archive that must have the run before Redis forgets
it) plugs in by overriding it; a run it keeps is looked at again on the next pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from airuntime.control_plane.scale_out import ScaleOutPhase, ScaleOutRequest, ScaleOutStore
from airuntime.control_plane.shared_runs import SharedRun, SharedRunStore
from airuntime.core import keys
from airuntime.core.execution_layout import buckets_for
from airuntime.core.redis_client import RedisClient
from airuntime.core.run_layout import run_buckets_for
from airuntime.core.slots import ensure_transaction_slot
from airuntime.core.supervision import LoopContext

__all__ = ["Retention", "RetentionPolicy", "RetentionReport"]

log = logging.getLogger(__name__)

DEFAULT_RETENTION_S = 7 * 24 * 3600


class RetentionPolicy:
    """How long the control plane keeps what it wrote, and whether a run may go."""

    def __init__(self, retention_s: float = DEFAULT_RETENTION_S) -> None:
        self.retention_s = retention_s

    def cutoff_ms(self, now_ms: int) -> int:
        """Records that ended at or before this time are past the window."""
        return now_ms - int(self.retention_s * 1000)

    async def may_delete(self, run: SharedRun) -> bool:
        """Whether ``run`` (terminal, past the window) may be deleted now. Always, here;
        an archiving policy answers True only once the run is archived."""
        return True


@dataclass
class RetentionReport:
    """What one pass removed."""

    shared_runs: int = 0
    kept: list[str] = field(default_factory=list)
    """Runs past the window that the policy kept."""
    scale_out_requests: int = 0
    executions: int = 0
    outcomes: int = 0


class Retention:
    """Prunes the control plane's records once they are past the retention window."""

    def __init__(
        self,
        redis: RedisClient,
        runs: SharedRunStore,
        scale_outs: ScaleOutStore,
        policy: RetentionPolicy | None = None,
        *,
        interval_s: float = 60.0,
        batch: int = 200,
    ) -> None:
        self.redis = redis
        self.runs = runs
        self.scale_outs = scale_outs
        self.policy = policy or RetentionPolicy()
        self.interval_s = interval_s
        self.batch = batch

    async def run(self, ctx: LoopContext) -> None:
        while True:
            await self.prune_once()
            ctx.ok()
            await asyncio.sleep(self.interval_s)

    async def prune_once(self) -> RetentionReport:
        report = RetentionReport()
        cutoff = self.policy.cutoff_ms(int(time.time() * 1000))
        await self._shared_runs(cutoff, report)
        await self._scale_out_requests(cutoff, report)
        await self._executions(cutoff, report)
        await self._runtime_runs(cutoff)
        for bucket in keys.run_buckets(run_buckets_for(self.redis)):
            report.outcomes += int(
                await self.redis.xtrim(bucket.outcomes, minid=f"{max(cutoff, 0)}-0")
            )
        if report.shared_runs or report.scale_out_requests or report.executions:
            log.info("retention removed %s", report)
        return report

    async def _shared_runs(self, cutoff: int, report: RetentionReport) -> None:
        while True:
            ids = await self.runs.finished_before(cutoff, len(report.kept), self.batch)
            if not ids:
                return
            found = {r.shared_run_id: r for r in await self.runs.get_many(ids)}
            for srid in ids:
                run = found.get(srid)
                if run is not None and not await self.policy.may_delete(run):
                    report.kept.append(srid)
                    continue
                await self._delete_run(srid, run)
                report.shared_runs += 1

    async def _delete_run(self, srid: str, run: SharedRun | None) -> None:
        """The run's queue item (its tenant's slot) first, then its record and index
        entries (the control slot): a crash in between leaves the record listed as
        finished, so the next pass deletes again (both steps are idempotent)."""
        if run is not None:
            tenant = run.snapshot.tenant_id
            pipe = self.redis.pipeline(transaction=True)
            pipe.delete(keys.squeue_item(tenant, srid))
            pipe.zrem(keys.squeue_pending(tenant), srid)
            pipe.zrem(keys.squeue_claimed(tenant), srid)
            ensure_transaction_slot("retention: queue item", pipe)
            await pipe.execute()
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(keys.shared_run(srid))
        pipe.zrem(keys.shared_runs(), srid)
        pipe.zrem(keys.shared_runs_open(), srid)
        pipe.hdel(keys.shared_runs_open_tenants(), srid)
        pipe.zrem(keys.shared_runs_finished(), srid)
        pipe.zrem(keys.shared_run_archive_outbox(), srid)
        if run is not None:
            pipe.zrem(keys.shared_runs_by_tenant(run.snapshot.tenant_id), srid)
        ensure_transaction_slot("retention: shared run", pipe)
        await pipe.execute()

    async def _scale_out_requests(self, cutoff: int, report: RetentionReport) -> None:
        kept = 0
        while True:
            page = await self.scale_outs.requested_before(cutoff, kept, self.batch)
            if not page:
                return
            done = [r.request_id for r in page if await self._finished(r)]
            await self.scale_outs.delete(done)
            report.scale_out_requests += len(done)
            kept += len(page) - len(done)

    async def _finished(self, req: ScaleOutRequest) -> bool:
        if req.phase in (ScaleOutPhase.FULFILLED, ScaleOutPhase.REJECTED) and req.requeued:
            return True
        return not await self.redis.exists(keys.shared_run(req.shared_run_id))

    async def _executions(self, cutoff: int, report: RetentionReport) -> None:
        """Index entries of executions whose keys expired (the engine's retention TTL),
        bucket by bucket (one bucket on a standalone server; see airuntime.core.keys).

        NOTE(engine): replace with the engine's own prune function once it has one."""
        buckets = buckets_for(self.redis)
        for bucket in keys.execution_buckets(buckets):
            await self._bucket_executions(bucket, buckets, cutoff, report)

    async def _bucket_executions(
        self, bucket: keys.ExecutionBucket, buckets: int, cutoff: int, report: RetentionReport
    ) -> None:
        start = 0
        while True:
            raw = await self.redis.zrangebyscore(
                bucket.executions, "-inf", cutoff, start=start, num=self.batch
            )
            ids = [i.decode() if isinstance(i, bytes) else str(i) for i in raw]
            if not ids:
                return
            pipe = self.redis.pipeline(transaction=False)
            for eid in ids:
                pipe.exists(keys.execution_keys(eid, buckets).meta)
            alive = await pipe.execute()
            expired = [eid for eid, a in zip(ids, alive, strict=True) if not a]
            if expired:
                await self.redis.zrem(bucket.executions, *expired)
            report.executions += len(expired)
            start += len(ids) - len(expired)

    async def _runtime_runs(self, cutoff: int) -> None:
        """CALL SITE (runtime): the runtime's run records (``air:{air}:run:*``, the
        SharedRunId -> RunId keys, per-tenant run indexes) are the runtime's to prune;
        call its prune function here once it exists (issue 11, runtime part)."""
        return None
