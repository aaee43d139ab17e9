"""The control plane: submit, queue, pump, admit, scale out, requeue, cancel.

:class:`ControlPlane` wires the shared run store, the shared queue, admission, the
dispatcher and pump, the scale-out watcher and the fulfilled-run requeuer. Submit
modes:

* ``QueueFirst`` — the run becomes QueuedGlobally with a Pending queue item; no
  RunId, no ExecutionId until a pump dispatches it;
* ``DirectDispatch`` — admission runs at once and its decision is kept
  (AssignToInstance / QueueGlobally / RequestScaleOut / Reject).

Whether manual drain is allowed and whether the background pump (with its readiness
gate) runs are fields of :class:`~airuntime.control_plane.settings.ControlPlaneSettings`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from redis.asyncio import Redis

from airuntime.control_plane.admission import Admission, Assign, Decision
from airuntime.control_plane.dispatch import (
    DispatchObserver,
    PumpIdentity,
    SharedRunDispatcher,
    cancel_local_run,
)
from airuntime.control_plane.pump import BackgroundPump, PumpResult, SharedQueuePump
from airuntime.control_plane.run_details import (
    ExecutionProgress,
    RunRecordView,
    SharedRunDetails,
)
from airuntime.control_plane.scale_out import (
    FulfilledRunRequeuer,
    ScaleOutProvider,
    ScaleOutStore,
    ScaleOutWatcher,
)
from airuntime.control_plane.settings import ControlPlaneSettings, SubmitMode
from airuntime.control_plane.shared_queue import SharedQueue
from airuntime.control_plane.shared_runs import SharedRun, SharedRunStatus, SharedRunStore
from airuntime.core import keys
from airuntime.core.context import ExecutionContextSnapshot, use_context
from airuntime.core.errors import AirError
from airuntime.core.tasks import cancel_and_wait
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import HandlerRegistry
from airuntime.engine.pipeline import PipelineError, compile_pipeline, parse_pipeline
from airuntime.fleet.discovery import publish_control_plane
from airuntime.fleet.providers import LocalProvider, RuntimeProvider, provider_for
from airuntime.fleet.registry import InstanceDescriptor, Registry
from airuntime.fleet.run_index import RunIndex
from airuntime.fleet.runs import RunRecord


class ControlPlaneError(AirError):
    """A control-plane request was refused (bad input, unknown run, pump disabled)."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class ControlPlane:
    """The control plane's operations over one Redis, and the loops it runs once started."""

    def __init__(
        self,
        redis: Redis,
        settings: ControlPlaneSettings | None = None,
        *,
        local: LocalProvider | None = None,
        scale_out_provider: ScaleOutProvider | None = None,
        handlers: HandlerRegistry | None = None,
        observer: DispatchObserver | None = None,
        worker_id: str = "pump-0",
    ) -> None:
        self.redis = redis
        self.settings = settings or ControlPlaneSettings()
        self.local = local or LocalProvider()
        self.handlers = handlers
        self.runs = SharedRunStore(redis)
        self.queue = SharedQueue(redis, claim_lease_ms=self.settings.claim_lease_ms)
        self.registry = Registry(redis)
        self.run_index = RunIndex(redis)
        self.executions = ExecutionStore(redis)
        self.admission = Admission(redis, scale_out_enabled=self.settings.scale_out_enabled)
        self.scale_outs = ScaleOutStore(redis)
        self.scale_out_provider = scale_out_provider
        self._providers: dict[str, RuntimeProvider] = {}
        self.identity = PumpIdentity(
            self.settings.control_plane_id, f"{self.settings.control_plane_id}/{worker_id}"
        )
        self.dispatcher = SharedRunDispatcher(
            self.runs,
            self.queue,
            self.admission,
            self.provider,
            self.scale_outs,
            self.identity,
            observer,
        )
        self.pump = SharedQueuePump(self.dispatcher)
        self.background = BackgroundPump(self.pump, self.registry)
        self._tasks: list[asyncio.Task[None]] = []

    def provider(self, instance: InstanceDescriptor) -> RuntimeProvider:
        name = instance.provider if instance.instance_id not in self.local.instances else "local"
        if name not in self._providers:
            self._providers[name] = provider_for(name, redis=self.redis, local=self.local)
        return self._providers[name]

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        await self._publish_discovery()
        self._tasks.append(asyncio.create_task(self._discovery_heartbeat(), name="cp-discovery"))
        if self.settings.pump_enabled and self.settings.background_pump:
            self._tasks.append(
                asyncio.create_task(self.background.run(), name="cp-background-pump")
            )
        if self.scale_out_provider is not None:
            watcher = ScaleOutWatcher(self.scale_outs, self.scale_out_provider)
            requeuer = FulfilledRunRequeuer(self.scale_outs, self.runs, self.queue)
            self._tasks.append(asyncio.create_task(watcher.run(), name="cp-scale-out-watcher"))
            self._tasks.append(asyncio.create_task(requeuer.run(), name="cp-requeue"))

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks.clear()
        if self.scale_out_provider is not None:
            await self.scale_out_provider.close()
        with contextlib.suppress(Exception):
            await self.redis.delete(keys.control_plane())

    async def _publish_discovery(self) -> None:
        await publish_control_plane(self.redis, self.settings.control_plane_id)

    async def _discovery_heartbeat(self) -> None:
        while True:
            await asyncio.sleep(3)
            await self._publish_discovery()

    # -- submit / read / cancel -----------------------------------------------------------------

    async def submit(
        self,
        pipeline: dict[str, Any],
        snapshot: ExecutionContextSnapshot,
        *,
        inputs: dict[str, Any] | None = None,
        metadata: dict[str, str] | None = None,
        mode: SubmitMode | None = None,
    ) -> SharedRun:
        """Persist a shared run and place it according to the submit mode."""
        try:
            spec = parse_pipeline(pipeline)
            compile_pipeline(spec, self.handlers)
        except PipelineError as exc:
            raise ControlPlaneError(f"pipeline: {exc}") from None
        now = int(time.time() * 1000)
        run = SharedRun(
            shared_run_id=SharedRunStore.new_id(),
            status=SharedRunStatus.SUBMITTED,
            pipeline_id=spec.id,
            pipeline=pipeline,
            inputs=inputs or {},
            snapshot=snapshot,
            metadata=metadata or {},
            created_at_ms=now,
            updated_at_ms=now,
        )
        await self.runs.create(run)
        run = await self.runs.update(run.shared_run_id, status=SharedRunStatus.QUEUED_GLOBALLY)
        await self.queue.enqueue(run.shared_run_id, snapshot.tenant_id)
        if (mode or self.settings.submit_mode) is SubmitMode.DIRECT_DISPATCH:
            # Keep the real admission decision: dispatch this very run now.
            await self.dispatcher.dispatch_run(run.shared_run_id)
        else:
            self.background.wake.set()
        return await self.runs.require(run.shared_run_id)

    async def _visible(self, shared_run_id: str, tenant_id: str | None) -> SharedRun | None:
        """The run, if ``tenant_id`` may see it (None: no tenant scope, internal callers)."""
        if tenant_id is None:
            return await self.runs.get(shared_run_id)
        return await self.runs.get_for_tenant(shared_run_id, tenant_id)

    async def get(self, shared_run_id: str, tenant_id: str | None) -> SharedRunDetails | None:
        """The run with RunId/ExecutionId/step states once known; None when invisible."""
        run = await self._visible(shared_run_id, tenant_id)
        if run is None:
            return None
        details = SharedRunDetails.of(run, await self.queue.item(shared_run_id))
        if run.run_id:
            record = await self.run_index.get_for_tenant(run.run_id, run.snapshot.tenant_id)
            if record is not None:
                await self._add_runtime_side(details, record)
        return details

    async def _add_runtime_side(self, details: SharedRunDetails, record: RunRecord) -> None:
        details.run = RunRecordView.of(record)
        details.execution_id = record.execution_id
        if record.execution_id:
            with contextlib.suppress(AirError):
                info = await self.executions.info(record.execution_id)
                details.execution = ExecutionProgress.of(info)
                details.steps = await self.executions.step_states(record.execution_id)

    async def list(self, tenant_id: str | None, limit: int = 100) -> list[SharedRun]:
        return await self.runs.list(tenant_id, limit)

    async def cancel(self, shared_run_id: str, tenant_id: str | None) -> SharedRun | None:
        run = await self._visible(shared_run_id, tenant_id)
        if run is None:
            return None
        tenant = run.snapshot.tenant_id
        if run.status is SharedRunStatus.DISPATCHED and run.run_id:
            await cancel_local_run(self.run_index, self.executions, run.run_id, tenant)
            return await self.runs.update(shared_run_id, reason="cancel requested")
        if await self.queue.cancel(shared_run_id) == 0:
            # A pump settled the item Dispatched after the run was read above: the
            # runtime accepted it, so cancel the runtime run (the shared run stays as the
            # pump records it, Dispatched).
            run_id = run.run_id or await self.run_index.run_for_shared(shared_run_id)
            if run_id is not None:
                await cancel_local_run(self.run_index, self.executions, run_id, tenant)
            return await self.runs.update(shared_run_id, reason="cancel requested")
        return await self.runs.update(
            shared_run_id, status=SharedRunStatus.CANCELLED, reason="cancelled"
        )

    async def drain(
        self, max_count: int = 100, *, stop_on_failure: bool = False, target: str | None = None
    ) -> PumpResult:
        """Manual drain (API/CLI/MCP); ``stop_on_failure`` stops at the first failed cycle."""
        if not self.settings.pump_enabled:
            raise ControlPlaneError(
                "the shared queue pump is disabled (pump_enabled = false)", status=409
            )
        return await self.pump.pump_once(max_count, stop_on_failure=stop_on_failure, target=target)

    async def admit_preview(self, snapshot: ExecutionContextSnapshot) -> Decision:
        """What admission would decide for this tenant now (does not reserve)."""
        with use_context(snapshot):
            result = await self.admission.admit()
        if isinstance(result, Assign):
            await self.admission.release(result.reservation)
        return result.decision
