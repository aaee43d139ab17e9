"""What a live runtime instance does for runs that are not (or not only) its own.

Why this module exists: the queue and the run index live in Redis, so nothing is lost
when an instance dies. Every heartbeat, a live instance that the run's tenant may use

* **adopts** what dead instances left behind (compare-and-set, ``adoptRun-1.lua``, only
  while the owner is unregistered):
  their queued runs move into its queue, their running executions continue here (the
  engine recovers the dead workers' claims);
* **repairs** its local queue: an own queued run missing from it (a crash between the
  two steps of acceptance, or of an adoption) is pushed again;
* **resumes** its own running runs that execute nowhere (its participation ended
  without finishing them, or its process restarted under the same id);
* **assists**: idle workers join running executions owned by other live instances,
  each instance respecting its own MaxLocalWorkersPerExecution.

Both run as supervised loops of :class:`~runtime_pod.instance.RuntimeInstance`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airuntime.core import keys
from airuntime.fleet.runs import RunRecord, RunRequest, RunStatus

if TYPE_CHECKING:
    from runtime_pod.instance import RuntimeInstance

__all__ = ["Adoption"]

log = logging.getLogger(__name__)


class Adoption:
    """Adoption, resumption and assistance for one instance."""

    def __init__(self, instance: RuntimeInstance) -> None:
        self.inst = instance

    async def adopt_orphans(self) -> None:
        """Take over what dead instances left behind (queued runs into this queue,
        running executions here) for tenants this instance may serve, and resume own
        running runs that execute nowhere."""
        inst = self.inst
        if inst.stopping:
            return
        live = {d.instance_id for d in await inst.registry.list_all()} | {inst.instance_id}
        for state in (RunStatus.QUEUED, RunStatus.RUNNING):
            ids = await inst.index.in_state(state)
            own_queued: list[str] = []
            # Owner and status first (one round trip): only runs with something to do
            # here are loaded whole, so a healthy fleet's sweep costs one read per run.
            for run_id, (status, owner) in zip(ids, await inst.index.owners(ids), strict=True):
                if (
                    state is RunStatus.QUEUED
                    and status == state.value
                    and owner == inst.instance_id
                ):
                    own_queued.append(run_id)
                if status != state.value or not self._concerns(state, run_id, owner, live):
                    continue
                loaded = await inst.index.get_unchecked(run_id)
                if loaded is not None and loaded[0].status is state:
                    await self._reconcile(*loaded, live=live)
            await self._repair_queue(own_queued)

    async def _repair_queue(self, own_queued: list[str]) -> None:
        """Push own queued runs missing from the local queue (a crash between
        acceptance's two steps, or an adoption's): see ``RunIndex.repair_queue``."""
        inst = self.inst
        # Ten heartbeats: far longer than the gap between acceptance's two steps.
        min_age_ms = int(inst.config.heartbeat_s * 10_000)
        lost = await inst.index.repair_queue(inst.instance_id, own_queued, min_age_ms=min_age_ms)
        if lost:
            log.warning("%s: queued runs %s were in no queue; queued again", inst.instance_id, lost)
            inst.kick()

    def _concerns(self, state: RunStatus, run_id: str, owner: str | None, live: set[str]) -> bool:
        """Whether :meth:`_reconcile` could act on the run: an own running run that
        executes nowhere here, or a run whose owner is gone."""
        if owner == self.inst.instance_id:
            return state is RunStatus.RUNNING and not self.inst.participates(run_id)
        return owner not in live

    async def _reconcile(self, record: RunRecord, request: RunRequest, *, live: set[str]) -> None:
        """One queued or running run: resume it if it is ours, adopt it if orphaned."""
        inst = self.inst
        if record.instance_id == inst.instance_id:
            # Ours but not executing here (adopted when no worker was free, a
            # participation that ended without finishing it, or this id restarted):
            # resume it once a worker is free.
            if record.status is RunStatus.RUNNING and not inst.participates(record.run_id):
                inst.launch(record, request, assisting=False)
            return
        if record.instance_id in live or not await self._may_adopt(record):
            return
        if not await inst.index.adopt(
            record.run_id, record.instance_id, inst.instance_id, record.status
        ):
            return  # another instance was first
        log.warning(
            "%s adopted %s run %s from %s",
            inst.instance_id,
            record.status.value,
            record.run_id,
            record.instance_id,
        )
        if record.status is RunStatus.QUEUED:
            await inst.index.remove_queued(record.instance_id, record.run_id)
            await inst.index.requeue(inst.instance_id, record.run_id)
            inst.kick()
        else:
            adopted = record.model_copy(update={"instance_id": inst.instance_id})
            inst.launch(adopted, request, assisting=False)

    async def _may_adopt(self, record: RunRecord) -> bool:
        """The run's tenant may use this instance, and a running run finds a worker."""
        inst = self.inst
        if not inst.may_serve(await inst.registry.tenant(record.tenant_id)):
            return False
        return record.status is not RunStatus.RUNNING or inst.available_workers > 0

    async def assist(self) -> None:
        """Lend idle workers to running executions owned by other live instances."""
        inst = self.inst
        if inst.stopping or inst.available_workers == 0:
            return
        if await inst.index.queue_length(inst.instance_id) > 0:
            return  # own queued runs come first
        for run_id in await inst.index.in_state(RunStatus.RUNNING, limit=100):
            if inst.available_workers == 0:
                return
            if inst.participates(run_id):
                continue
            loaded = await inst.index.get_unchecked(run_id)
            if (
                loaded is None
                or loaded[0].execution_id is None
                or loaded[0].instance_id == inst.instance_id
            ):
                continue
            record, request = loaded
            if not inst.may_serve(await inst.registry.tenant(record.tenant_id)):
                continue
            assert record.execution_id is not None  # runs without one were skipped above
            lease = keys.assist_lease(record.execution_id, inst.instance_id)
            ttl_ms = inst.config.heartbeat_ttl_ms * 10
            if not await inst.redis.set(lease, "1", nx=True, px=ttl_ms):
                continue
            if not inst.launch(record, request, assisting=True):
                await inst.redis.delete(lease)
