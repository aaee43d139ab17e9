"""The scale-out loops: hand Pending requests to the provider, requeue fulfilled runs.

A :class:`ScaleOutWatcher` hands Pending requests to a provider. Fulfilment marks the
request Fulfilled with the new instance id; a refusal or a crash marks it Rejected
with the error and the time of the next attempt (the prefix backs off, see
:mod:`~airuntime.control_plane.scale_out.requests`). A request left Observed by a
control plane that died while its provider worked is failed as abandoned after
``abandon_after_s``, so its prefix is not blocked forever. The :class:`FulfilledRunRequeuer`
then puts the shared run back into the shared queue -- a compare-and-set from
ScaleOutRequested, so a cancel that landed meanwhile stands -- and the pump dispatches
it: the watcher never dispatches.

Both run as supervised loops (:class:`~airuntime.core.supervision.Supervisor`): each
pass that completed reports ``ok``; a pass that raised restarts the loop with backoff.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

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
from airuntime.core.supervision import LoopContext
from airuntime.core.tasks import cancel_and_wait

log = logging.getLogger(__name__)

FailureHook = Callable[[ScaleOutRequest, str], None]
"""Called with the failed request and the error (metrics)."""


class ScaleOutWatcher:
    """Hands Pending requests to the provider and records the outcome."""

    def __init__(
        self,
        store: ScaleOutStore,
        provider: ScaleOutProvider,
        poll_s: float = 0.1,
        on_failure: FailureHook | None = None,
        abandon_after_s: float = 900.0,
    ) -> None:
        self.store = store
        self.provider = provider
        self.poll_s = poll_s
        self.on_failure = on_failure
        self.abandon_after_ms = int(abandon_after_s * 1000)
        self._inflight: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, ctx: LoopContext) -> None:
        while True:
            await self.observe_once()
            ctx.ok()
            await asyncio.sleep(self.poll_s)

    async def observe_once(self) -> int:
        started = 0
        for req in await self.store.list():
            if req.request_id in self._inflight:
                continue
            if req.phase is ScaleOutPhase.OBSERVED and self._abandoned(req):
                await self._failed(req, "abandoned: the control plane working on it stopped")
                continue
            if req.phase is not ScaleOutPhase.PENDING:
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
            task = asyncio.create_task(self._fulfil(observed), name=f"scale-out:{req.request_id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            started += 1
        return started

    def _abandoned(self, req: ScaleOutRequest) -> bool:
        observed = req.observed_at_ms or req.requested_at_ms
        return now_ms() - observed > self.abandon_after_ms

    async def _fulfil(self, req: ScaleOutRequest) -> None:
        try:
            instance_id = await self.provider.fulfil(req)
        except ScaleOutRejected as exc:
            await self._failed(req, str(exc))
        except Exception as exc:
            log.exception("scale-out %s failed", req.request_id)
            await self._failed(req, f"{type(exc).__name__}: {exc}")
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

    async def _failed(self, req: ScaleOutRequest, error: str) -> None:
        failed = await self.store.failed(req.request_id, error)
        log.warning(
            "scale-out %s of %s failed (attempt %d): %s; next attempt not before %s",
            req.request_id,
            req.runtime_prefix,
            req.attempts,
            error,
            failed.next_attempt_at_ms if failed else "-",
        )
        if self.on_failure is not None:
            self.on_failure(req, error)

    async def wait_idle(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def stop(self) -> None:
        """Cancel the fulfilments in flight (their requests stay Observed)."""
        await cancel_and_wait(list(self._tasks))


class FulfilledRunRequeuer:
    """Puts shared runs of finished scale-out requests back into the shared queue."""

    def __init__(
        self, store: ScaleOutStore, runs: SharedRunStore, queue: SharedQueue, poll_s: float = 0.1
    ) -> None:
        self.store = store
        self.runs = runs
        self.queue = queue
        self.poll_s = poll_s

    async def run(self, ctx: LoopContext) -> None:
        while True:
            await self.requeue_once()
            ctx.ok()
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
            # Rejected scale-out still requeues: existing capacity (or shared fallback)
            # may take the run later; admission decides again at dispatch time.
            try:
                moved = await self.runs.transition(
                    req.shared_run_id,
                    SharedRunStatus.QUEUED_GLOBALLY,
                    expect=frozenset({SharedRunStatus.SCALE_OUT_REQUESTED}),
                )
            except KeyError:
                continue  # the run is gone (retention)
            if not moved.moved:
                continue  # cancelled meanwhile (or never parked for this request)
            await self.queue.enqueue(req.shared_run_id, moved.run.snapshot.tenant_id, requeue=True)
            n += 1
        return n
