"""One runtime instance: local queue, background controller, worker capacity,
registry heartbeat, and supervised background loops.

Accepting a run creates its ``RunId`` (:mod:`runtime_pod.intake`: idempotent by
SharedRunId, checked against the tenant's visibility and handler allowlist); the
background controller starts queued runs while a run slot *and* a worker are free and
creates the ``ExecutionId`` (``startRun-3.lua``); a participation
(:mod:`runtime_pod.participation`) runs the DAG with ``min(WorkerCount,
MaxLocalWorkersPerExecution, AvailableWorkerCount)`` workers of this instance and
records the run's end. With no worker free the run waits in the queue.

Every background loop -- controller, heartbeat, capacity publisher, inbox reader,
adoption, assistance, settings watcher, retention sweep -- runs under a
:class:`~airuntime.core.supervision.Supervisor`: a loop that fails (Redis restarted,
a connection dropped) is logged, counted (``InstanceHooks.on_loop_error``, the
``airuntime_loop_errors_total`` metric) and restarted with backoff; its health is
published (``unhealthy_loops``) and reported by ``/readyz``, and while the controller
is unhealthy the instance advertises ``can_accept_run: false``. If the heartbeat
cannot be written, the registry entry simply expires.

The queue and the run index live in Redis, so nothing is lost when an instance dies:
live instances adopt what it left (:mod:`runtime_pod.adoption`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airuntime.core import keys
from airuntime.core.errors import AirError
from airuntime.core.redis_client import RedisClient
from airuntime.core.supervision import Backoff, LoopContext, Supervisor, log_task_failure
from airuntime.core.tasks import cancel_and_wait
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import HandlerRegistry
from airuntime.engine.payloads import PayloadOffload
from airuntime.engine.pipeline import PlanCache
from airuntime.engine.worker_pool import PoolSettings, WorkerPool
from airuntime.fleet.instance_settings import InstanceConfig
from airuntime.fleet.registry import (
    CapacityDescriptor,
    InstanceDescriptor,
    InstanceStatus,
    Registry,
)
from airuntime.fleet.run_cancel import CancelOutcome, cancel_run
from airuntime.fleet.run_index import RunIndex
from airuntime.fleet.runs import RunRecord, RunRequest, RunStatus
from airuntime.fleet.tenancy import TenantSettings, is_visible
from runtime_pod.adoption import Adoption
from runtime_pod.inbox import Inbox
from runtime_pod.intake import RunRefused, accept_run, accept_runs
from runtime_pod.participation import Participation, run_metadata, start_entry
from runtime_pod.step_slots import StepSlotController

__all__ = ["LOOPS", "InstanceHooks", "RunRefused", "RuntimeInstance"]

log = logging.getLogger(__name__)

CONTROLLER = "controller"
LOOPS = (
    CONTROLLER,
    "heartbeat",
    "publisher",
    "inbox",
    "adoption",
    "assistance",
    "settings-watcher",
    "retention",
)
"""Names of an instance's supervised loops (``inbox`` only with the ``redis`` provider,
``assistance`` only with ``assist``)."""

RETENTION_EVERY_HEARTBEATS = 10
"""The retention sweep runs once every this many heartbeats."""

PUBLISH_GUESSES = 3
"""Publications tried with a guessed queue length before reading it (:meth:`_publish`)."""


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
    on_loop_error: Callable[[str, BaseException], None] | None = None
    """``(loop, error)`` when a background loop fails, or a participation waits out a
    Redis failure (loop ``participation``)."""
    extra: dict[str, Any] = field(default_factory=dict)


class RuntimeInstance:
    """A dispatch target: accepts runs, executes them, publishes its capacity."""

    def __init__(
        self,
        redis: RedisClient,
        config: InstanceConfig,
        instance_id: str,
        *,
        endpoint: str = "",
        handlers: HandlerRegistry | None = None,
        slots: StepSlotController | None = None,
        hooks: InstanceHooks | None = None,
        backoff: Backoff | None = None,
        payloads: PayloadOffload | None = None,
    ) -> None:
        self.redis = redis
        self.config = config
        self.instance_id = instance_id
        self.endpoint = endpoint
        self.handlers = handlers
        self.plans = PlanCache(handlers)
        self.slots = slots or StepSlotController(config.max_concurrent_step_tasks)
        self.hooks = hooks or InstanceHooks()
        self.store = ExecutionStore(redis)
        self.index = RunIndex(redis, retention_s=config.run_retention_s)
        self.registry = Registry(redis)
        self.pool = WorkerPool(
            self.store,
            handlers,
            PoolSettings(workers=config.workers, lease_ms=config.lease_ms),
            pool_id=f"{instance_id}@{socket.gethostname()}",
            slots=self.slots,
            observer=self.hooks.on_step,
            payloads=payloads,
        )
        self.supervisor = Supervisor(
            f"runtime {instance_id}", backoff=backoff, on_error=self.loop_failed
        )
        self.adoption = Adoption(self)
        self.inbox = Inbox(self) if config.provider == "redis" else None
        self.paused = False
        self.status = InstanceStatus.STARTING
        self.active_workers = 0
        self.participations: dict[str, _Participation] = {}
        self._starting: set[str] = set()
        self._kick = asyncio.Event()
        self._queue_left = True
        """Whether runs may wait in the local queue: False once the controller's read
        took the whole queue, until something could have queued more (an accept, an
        adoption, a heartbeat's kick: each kicks the controller, which reads again). A
        finished run kicks the controller only while this holds, so a run that ends
        with nothing queued behind it costs no read of an empty queue."""
        self._stopping = False
        self._last_tenant_slot_limit: int | None = None
        self._tenant_settings_seen = False
        self.registered = asyncio.Event()
        self.control_plane_id: str | None = None
        self._changed = asyncio.Event()
        self.last_capacity: CapacityDescriptor | None = None
        self._queue_length_seen = 0
        """The local queue's length the last publication found (its next guess)."""

    # -- capacity and health ---------------------------------------------------------

    @property
    def running_runs(self) -> int:
        return sum(1 for p in self.participations.values() if not p.assisting)

    @property
    def available_workers(self) -> int:
        return max(0, self.config.workers - self.active_workers)

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def controller_healthy(self) -> bool:
        """False while the controller loop fails (before start: True)."""
        health = self.supervisor.loops.get(CONTROLLER)
        return health is None or health.healthy

    def unhealthy_loops(self) -> list[str]:
        """Supervised loops failing right now: they failed and have not completed a
        round since (a loop still in its first round is starting, not failing). None
        before start and after stop."""
        if self._stopping:
            return []
        return [
            name
            for name, health in self.supervisor.loops.items()
            if not health.healthy and health.consecutive_errors > 0
        ]

    async def capacity(self, queued: int | None = None) -> CapacityDescriptor:
        """The capacity now, with the local queue's length read (or ``queued``)."""
        if queued is None:
            queued = await self.index.queue_length(self.instance_id)
        self.last_capacity = CapacityDescriptor.compute(
            worker_count=self.config.workers,
            active_worker_count=self.active_workers,
            max_local_workers_per_execution=self.config.max_local_workers_per_execution,
            queued_run_count=queued,
            running_run_count=self.running_runs,
            queue_capacity=self.config.queue_capacity,
            max_concurrent_runs=self.config.max_concurrent_runs,
            is_queue_paused=self.paused or self._stopping,
            controller_healthy=self.controller_healthy,
        )
        return self.last_capacity

    async def descriptor(self, queued: int | None = None) -> InstanceDescriptor:
        """What this instance publishes (``queued``: the local queue's length, if known)."""
        cfg = self.config
        return InstanceDescriptor(
            instance_id=self.instance_id,
            status=self.status,
            heartbeat_at_ms=int(time.time() * 1000),  # replaced by Redis time on publication
            provider=cfg.provider,
            endpoint=self.endpoint,
            host=socket.gethostname(),
            tenant_id=cfg.tenant_id,
            tenant_group_id=cfg.tenant_group_id,
            isolation_mode=cfg.isolation_mode,
            prefer_dedicated=cfg.prefer_dedicated,
            allow_shared_fallback=cfg.allow_shared_fallback,
            runtime_prefix=cfg.runtime_prefix,
            capacity=await self.capacity(queued),
            control_plane_id=self.control_plane_id,
            unhealthy_loops=tuple(self.unhealthy_loops()),
        )

    async def _publish(self) -> None:
        """Publish the descriptor. Where the local queue shares the descriptor's slot (a
        standalone server) the queue's length is not read first: the descriptor is made
        with the length the last publication found, and the script publishes it only
        if the queue still has it (else it answers the length, and the descriptor is
        made again with it) -- one round trip instead of two when it holds."""
        ttl = self.config.heartbeat_ttl_ms
        if self.index.buckets == 1:
            queue = self.index.queue_key(self.instance_id)
            for _ in range(PUBLISH_GUESSES):
                descriptor = await self.descriptor(self._queue_length_seen)
                published, value = await self.registry.publish_if_queued(descriptor, ttl, queue)
                if published:
                    return
                self._queue_length_seen = value
        # A cluster (the queue in another slot), or a queue that moved under every
        # guess: read its length, then publish.
        descriptor = await self.descriptor()
        self._queue_length_seen = descriptor.capacity.queued_run_count
        await self.registry.publish(descriptor, ttl)

    # -- intake ----------------------------------------------------------------------

    async def accept(self, request: RunRequest | dict[str, Any]) -> str:
        """Put a run in the local queue; return its RunId (same one for a repeated
        SharedRunId). Raises :class:`RunRefused` (see :mod:`runtime_pod.intake`)."""
        run_id, created = await accept_run(self, request)
        if created:
            self.run_state(run_id, RunStatus.QUEUED)
        self._kick.set()
        self._changed.set()
        return run_id

    async def accept_many(
        self, requests: list[RunRequest | dict[str, Any]]
    ) -> list[str | AirError]:
        """:meth:`accept` for a batch (one delivery carrying N runs): one RunId or one
        :class:`RunRefused` per request, in order."""
        answers = await accept_runs(self, requests)
        out: list[str | AirError] = []
        for answer in answers:
            if isinstance(answer, RunRefused):
                out.append(answer)
                continue
            run_id, created = answer
            if created:
                self.run_state(run_id, RunStatus.QUEUED)
            out.append(run_id)
        self._kick.set()
        self._changed.set()
        return out

    def may_serve(self, tenant: TenantSettings) -> bool:
        """Whether the tenant may use this instance (same rules as admission)."""
        return is_visible(
            tenant=tenant,
            instance_mode=self.config.isolation_mode,
            instance_tenant_id=self.config.tenant_id,
            instance_tenant_group_id=self.config.tenant_group_id,
        )

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
        outcome = await cancel_run(self.index, self.store, run_id, tenant_id)
        if outcome is CancelOutcome.NOT_FOUND:
            return None  # never touch the controller for a run the caller may not see
        if outcome is CancelOutcome.CANCELLED_QUEUED:
            self.run_state(run_id, RunStatus.CANCELLED)
            self._changed.set()
        return await self.index.get_for_tenant(run_id, tenant_id)

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Start the loops; return once the controller runs and the instance is registered."""
        self.status = InstanceStatus.READY
        self.pool.hold()  # one control subscription for the instance's life
        if self.config.step_slots_from_tenant:
            await self._apply_settings()  # the tenant's limit before the first run
        if self.inbox is not None:
            await self.inbox.ensure()  # deliverable from the moment it is registered
        self.supervisor.start(CONTROLLER, self._controller)
        await self.supervisor.wait_ok(CONTROLLER)
        await self._publish()
        self.registered.set()
        self._kick.set()
        self.supervisor.start("heartbeat", self._heartbeat)
        self.supervisor.start("publisher", self._publisher)
        self.supervisor.start("settings-watcher", self._every_heartbeat(self._apply_settings))
        self.supervisor.start("adoption", self._every_heartbeat(self.adoption.adopt_orphans))
        if self.config.assist:
            self.supervisor.start("assistance", self._every_heartbeat(self.adoption.assist))
        self.supervisor.start("retention", self._retention)
        if self.inbox is not None:
            self.supervisor.start("inbox", self.inbox.run)

    async def stop(self, *, drain_timeout_s: float = 30.0) -> None:
        """Stop taking runs, let running work drain, unregister (no rediscovery needed)."""
        self._stopping = True
        self.status = InstanceStatus.DRAINING
        with contextlib.suppress(Exception):
            await self._publish()
        await self.supervisor.stop()
        running = [p.task for p in self.participations.values()]
        if running:
            _, pending = await asyncio.wait(running, timeout=drain_timeout_s)
            # claims expire; another instance adopts the executions
            await cancel_and_wait(pending)
        # Only now: a step refused by a shut-down slot controller counts as a failed
        # attempt, so closing admission while participations still claim steps would
        # fail the runs being drained.
        self.slots.shutdown()
        await self.pool.release()
        if self.inbox is not None:
            with contextlib.suppress(Exception):
                await self.inbox.delete()
        with contextlib.suppress(Exception):
            await self.registry.unregister(self.instance_id)

    def loop_failed(self, loop: str, error: BaseException) -> None:
        """A loop failed (the supervisor restarts it): count it, publish the change."""
        self._changed.set()
        if self.hooks.on_loop_error is not None:
            self.hooks.on_loop_error(loop, error)

    # -- background controller ----------------------------------------------------------

    async def _controller(self, ctx: LoopContext) -> None:
        self._kick.set()  # a (re)started controller looks at its queue at once
        while True:
            await self._kick.wait()
            self._kick.clear()
            await self._start_queued()
            if not ctx.health.healthy:
                self._changed.set()  # recovered: can_accept_run may be true again
            ctx.ok()

    def _may_start(self) -> bool:
        # Not before it is registered: adoption treats an unregistered owner as dead.
        return (
            self.registered.is_set()
            and not self.paused
            and not self._stopping
            and self.running_runs + len(self._starting) < self.config.max_concurrent_runs
            and self.available_workers > 0
        )

    async def _start_queued(self) -> None:
        """Start queued runs while a run slot and a worker are free, a batch at a time:
        the head of the queue in one read, the records in one round trip, and the start
        scripts with the queue removals and the tenants' settings in one more
        (:meth:`~airuntime.fleet.run_index.RunIndex.start_batch`; on a cluster, one
        call after the other)."""
        self._queue_left = True  # unknown until a read shows the queue taken whole
        while self._may_start():
            room = self.config.max_concurrent_runs - self.running_runs - len(self._starting)
            ids = await self.index.queue_head(self.instance_id, room)
            if not ids:
                self._queue_left = False
                return
            ready: list[tuple[RunRecord, RunRequest]] = []
            for run_id, loaded in zip(ids, await self.index.load_queued(ids), strict=True):
                if isinstance(loaded, ValueError):
                    log.error(
                        "%s: run %s has a corrupt record (%s); dropped",
                        self.instance_id,
                        run_id,
                        loaded,
                    )
                    await self.index.remove_queued(self.instance_id, run_id)
                elif loaded is None or loaded[0].status is not RunStatus.QUEUED:
                    await self.index.remove_queued(self.instance_id, run_id)
                else:
                    ready.append(loaded)
            planned = await self._start(ready) if ready else 0
            if ready and not planned:
                return
            if len(ids) < room:
                # The read took the whole queue: nothing is left to start until an
                # accept (or a heartbeat) kicks the controller again, so it does not
                # read the queue once more only to find it empty -- unless workers ran
                # out before the last of them (a finished run kicks it then).
                self._queue_left = planned < len(ready)
                return

    async def _start(self, ready: list[tuple[RunRecord, RunRequest]]) -> int:
        """Take workers, mark the runs running with new ExecutionIds, launch them; how
        many got workers (the first of ``ready``, in order; 0 when no worker was free
        for the first one)."""
        plans: list[tuple[RunRecord, RunRequest, int, str]] = []
        for record, request in ready:
            workers = self._effective_workers()
            if workers == 0:
                # While the queue was read, adoption or assistance took the free workers:
                # the run stays queued (a participation's end kicks the controller again).
                break
            self.active_workers += workers
            self._starting.add(record.run_id)  # adoption must not resume it meanwhile
            plans.append((record, request, workers, f"ex-{uuid.uuid4().hex}"))
        if not plans:
            return 0
        try:
            # The batch's tenant settings read with the starts: each run's pipeline is
            # compiled with its tenant's allowlist as it stands now (Participation._plan).
            batch = await self.index.start_batch(
                self.instance_id,
                [(r.run_id, eid) for r, _, _, eid in plans],
                [run_metadata(start_entry(self, r, q, w)) for r, q, w, _ in plans],
                tenant_ids=[r.tenant_id for r, _, _, _ in plans],
            )
            started, tenants = batch.started, batch.tenants
        except BaseException:
            for record, _, workers, _ in plans:
                self._starting.discard(record.run_id)
                self.active_workers -= workers
            raise
        for (record, request, workers, eid), ok in zip(plans, started, strict=True):
            self._starting.discard(record.run_id)
            if not ok:
                self.active_workers -= workers
                continue
            running = record.model_copy(update={"status": RunStatus.RUNNING, "execution_id": eid})
            self._spawn(
                running,
                request,
                workers,
                assisting=False,
                just_started=True,
                tenant=tenants[record.tenant_id],
            )
        return len(plans)

    def _effective_workers(self) -> int:
        return min(
            self.config.workers, self.config.max_local_workers_per_execution, self.available_workers
        )

    # -- participations ------------------------------------------------------------------

    def participates(self, run_id: str) -> bool:
        """This instance runs (or is starting, or assists) ``run_id``."""
        return (
            run_id in self.participations
            or f"{run_id}:assist" in self.participations
            or run_id in self._starting
        )

    def launch(self, record: RunRecord, request: RunRequest, *, assisting: bool) -> bool:
        """Start (or join) the run's execution with this instance's effective workers;
        False when no worker is free (callers retry later, nothing is started)."""
        workers = self._effective_workers()
        if workers == 0:
            return False
        self.active_workers += workers
        self._spawn(record, request, workers, assisting=assisting)
        return True

    def _spawn(
        self,
        record: RunRecord,
        request: RunRequest,
        workers: int,
        *,
        assisting: bool,
        just_started: bool = False,
        tenant: TenantSettings | None = None,
    ) -> None:
        """Run a participation that already holds ``workers``; they return when it ends
        (``just_started``: the controller's start script just made the run running here;
        ``tenant``: the run's tenant settings, read with the start)."""
        body = Participation(
            self,
            record,
            request,
            workers,
            assisting=assisting,
            just_started=just_started,
            tenant=tenant,
        )
        task = asyncio.create_task(body.run(), name=f"run:{record.run_id}")
        key = f"{record.run_id}:assist" if assisting else record.run_id
        self.participations[key] = _Participation(
            record.run_id, body.execution_id, workers, task, assisting
        )
        self._changed.set()

        def done(finished: asyncio.Task[None]) -> None:
            self.participations.pop(key, None)
            self.active_workers -= workers
            if self._queue_left:  # a run may wait for the slot and workers freed here
                self._kick.set()
            self._changed.set()
            log_task_failure(finished)

        task.add_done_callback(done)

    def kick(self) -> None:
        """Make the controller look at the queue now."""
        self._kick.set()

    def run_state(self, run_id: str, status: RunStatus) -> None:
        if self.hooks.on_run_state:
            self.hooks.on_run_state(run_id, status.value)

    # -- heartbeat, publication, settings, retention ---------------------------------------

    async def _heartbeat(self, ctx: LoopContext) -> None:
        while True:
            await self._publish()
            if self.inbox is not None:
                await self.inbox.refresh()
            ctx.ok()
            self._kick.set()  # the controller re-checks its queue every heartbeat
            await asyncio.sleep(self.config.heartbeat_s)

    async def _publisher(self, ctx: LoopContext) -> None:
        """Publish the descriptor soon after every change (accept, start, finish, a loop
        failing), so admission does not wait a heartbeat to see capacity move."""
        self._changed.set()  # a (re)started publisher publishes at once
        while True:
            await self._changed.wait()
            await asyncio.sleep(0.02)  # debounce
            self._changed.clear()
            await self._publish()
            ctx.ok()

    def _every_heartbeat(self, work: Callable[[], Any]) -> Callable[[LoopContext], Any]:
        async def loop(ctx: LoopContext) -> None:
            while True:
                await work()
                ctx.ok()
                await asyncio.sleep(self.config.heartbeat_s)

        return loop

    async def _retention(self, ctx: LoopContext) -> None:
        """The run index's retention sweep (idempotent; every instance runs it)."""
        while True:
            await self.index.prune()
            ctx.ok()
            await asyncio.sleep(self.config.heartbeat_s * RETENTION_EVERY_HEARTBEATS)

    async def _apply_settings(self) -> None:
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
        # value from its environment) unless the instance takes its limit from the
        # tenant; only later changes are applied, so a limit set locally through the
        # settings API is not overwritten by an unchanged value.
        adopt = first and self.config.step_slots_from_tenant
        if limit is not None and (adopt or (not first and limit != previous)):
            self.slots.set_limit(limit)
