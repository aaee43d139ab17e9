"""One runtime instance's part in one run: owning it from start to outcome, or assisting.

Why this module exists: what happens between "the controller started the run" and "the
run is finished" is the part of a runtime that must hold under faults. The owner
compiles the pipeline with the tenant's handler allowlist, creates the execution
(idempotent by ExecutionId), runs it with the instance's workers and, when the
execution is terminal, records the run's end: its step-slot evidence goes into the
execution's ledger and into the run record, and the run is marked finished together
with its :class:`~airuntime.fleet.outcomes.RunOutcome` (``finishRun-6.lua``). Every one
of these steps is idempotent, so a transient Redis failure is waited out and the step
repeated (:mod:`airuntime.core.transient`) instead of ending the participation; a run is
never left "running" because Redis was away for a moment.

A helper (assistance) only lends workers to the execution and gives its evidence to
the ledger; it never decides the run's outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from airuntime.core import keys
from airuntime.core.context import use_context
from airuntime.core.errors import AirError
from airuntime.core.scripts import ScriptCall
from airuntime.core.supervision import Backoff
from airuntime.core.transient import TRANSIENT_ERRORS, retry_transient
from airuntime.engine.execution_store import merged_inputs
from airuntime.engine.pipeline import PipelineError, Plan
from airuntime.engine.status import ExecutionStatus
from airuntime.engine.store_results import ClaimBatch
from airuntime.engine.worker_pool import KnownExecution
from airuntime.fleet.runs import RunRecord, RunRequest, RunStatus
from airuntime.fleet.tenancy import TenantSettings

if TYPE_CHECKING:
    from runtime_pod.instance import RuntimeInstance

__all__ = ["PARTICIPATION_LOOP", "Participation", "run_metadata", "start_entry"]

log = logging.getLogger(__name__)

T = TypeVar("T")

PARTICIPATION_LOOP = "participation"
"""The ``loop`` label under which participations count the Redis failures they waited out."""

RETRY_BACKOFF = Backoff(initial=0.05, maximum=2.0)
"""Between two attempts through an outage: bounded (and jittered), so a participation
notices Redis back within ~2 s."""

_TERMINAL_TO_RUN = {
    ExecutionStatus.SUCCEEDED: RunStatus.COMPLETED,
    ExecutionStatus.FAILED: RunStatus.FAILED,
    ExecutionStatus.CANCELLED: RunStatus.CANCELLED,
}


def start_entry(
    inst: RuntimeInstance, record: RunRecord, request: RunRequest, workers: int
) -> dict[str, str]:
    """The ``run_started`` ledger entry of ``record`` run by ``inst`` with ``workers``."""
    return {
        "run_id": record.run_id,
        "runtime.instance.id": inst.instance_id,
        "assigned.runtime.instance.id": request.metadata.get(
            "assigned.runtime.instance.id", inst.instance_id
        ),
        "max.local.workers.per.execution": str(inst.config.max_local_workers_per_execution),
        "effective.worker.count.per.execution": str(workers),
        "tenant.id": record.tenant_id,
        "tenant.groupId": record.tenant_group_id or "",
        "runtime.isolation.mode": inst.config.isolation_mode.value,
    }


def run_metadata(entry: dict[str, str]) -> dict[str, str]:
    """The part of a ``run_started`` entry the run record's metadata keeps (dotted keys)."""
    return {k: v for k, v in entry.items() if "." in k}


