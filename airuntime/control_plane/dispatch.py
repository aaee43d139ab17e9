"""The shared-queue dispatcher, the pump, and the background pump service.

One dispatch cycle (:meth:`SharedRunDispatcher.dispatch_next`): claim the next
Pending item, load the shared run, **restore its ExecutionContextSnapshot**, re-admit
at dispatch time, deliver through the chosen instance's provider, and only after
the runtime accepted mark the queue item and the shared run Dispatched — otherwise
the item returns to Pending and the run stays QueuedGlobally with no RunId and no
ExecutionId. The previous context (or none) is restored afterwards, also on
failure, so no tenant context leaks into the next cycle.

The pump's identity (``pump_runtime_instance_id``, ``pump_worker_id``) is recorded on
the shared run for observability and is never used as the dispatch target.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from airuntime.control_plane.admission import Admission, AdmissionResult, Decision
from airuntime.control_plane.scale_out import ScaleOutStore
from airuntime.control_plane.shared_runs import (
    ClaimedItem,
    SharedQueue,
    SharedRun,
    SharedRunStatus,
    SharedRunStore,
)
from airuntime.core.context import use_context
from airuntime.core.errors import AirError
from airuntime.engine.execution_store import ExecutionStore
from airuntime.fleet.providers import DeliveryError, RuntimeProvider
from airuntime.fleet.registry import InstanceDescriptor, InstanceStatus, Registry
from airuntime.fleet.run_index import RunIndex
from airuntime.fleet.runs import RunRequest, RunStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PumpIdentity:
    """Who is pumping. Recorded, never a dispatch target."""

    runtime_instance_id: str
    worker_id: str


@dataclass(frozen=True, slots=True)
class DispatchResult:
    success: bool
    empty: bool = False
    shared_run_id: str | None = None
    decision: Decision | None = None
    tenant_id: str | None = None
    instance_id: str | None = None
    run_id: str | None = None
    reason: str = ""
    latency_s: float = 0.0


DispatchObserver = Callable[[DispatchResult], None]


async def cancel_local_run(
    index: RunIndex, executions: ExecutionStore, run_id: str, tenant_id: str
) -> None:
    """Cancel a run a runtime instance accepted: take it out of its local queue before
    it starts, or cancel its execution. Finished runs are left as they are."""
    record = await index.get_for_tenant(run_id, tenant_id)
    if record is None or record.status.terminal:
        return
    if record.execution_id:
        with contextlib.suppress(AirError):
            await executions.cancel(record.execution_id, actor=f"tenant {tenant_id}")
        return
    await index.remove_queued(record.instance_id, record.run_id)
    await index.mark_finished(record.run_id, RunStatus.CANCELLED, "cancelled before start")


class SharedRunDispatcher:
    def __init__(
        self,
        runs: SharedRunStore,
        queue: SharedQueue,
        admission: Admission,
        providers: Callable[[InstanceDescriptor], RuntimeProvider],
        scale_outs: ScaleOutStore | None,
        identity: PumpIdentity,
        observer: DispatchObserver | None = None,
    ) -> None:
        self.runs = runs
        self.queue = queue
        self.admission = admission
        self.providers = providers
        self.scale_outs = scale_outs
        self.identity = identity
        self.observer = observer
        self.run_index = RunIndex(runs.redis)
        self.executions = ExecutionStore(runs.redis)

    async def dispatch_next(
        self, *, skip_tenants: frozenset[str] = frozenset(), target: str | None = None
    ) -> DispatchResult:
        item = await self.queue.claim_next(self.identity.worker_id, skip_tenants)
        if item is None:
            return DispatchResult(success=False, empty=True, reason="no pending item")
        return await self._handle(item, target)

    async def dispatch_run(self, shared_run_id: str) -> DispatchResult:
        """Dispatch one specific queued run now (DirectDispatch)."""
        item = await self.queue.claim(self.identity.worker_id, shared_run_id)
        if item is None:
            return DispatchResult(
                False, empty=True, shared_run_id=shared_run_id, reason="not pending"
            )
        return await self._handle(item, None)

    async def _handle(self, item: ClaimedItem, target: str | None) -> DispatchResult:
        run = await self.runs.get(item.shared_run_id)
        if run is None or run.status is SharedRunStatus.CANCELLED:
            await self.queue.settle(item, "Cancelled", "shared run cancelled or missing")
            return DispatchResult(False, shared_run_id=item.shared_run_id, reason="cancelled")
        with use_context(run.snapshot):
            result = await self._dispatch(item, run, target)
        if self.observer is not None:
            self.observer(result)
        return result

    async def _dispatch(
        self, item: ClaimedItem, run: SharedRun, target: str | None
    ) -> DispatchResult:
        tenant_id = run.snapshot.tenant_id
        try:
            admitted = await self.admission.admit(target=target)
        except Exception as exc:
            await self.queue.settle(item, "Pending", f"admission failed: {exc}")
            return DispatchResult(
                False, shared_run_id=run.shared_run_id, tenant_id=tenant_id, reason=str(exc)
            )
        if admitted.decision is Decision.ASSIGN:
            return await self._deliver(item, run, admitted)
        if admitted.decision is Decision.SCALE_OUT and self.scale_outs is not None:
            in_flight = await self.scale_outs.outstanding(admitted.tenant.runtime_prefix)
            if in_flight is not None:
                # Capacity for this prefix is already being created: wait in the queue
                # for it instead of filing one request per queued run.
                await self.queue.settle(item, "Pending", f"waiting for {in_flight.request_id}")
                return DispatchResult(
                    False,
                    shared_run_id=run.shared_run_id,
                    decision=Decision.QUEUE,
                    tenant_id=tenant_id,
                    reason=f"scale-out {in_flight.request_id} in flight",
                )
            req = await self.scale_outs.create(admitted.tenant, run.shared_run_id)
            # Settle first: a run cancelled while claimed (settle refused) stays Cancelled
            # and is not requeued after the scale-out.
            if await self.queue.settle(item, "ScaleOutRequested", req.request_id):
                await self.runs.update(
                    run.shared_run_id,
                    status=SharedRunStatus.SCALE_OUT_REQUESTED,
                    scale_out_request_id=req.request_id,
                    reason=admitted.reason,
                )
            return DispatchResult(
                False,
                shared_run_id=run.shared_run_id,
                decision=admitted.decision,
                tenant_id=tenant_id,
                reason=admitted.reason,
            )
        if admitted.decision is Decision.REJECT:
            if await self.queue.settle(item, "Rejected", admitted.reason):
                await self.runs.update(
                    run.shared_run_id, status=SharedRunStatus.REJECTED, reason=admitted.reason
                )
            return DispatchResult(
                False,
                shared_run_id=run.shared_run_id,
                decision=admitted.decision,
                tenant_id=tenant_id,
                reason=admitted.reason,
            )
        await self.queue.settle(item, "Pending", admitted.reason)
        return DispatchResult(
            False,
            shared_run_id=run.shared_run_id,
            decision=Decision.QUEUE,
            tenant_id=tenant_id,
            reason=admitted.reason,
        )

    async def _deliver(
        self, item: ClaimedItem, run: SharedRun, admitted: AdmissionResult
    ) -> DispatchResult:
        assert admitted.instance is not None and admitted.reservation is not None
        instance = admitted.instance
        request = RunRequest(
            shared_run_id=run.shared_run_id,
            pipeline=run.pipeline,
            inputs=run.inputs,
            snapshot=run.snapshot,
            metadata={**run.metadata, "assigned.runtime.instance.id": instance.instance_id},
        )
        try:
            run_id = await self.providers(instance).deliver(instance, request)
        except (DeliveryError, OSError) as exc:
            await self.admission.release(admitted.reservation)
            await self.queue.settle(
                item, "Pending", f"dispatch to {instance.instance_id} failed: {exc}"
            )
            return DispatchResult(
                False,
                shared_run_id=run.shared_run_id,
                decision=Decision.ASSIGN,
                tenant_id=run.snapshot.tenant_id,
                instance_id=instance.instance_id,
                reason=str(exc),
            )
        except BaseException:
            await self.admission.release(admitted.reservation)
            with contextlib.suppress(Exception):
                await self.queue.settle(item, "Pending", "dispatch interrupted")
            raise
        # The runtime accepted: only now the queue item and the shared run are Dispatched.
        settled = await self.queue.settle(item, "Dispatched", instance.instance_id)
        if not settled and (await self.queue.item(run.shared_run_id)).get("status") == (
            "Cancelled"
        ):
            # Cancelled while this pump held the claim, after the runtime accepted: cancel
            # that local run and leave the shared run Cancelled (not Dispatched).
            await cancel_local_run(self.run_index, self.executions, run_id, run.snapshot.tenant_id)
            await self.admission.release(admitted.reservation)
            await self.runs.update(
                run.shared_run_id,
                status=SharedRunStatus.CANCELLED,
                assigned_instance_id=instance.instance_id,
                run_id=run_id,
                reason="cancelled while being dispatched",
            )
            return DispatchResult(
                False,
                shared_run_id=run.shared_run_id,
                instance_id=instance.instance_id,
                run_id=run_id,
                reason="cancelled while being dispatched",
            )
        now = int(time.time() * 1000)
        await self.runs.update(
            run.shared_run_id,
            status=SharedRunStatus.DISPATCHED,
            assigned_instance_id=instance.instance_id,
            run_id=run_id,
            pump_runtime_instance_id=self.identity.runtime_instance_id,
            pump_worker_id=self.identity.worker_id,
            dispatched_at_ms=now,
            reason=None,
        )
        if not settled:
            log.warning(
                "claim of %s expired before it was settled; the runtime's idempotency "
                "keeps the run single",
                run.shared_run_id,
            )
        return DispatchResult(
            True,
            shared_run_id=run.shared_run_id,
            decision=Decision.ASSIGN,
            tenant_id=run.snapshot.tenant_id,
            instance_id=instance.instance_id,
            run_id=run_id,
            latency_s=max(0.0, (now - run.created_at_ms) / 1000),
        )


@dataclass
class PumpResult:
    dispatched: int = 0
    failed: int = 0
    cycles: int = 0
    stopped: str = ""
    results: list[DispatchResult] = field(default_factory=list)


class SharedQueuePump:
    """Runs dispatch cycles: until max count, an empty queue, a stopping failure or cancel."""

    def __init__(self, dispatcher: SharedRunDispatcher) -> None:
        self.dispatcher = dispatcher

    async def pump_once(
        self, max_count: int = 100, *, stop_on_failure: bool = False, target: str | None = None
    ) -> PumpResult:
        result = PumpResult()
        no_capacity: set[str] = set()
        while result.cycles < max_count:
            r = await self.dispatcher.dispatch_next(
                skip_tenants=frozenset(no_capacity), target=target
            )
            if r.empty:
                result.stopped = "empty"
                break
            result.cycles += 1
            result.results.append(r)
            if r.success:
                result.dispatched += 1
                continue
            result.failed += 1
            if r.tenant_id and r.decision not in (Decision.SCALE_OUT, Decision.REJECT):
                # The item went back to Pending at the head of the queue (no capacity,
                # failed admission or failed delivery): skip this tenant for the rest of
                # the cycle, so the same item is not re-claimed until max_count and the
                # other tenants' items behind it are not starved.
                no_capacity.add(r.tenant_id)
            if stop_on_failure and r.decision is not Decision.QUEUE:
                result.stopped = "failure"
                break
        else:
            result.stopped = "max_count"
        return result


class BackgroundPump:
    """Pumps continuously once the readiness gate passed (a ready runtime is visible)."""

    def __init__(
        self, pump: SharedQueuePump, registry: Registry, *, idle_s: float = 0.05, batch: int = 100
    ) -> None:
        self.pump = pump
        self.registry = registry
        self.idle_s = idle_s
        self.batch = batch
        self.ready = asyncio.Event()
        self.wake = asyncio.Event()

    async def wait_ready(self) -> None:
        """The readiness gate: at least one registered, ready runtime that can accept a run."""
        while True:
            for d in await self.registry.list_all():
                if d.status is InstanceStatus.READY and d.capacity.can_accept_run:
                    self.ready.set()
                    return
            await asyncio.sleep(self.idle_s)

    async def run(self) -> None:
        await self.wait_ready()
        while True:
            result = await self.pump.pump_once(self.batch)
            if result.dispatched == 0:
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), self.idle_s)
