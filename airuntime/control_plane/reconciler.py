"""The reconciler: open shared runs checked against what really happened to them.

Why this module exists: the outcome stream (:mod:`~airuntime.control_plane.outcomes`)
ends shared runs as their runtime runs end, but an outcome can be missed -- written by
a runtime of an older release, lost with a Redis that restarted without persistence,
or never written because the runtime died at the wrong moment -- and a pump can die
between the runtime's acceptance and its record of it. Periodically (a supervised
loop) the reconciler walks the open shared runs (``air:{air}:sruns:open``) and:

* ends a run whose runtime run (the run index, by RunId or by SharedRunId) is
  terminal, exactly as its outcome would have (:func:`end_shared_run`);
* records the dispatch of a QueuedGlobally run a runtime accepted (the pump died
  before writing Dispatched);
* fails a Dispatched run whose run record no longer exists (nothing will ever end it);
* puts back into the shared queue a QueuedGlobally run that has no queue item waiting
  (its submit or requeue was interrupted), once it has been quiet for
  ``stale_after_ms``, and announces the tenant of one whose item waits (an enqueue
  that died before its announce: :mod:`~airuntime.control_plane.queue_tenants`);
* drops index entries of runs whose record is gone.

A pass looks only at runs created at least ``stale_after_ms`` ago (the open index is
scored by creation time), and a QueuedGlobally run without a RunId only once it has
also been quiet that long (its runtime side included). Everything the pass repairs is
a miss that, by then, the event path has had ``stale_after_ms`` to make good; so a
backlog of freshly queued runs -- a control plane starting behind 10,000 of them --
costs the pass not one read per run (it read and parsed them all before: ~5 % of the
CPU of draining such a backlog). A run missed young is repaired by the first pass
after it is ``stale_after_ms`` old.
"""

from __future__ import annotations

import asyncio
import logging
import time

from airuntime.control_plane.outcomes import end_shared_run, outcome_of
from airuntime.control_plane.shared_queue import QueueItemStatus, SharedQueue
from airuntime.control_plane.shared_runs import SharedRun, SharedRunStatus, SharedRunStore
from airuntime.core import keys
from airuntime.core.supervision import LoopContext
from airuntime.fleet.run_index import RunIndex

__all__ = ["Reconciler"]

log = logging.getLogger(__name__)

_WAITING = frozenset({QueueItemStatus.PENDING, QueueItemStatus.CLAIMED})


class Reconciler:
    """Ends, records or requeues open shared runs that the event path missed."""

    def __init__(
        self,
        runs: SharedRunStore,
        queue: SharedQueue,
        run_index: RunIndex,
        *,
        interval_s: float = 30.0,
        stale_after_ms: int = 60_000,
        page: int = 200,
    ) -> None:
        self.runs = runs
        self.queue = queue
        self.run_index = run_index
        self.interval_s = interval_s
        self.stale_after_ms = stale_after_ms
        self.page = page

    async def run(self, ctx: LoopContext) -> None:
        while True:
            await self.reconcile_once()
            ctx.ok()
            await asyncio.sleep(self.interval_s)

    async def reconcile_once(self) -> int:
        """One pass over the open runs; how many it changed."""
        changed = 0
        start = 0
        cutoff = int(time.time() * 1000) - self.stale_after_ms
        while True:
            ids = await self.runs.open_ids(start, self.page, created_before_ms=cutoff)
            if not ids:
                return changed
            found = {r.shared_run_id: r for r in await self.runs.get_many(ids)}
            gone = [i for i in ids if i not in found]
            if gone:
                await self.runs.redis.zrem(keys.shared_runs_open(), *gone)
                await self.runs.redis.hdel(keys.shared_runs_open_tenants(), *gone)
            for run in found.values():
                changed += await self._reconcile(run)
            start += len(ids) - len(gone)

    async def _reconcile(self, run: SharedRun) -> int:
        if run.status not in (SharedRunStatus.QUEUED_GLOBALLY, SharedRunStatus.DISPATCHED):
            return 0
        if run.run_id is None and not self._quiet(run):
            # Queued and recently changed: a pump or the outcome reader is at work on it
            # (everything below waits for quiet, or is the outcome reader's first), so a
            # backlog of fresh runs costs no reads per pass.
            return 0
        run_id = run.run_id or await self.run_index.run_for_shared(run.shared_run_id)
        if run_id is None:
            return await self._requeue_if_stranded(run)
        loaded = await self.run_index.get_unchecked(run_id)
        if loaded is None:
            return await self._lost(run, run_id)
        record = loaded[0]
        outcome = outcome_of(record)
        if outcome is not None:
            ended = await end_shared_run(self.runs, outcome)
            return int(ended is not None and ended.moved)
        if run.status is SharedRunStatus.QUEUED_GLOBALLY and self._quiet(run):
            # A runtime accepted the run but its dispatch was never recorded.
            moved = await self.runs.transition(
                run.shared_run_id,
                SharedRunStatus.DISPATCHED,
                expect=frozenset({SharedRunStatus.QUEUED_GLOBALLY}),
                run_id=run_id,
                assigned_instance_id=record.instance_id,
                dispatched_at_ms=record.created_at_ms,
            )
            return int(moved.moved)
        return 0

    async def _lost(self, run: SharedRun, run_id: str) -> int:
        if run.status is not SharedRunStatus.DISPATCHED or not self._quiet(run):
            return 0
        log.warning("shared run %s: its run %s no longer exists", run.shared_run_id, run_id)
        moved = await self.runs.transition(
            run.shared_run_id,
            SharedRunStatus.FAILED,
            expect=frozenset({SharedRunStatus.DISPATCHED}),
            reason=f"the runtime's record of run {run_id} no longer exists",
        )
        return int(moved.moved)

    async def _requeue_if_stranded(self, run: SharedRun) -> int:
        if run.status is not SharedRunStatus.QUEUED_GLOBALLY or not self._quiet(run):
            return 0
        tenant = run.snapshot.tenant_id
        if await self.queue.status(run.shared_run_id, tenant) in _WAITING:
            # Its item waits; make sure the pumps see its tenant (an enqueue that died
            # between its item and its announce).
            await self.queue.tenants.announce(tenant)
            return 0
        log.warning("shared run %s is queued without a queue item: requeued", run.shared_run_id)
        return int(
            await self.queue.enqueue(run.shared_run_id, run.snapshot.tenant_id, requeue=True)
        )

    def _quiet(self, run: SharedRun) -> bool:
        """Unchanged for ``stale_after_ms``: whoever was changing it is not any more."""
        return int(time.time() * 1000) - run.updated_at_ms >= self.stale_after_ms
