"""The control plane: submit, queue, pump, admit, scale out, requeue, end, cancel, prune.

:class:`ControlPlane` wires the shared run store, the shared queue, admission, the
dispatcher and pump, scale-out (watcher and fulfilled-run requeuer), the end of runs
(outcome reader and reconciler), retention and -- given a history store -- the
archivers (executions and shared runs into the durable history). Submit modes:

* ``QueueFirst`` — the run becomes QueuedGlobally with a Pending queue item; no
  RunId, no ExecutionId until a pump dispatches it;
* ``DirectDispatch`` — admission runs at once and its decision is kept
  (AssignToInstance / QueueGlobally / RequestScaleOut / Reject).

Every background loop runs under one :class:`~airuntime.core.supervision.Supervisor`
(``discovery``, ``pump``, ``scale-out-watcher``, ``requeuer``, ``outcomes``,
``reconciler``, ``retention``, ``archiver``, ``shared-run-archiver``): a loop that
fails -- Redis restarting, a runtime frozen mid-delivery -- is logged, counted
(``airuntime_loop_errors_total``) and restarted with jittered backoff, and
``/readyz`` names it until it works again.

Whether manual drain is allowed and whether the background pump (with its readiness
gate) runs are fields of :class:`~airuntime.control_plane.settings.ControlPlaneSettings`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Sequence
from typing import Any, TypedDict, Unpack

from redis.exceptions import RedisError

from airuntime.control_plane.admission import Admission, Assign, Decision
from airuntime.control_plane.archive import ArchivingRetentionPolicy, SharedRunArchiver
from airuntime.control_plane.delivery import Deliveries
from airuntime.control_plane.dispatch import (
    DispatchObserver,
    PumpIdentity,
    SharedRunDispatcher,
)
from airuntime.control_plane.outcomes import OutcomeReader, end_shared_run, outcome_of
from airuntime.control_plane.pump import BackgroundPump, PumpResult, SharedQueuePump
from airuntime.control_plane.queue_tenants import QueueTenants
from airuntime.control_plane.reconciler import Reconciler
from airuntime.control_plane.retention import Retention, RetentionPolicy
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
from airuntime.control_plane.scale_out.requests import ScaleOutBackoff
from airuntime.control_plane.settings import ControlPlaneSettings, SubmitMode
from airuntime.control_plane.shared_queue import SharedQueue
from airuntime.control_plane.shared_runs import (
    SETTINGS_CHANGED,
    SharedRun,
    SharedRunStatus,
    SharedRunStore,
    check_created,
)
from airuntime.control_plane.submit_idempotency import (
    Submission,
    SubmitIdempotency,
    request_fingerprint,
)
from airuntime.control_plane.suspects import SuspectMarks, SuspectPolicy
from airuntime.control_plane.tenant_settings_cache import TenantSettingsCache
from airuntime.core import keys
from airuntime.core.context import ExecutionContextSnapshot, use_context
from airuntime.core.errors import AirError
from airuntime.core.redis_client import RedisClient
from airuntime.core.supervision import LoopContext, Supervisor
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import HandlerRegistry
from airuntime.engine.model_budget import ModelBudgets
from airuntime.engine.pipeline import PipelineError, Plan, PlanCache
from airuntime.engine.pipeline.problems import Problem, format_loc
from airuntime.engine.secret_refs import UnknownSecret, secret_uses
from airuntime.engine.tenant_secrets import TenantSecrets
from airuntime.fleet.discovery import publish_control_plane
from airuntime.fleet.providers import LocalProvider, RuntimeProvider
from airuntime.fleet.registry import InstanceDescriptor, Registry
from airuntime.fleet.run_cancel import cancel_run
from airuntime.fleet.run_index import RunIndex
from airuntime.fleet.runs import RunRecord, RunStatus
from airuntime.fleet.tenancy import TenantSettings
from airuntime.history.archiver import ExecutionArchiver
from airuntime.history.store import HistoryStore

log = logging.getLogger(__name__)

DISCOVERY_INTERVAL_S = 3.0

SUBMIT_ATTEMPTS = 5
"""Submit attempts when the tenant's settings keep changing under it (each one reads
them again): a change lands between a read and the next round trip, so a second
attempt almost always goes through."""


class SubmitOptions(TypedDict, total=False):
    """What a submit may say besides the pipeline and the snapshot."""

    inputs: dict[str, Any] | None
    metadata: dict[str, str] | None
    mode: SubmitMode | None
    replay_of: str | None
    """The SharedRunId this run replays."""


class ControlPlaneError(AirError):
    """A control-plane request was refused (bad input, unknown run, pump disabled)."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class PipelineRefused(ControlPlaneError):
    """The submitted pipeline is invalid for the submitting tenant (422); ``problems``
    are ``(location, message)`` pairs, the location as a path into the pipeline."""

    def __init__(self, problems: list[tuple[list[str | int], str]]) -> None:
        super().__init__(
            "pipeline: " + "; ".join(f"{_dotted(loc)}: {msg}" for loc, msg in problems),
            status=422,
        )
        self.problems = problems


