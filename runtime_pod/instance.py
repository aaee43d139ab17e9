"""One runtime instance: local queue, background controller, worker capacity,
registry heartbeat, and adoption of what dead instances leave behind.

Accepting a run creates its ``RunId`` (idempotent by SharedRunId, the request must
carry an ExecutionContextSnapshot); the background controller starts queued runs
while a run slot *and* a worker are free, restores the run's snapshot, creates the
``ExecutionId`` and runs the DAG with ``min(WorkerCount, MaxLocalWorkersPerExecution,
AvailableWorkerCount)`` workers of this instance. With no worker free it waits.

The queue and the run index live in Redis, so nothing is lost when an instance dies:
a live instance that the run's tenant may use adopts the dead instance's queued runs
(into its own queue) and running executions (their state is in Redis; the engine
recovers the dead workers' claims). Idle workers may also *assist* running
executions of visible tenants; each instance respects its own
MaxLocalWorkersPerExecution.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.core.context import use_context
from airuntime.core.errors import AirError
from airuntime.core.tasks import cancel_and_wait
from airuntime.core.validation import format_validation_error
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import HandlerRegistry
from airuntime.engine.pipeline import PipelineError, compile_pipeline, parse_pipeline
from airuntime.engine.status import ExecutionStatus
from airuntime.engine.worker_pool import PoolSettings, WorkerPool
from airuntime.fleet.instance_settings import InstanceConfig
from airuntime.fleet.registry import (
    CapacityDescriptor,
    InstanceDescriptor,
    InstanceStatus,
    Registry,
)
from airuntime.fleet.run_index import RunIndex
from airuntime.fleet.runs import RunRecord, RunRequest, RunStatus
from airuntime.fleet.tenancy import TenantSettings, is_visible
from runtime_pod.step_slots import StepSlotController

log = logging.getLogger(__name__)


class RunRefused(AirError):
    """The instance will not take the run; ``reason`` is a short machine-readable code."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


_TERMINAL_TO_RUN = {
    ExecutionStatus.SUCCEEDED: RunStatus.COMPLETED,
    ExecutionStatus.FAILED: RunStatus.FAILED,
    ExecutionStatus.CANCELLED: RunStatus.CANCELLED,
}


@dataclass
class _Participation:
    run_id: str
    execution_id: str | None
    workers: int
    task: asyncio.Task[None]
    assisting: bool = False


