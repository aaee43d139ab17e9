"""The scale-out loops: hand Pending requests to the provider, requeue fulfilled runs.

A :class:`ScaleOutWatcher` hands Pending requests to a provider. Fulfilment marks the
request Fulfilled with the new instance id; the :class:`FulfilledRunRequeuer` then puts
the shared run back into the shared queue and the pump dispatches it: the watcher never
dispatches.
"""

from __future__ import annotations

import asyncio
import logging

from airuntime.control_plane.scale_out.requests import (
    ScaleOutPhase,
    ScaleOutProvider,
    ScaleOutRejected,
    ScaleOutRequest,
    ScaleOutStore,
    now_ms,
)
from airuntime.control_plane.shared_queue import SharedQueue
from airuntime.control_plane.shared_runs import SharedRunStatus, SharedRunStore

log = logging.getLogger(__name__)


class ScaleOutWatcher:
    """Hands Pending requests to the provider and records the outcome."""

    def __init__(
        self, store: ScaleOutStore, provider: ScaleOutProvider, poll_s: float = 0.1
    ) -> None:
        self.store = store
        self.provider = provider
        self.poll_s = poll_s
        self._inflight: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        while True:
            await self.observe_once()
            await asyncio.sleep(self.poll_s)

    async def observe_once(self) -> int:
        started = 0
        for req in await self.store.list():
            if req.phase is not ScaleOutPhase.PENDING or req.request_id in self._inflight:
                continue
            observed = await self.store.transition(
                req.request_id,
                {ScaleOutPhase.PENDING},
                phase=ScaleOutPhase.OBSERVED,
                observed_at_ms=now_ms(),
                provider=self.provider.name,
            )
            if observed is None:
                continue  # another watcher took it
            self._inflight.add(req.request_id)
            task = asyncio.create_task(self._fulfil(observed))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            started += 1
        return started

    async def _fulfil(self, req: ScaleOutRequest) -> None:
        try:
            instance_id = await self.provider.fulfil(req)
        except ScaleOutRejected as exc:
            await self.store.transition(
                req.request_id, None, phase=ScaleOutPhase.REJECTED, reason=str(exc)
            )
        except Exception as exc:
            log.exception("scale-out %s failed", req.request_id)
            await self.store.transition(
                req.request_id, None, phase=ScaleOutPhase.REJECTED, reason=repr(exc)
            )
        else:
            await self.store.transition(
                req.request_id,
                None,
                phase=ScaleOutPhase.FULFILLED,
                fulfilled_instance_id=instance_id,
                fulfilled_at_ms=now_ms(),
            )
        finally:
            self._inflight.discard(req.request_id)

    async def wait_idle(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


class FulfilledRunRequeuer:
    """Puts shared runs of finished scale-out requests back into the shared queue."""

    def __init__(
        self, store: ScaleOutStore, runs: SharedRunStore, queue: SharedQueue, poll_s: float = 0.1
    ) -> None:
        self.store = store
        self.runs = runs
        self.queue = queue
        self.poll_s = poll_s

    async def run(self) -> None:
        while True:
            await self.requeue_once()
            await asyncio.sleep(self.poll_s)

    async def requeue_once(self) -> int:
        n = 0
        for req in await self.store.list():
            if req.requeued or req.phase not in (ScaleOutPhase.FULFILLED, ScaleOutPhase.REJECTED):
                continue
            marked = await self.store.transition(
                req.request_id,
                {ScaleOutPhase.FULFILLED, ScaleOutPhase.REJECTED},
                unless_requeued=True,
                requeued=True,
            )
            if marked is None:
                continue  # another requeuer took it
            run = await self.runs.get(req.shared_run_id)
            if run is None or run.status is not SharedRunStatus.SCALE_OUT_REQUESTED:
                continue
            # Rejected scale-out still requeues: existing capacity (or shared fallback)
            # may take the run later; admission decides again at dispatch time.
            await self.runs.update(req.shared_run_id, status=SharedRunStatus.QUEUED_GLOBALLY)
            await self.queue.enqueue(req.shared_run_id, run.snapshot.tenant_id, requeue=True)
            n += 1
        return n
