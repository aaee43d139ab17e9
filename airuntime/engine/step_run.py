"""One attempt of one step on one worker slot, from its claim until it is reported.

Why this module exists: an attempt is where a handler meets the engine's rules -- the
:class:`~airuntime.engine.handlers.StepContext` with its idempotency key and fencing
token, the step slot, the timeout, the output limit -- and where its end is sorted into
exactly one outcome (:class:`~airuntime.engine.pool_settings.AttemptOutcome`): completed
(queued for the next completion batch), failed (reported with ``failStep``), stopped
(the execution was cancelled; queued for the next ``stopSteps`` batch) or crashed
(cancelled by something other than the pool: nothing is reported, the claim expires
and another worker recovers the step with the same attempt).

How a cancel stops an attempt (:meth:`StepRun.stop`): an attempt whose handler has not
started never starts it; one waiting for a step slot or a handler thread is withdrawn
from the queue; an async handler has its task cancelled; a sync handler, which runs in a
thread that cannot be interrupted, is told through ``ctx.is_cancelled()`` and stops when
it looks (if it returns a result anyway, that result is completed: it happened).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airuntime.core.errors import (
    EngineError,
    ExecutionTerminal,
    InvalidTransition,
    NonRetryableError,
    StaleClaim,
)
from airuntime.core.transient import TRANSIENT_ERRORS
from airuntime.engine.handlers import MAX_RETRY_AFTER_S, StepContext, invoke
from airuntime.engine.pipeline import PlanStep
from airuntime.engine.pool_settings import AttemptOutcome
from airuntime.engine.references import resolve
from airuntime.engine.retry import retry_delay_s
from airuntime.engine.secret_refs import (
    UnknownSecret,
    header_templates,
    referenced,
    scrub,
    scrub_value,
    substitute,
)
from airuntime.engine.store_results import Claim, FailOutcome
from airuntime.engine.tenant_secrets import UnreadableSecret

if TYPE_CHECKING:
    from airuntime.engine.participation import Participation

__all__ = ["REPORT_ERRORS", "Report", "StepRun"]

REPORT_ERRORS: tuple[type[Exception], ...] = (EngineError, *TRANSIENT_ERRORS)
"""Why a report may end unrecorded: the engine refused it, or Redis stayed away until
the claim's lease ran out."""


@dataclass(frozen=True, slots=True)
class Report:
    """A finished attempt waiting for its batch: a completion (with output) or a stop."""

    step: str
    token: str
    worker: str
    lease_until: float
    output: str = ""


