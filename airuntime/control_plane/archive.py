"""Archiving on the control plane: executions and shared runs into the durable history.

Why this exists: the control plane is the one long-lived process that sees every run,
so it runs the archivers. Executions are archived by the history layer's
:class:`~airuntime.history.archiver.ExecutionArchiver` (it needs only Redis and the
engine's keys); shared runs are control-plane records, so their archiving lives here:
a shared run that becomes terminal is queued on ``air:archive:sruns`` in the same
transaction (``SharedRunStore.transition``), and :class:`SharedRunArchiver` writes
each queued run with ``upsert_shared_run`` (idempotent) before removing it from the
queue. :class:`ArchivingRetentionPolicy` makes retention "archive first": a shared
run past the window is deleted from Redis only once the history has it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from airuntime.control_plane.retention import RetentionPolicy
from airuntime.control_plane.shared_runs import SharedRun, SharedRunStore
from airuntime.core import keys
from airuntime.core.redis_client import RedisClient
from airuntime.core.supervision import LoopContext
from airuntime.history.errors import HistoryError, HistoryUnavailable
from airuntime.history.records import ArchivedSharedRun
from airuntime.history.store import HistoryStore

__all__ = ["ArchivingRetentionPolicy", "SharedRunArchiver", "archived_shared_run"]

log = logging.getLogger(__name__)


def archived_shared_run(run: SharedRun) -> ArchivedSharedRun:
    """The history's record of a shared run: the SharedRun JSON as Redis holds it."""
    return ArchivedSharedRun(
        shared_run_id=run.shared_run_id,
        tenant_id=run.snapshot.tenant_id,
        pipeline_id=run.pipeline_id,
        status=run.status.value,
        created_ms=run.created_at_ms,
        finished_ms=run.finished_at_ms,
        run=run.model_dump(mode="json"),
    )


@dataclass
class SharedRunArchiveStats:
    archived: int = 0
    errors: int = 0


class SharedRunArchiver:
    """Drains ``air:archive:sruns`` into the history (a supervised loop). Any number of
    control planes may run it: a write is idempotent, an entry goes only after it."""

    def __init__(
        self,
        redis: RedisClient,
        runs: SharedRunStore,
        store: HistoryStore,
        *,
        batch: int = 100,
        idle_s: float = 0.5,
    ) -> None:
        self.redis = redis
        self.runs = runs
        self.store = store
        self.batch = batch
        self.idle_s = idle_s
        self.stats = SharedRunArchiveStats()

    async def run(self, ctx: LoopContext) -> None:
        while True:
            try:
                done = await self.archive_once()
            except Exception:
                self.stats.errors += 1
                raise
            ctx.ok()
            if done < self.batch:  # caught up: let the next batch gather
                await asyncio.sleep(self.idle_s)

    async def backlog(self) -> int:
        return int(await self.redis.zcard(keys.shared_run_archive_outbox()))

    async def archive_once(self) -> int:
        raw = await self.redis.zrange(keys.shared_run_archive_outbox(), 0, self.batch - 1)
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in raw]
        if not ids:
            return 0
        found = {r.shared_run_id: r for r in await self.runs.get_many(ids)}
        # One transaction for the batch; an entry leaves the outbox only after it (ids
        # whose run is gone leave too: there is nothing to archive).
        refused = await self._write([archived_shared_run(r) for r in found.values()])
        self.stats.archived += len(found) - len(refused)
        await self.redis.zrem(
            keys.shared_run_archive_outbox(), *[i for i in ids if i not in refused]
        )
        return len(ids)

    async def _write(self, records: list[ArchivedSharedRun]) -> set[str]:
        """Upsert the batch in one transaction; when the store refuses it (not a
        connection problem), one by one so a refused run holds back only itself (it
        stays in the outbox, logged and counted). Returns the refused ids."""
        try:
            await self.store.upsert_shared_runs(records)
            return set()
        except HistoryUnavailable:
            raise
        except HistoryError:
            pass
        refused: set[str] = set()
        for record in records:
            try:
                await self.store.upsert_shared_run(record)
            except HistoryUnavailable:
                raise
            except HistoryError as error:
                self.stats.errors += 1
                refused.add(record.shared_run_id)
                log.error("shared run %s not archived: %s", record.shared_run_id, error)
        return refused


class ArchivingRetentionPolicy(RetentionPolicy):
    """Retention that deletes a shared run only once the history has it."""

    def __init__(self, store: HistoryStore, retention_s: float) -> None:
        super().__init__(retention_s)
        self.store = store

    async def may_delete(self, run: SharedRun) -> bool:
        try:
            archived = await self.store.get_shared_run(run.shared_run_id, None)
        except HistoryError as exc:
            log.warning("retention keeps shared run %s: history: %s", run.shared_run_id, exc)
            return False
        return archived is not None
