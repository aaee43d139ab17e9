"""The shared-queue dispatcher: one claimed queue item, admitted and delivered.

One dispatch cycle (:meth:`SharedRunDispatcher.dispatch_next`): claim the next
Pending item, load the shared run, **restore its ExecutionContextSnapshot**, re-admit
at dispatch time, deliver through the chosen instance's provider, and only after
the runtime accepted mark the queue item and the shared run Dispatched — otherwise
the item returns to Pending and the run stays QueuedGlobally with no RunId and no
ExecutionId. The previous context (or none) is restored afterwards, also on
failure, so no tenant context leaks into the next cycle. The pumps that repeat the
cycle are in :mod:`~airuntime.control_plane.pump`.

The pump's identity (``pump_runtime_instance_id``, ``pump_worker_id``) is recorded on
the shared run for observability and is never used as the dispatch target.

Every status the dispatcher records is a compare-and-set on the shared run
(:meth:`~airuntime.control_plane.shared_runs.SharedRunStore.transition`): a cancel that
landed meanwhile is never overwritten. Failures to reach an instance are counted
(:mod:`~airuntime.control_plane.suspects`), a success clears them; a scale-out that
failed lately is not asked for again before its backoff passed.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from airuntime.control_plane.admission import Admission, Assign, Decision, NotAssigned
from airuntime.control_plane.scale_out import ScaleOutStore
from airuntime.control_plane.shared_queue import ClaimedItem, QueueItemStatus, SharedQueue
from airuntime.control_plane.shared_runs import SharedRun, SharedRunStatus, SharedRunStore
from airuntime.control_plane.suspects import FAULT_REASONS, SuspectMarks
from airuntime.core.context import use_context
from airuntime.engine.execution_store import ExecutionStore
from airuntime.fleet.providers import DeliveryError, RuntimeProvider
from airuntime.fleet.registry import InstanceDescriptor
from airuntime.fleet.run_cancel import cancel_run
from airuntime.fleet.run_index import RunIndex
from airuntime.fleet.runs import RunRequest

log = logging.getLogger(__name__)

CANCELLED_IN_FLIGHT = "cancelled while being dispatched"
_QUEUED = frozenset({SharedRunStatus.QUEUED_GLOBALLY})


@dataclass(frozen=True, slots=True)
class PumpIdentity:
    """Who is pumping. Recorded, never a dispatch target."""

    runtime_instance_id: str
    worker_id: str


@dataclass(frozen=True, slots=True)
class DispatchResult:
    """The outcome of one dispatch cycle.

    ``requeued``: the queue item went back to Pending at the head of the queue (no
    capacity, failed admission or failed delivery), so the same tenant's item would
    be claimed again at once.
    """

    success: bool
    empty: bool = False
    shared_run_id: str | None = None
    decision: Decision | None = None
    tenant_id: str | None = None
    instance_id: str | None = None
    run_id: str | None = None
    reason: str = ""
    latency_s: float = 0.0
    requeued: bool = False

    @classmethod
    def refused(
        cls,
        run: SharedRun,
        decision: Decision | None,
        reason: str,
        *,
        requeued: bool,
        instance_id: str | None = None,
        run_id: str | None = None,
    ) -> DispatchResult:
        """``run`` was not dispatched in this cycle, for ``reason``."""
        return cls(
            False,
            shared_run_id=run.shared_run_id,
            decision=decision,
            tenant_id=run.snapshot.tenant_id,
            instance_id=instance_id,
            run_id=run_id,
            reason=reason,
            requeued=requeued,
        )


DispatchObserver = Callable[[DispatchResult], None]


class SharedRunDispatcher:
    """Claims, admits and delivers one shared run per call."""

    def __init__(
        self,
        runs: SharedRunStore,
        queue: SharedQueue,
        admission: Admission,
        providers: Callable[[InstanceDescriptor], RuntimeProvider],
        scale_outs: ScaleOutStore | None,
        identity: PumpIdentity,
        observer: DispatchObserver | None = None,
        *,
        suspects: SuspectMarks | None = None,
    ) -> None:
        self.runs = runs
        self.queue = queue
        self.admission = admission
        self.providers = providers
        self.scale_outs = scale_outs
        self.identity = identity
        self.observer = observer
        self.suspects = suspects or admission.suspects
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
        run = await self.runs.get(shared_run_id)
        tenant_id = run.snapshot.tenant_id if run is not None else None
        item = None
        if tenant_id is not None:
            item = await self.queue.claim(self.identity.worker_id, shared_run_id, tenant_id)
        if item is None:
            return DispatchResult(
                False, empty=True, shared_run_id=shared_run_id, reason="not pending"
            )
        return await self._handle(item, None)

    async def _handle(self, item: ClaimedItem, target: str | None) -> DispatchResult:
        run = await self.runs.get(item.shared_run_id)
        if run is None or run.status is not SharedRunStatus.QUEUED_GLOBALLY:
            return await self.leave(item, run)
        with use_context(run.snapshot):
            result = await self.decide(item, run, target)
        if self.observer is not None:
            self.observer(result)
        return result

    async def leave(self, item: ClaimedItem, run: SharedRun | None) -> DispatchResult:
        """A claimed item whose run is no longer QueuedGlobally leaves the queue."""
        # Cancelled (or ended, or gone) while its item waited: it leaves the queue.
        # A run that already ran (a pump died after delivering it and the runtime's
        # outcome ended it) leaves as Dispatched: it was, once, and never again.
        what = "missing" if run is None else run.status.value
        ran = run is not None and run.run_id is not None and run.status.terminal
        status = QueueItemStatus.DISPATCHED if ran else QueueItemStatus.CANCELLED
        await self.queue.settle(item, status, f"shared run {what}")
        return DispatchResult(False, shared_run_id=item.shared_run_id, reason=what)

    # -- admission decides --------------------------------------------------------------

    async def decide(self, item: ClaimedItem, run: SharedRun, target: str | None) -> DispatchResult:
        """Admit one claimed run (its snapshot is the current context) and act on the
        decision: deliver, request scale-out, park as rejected, or wait in the queue."""
        try:
            admitted = await self.admission.admit(target=target)
        except Exception as exc:
            await self.queue.settle(item, QueueItemStatus.PENDING, f"admission failed: {exc}")
            return DispatchResult.refused(run, None, str(exc), requeued=True)
        if isinstance(admitted, Assign):
            return await self._deliver(item, run, admitted)
        if admitted.decision is Decision.SCALE_OUT and self.scale_outs is not None:
            return await self._scale_out(item, run, admitted, self.scale_outs)
        if admitted.decision is Decision.REJECT:
            await self._park(
                item,
                run,
                QueueItemStatus.REJECTED,
                admitted.reason,
                status=SharedRunStatus.REJECTED,
                reason=admitted.reason,
            )
            return DispatchResult.refused(run, admitted.decision, admitted.reason, requeued=False)
        # QueueGlobally (or RequestScaleOut without a scale-out store): wait in the queue.
        await self.queue.settle(item, QueueItemStatus.PENDING, admitted.reason)
        return DispatchResult.refused(run, Decision.QUEUE, admitted.reason, requeued=True)

    async def _scale_out(
        self, item: ClaimedItem, run: SharedRun, admitted: NotAssigned, scale_outs: ScaleOutStore
    ) -> DispatchResult:
        prefix = admitted.tenant.runtime_prefix
        in_flight = await scale_outs.outstanding(prefix)
        if in_flight is not None:
            # Capacity for this prefix is already being created: wait in the queue
            # for it instead of filing one request per queued run.
            request_id = in_flight.request_id
            await self.queue.settle(item, QueueItemStatus.PENDING, f"waiting for {request_id}")
            return DispatchResult.refused(
                run, Decision.QUEUE, f"scale-out {request_id} in flight", requeued=True
            )
        latest = await scale_outs.latest(prefix)
        if latest is not None and scale_outs.backing_off(latest):
            # The last attempt failed: wait in the queue until its backoff passed.
            why = (
                f"scale-out of {prefix} backing off after {latest.attempts} failed "
                f"attempt(s) until {latest.next_attempt_at_ms}: {latest.last_error}"
            )
            await self.queue.settle(item, QueueItemStatus.PENDING, why[:500])
            return DispatchResult.refused(run, Decision.QUEUE, why, requeued=True)
        req = await scale_outs.create(
            admitted.tenant, run.shared_run_id, attempts=scale_outs.next_attempts(latest)
        )
        await self._park(
            item,
            run,
            QueueItemStatus.SCALE_OUT_REQUESTED,
            req.request_id,
            status=SharedRunStatus.SCALE_OUT_REQUESTED,
            scale_out_request_id=req.request_id,
            reason=admitted.reason,
        )
        return DispatchResult.refused(run, admitted.decision, admitted.reason, requeued=False)

    async def _park(
        self,
        item: ClaimedItem,
        run: SharedRun,
        outcome: QueueItemStatus,
        detail: str,
        **changes: Any,
    ) -> None:
        """Take the item out of the queue as ``outcome`` and record ``changes`` on the
        shared run. Settle first: a run cancelled while claimed (settle refused) stays
        Cancelled, and is not requeued after a scale-out; the record is a
        compare-and-set from QueuedGlobally, so a cancel that lands in between stands."""
        if await self.queue.settle(item, outcome, detail):
            status: SharedRunStatus = changes.pop("status")
            await self.runs.transition(run.shared_run_id, status, expect=_QUEUED, **changes)

    # -- delivery ---------------------------------------------------------------------

    async def _deliver(self, item: ClaimedItem, run: SharedRun, admitted: Assign) -> DispatchResult:
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
        except (DeliveryError, OSError, RedisError) as exc:
            await self.admission.release(admitted.reservation)
            await self.queue.settle(
                item,
                QueueItemStatus.PENDING,
                f"dispatch to {instance.instance_id} failed: {exc}",
            )
            if not isinstance(exc, DeliveryError) or exc.reason in FAULT_REASONS:
                await self.suspects.failed(instance.instance_id, f"{type(exc).__name__}: {exc}")
            return DispatchResult.refused(
                run, Decision.ASSIGN, str(exc), requeued=True, instance_id=instance.instance_id
            )
        except BaseException:
            await self.admission.release(admitted.reservation)
            with contextlib.suppress(Exception):
                await self.queue.settle(item, QueueItemStatus.PENDING, "dispatch interrupted")
            raise
        return await self._accepted(item, run, admitted, run_id)

    async def _accepted(
        self, item: ClaimedItem, run: SharedRun, admitted: Assign, run_id: str
    ) -> DispatchResult:
        """The runtime accepted: only now the queue item and the shared run are Dispatched."""
        instance_id = admitted.instance.instance_id
        await self.admission.confirm(admitted.reservation)
        if admitted.reservation.instance_had_failures:
            await self.suspects.succeeded(instance_id)
        settled = await self.queue.settle(item, QueueItemStatus.DISPATCHED, instance_id)
        if not settled and await self.queue.status(run.shared_run_id, item.tenant_id) is (
            QueueItemStatus.CANCELLED
        ):
            return await self.cancelled_in_flight(run, admitted, run_id)
        now = int(time.time() * 1000)
        # From QueuedGlobally; a run whose outcome already ended it keeps its end.
        await self.runs.record_dispatched(
            [(run.shared_run_id, self.dispatched_changes(instance_id, run_id, now))]
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
            instance_id=instance_id,
            run_id=run_id,
            latency_s=max(0.0, (now - run.created_at_ms) / 1000),
        )

    def dispatched_changes(self, instance_id: str, run_id: str, now_ms: int) -> dict[str, Any]:
        """What a shared run records when its runtime accepted it."""
        return {
            "assigned_instance_id": instance_id,
            "run_id": run_id,
            "pump_runtime_instance_id": self.identity.runtime_instance_id,
            "pump_worker_id": self.identity.worker_id,
            "dispatched_at_ms": now_ms,
            "reason": None,
        }

    async def cancelled_in_flight(
        self, run: SharedRun, admitted: Assign, run_id: str
    ) -> DispatchResult:
        """Cancelled while this pump held the claim, after the runtime accepted: cancel
        that local run and leave the shared run Cancelled (not Dispatched)."""
        await cancel_run(self.run_index, self.executions, run_id, run.snapshot.tenant_id)
        await self.admission.release(admitted.reservation)
        await self.runs.transition(
            run.shared_run_id,
            SharedRunStatus.CANCELLED,
            assigned_instance_id=admitted.instance.instance_id,
            run_id=run_id,
            reason=CANCELLED_IN_FLIGHT,
        )
        return DispatchResult.refused(
            run,
            None,
            CANCELLED_IN_FLIGHT,
            requeued=False,
            instance_id=admitted.instance.instance_id,
            run_id=run_id,
        )