class StepRun:
    """One step attempt of a participation (see the module doc)."""

    def __init__(
        self,
        part: Participation,
        claim: Claim,
        worker: str,
        lease_until: float,
        lease: tuple[str, str, int] | None = None,
    ) -> None:
        self.part = part
        self.claim = claim
        self.worker = worker
        self.lease_until = lease_until
        """``loop.time()`` at which the claim's lease runs out unless renewed."""
        self.lease = lease
        """The concurrency lease of a throttled step: scope, holder, ttl_ms."""
        self.task: asyncio.Task[None] | None = None
        self.ctx: StepContext | None = None
        self.in_handler = False
        """Waiting for a step slot or running the handler: the part a cancel interrupts."""
        self.lost = False
        """Stopped by the pool (claim lost, participation over): not a crash, not reported."""
        self.stopping = part.cancelling
        """The execution is cancelled: stop the handler and record the stop."""
        self.secrets: tuple[str, ...] = ()
        """The secret values this attempt sends (scrubbed from its output and error)."""

    def start(self) -> None:
        # The loop's own create_task names the task as it makes it (asyncio.create_task
        # wraps it and names the task again: ~0.5 us a step).
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"step:{self.part.eid}:{self.claim.step_id}"
        )

    # -- what the participation asks of a running attempt -------------------------------

    def stop(self) -> None:
        """The execution is cancelled: stop this attempt (see the module doc)."""
        if self.stopping or self.lost:
            return
        self.stopping = True
        if not self.in_handler or self.task is None:
            return  # not started yet (it checks before starting), or already reporting
        in_thread = self.ctx is not None and self.ctx.mark_cancelled()
        if not in_thread:
            self.task.cancel()  # an async handler, or one still waiting for a slot or thread

    def thread_running(self) -> bool:
        """True while a handler thread runs this attempt's sync handler."""
        future = self.ctx._thread_future if self.ctx is not None else None
        return future is not None and future.running()

    def lose(self) -> None:
        """The claim is gone (recovered elsewhere, or the participation ends): stop the
        local run and report nothing."""
        self.lost = True
        if self.ctx is not None:
            self.ctx.mark_cancelled()
        if self.task is not None:
            self.task.cancel()

    # -- the attempt ------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        outcome = AttemptOutcome.CRASHED
        try:
            outcome = await self._attempt()
        except asyncio.CancelledError:
            # Not reported: either the pool stopped it (lost claim, shutdown) or the
            # worker "died". The claim expires and the step is recovered elsewhere.
            if not self.lost:
                self.part.stats.crashed_steps += 1
                self.lease = None  # a crashed holder cannot release; its TTL frees the scope
        finally:
            if self.lease is not None:  # a throttled step's (most have none: no await)
                await self._release_lease()
            self.part.attempt_ended(self, outcome, loop.time() - started)

    async def _attempt(self) -> AttemptOutcome:
        step = self.part.steps[self.claim.step_id]
        try:
            if self.stopping:
                return self._queue_stop()  # cancelled before its handler started
            output_json = await self._execute(step)
        except asyncio.CancelledError:
            if self.lost or not self.stopping:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # our own stop request, handled here
            return self._queue_stop()
        except Exception as exc:  # a failed attempt
            if self.lost:
                return AttemptOutcome.CRASHED  # e.g. StepCancelled: the pool let go of it
            if self.stopping:
                return self._queue_stop()  # e.g. StepCancelled after noticing the cancel
            await self._report_failure(step, exc)
            return AttemptOutcome.FAILED
        if self.lost:
            return AttemptOutcome.CRASHED  # finished after the pool let go: not reported
        # The worker slot stays held until the completion is flushed: that flush
        # claims the next ready steps into it (claim_next).
        claim = self.claim
        self.part.queue_completion(
            Report(claim.step_id, claim.token, self.worker, self.lease_until, output_json)
        )
        return AttemptOutcome.COMPLETED

    def _queue_stop(self) -> AttemptOutcome:
        claim = self.claim
        self.part.queue_stop(Report(claim.step_id, claim.token, self.worker, self.lease_until))
        return AttemptOutcome.STOPPED

    async def _release_lease(self) -> None:
        if self.lease is not None:
            scope, holder, _ = self.lease
            with contextlib.suppress(Exception):
                await self.part.pool.leases.release(scope, holder)

    def _context(self, step: PlanStep, outputs: dict[str, Any]) -> StepContext:
        """The handler's context, from the step's referenced ``outputs`` (resolved)."""
        claim, part = self.claim, self.part
        try:
            inputs = resolve(step.inputs, outputs, part.run_inputs)
        except Exception as exc:
            raise NonRetryableError(f"step {step.id!r}: {exc}") from exc
        return StepContext(
            execution_id=part.eid,
            step_id=step.id,
            attempt=claim.attempt,
            inputs=inputs,
            pipeline_id=part.plan.pipeline_id,
            tenant_id=part.tenant_id or None,
            fencing_token=claim.token,
            fencing_seq=claim.sequence,
            model_budgets=part.pool.model_budgets,
        )

    async def _execute(self, step: PlanStep) -> str:
        pool = self.part.pool
        handler = pool.registry.get(step.handler)
        outputs = self.claim.ref_outputs
        if pool.payloads is not None and outputs:  # offloaded outputs are fetched first
            outputs = await pool.payloads.resolve(outputs, self.part.tenant_id)
        templates = header_templates(step.handler, step.inputs)
        values = await self._secret_values(templates) if templates else {}
        ctx = self.ctx = self._context(step, outputs)
        if templates:
            headers = dict(ctx.inputs["headers"])
            for header, template in templates.items():
                headers[header] = substitute(template, values)
            ctx.inputs = {**ctx.inputs, "headers": headers}
        self.in_handler = True
        try:
            # asyncio.timeout, not wait_for: no second task per attempt; and none at all
            # for a step without a time limit (the default), where it would only cost.
            if pool.slots is not None:
                async with pool.slots.slot(self.part.eid), asyncio.timeout(step.timeout_s):
                    output = await invoke(handler, ctx)
            elif step.timeout_s is None:
                output = await invoke(handler, ctx)
            else:
                async with asyncio.timeout(step.timeout_s):
                    output = await invoke(handler, ctx)
        except TimeoutError as exc:
            ctx.mark_cancelled()  # a handler thread still running notices and ends
            raise TimeoutError(f"step {step.id!r} timed out after {step.timeout_s} s") from exc
        finally:
            self.in_handler = False
        if self.secrets:
            output = scrub_value(output, self.secrets)
        text = _output_json(step, output, self.part.settings.max_output_bytes)
        if pool.payloads is not None:
            text = await pool.payloads.offload(self.part.tenant_id, self.part.eid, step.id, text)
        return text

    async def _secret_values(self, templates: dict[str, str]) -> dict[str, str]:
        """The values of the tenant's secrets the step's headers name (read right before
        the request; kept for scrubbing): a name the tenant has not stored fails the
        step, naming it, with no retry."""
        names = referenced(templates)
        tenant = self.part.tenant_id
        try:
            values = await self.part.pool.secrets.values(tenant, names)
        except UnreadableSecret as exc:  # sealed under a key this runtime does not hold
            raise NonRetryableError(str(exc)) from None
        if len(values) < len(names):
            raise NonRetryableError(str(UnknownSecret(names - values.keys(), tenant)))
        self.secrets = tuple(values.values())
        return values

    async def _report_failure(self, step: PlanStep, exc: BaseException) -> None:
        claim, part = self.claim, self.part
        part.stats.failed_attempts += 1
        retryable = not isinstance(exc, NonRetryableError) and not getattr(
            exc, "non_retryable", False
        )
        delay_ms = int(retry_delay_s(step.retry, claim.attempt, part.eid, step.id) * 1000)
        asked = getattr(exc, "retry_after_s", None) if retryable else None
        if isinstance(asked, int | float) and asked > 0:
            delay_ms = max(delay_ms, int(min(asked, MAX_RETRY_AFTER_S) * 1000))
        message = f"{type(exc).__name__}: {exc}"
        if self.secrets:
            message = scrub(message, self.secrets)

        async def fail() -> FailOutcome:
            result = await part.store.fail(
                part.eid,
                self.worker,
                claim.step_id,
                claim.token,
                message,
                retryable=retryable,
                delay_ms=delay_ms,
            )
            part.observe(result.status)
            return result.outcome

        try:
            outcome = await part.retry(fail, f"failure report of {claim.step_id}", self.lease_until)
        except StaleClaim:
            part.stats.stale_rejections += 1
            return
        except ExecutionTerminal:
            part.stats.late_reports += 1  # finalized meanwhile: the snapshot is the record
            return
        except REPORT_ERRORS as err:
            # InvalidTransition after a retry: the first call went through.
            if not isinstance(err, InvalidTransition):
                part.report_lost("failure", [claim.step_id], err)
            return
        if outcome is FailOutcome.RETRY:
            part.stats.retries_scheduled += 1


def _output_json(step: PlanStep, output: object, limit: int) -> str:
    if output is None:
        return "null"  # the common case of side-effect steps, without the encoder
    try:
        text = json.dumps(output, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise NonRetryableError(
            f"output of step {step.id!r} is not JSON-serialisable: {exc}"
        ) from exc
    if len(text) > limit:
        raise NonRetryableError(
            f"output of step {step.id!r} is {len(text)} bytes, over the limit of {limit}"
        )
    return text
