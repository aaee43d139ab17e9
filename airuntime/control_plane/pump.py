"""The pumps: repeat dispatch cycles, on demand (drain) or in the background.

:class:`SharedQueuePump` runs cycles of the
:class:`~airuntime.control_plane.dispatch.SharedRunDispatcher` until ``max_count``
cycles ran, no Pending item is left, a cycle failed while the options ask to stop
at a failure, or it is cancelled (the manual drain: one run per cycle, each result in
order). :class:`BackgroundPump` pumps continuously, in batch cycles
(:func:`~airuntime.control_plane.batch_dispatch.dispatch_batch`), once
its readiness gate passed (a registered runtime is ready to accept a run); it runs as
a supervised loop, reporting ``ok`` after every gate poll and every batch, so a Redis
that goes away restarts it (gate included) instead of ending it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from enum import StrEnum

from airuntime.control_plane.admission import Decision
from airuntime.control_plane.batch_dispatch import dispatch_batch
from airuntime.control_plane.dispatch import DispatchResult, SharedRunDispatcher
from airuntime.core.supervision import LoopContext
from airuntime.fleet.registry import InstanceStatus, Registry


class PumpStop(StrEnum):
    """Why a pump stopped."""

    EMPTY = "empty"
    MAX_COUNT = "max_count"
    FAILURE = "failure"


@dataclass
class PumpResult:
    dispatched: int = 0
    failed: int = 0
    cycles: int = 0
    stopped: PumpStop = PumpStop.MAX_COUNT
    results: list[DispatchResult] = field(default_factory=list)


class SharedQueuePump:
    """Runs dispatch cycles: until max count, an empty queue, a stopping failure or cancel."""

    def __init__(self, dispatcher: SharedRunDispatcher) -> None:
        self.dispatcher = dispatcher

    async def pump_once(
        self, max_count: int = 100, *, stop_on_failure: bool = False, target: str | None = None
    ) -> PumpResult:
        """Pump up to ``max_count`` cycles.

        ``stop_on_failure`` stops at the first cycle that neither dispatched nor just
        left its run waiting in the queue (QueueGlobally is no failure), leaving the
        items behind it queued.
        """
        result = PumpResult()
        no_capacity: set[str] = set()
        while result.cycles < max_count:
            r = await self.dispatcher.dispatch_next(
                skip_tenants=frozenset(no_capacity), target=target
            )
            if r.empty:
                result.stopped = PumpStop.EMPTY
                break
            result.cycles += 1
            result.results.append(r)
            if r.success:
                result.dispatched += 1
                continue
            result.failed += 1
            if r.requeued and r.tenant_id:
                # The item is back at the head of the queue: skip this tenant for the
                # rest of the cycle, so the same item is not re-claimed until max_count
                # and the other tenants' items behind it are not starved.
                no_capacity.add(r.tenant_id)
            if stop_on_failure and r.decision is not Decision.QUEUE:
                result.stopped = PumpStop.FAILURE
                break
        return result

    async def pump_batches(self, max_runs: int = 1000, batch: int = 64) -> PumpResult:
        """Pump batch cycles of up to ``batch`` runs until ``max_runs`` runs were tried or
        nothing is left to claim; a tenant whose run had to wait in the queue is skipped
        for the rest of the call."""
        result = PumpResult()
        no_capacity: set[str] = set()
        while result.cycles < max_runs:
            wanted = min(batch, max_runs - result.cycles)
            results = await dispatch_batch(
                self.dispatcher, wanted, skip_tenants=frozenset(no_capacity)
            )
            if not results:
                result.stopped = PumpStop.EMPTY
                break
            result.results.extend(results)
            for r in results:
                result.cycles += 1
                if r.success:
                    result.dispatched += 1
                    continue
                result.failed += 1
                if r.requeued and r.tenant_id:
                    no_capacity.add(r.tenant_id)
            if len(results) < wanted:
                # The claim took every Pending item it saw: the queues were drained as of
                # that read, so claiming again now would only come back empty (a submit
                # since then wakes the background pump; see BackgroundPump.run).
                result.stopped = PumpStop.EMPTY
                break
        return result


class BackgroundPump:
    """Pumps continuously once the readiness gate passed (a ready runtime is visible)."""

    def __init__(
        self,
        pump: SharedQueuePump,
        registry: Registry,
        *,
        idle_s: float = 0.05,
        batch: int = 100,
        claim_batch: int = 64,
    ) -> None:
        self.pump = pump
        self.registry = registry
        self.idle_s = idle_s
        self.batch = batch
        """Most runs tried per round (then ``ok`` is reported)."""
        self.claim_batch = claim_batch
        """Most runs claimed, admitted and delivered together in one cycle."""
        self.ready = asyncio.Event()
        self.wake = asyncio.Event()

    async def wait_ready(self, ctx: LoopContext | None = None) -> None:
        """The readiness gate: at least one registered, ready runtime that can accept a run."""
        while not self.ready.is_set():
            for d in await self.registry.list_all():
                if d.status is InstanceStatus.READY and d.capacity.can_accept_run:
                    self.ready.set()
                    return
            if ctx is not None:
                ctx.ok()
            await asyncio.sleep(self.idle_s)

    async def run(self, ctx: LoopContext) -> None:
        await self.wait_ready(ctx)
        while True:
            # Cleared before the pass, not after it: a submit landing while the pass
            # runs (after it looked at the queues) must not wait out the idle period.
            self.wake.clear()
            result = await self.pump.pump_batches(self.batch, self.claim_batch)
            ctx.ok()
            if result.dispatched == 0 or result.failed > 0 or result.stopped is PumpStop.EMPTY:
                # Nothing moved, or some runs found no room: capacity changes when runs
                # start and end, so wait for a submit or the idle period instead of
                # claiming the same items again at once. Or the pass drained the queues:
                # the next item comes with a submit's wake-up (or, submitted through
                # another control plane, by the idle period, as after an empty pass).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), self.idle_s)