@dataclass
class InstanceHooks:
    """Observability callbacks (metrics); all optional."""

    on_step: Callable[[str, str, str, float], None] | None = None
    on_run_state: Callable[[str, str], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class RuntimeInstance:
    """A dispatch target: accepts runs, executes them, publishes its capacity."""

    def __init__(
        self,
        redis: Redis,
        config: InstanceConfig,
        instance_id: str,
        *,
        endpoint: str = "",
        handlers: HandlerRegistry | None = None,
        slots: StepSlotController | None = None,
        hooks: InstanceHooks | None = None,
    ) -> None:
        self.redis = redis
        self.config = config
        self.instance_id = instance_id
        self.endpoint = endpoint
        self.handlers = handlers
        self.slots = slots or StepSlotController(config.max_concurrent_step_tasks)
        self.hooks = hooks or InstanceHooks()
        self.store = ExecutionStore(redis)
        self.index = RunIndex(redis)
        self.registry = Registry(redis)
        self.pool = WorkerPool(
            self.store,
            handlers,
            PoolSettings(workers=config.workers, lease_ms=config.lease_ms),
            pool_id=f"{instance_id}@{socket.gethostname()}",
            slots=self.slots,
            observer=self.hooks.on_step,
        )
        self.paused = False
        self.status = InstanceStatus.STARTING
        self.active_workers = 0
        self.participations: dict[str, _Participation] = {}
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._last_tenant_slot_limit: int | None = None
        self._tenant_settings_seen = False
        self.registered = asyncio.Event()
        self.control_plane_id: str | None = None
        self._changed = asyncio.Event()
        self.last_capacity: CapacityDescriptor | None = None

    # -- capacity ------------------------------------------------------------------

    @property
    def running_runs(self) -> int:
        return sum(1 for p in self.participations.values() if not p.assisting)

    @property
    def available_workers(self) -> int:
        return max(0, self.config.workers - self.active_workers)

    async def capacity(self) -> CapacityDescriptor:
        self.last_capacity = CapacityDescriptor.compute(
            worker_count=self.config.workers,
            active_worker_count=self.active_workers,
            max_local_workers_per_execution=self.config.max_local_workers_per_execution,
            queued_run_count=await self.index.queue_length(self.instance_id),
            running_run_count=self.running_runs,
            queue_capacity=self.config.queue_capacity,
            max_concurrent_runs=self.config.max_concurrent_runs,
            is_queue_paused=self.paused or self._stopping,
        )
        return self.last_capacity

    async def descriptor(self) -> InstanceDescriptor:
        cfg = self.config
        return InstanceDescriptor(
            instance_id=self.instance_id,
            status=self.status,
            heartbeat_at_ms=int(time.time() * 1000),
            provider=cfg.provider,
            endpoint=self.endpoint,
            host=socket.gethostname(),
            tenant_id=cfg.tenant_id,
            tenant_group_id=cfg.tenant_group_id,
            isolation_mode=cfg.isolation_mode,
            prefer_dedicated=cfg.prefer_dedicated,
            allow_shared_fallback=cfg.allow_shared_fallback,
            runtime_prefix=cfg.runtime_prefix,
            capacity=await self.capacity(),
            control_plane_id=self.control_plane_id,
        )

    # -- intake ----------------------------------------------------------------------

    async def accept(self, request: RunRequest | dict[str, Any]) -> str:
        """Put a run in the local queue; return its RunId (same one for a repeated SharedRunId)."""
        if isinstance(request, dict):
            try:
                request = RunRequest.model_validate(request)
            except ValidationError as exc:
                problem = format_validation_error(exc, with_value=False)
                raise RunRefused(f"run request {problem}", reason="invalid") from None
        existing = await self.index.run_for_shared(request.shared_run_id)
        if existing is not None and (await self.index.get_unchecked(existing)) is not None:
            return existing
        if self._stopping:
            raise RunRefused(
                f"Runtime instance {self.instance_id} is shutting down.", reason="stopping"
            )
        if self.paused:
            raise RunRefused(f"The queue of {self.instance_id} is paused.", reason="paused")
        try:
            compile_pipeline(parse_pipeline(request.pipeline), self.handlers)
        except PipelineError as exc:
            raise RunRefused(f"run request pipeline: {exc}", reason="invalid") from None
        if await self.index.queue_length(self.instance_id) >= self.config.queue_capacity:
            raise RunRefused(
                f"The queue of {self.instance_id} is full ({self.config.queue_capacity} runs).",
                reason="queue_full",
            )
        run_id, created = await self.index.accept(self.instance_id, request)
        if created and self.hooks.on_run_state:
            self.hooks.on_run_state(run_id, RunStatus.QUEUED.value)
        self._kick.set()
        self._changed.set()
        return run_id

    def pause_queue(self) -> None:
        self.paused = True

    def resume_queue(self) -> None:
        self.paused = False
        self._kick.set()

    # -- tenant-aware run operations ------------------------------------------------

    async def run_status(self, run_id: str, tenant_id: str) -> RunRecord | None:
        """The run if ``tenant_id`` may see it; None ("not found") otherwise."""
        return await self.index.get_for_tenant(run_id, tenant_id)

    async def cancel_run(self, run_id: str, tenant_id: str) -> RunRecord | None:
        record = await self.index.get_for_tenant(run_id, tenant_id)
        if record is None:
            return None  # never touch the controller for a run the caller may not see
        if record.status is RunStatus.QUEUED and await self.index.remove_queued(
            record.instance_id, run_id
        ):
            await self.index.mark_finished(run_id, RunStatus.CANCELLED, "cancelled while queued")
            self._run_state(run_id, RunStatus.CANCELLED)
        elif record.execution_id and not record.status.terminal:
            with contextlib.suppress(AirError):
                await self.store.cancel(record.execution_id, actor=f"tenant {tenant_id}")
        return await self.index.get_for_tenant(run_id, tenant_id)

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        self.status = InstanceStatus.READY
        await self.registry.publish(await self.descriptor(), self.config.heartbeat_ttl_ms)
        self.registered.set()
        self._tasks = [
            asyncio.create_task(self._controller(), name=f"controller:{self.instance_id}"),
            asyncio.create_task(self._heartbeat(), name=f"heartbeat:{self.instance_id}"),
            asyncio.create_task(self._publisher(), name=f"publisher:{self.instance_id}"),
        ]
        if self.config.provider == "redis":
            self._tasks.append(asyncio.create_task(self._inbox(), name=f"inbox:{self.instance_id}"))

    async def stop(self, *, drain_timeout_s: float = 30.0) -> None:
        """Stop taking runs, let running work drain, unregister (no rediscovery needed)."""
        self._stopping = True
        self.status = InstanceStatus.DRAINING
        with contextlib.suppress(Exception):
            await self.registry.publish(await self.descriptor(), self.config.heartbeat_ttl_ms)
        await cancel_and_wait(self._tasks)
        running = [p.task for p in self.participations.values()]
        if running:
            _, pending = await asyncio.wait(running, timeout=drain_timeout_s)
            # claims expire; another instance adopts the executions
            await cancel_and_wait(pending)
        # Only now: a step refused by a shut-down slot controller counts as a failed
        # attempt, so closing admission while participations still claim steps would
        # fail the runs being drained.
        self.slots.shutdown()
        with contextlib.suppress(Exception):
            await self.registry.unregister(self.instance_id)

    # -- background controller ----------------------------------------------------------

    async def _controller(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            while (
                not self.paused
                and not self._stopping
                and self.running_runs < self.config.max_concurrent_runs
                and self.available_workers > 0
            ):
                run_id = await self.index.pop_queued(self.instance_id)
                if run_id is None:
                    break
                loaded = await self.index.get_unchecked(run_id)
                if loaded is None or loaded[0].status is not RunStatus.QUEUED:
                    continue
                if self._effective_workers() == 0:
                    # An assist took the last worker while we awaited Redis: wait for one.
                    await self.index.push_front(self.instance_id, run_id)
                    break
                self._launch(loaded[0], loaded[1], assisting=False)

    def _effective_workers(self) -> int:
        return min(
            self.config.workers, self.config.max_local_workers_per_execution, self.available_workers
        )

    def _launch(self, record: RunRecord, request: RunRequest, *, assisting: bool) -> bool:
        """Start (or join) the run's execution with this instance's effective workers;
        False when no worker is free (callers retry later, nothing is started)."""
        workers = self._effective_workers()
        if workers == 0:
            return False
        self.active_workers += workers
        task = asyncio.create_task(
            self._execute(record, request, workers, assisting), name=f"run:{record.run_id}"
        )
        key = f"{record.run_id}:assist" if assisting else record.run_id
        self.participations[key] = _Participation(
            record.run_id, record.execution_id, workers, task, assisting
        )
        self._changed.set()

        def done(_: asyncio.Task[None]) -> None:
            self.participations.pop(key, None)
            self.active_workers -= workers
            self._kick.set()
            self._changed.set()

        task.add_done_callback(done)
        return True

    async def _execute(
        self, record: RunRecord, request: RunRequest, workers: int, assisting: bool
    ) -> None:
        run_id = record.run_id
        with use_context(record.snapshot):
            try:
                plan = compile_pipeline(parse_pipeline(request.pipeline), self.handlers)
            except PipelineError as exc:
                # A helper that cannot run this pipeline (e.g. lacks a handler) just does
                # not assist; the run is the owner's to fail, not the helper's.
                if not assisting:
                    await self.index.mark_finished(run_id, RunStatus.FAILED, str(exc))
                    self._run_state(run_id, RunStatus.FAILED)
                return
            eid = record.execution_id or f"ex-{uuid.uuid4().hex}"
            if not assisting:
                if record.status is RunStatus.QUEUED:
                    await self.index.mark_running(run_id, eid)
                await self.store.create(
                    plan, execution_id=eid, context=record.snapshot, inputs=request.inputs
                )
                ledger = {
                    "type": "run_started",
                    "run_id": run_id,
                    "runtime.instance.id": self.instance_id,
                    "assigned.runtime.instance.id": request.metadata.get(
                        "assigned.runtime.instance.id", self.instance_id
                    ),
                    "max.local.workers.per.execution": str(
                        self.config.max_local_workers_per_execution
                    ),
                    "effective.worker.count.per.execution": str(workers),
                    "tenant.id": record.tenant_id,
                    "tenant.groupId": record.tenant_group_id or "",
                    "runtime.isolation.mode": self.config.isolation_mode.value,
                }
                await self.redis.xadd(keys.execution_keys(eid).events, ledger)  # type: ignore[arg-type]
                await self.index.set_metadata(run_id, {k: v for k, v in ledger.items() if "." in k})
                if self.hooks.on_run_state:
                    self.hooks.on_run_state(run_id, RunStatus.RUNNING.value)
            try:
                final = await self.pool.run(eid, workers=workers)
            except AirError as exc:
                if not assisting:
                    await self.index.mark_finished(run_id, RunStatus.FAILED, str(exc))
                    self._run_state(run_id, RunStatus.FAILED)
                return
            if not assisting:
                status = _TERMINAL_TO_RUN.get(final, RunStatus.FAILED)
                await self.index.mark_finished(
                    run_id, status, None if status is RunStatus.COMPLETED else final
                )
                if self.hooks.on_run_state:
                    self.hooks.on_run_state(run_id, status.value)

    def _run_state(self, run_id: str, status: RunStatus) -> None:
        if self.hooks.on_run_state:
            self.hooks.on_run_state(run_id, status.value)

    # -- heartbeat, live settings, adoption, assistance ------------------------------------

    async def _publisher(self) -> None:
        """Publish the descriptor soon after every change (accept, start, finish), so
        admission does not wait a heartbeat to see capacity move. Debounced."""
        while True:
            await self._changed.wait()
            await asyncio.sleep(0.02)
            self._changed.clear()
            try:
                await self.registry.publish(await self.descriptor(), self.config.heartbeat_ttl_ms)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("publishing the descriptor of %s failed", self.instance_id)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            try:
                await self.registry.publish(await self.descriptor(), self.config.heartbeat_ttl_ms)
                await self._apply_tenant_settings()
                await self._adopt_orphans()
                if self.config.assist:
                    await self._assist()
            except asyncio.CancelledError:
                raise
            except Exception:  # keep heartbeating whatever one round hit
                log.exception("heartbeat round of %s failed", self.instance_id)
            self._kick.set()

    async def _apply_tenant_settings(self) -> None:
        """The operator publishes maxConcurrentStepTasks in the tenant settings: apply it live."""
        if not self.config.tenant_id:
            return
        raw = await self.redis.get(keys.tenant_settings(self.config.tenant_id))
        limit = (
            None
            if raw is None
            else TenantSettings.model_validate_json(raw).max_concurrent_step_tasks
        )
        first = not self._tenant_settings_seen
        self._tenant_settings_seen = True
        previous, self._last_tenant_slot_limit = self._last_tenant_slot_limit, limit
        # Settings present at startup are the baseline (the pod started with the same
        # value from its environment); only later changes are applied, so a limit set
        # locally through the settings API is not overwritten by an unchanged value.
        if limit is not None and not first and limit != previous:
            self.slots.set_limit(limit)

    def _may_serve(self, tenant: TenantSettings) -> bool:
        """Whether the run's tenant may use this instance (same rules as admission)."""
        return is_visible(
            tenant=tenant,
            instance_mode=self.config.isolation_mode,
            instance_tenant_id=self.config.tenant_id,
            instance_tenant_group_id=self.config.tenant_group_id,
        )

    async def _adopt_orphans(self) -> None:
        """Take over what dead instances left behind (queued runs into this queue,
        running executions here) for tenants this instance may serve, and resume own
        running runs that execute nowhere."""
        if self._stopping:
            return
        live = {d.instance_id for d in await self.registry.list_all()} | {self.instance_id}
        for state in (RunStatus.QUEUED, RunStatus.RUNNING):
            for run_id in await self.index.in_state(state):
                loaded = await self.index.get_unchecked(run_id)
                if loaded is not None and loaded[0].status is state:
                    await self._reconcile(*loaded, live=live)

    async def _reconcile(self, record: RunRecord, request: RunRequest, *, live: set[str]) -> None:
        """One queued or running run: resume it if it is ours, adopt it if orphaned."""
        if record.instance_id == self.instance_id:
            # Ours but not executing here (adopted when no worker was free, or this id
            # restarted): resume it once a worker is free.
            if record.status is RunStatus.RUNNING and record.run_id not in self.participations:
                self._launch(record, request, assisting=False)
            return
        if record.instance_id in live or not await self._may_adopt(record):
            return
        if not await self.index.adopt(record.run_id, record.instance_id, self.instance_id):
            return  # another instance was first
        log.warning(
            "%s adopted %s run %s from %s",
            self.instance_id,
            record.status.value,
            record.run_id,
            record.instance_id,
        )
        if record.status is RunStatus.QUEUED:
            await self.index.remove_queued(record.instance_id, record.run_id)
            await self.redis.rpush(keys.instance_queue(self.instance_id), record.run_id)
        else:
            adopted = record.model_copy(update={"instance_id": self.instance_id})
            self._launch(adopted, request, assisting=False)

    async def _may_adopt(self, record: RunRecord) -> bool:
        """The run's tenant may use this instance, and a running run finds a worker."""
        if not self._may_serve(await self.registry.tenant(record.tenant_id)):
            return False
        return record.status is not RunStatus.RUNNING or self.available_workers > 0

    async def _assist(self) -> None:
        """Lend idle workers to running executions owned by other live instances."""
        if self._stopping or self.available_workers == 0:
            return
        if await self.index.queue_length(self.instance_id) > 0:
            return  # own queued runs come first
        for run_id in await self.index.in_state(RunStatus.RUNNING, limit=100):
            if self.available_workers == 0:
                return
            if run_id in self.participations or f"{run_id}:assist" in self.participations:
                continue
            loaded = await self.index.get_unchecked(run_id)
            if (
                loaded is None
                or loaded[0].execution_id is None
                or loaded[0].instance_id == self.instance_id
            ):
                continue
            record, request = loaded
            if not self._may_serve(await self.registry.tenant(record.tenant_id)):
                continue
            assert record.execution_id is not None  # runs without one were skipped above
            lease = keys.assist_lease(record.execution_id, self.instance_id)
            if not await self.redis.set(lease, "1", nx=True, px=self.config.heartbeat_ttl_ms * 10):
                continue
            if not self._launch(record, request, assisting=True):
                await self.redis.delete(lease)

    # -- redis provider: the instance's stream inbox ----------------------------------------

    async def _inbox(self) -> None:
        stream = keys.instance_inbox(self.instance_id)
        group = "runtime"
        with contextlib.suppress(Exception):
            await self.redis.xgroup_create(stream, group, id="0", mkstream=True)
        consumer = f"{self.instance_id}@{socket.gethostname()}"
        while True:
            try:
                reply: Any = await self.redis.xreadgroup(
                    group, consumer, {stream: ">"}, count=32, block=1000
                )
            except asyncio.CancelledError:
                raise
            except Exception:  # a Redis hiccup must not end intake for good
                log.exception("reading the inbox of %s failed; retrying", self.instance_id)
                await asyncio.sleep(1)
                with contextlib.suppress(Exception):
                    await self.redis.xgroup_create(stream, group, id="0", mkstream=True)
                continue
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    f = {
                        (k.decode() if isinstance(k, bytes) else k): (
                            v.decode() if isinstance(v, bytes) else v
                        )
                        for k, v in fields.items()
                    }
                    answer: dict[str, Any]
                    try:
                        body = json.loads(f.get("request", ""))
                    except ValueError:
                        body = None
                    try:
                        if not isinstance(body, dict):
                            raise RunRefused("run request: not a JSON object", reason="invalid")
                        # accept() validates the dict and names the offending field
                        # (e.g. "run request snapshot: Field required").
                        answer = {"run_id": await self.accept(body)}
                    except RunRefused as exc:
                        answer = {"error": str(exc), "reason": exc.reason}
                    if f.get("reply_to"):
                        pipe = self.redis.pipeline(transaction=False)
                        pipe.rpush(f["reply_to"], json.dumps(answer))
                        pipe.expire(f["reply_to"], 300)
                        await pipe.execute()
                    await self.redis.xack(stream, group, entry_id)
                    await self.redis.xdel(stream, entry_id)