_LOC_PART = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)|\[(\d+)\]|\['([^']*)'\]")


def _loc(text: str) -> list[str | int]:
    """``steps[1].uses`` -> ``["steps", 1, "uses"]``."""
    return [int(index) if index else (name or key) for name, index, key in _LOC_PART.findall(text)]


def _dotted(loc: list[str | int]) -> str:
    return ".".join(str(p) for p in loc)


def _refusal(exc: PipelineError, pipeline: dict[str, Any]) -> PipelineRefused:
    """The compiler's problems, each naming the step's id where it is about a step."""
    raw = pipeline.get("steps")
    steps: list[Any] = raw if isinstance(raw, list) else []
    problems: list[tuple[list[str | int], str]] = []
    for p in exc.problems:
        loc = _loc(p.loc)
        message = p.message
        if len(loc) >= 2 and loc[0] == "steps" and isinstance(loc[1], int):
            step = steps[loc[1]] if loc[1] < len(steps) else None
            if isinstance(step, dict) and isinstance(step.get("id"), str):
                named = f"step {step['id']!r}: "
                message = message if message.startswith(named) else named + message
        problems.append((loc, message))
    return PipelineRefused(problems)


class ControlPlane:
    """The control plane's operations over one Redis, and the loops it runs once started."""

    def __init__(
        self,
        redis: RedisClient,
        settings: ControlPlaneSettings | None = None,
        *,
        local: LocalProvider | None = None,
        scale_out_provider: ScaleOutProvider | None = None,
        handlers: HandlerRegistry | None = None,
        observer: DispatchObserver | None = None,
        worker_id: str = "pump-0",
        retention_policy: RetentionPolicy | None = None,
        history: HistoryStore | None = None,
    ) -> None:
        self.redis = redis
        self.settings = s = settings or ControlPlaneSettings()
        self.local = local or LocalProvider()
        self.handlers = handlers
        self.plans = PlanCache(handlers)
        self.runs = SharedRunStore(redis)
        self.queue = SharedQueue(redis, claim_lease_ms=s.claim_lease_ms)
        self.registry = Registry(redis)
        self.tenant_settings = TenantSettingsCache(self.registry)
        """What submits compile against (checked where the run is created)."""
        self.secrets = TenantSecrets(redis)
        self.model_budgets = ModelBudgets(redis)
        """The tenants' model token budgets, read for ``GET /v1/tenants/{t}/model-usage``."""
        """The tenants' secrets: a submit naming one its tenant has not stored is 422."""
        self.run_index = RunIndex(redis)
        self.executions = ExecutionStore(redis)
        self.suspects = SuspectMarks(
            redis,
            SuspectPolicy(s.delivery_failures_before_suspect, s.suspect_initial_s, s.suspect_max_s),
        )
        self.admission = Admission(
            redis, scale_out_enabled=s.scale_out_enabled, suspects=self.suspects
        )
        self.scale_outs = ScaleOutStore(
            redis, ScaleOutBackoff(s.scale_out_backoff_initial_s, s.scale_out_backoff_max_s)
        )
        self.scale_out_provider = scale_out_provider
        self._dispatching(observer, worker_id)
        self.supervisor = Supervisor(f"control plane {s.control_plane_id}")
        self._seeds: tuple[tuple[TenantSettings, ...], str] | None = None
        """The tenants file's settings and where they were read (:meth:`seed_tenants`)."""
        self.watcher = (
            ScaleOutWatcher(self.scale_outs, scale_out_provider) if scale_out_provider else None
        )
        self.requeuer = FulfilledRunRequeuer(self.scale_outs, self.runs, self.queue)
        self.outcomes = OutcomeReader(
            self.deliveries.blocking_redis, self.runs, consumer=s.control_plane_id
        )
        self.reconciler = Reconciler(
            self.runs, self.queue, self.run_index, interval_s=s.reconcile_interval_s
        )
        self._archiving(history if s.archiver_enabled else None, retention_policy)

    def _dispatching(self, observer: DispatchObserver | None, worker_id: str) -> None:
        """Deliveries to runtime instances, and the pump that admits runs onto them."""
        s = self.settings
        self.deliveries = Deliveries(
            self.redis,
            self.local,
            timeout_s=s.delivery_timeout_s,
            runtime_token=s.runtime_token.get_secret_value() if s.runtime_token else None,
        )
        self.identity = PumpIdentity(s.control_plane_id, f"{s.control_plane_id}/{worker_id}")
        self.dispatcher = SharedRunDispatcher(
            self.runs,
            self.queue,
            self.admission,
            self.provider,
            self.scale_outs,
            self.identity,
            observer,
            suspects=self.suspects,
        )
        self.pump = SharedQueuePump(self.dispatcher)
        self.background = BackgroundPump(self.pump, self.registry)

    def _archiving(self, history: HistoryStore | None, policy: RetentionPolicy | None) -> None:
        """The archivers (with a history store) and retention, archive-first then."""
        s, redis = self.settings, self.redis
        self.history = history
        self.archiver = ExecutionArchiver(redis, history) if history else None
        self.run_archiver = SharedRunArchiver(redis, self.runs, history) if history else None
        if policy is None:
            policy = (
                ArchivingRetentionPolicy(history, s.retention_s)
                if history
                else RetentionPolicy(s.retention_s)
            )
        self.retention = Retention(
            redis, self.runs, self.scale_outs, policy, interval_s=s.retention_interval_s
        )

    def provider(self, instance: InstanceDescriptor) -> RuntimeProvider:
        return self.deliveries.provider(instance)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every background loop under the supervisor."""
        with contextlib.suppress(RedisError):
            await self._publish_discovery()  # at once if it can; the loop keeps it fresh
        sup = self.supervisor
        sup.start("discovery", self._discovery_loop)
        if self._seeds is not None:
            sup.start("tenant-seeds", self._seed_loop)
        if self.settings.pump_enabled and self.settings.background_pump:
            sup.start("pump", self.background.run)
        if self.watcher is not None:
            sup.start("scale-out-watcher", self.watcher.run)
            sup.start("requeuer", self.requeuer.run)
        sup.start("outcomes", self.outcomes.run)
        sup.start("reconciler", self.reconciler.run)
        sup.start("retention", self.retention.run)
        if self.archiver is not None and self.run_archiver is not None:
            sup.start("archiver", self.archiver.run)
            sup.start("shared-run-archiver", self.run_archiver.run)

    async def seed_tenants(self, seeds: Sequence[TenantSettings], source: str) -> None:
        """Publish a tenants file's settings (``source``: where they were read), now and,
        once started, again whenever Redis has lost them.

        Stored settings are what admission, submits and runtimes read; a tenant without
        any is a Shared one with the default handlers. So a Redis that lost its data
        (the chart's Valkey keeps none across a restart) would turn a Dedicated tenant
        without shared fallback into one that runs on Shared runtimes, until the control
        plane restarted. The file's settings are written with a marker in one
        transaction; the ``tenant-seeds`` loop looks for the marker every
        ``DISCOVERY_INTERVAL_S`` and writes the file again when it is gone. Settings
        changed through the API since stay as they are while the marker does."""
        self._seeds = (tuple(seeds), source)
        await self.registry.put_seeds(*self._seeds)

    async def _seed_loop(self, ctx: LoopContext) -> None:
        seeds, source = self._seeds or ((), "")
        while True:
            if not await self.registry.seeds_present():
                log.warning(
                    "%s: the tenant settings from %s are gone from Redis (it lost its "
                    "data?): publishing them again",
                    self.settings.control_plane_id,
                    source,
                )
                await self.registry.put_seeds(seeds, source)
            ctx.ok()
            await asyncio.sleep(DISCOVERY_INTERVAL_S)

    async def stop(self) -> None:
        await self.supervisor.stop()
        if self.watcher is not None:
            await self.watcher.stop()
        if self.scale_out_provider is not None:
            await self.scale_out_provider.close()
        with contextlib.suppress(Exception):
            await self.redis.delete(keys.control_plane())
        await self.deliveries.close()

    async def wait_started(self) -> None:
        """Return once every loop has worked at least once (tests, the local stack)."""
        await asyncio.gather(*(self.supervisor.wait_ok(name) for name in self.supervisor.loops))

    def unhealthy_loops(self) -> list[str]:
        """The background loops that are not working right now (``/readyz``)."""
        return self.supervisor.unhealthy()

    async def _publish_discovery(self) -> None:
        await publish_control_plane(self.redis, self.settings.control_plane_id)

    async def _discovery_loop(self, ctx: LoopContext) -> None:
        while True:
            await self._publish_discovery()
            ctx.ok()
            await asyncio.sleep(DISCOVERY_INTERVAL_S)

    # -- submit / read / cancel -----------------------------------------------------------------

    async def submit(
        self,
        pipeline: dict[str, Any],
        snapshot: ExecutionContextSnapshot,
        **options: Unpack[SubmitOptions],
    ) -> SharedRun:
        """Persist a shared run and place it according to the submit mode:
        :meth:`submission` without an idempotency key (the options: :class:`SubmitOptions`)."""
        made = await self.submission(pipeline, snapshot, **options)
        assert made.run is not None  # a submission without a key is never a replay
        return made.run

    async def submission(
        self,
        pipeline: dict[str, Any],
        snapshot: ExecutionContextSnapshot,
        *,
        inputs: dict[str, Any] | None = None,
        metadata: dict[str, str] | None = None,
        mode: SubmitMode | None = None,
        replay_of: str | None = None,
        idempotency_key: str | None = None,
    ) -> Submission:
        """Persist a shared run and place it according to the submit mode, or, when
        ``idempotency_key`` created a run already, answer with that run
        (:mod:`~airuntime.control_plane.submit_idempotency`; 409 when it was another
        request).

        The pipeline is compiled against the submitting tenant's handler allowlist
        first (:class:`PipelineRefused` names the step and the handler), as the settings
        are when the run is created: the settings this control plane last read are
        checked by the creating script, and read again when they changed
        (:mod:`~airuntime.control_plane.tenant_settings_cache`)."""
        tenant_id = snapshot.tenant_id
        idempotency = None
        if idempotency_key is not None:
            fingerprint = request_fingerprint(
                pipeline,
                snapshot,
                inputs=inputs,
                metadata=metadata,
                mode=mode.value if mode else None,
                replay_of=replay_of,
            )
            idempotency = SubmitIdempotency.of(
                tenant_id, idempotency_key, self.settings.idempotency_ttl_s, fingerprint
            )
            earlier = await self.redis.get(idempotency.key)
            if earlier is not None:  # a replay compiles and writes nothing
                return await self._replayed(idempotency, earlier, tenant_id)
        for _ in range(SUBMIT_ATTEMPTS):
            known, kept = await self.tenant_settings.get(tenant_id)
            try:
                plan = self.plans.compile(
                    pipeline,
                    allowed_handlers=known.settings.allowed_handlers,
                    allowed_model_providers=known.settings.allowed_model_providers,
                )
            except PipelineError as exc:
                if not kept:
                    raise _refusal(exc, pipeline) from None
                # Refused by settings kept from before: refused only if fresh ones agree.
                self.tenant_settings.forget(tenant_id)
                continue
            await self._check_secrets(plan, pipeline, tenant_id)
            now = int(time.time() * 1000)
            run = SharedRun(
                shared_run_id=SharedRunStore.new_id(),
                status=SharedRunStatus.QUEUED_GLOBALLY,
                pipeline_id=plan.pipeline_id,
                pipeline=pipeline,
                inputs=inputs or {},
                snapshot=snapshot,
                metadata=metadata or {},
                created_at_ms=now,
                updated_at_ms=now,
                replay_of=replay_of,
            )
            # Record and indexes in one script (the control slot), then the queue item
            # (the tenant's queue slot), then the tenant announced to the pumps: in
            # this order, in one round trip where the server keeps the order
            # (call_in_order). A cancel in between finds the record and no item, and the
            # pump drops the item it claims later; a crash in between leaves the run
            # QueuedGlobally without an item, which the reconciler requeues (also the
            # repair when a script-cache loss makes the record land after its item).
            replies = await self.queue.scripts.call_in_order(
                self.redis,
                [
                    SharedRunStore.create_call(run, known.text, idempotency),
                    self.queue.enqueue_call(run.shared_run_id, tenant_id),
                ],
                then=[QueueTenants.announce_command(tenant_id)],
            )
            if isinstance(replies[0], list) and idempotency is not None:
                # A submission with the same key created its run first: this one wrote
                # no record; the item queued beside it goes (as for changed settings).
                await self.queue.cancel(run.shared_run_id, tenant_id)
                return await self._replayed(idempotency, replies[0][1], tenant_id)
            if int(replies[0]) != SETTINGS_CHANGED:
                break
            # Compiled against settings changed since: no record was written. The item
            # queued beside it is cancelled (a pump that claimed it meanwhile finds no
            # record and drops it), and the submit starts again from fresh settings.
            self.tenant_settings.forget(tenant_id)
            await self.queue.cancel(run.shared_run_id, tenant_id)
        else:
            raise ControlPlaneError(
                f"tenant {tenant_id!r}'s settings changed during each of "
                f"{SUBMIT_ATTEMPTS} submit attempts; submit again",
                status=409,
            )
        check_created(run, replies[0])
        if (mode or self.settings.submit_mode) is SubmitMode.DIRECT_DISPATCH:
            # Keep the real admission decision: dispatch this very run now.
            await self.dispatcher.dispatch_run(run.shared_run_id)
            return Submission(run.shared_run_id, await self.runs.require(run.shared_run_id))
        self.background.wake.set()
        return Submission(run.shared_run_id, run)

    async def _check_secrets(self, plan: Plan, pipeline: dict[str, Any], tenant_id: str) -> None:
        """422 naming each header whose secret the tenant has not stored (one HMGET,
        only for a pipeline that names secrets); one deleted after this is the step's
        failure when it runs, naming the secret."""
        uses = secret_uses(plan.steps)
        if not uses:
            return
        missing = set(
            await self.secrets.missing(tenant_id, {n for _, _, names in uses for n in names})
        )
        if not missing:
            return
        raw = pipeline.get("steps")
        declared = {
            s.get("id"): i
            for i, s in enumerate(raw if isinstance(raw, list) else [])
            if isinstance(s, dict)
        }
        problems = []
        for step_id, header, names in uses:
            gone = sorted(set(names) & missing)
            if gone:
                at = format_loc(("steps", declared.get(step_id, 0), "with", "headers", header))
                problems.append(Problem(at, str(UnknownSecret(gone, tenant_id))))
        raise _refusal(PipelineError(problems), pipeline)

    async def _replayed(
        self, idempotency: SubmitIdempotency, stored: Any, tenant_id: str
    ) -> Submission:
        """The run the key created (``stored``: the key's value), if this request is the
        one that created it; 409 otherwise."""
        shared_run_id, fingerprint = SubmitIdempotency.parse(stored)
        if fingerprint != idempotency.fingerprint:
            raise ControlPlaneError(
                f"idempotency key {idempotency.given!r} was used for another request (it "
                f"created {shared_run_id}): a key stands for one request; use a new key",
                status=409,
            )
        run = await self.runs.get_for_tenant(shared_run_id, tenant_id)
        return Submission(shared_run_id, run, replayed=True)

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
        item = await self.queue.item(shared_run_id, run.snapshot.tenant_id)
        details = SharedRunDetails.of(run, item)
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
        """Cancel a run: out of the queue if it is still there (Cancelled at once), else
        its runtime run is cancelled and the shared run ends Cancelled once the runtime
        run did (at once when it had not started yet)."""
        run = await self._visible(shared_run_id, tenant_id)
        if run is None:
            return None
        if run.status.terminal and run.status is not SharedRunStatus.REJECTED:
            return run
        if run.status is SharedRunStatus.DISPATCHED and run.run_id:
            return await self._cancel_runtime_run(run, run.run_id)
        if await self.queue.cancel(shared_run_id, run.snapshot.tenant_id) == 0:
            # A pump settled the item Dispatched after the run was read above: the
            # runtime accepted it, so cancel the runtime run.
            run_id = run.run_id or await self.run_index.run_for_shared(shared_run_id)
            if run_id is not None:
                return await self._cancel_runtime_run(run, run_id)
            return await self.runs.update(shared_run_id, reason="cancel requested")
        ended = await self.runs.transition(
            shared_run_id, SharedRunStatus.CANCELLED, reason="cancelled"
        )
        return ended.run

    async def _cancel_runtime_run(self, run: SharedRun, run_id: str) -> SharedRun:
        tenant = run.snapshot.tenant_id
        await cancel_run(self.run_index, self.executions, run_id, tenant)
        record = await self.run_index.get_for_tenant(run_id, tenant)
        outcome = outcome_of(record) if record is not None else None
        if outcome is not None and outcome.status is RunStatus.CANCELLED:
            ended = await end_shared_run(self.runs, outcome)
            if ended is not None:
                return ended.run
        current = await self.runs.require(run.shared_run_id)
        if current.status.terminal:
            return current
        return await self.runs.update(run.shared_run_id, reason="cancel requested")

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