class Participation:
    """The body of one participation task (see the module docstring)."""

    def __init__(
        self,
        instance: RuntimeInstance,
        record: RunRecord,
        request: RunRequest,
        workers: int,
        *,
        assisting: bool,
        just_started: bool = False,
        tenant: TenantSettings | None = None,
    ) -> None:
        self.inst = instance
        self.tenant = tenant
        """The tenant's settings, when the starter read them with the start (else
        :meth:`_plan` reads them)."""
        self.just_started = just_started
        """The controller's start script made the run running here a moment ago: no
        stale read to guard against (:meth:`_still_ours`)."""
        self.record = record
        self.request = request
        self.workers = workers
        self.assisting = assisting
        self.execution_id = record.execution_id or f"ex-{uuid.uuid4().hex}"

    async def run(self) -> None:
        with use_context(self.record.snapshot):
            try:
                if self.assisting:
                    await self._assist()
                else:
                    await self._own()
            finally:
                # Whatever happened (cancelled at shutdown, a bug), the evidence of this
                # execution must not stay in the slot controller's memory.
                self._take_evidence()

    # -- owner ---------------------------------------------------------------------

    async def _own(self) -> None:
        if not self.just_started and not await self._still_ours():
            return
        plan = await self._plan()
        if plan is None:
            return
        eid = self.execution_id
        ledger = self._start_entry()
        try:
            claimed, sent = await self._create(plan, ledger)
        except AirError as exc:
            await self._finish(RunStatus.FAILED, str(exc))
            return
        await self._started(ledger)
        inputs = merged_inputs(plan, self.request.inputs)
        tenant_id = self.record.snapshot.tenant_id

        def execute() -> Awaitable[ExecutionStatus]:
            nonlocal claimed
            # The first claims go to the first attempt only: a repeated attempt claims anew.
            known = KnownExecution(plan, inputs, tenant_id, claimed=claimed, claimed_at=sent)
            claimed = None
            return self.inst.pool.run(eid, workers=self.workers, known=known)

        try:
            final = await self._retry("executing", execute)
        except AirError as exc:
            await self._finish(RunStatus.FAILED, str(exc))
            return
        except Exception as exc:  # a bug must end the run, not leave it "running"
            log.exception("run %s: execution %s failed", self.record.run_id, eid)
            await self._finish(RunStatus.FAILED, f"internal error: {type(exc).__name__}: {exc}")
            return
        # No finalize call here: a terminal status is only ever reported by the script
        # that finalized the execution, which also took it out of the active index and
        # queued it for the archiver (includes/finalize.lua).
        status = _TERMINAL_TO_RUN.get(final, RunStatus.FAILED)
        await self._finish(status, None if status is RunStatus.COMPLETED else str(final))

    async def _create(self, plan: Plan, ledger: dict[str, str]) -> tuple[ClaimBatch | None, float]:
        """One call: the execution, its run_started ledger entry and the first claims of
        this pool, with the ``loop.time()`` the call was sent at (their leases count from
        it). A resend after a lost reply finds the execution and claims nothing: the
        first call's claims expire and are recovered."""
        pool = self.inst.pool
        sent = 0.0

        def create() -> Awaitable[tuple[str, ClaimBatch | None]]:
            nonlocal sent
            sent = asyncio.get_running_loop().time()
            return self.inst.store.create_and_claim(
                plan,
                execution_id=self.execution_id,
                context=self.record.snapshot,
                inputs=self.request.inputs,
                retention_s=self.inst.config.run_retention_s,
                archive_hold_s=self.inst.config.archive_hold(),
                then_record=("run_started", ledger),
                claim=(
                    pool.pool_id,
                    min(self.workers, pool.settings.claim_batch),
                    pool.settings.lease_ms,
                ),
            )

        _, claimed = await self._retry("creating the execution", create)
        return claimed, sent

    async def _still_ours(self) -> bool:
        """The run is still running here: a resumption decided on a stale read (the
        previous participation finished it meanwhile) does nothing."""
        loaded = await self._retry(
            "reading the run", lambda: self.inst.index.get_unchecked(self.record.run_id)
        )
        if loaded is None:
            return False
        current = loaded[0]
        return current.status is RunStatus.RUNNING and current.instance_id == self.inst.instance_id

    async def _plan(self) -> Plan | None:
        """The pipeline compiled with the tenant's allowlist; a refusal fails the run
        (owner) or skips the assist (helper)."""
        tenant = self.tenant
        if tenant is None:
            tenant = await self._retry(
                "reading the tenant settings",
                lambda: self.inst.registry.tenant(self.record.tenant_id),
            )
        try:
            return self.inst.plans.compile(
                self.request.pipeline,
                allowed_handlers=tenant.allowed_handlers,
                allowed_model_providers=tenant.allowed_model_providers,
            )
        except PipelineError as exc:
            # A helper that cannot run this pipeline (e.g. lacks a handler) just does
            # not assist; the run is the owner's to fail, not the helper's.
            if not self.assisting:
                await self._finish(RunStatus.FAILED, f"pipeline: {exc}", created=False)
            return None

    def _start_entry(self) -> dict[str, str]:
        return start_entry(self.inst, self.record, self.request, self.workers)

    async def _started(self, ledger: dict[str, str]) -> None:
        inst, record = self.inst, self.record
        if not self.just_started:
            # A fresh start wrote this metadata with the start itself (startRun);
            # a resumed or adopted run records who runs it now.
            metadata = run_metadata(ledger)
            await self._retry(
                "recording the start", lambda: inst.index.set_metadata(record.run_id, metadata)
            )
        inst.run_state(record.run_id, RunStatus.RUNNING)

    async def _finish(self, status: RunStatus, reason: str | None, *, created: bool = True) -> None:
        """Evidence to the ledger, then the run finished with its outcome (one script),
        both in one round trip where the server keeps their order."""
        evidence = self._take_evidence()
        first = [self._evidence_call(evidence)] if created else []
        finished = await self._retry(
            "finishing the run",
            lambda: self.inst.index.finish(
                self.record,
                status,
                reason=reason,
                execution_id=self.execution_id if created else None,
                step_slots=evidence,
                after=first,
            ),
        )
        if finished:
            self.inst.run_state(self.record.run_id, status)

    # -- helper ----------------------------------------------------------------------

    async def _assist(self) -> None:
        eid = self.execution_id
        try:
            if await self._plan() is None:
                return
            await self.inst.pool.run(eid, workers=self.workers)
        except AirError as exc:
            # The owner decides the run; a helper that cannot go on just stops helping.
            log.info("%s stops assisting %s: %s", self.inst.instance_id, eid, exc)
        except TRANSIENT_ERRORS as exc:
            log.info(
                "%s stops assisting %s: Redis unavailable: %s", self.inst.instance_id, eid, exc
            )
        finally:
            evidence = self._take_evidence()
            with contextlib.suppress(Exception):
                await self._record_evidence(evidence)
            with contextlib.suppress(Exception):
                await self.inst.redis.delete(keys.assist_lease(eid, self.inst.instance_id))

    # -- shared ------------------------------------------------------------------------

    def _take_evidence(self) -> dict[str, int]:
        """This instance's step-slot evidence of the execution, removed from memory."""
        evidence = self.inst.slots.pop_evidence(self.execution_id)
        return evidence.to_dict()

    def _evidence_fields(self, evidence: dict[str, int]) -> dict[str, str]:
        """The ``step_slots`` ledger entry of this instance's evidence."""
        fields = {k: str(v) for k, v in evidence.items()}
        fields["runtime.instance.id"] = self.inst.instance_id
        fields["assisting"] = "1" if self.assisting else "0"
        return fields

    def _evidence_call(self, evidence: dict[str, int]) -> ScriptCall:
        fields = self._evidence_fields(evidence)
        return self.inst.store.event_call(self.execution_id, "step_slots", fields)

    async def _record_evidence(self, evidence: dict[str, int]) -> None:
        fields = self._evidence_fields(evidence)
        await self.inst.store.record_event(self.execution_id, "step_slots", fields)

    async def _retry(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt`` (idempotent) until Redis answers: the participation keeps the
        run's place, workers and evidence through an outage, and only an engine refusal
        or a bug ends the run."""
        return await retry_transient(
            attempt,
            what=f"{self.inst.instance_id}: run {self.record.run_id}: {what}",
            backoff=RETRY_BACKOFF,
            on_error=self._count,
        )

    def _count(self, exc: BaseException) -> None:
        self.inst.loop_failed(PARTICIPATION_LOOP, exc)
