"""asyncio workers that advance one execution by claiming, running and completing steps.

A :class:`WorkerPool` is stateless with respect to the execution: everything it
knows it learns from claims, and everything it changes goes through the Lua scripts
(:mod:`airuntime.engine.execution_store`). Any number of pools, in any number of processes
and hosts, may participate in the same execution; the result does not depend on
which of them ran what.

Round trips are kept below one per step by batching: idle worker slots are filled
by one ``claimSteps`` call, finished steps are completed in batches by one flusher
task per participation (whatever finished while the previous flush was in flight
goes in the next one), and every completion call also claims the next ready steps
for the slots it frees (BullMQ's *moveToFinished* trick). Throttled steps take the
separate policy -> lease -> claim path of :mod:`airuntime.engine.concurrency`.

A step task cancelled by anything other than the pool itself is treated as a
crashed worker: nothing is reported, its claim and concurrency lease are left to
expire, and another worker recovers the step with its attempt count unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from airuntime.core.errors import OK, EngineError, NonRetryableError, StaleClaim
from airuntime.core.tasks import cancel_and_wait
from airuntime.engine.concurrency import (
    AdmissionPolicy,
    ConcurrencyContext,
    ConcurrencyLeases,
    ZeroLimitPolicy,
)
from airuntime.engine.execution_store import Claim, ClaimBatch, ExecutionStore, FailOutcome
from airuntime.engine.handlers import HandlerRegistry, StepContext, default_registry, invoke
from airuntime.engine.pipeline import Plan, PlanStep, ResolvedThrottle
from airuntime.engine.references import resolve
from airuntime.engine.retry import retry_delay_s
from airuntime.engine.status import ExecutionStatus

log = logging.getLogger(__name__)


class StepSlots(Protocol):
    """Instance-wide admission around each handler call (runtime_pod's step slots)."""

    def slot(self, execution_id: str) -> AbstractAsyncContextManager[Any]: ...


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """How one pool participates in an execution."""

    workers: int = 4
    """Steps this pool runs at once (its worker slots). Must be >= 1."""
    claim_batch: int = 64
    """Most steps claimed in one round trip."""
    lease_ms: int = 30_000
    """Claim lease; renewed every ``lease_ms / 3`` while the step runs. An expired
    lease lets another worker recover the step."""
    idle_poll_max_ms: int = 50
    """Longest sleep between claim attempts when nothing is ready (doubles from 1 ms)."""
    blocked_poll_ms: int = 200
    """Sleep between checks while the execution is paused/waiting for input."""
    max_output_bytes: int = 1 << 20
    """Largest JSON output a step may produce; larger outputs fail the step."""

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.claim_batch < 1:
            raise ValueError(f"claim_batch must be >= 1, got {self.claim_batch}")
        if self.lease_ms < 10:
            raise ValueError(f"lease_ms must be >= 10, got {self.lease_ms}")


@dataclass(slots=True)
class PoolStats:
    claimed: int = 0
    completed: int = 0
    failed_attempts: int = 0
    retries_scheduled: int = 0
    stale_rejections: int = 0
    lost_claims: int = 0
    crashed_steps: int = 0
    policy_denied: int = 0
    lease_denied: int = 0
    claim_conflicts: int = 0
    claim_calls: int = 0
    complete_calls: int = 0
    recovered: int = 0


class AttemptOutcome(StrEnum):
    """How one attempt of a step ended, as far as this pool saw it."""

    COMPLETED = "completed"
    """The handler returned; the completion is flushed in a batch."""
    FAILED = "failed"
    """The handler raised; the failure was reported (retry or not is the script's call)."""
    CRASHED = "crashed"
    """The attempt was cancelled without a report; its claim expires and is recovered."""


StepObserver = Callable[[str, str, AttemptOutcome, float], None]
"""(execution_id, step_id, outcome, seconds) after each step attempt."""


def default_pool_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass(eq=False)
class _Running:
    claim: Claim
    worker: str
    task: asyncio.Task[None] | None = None
    lease: tuple[str, str, int] | None = None  # scope, holder, ttl_ms
    lost: bool = False


class WorkerPool:
    """Runs steps of executions it is asked to participate in."""

    def __init__(
        self,
        store: ExecutionStore,
        registry: HandlerRegistry | None = None,
        settings: PoolSettings | None = None,
        *,
        pool_id: str | None = None,
        leases: ConcurrencyLeases | None = None,
        policies: Sequence[AdmissionPolicy] = (ZeroLimitPolicy(),),
        slots: StepSlots | None = None,
        observer: StepObserver | None = None,
    ) -> None:
        self.store = store
        self.registry = registry or default_registry()
        self.settings = settings or PoolSettings()
        self.pool_id = pool_id or default_pool_id()
        self.leases = leases or ConcurrencyLeases(store.redis, store.scripts)
        self.policies = tuple(policies)
        self.slots = slots
        self.observer = observer
        self.stats = PoolStats()

    async def run(self, execution_id: str, *, workers: int | None = None) -> ExecutionStatus:
        """Participate in ``execution_id`` until it is finalized; return its terminal status."""
        n = workers if workers is not None else self.settings.workers
        if n < 1:
            raise ValueError(f"workers must be >= 1, got {n}")
        plan = await self.store.load_plan(execution_id)
        run_inputs = await self.store.run_inputs(execution_id)
        info = await self.store.info(execution_id)
        participation = _Participation(self, execution_id, plan, run_inputs, info.tenant_id, n)
        return await participation.run()


class _Participation:
    """One pool's part in one execution."""

    def __init__(
        self,
        pool: WorkerPool,
        execution_id: str,
        plan: Plan,
        run_inputs: dict[str, Any],
        tenant_id: str,
        workers: int,
    ) -> None:
        self.pool = pool
        self.store = pool.store
        self.settings = pool.settings
        self.eid = execution_id
        self.plan = plan
        self.steps: dict[str, PlanStep] = {s.id: s for s in plan.steps}
        self.run_inputs = run_inputs
        self.tenant_id = tenant_id
        self.free = workers
        self.idle_workers = list(range(workers - 1, -1, -1))
        self.running: dict[str, _Running] = {}
        self.pending: list[tuple[str, str, str, str]] = []
        self.have_completions = asyncio.Event()
        self.wake = asyncio.Event()
        self.terminal: ExecutionStatus | None = None
        self.throttled_ready = 0
        self.throttle_retry_ms = -1

    # -- main loop -----------------------------------------------------------------

    async def run(self) -> ExecutionStatus:
        flusher = asyncio.create_task(self._flusher(), name=f"flush:{self.eid}")
        renewer = asyncio.create_task(self._renewer(), name=f"renew:{self.eid}")
        try:
            await self._loop()
        finally:
            for r in list(self.running.values()):
                r.lost = True  # stopped by the pool: not a crash
            tasks = [r.task for r in self.running.values() if r.task is not None]
            await cancel_and_wait([flusher, renewer, *tasks])
        assert self.terminal is not None
        return self.terminal

    async def _loop(self) -> None:
        backoff_ms = 1
        while self.terminal is None:
            self.wake.clear()
            wait_ms: float | None = None
            if self.free > 0:
                want = min(self.free, self.settings.claim_batch)
                batch, claimed = await self._claim_round(want)
                if batch.status.terminal:
                    break
                if claimed >= want:
                    backoff_ms = 1
                    continue  # the batch was full: more may be ready right now
                wait_ms, backoff_ms = self._idle_wait_ms(batch, backoff_ms)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.wake.wait(), None if wait_ms is None else wait_ms / 1000
                )

    async def _claim_round(self, want: int) -> tuple[ClaimBatch, int]:
        """Claim up to ``want`` plain steps in one round trip, then throttled ones into
        the slots left; returns the batch and how many steps were claimed."""
        self.free -= want
        try:
            batch = await self.store.claim(
                self.eid, self.pool.pool_id, want, self.settings.lease_ms
            )
        finally:
            self.free += want
        self.pool.stats.claim_calls += 1
        self.pool.stats.recovered += batch.recovered
        self._start(batch.claims)
        self.throttled_ready = batch.throttled_ready
        if batch.status.terminal:
            self.terminal = batch.status
            return batch, len(batch.claims)
        claimed = len(batch.claims)
        running = batch.status is ExecutionStatus.RUNNING
        if self.free > 0 and self.throttled_ready > 0 and running:
            claimed += await self._claim_throttled()
        return batch, claimed

    def _idle_wait_ms(self, batch: ClaimBatch, backoff_ms: int) -> tuple[float, int]:
        """How long to sleep after a round that claimed less than it asked for, and the
        backoff for the next such round."""
        wait_ms: float
        if batch.status is not ExecutionStatus.RUNNING:
            wait_ms = self.settings.blocked_poll_ms
        else:
            wait_ms = backoff_ms
            backoff_ms = min(backoff_ms * 2, self.settings.idle_poll_max_ms)
            if self.running:
                # Local completions claim what they make ready and wake this
                # loop when slots are left over: poll only for other processes.
                wait_ms = max(wait_ms, self.settings.blocked_poll_ms)
        if batch.wake_ms >= 0:
            wait_ms = min(wait_ms, batch.wake_ms + 1)
        if self.throttle_retry_ms >= 0:
            wait_ms = min(wait_ms, self.throttle_retry_ms + 1)
        return wait_ms, backoff_ms

    def _start(self, claims: Sequence[Claim]) -> None:
        for claim in claims:
            self._spawn(claim, None)

    def _spawn(self, claim: Claim, lease: tuple[str, str, int] | None) -> None:
        self.pool.stats.claimed += 1
        self.free -= 1
        worker = f"{self.pool.pool_id}/w{self.idle_workers.pop()}"
        r = _Running(claim, worker, lease=lease)
        self.running[claim.step_id] = r
        r.task = asyncio.create_task(self._run_step(r), name=f"step:{self.eid}:{claim.step_id}")

    # -- throttled path: policy -> lease -> claim ------------------------------------

    async def _claim_throttled(self) -> int:
        candidates = await self.store.throttled_ready(self.eid, self.free * 4)
        claimed = 0
        self.throttle_retry_ms = -1
        for step_id in candidates:
            if self.free <= 0:
                break
            step = self.steps.get(step_id)
            if step is None or step.throttle is None or step_id in self.running:
                continue
            if self._policy_denies(step, step.throttle):
                self.pool.stats.policy_denied += 1
                continue
            if await self._lease_and_claim(step, step.throttle):
                claimed += 1
        return claimed

    def _policy_denies(self, step: PlanStep, thr: ResolvedThrottle) -> bool:
        spec = step.concurrency
        ctx = ConcurrencyContext(
            pipeline_id=self.plan.pipeline_id,
            execution_id=self.eid,
            step_id=step.id,
            tenant_id=self.tenant_id,
            provider=spec.provider if spec else None,
            model=spec.model if spec else None,
            operation=spec.operation if spec else None,
            key=spec.key if spec else None,
            scope=thr.scope,
            limit=thr.limit,
        )
        return any(policy.deny_reason(ctx) for policy in self.pool.policies)

    async def _lease_and_claim(self, step: PlanStep, thr: ResolvedThrottle) -> bool:
        """Take a concurrency lease of the step's scope, then claim the step with it (a
        failed claim gives the lease back at once). True if the step now runs."""
        holder = f"{self.pool.pool_id}:{self.eid}:{step.id}:{uuid.uuid4().hex[:8]}"
        ttl_ms = max(10, int(thr.lease_ttl_s * 1000))
        lease = await self.pool.leases.acquire(thr.scope, holder, thr.limit, ttl_ms)
        if not lease.acquired:
            self.pool.stats.lease_denied += 1
            if self.throttle_retry_ms < 0 or lease.retry_after_ms < self.throttle_retry_ms:
                self.throttle_retry_ms = lease.retry_after_ms
            return False
        try:
            claim = await self.store.claim_step(
                self.eid, self.pool.pool_id, step.id, self.settings.lease_ms, holder
            )
        except EngineError:
            self.pool.stats.claim_conflicts += 1
            await self.pool.leases.release(thr.scope, holder)
            return False
        self._spawn(claim, (thr.scope, holder, ttl_ms))
        return True

    # -- one step attempt ------------------------------------------------------------

    async def _run_step(self, r: _Running) -> None:
        claim = r.claim
        loop = asyncio.get_running_loop()
        started = loop.time()
        outcome = AttemptOutcome.CRASHED
        try:
            step = self.steps[claim.step_id]
            try:
                output_json = await self._execute(step, claim)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed attempt
                outcome = AttemptOutcome.FAILED
                await self._report_failure(step, r, exc)
            else:
                outcome = AttemptOutcome.COMPLETED
                # The worker slot stays held until the completion is flushed: that
                # flush claims the next ready steps into it (claim_next).
                self.pending.append((claim.step_id, claim.token, r.worker, output_json))
                self.have_completions.set()
        except asyncio.CancelledError:
            # Not reported: either the pool stopped it (lost claim, shutdown) or the
            # worker "died". The claim expires and the step is recovered elsewhere.
            if not r.lost:
                self.pool.stats.crashed_steps += 1
                r.lease = None  # a crashed holder cannot release; its TTL frees the scope
        finally:
            self.running.pop(claim.step_id, None)
            self.idle_workers.append(int(r.worker.rsplit("/w", 1)[1]))
            if outcome is not AttemptOutcome.COMPLETED:
                self.free += 1
            if r.lease is not None:
                scope, holder, _ = r.lease
                with contextlib.suppress(Exception):
                    await self.pool.leases.release(scope, holder)
            if self.pool.observer is not None:
                self.pool.observer(self.eid, claim.step_id, outcome, loop.time() - started)
            if outcome is not AttemptOutcome.COMPLETED:
                self.wake.set()

    async def _execute(self, step: PlanStep, claim: Claim) -> str:
        handler = self.pool.registry.get(step.handler)
        try:
            inputs = resolve(step.inputs, claim.ref_outputs, self.run_inputs)
        except Exception as exc:
            raise NonRetryableError(f"step {step.id!r}: {exc}") from exc
        ctx = StepContext(
            execution_id=self.eid,
            step_id=step.id,
            attempt=claim.attempt,
            inputs=inputs,
            pipeline_id=self.plan.pipeline_id,
            tenant_id=self.tenant_id or None,
            cancelled=asyncio.Event(),
        )
        call = invoke(handler, ctx)
        if step.timeout_s is not None:
            call = asyncio.wait_for(call, step.timeout_s)
        try:
            if self.pool.slots is not None:
                async with self.pool.slots.slot(self.eid):
                    output = await call
            else:
                output = await call
        except TimeoutError as exc:
            raise TimeoutError(f"step {step.id!r} timed out after {step.timeout_s} s") from exc
        try:
            text = json.dumps(output, separators=(",", ":"), sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise NonRetryableError(
                f"output of step {step.id!r} is not JSON-serialisable: {exc}"
            ) from exc
        if len(text) > self.settings.max_output_bytes:
            raise NonRetryableError(
                f"output of step {step.id!r} is {len(text)} bytes, over the limit of "
                f"{self.settings.max_output_bytes}"
            )
        return text

    async def _report_failure(self, step: PlanStep, r: _Running, exc: BaseException) -> None:
        claim = r.claim
        self.pool.stats.failed_attempts += 1
        retryable = not isinstance(exc, NonRetryableError) and not getattr(
            exc, "non_retryable", False
        )
        delay_ms = int(retry_delay_s(step.retry, claim.attempt, self.eid, step.id) * 1000)
        message = f"{type(exc).__name__}: {exc}"
        try:
            result = await self.store.fail(
                self.eid,
                r.worker,
                claim.step_id,
                claim.token,
                message,
                retryable=retryable,
                delay_ms=delay_ms,
            )
        except StaleClaim:
            self.pool.stats.stale_rejections += 1
            return
        except EngineError as err:
            log.warning("failure of %s/%s not recorded: %s", self.eid, claim.step_id, err)
            return
        if result.outcome is FailOutcome.RETRY:
            self.pool.stats.retries_scheduled += 1
        if result.status.terminal:
            self.terminal = result.status

    # -- batched completion ------------------------------------------------------------

    async def _flusher(self) -> None:
        while True:
            await self.have_completions.wait()
            self.have_completions.clear()
            if self.pending:
                items, self.pending = self.pending, []
                await self._flush(items)

    async def _flush(self, items: list[tuple[str, str, str, str]]) -> None:
        # Each completed step still holds its worker slot; the same round trip
        # that completes it claims the next ready steps into those slots.
        slots = len(items)
        want = 0 if self.terminal else min(slots, self.settings.claim_batch)
        try:
            result = await self.store.complete(
                self.eid, self.pool.pool_id, items, claim_next=want, lease_ms=self.settings.lease_ms
            )
        except EngineError as err:
            log.warning("completion batch for %s rejected: %s", self.eid, err)
            self.wake.set()
            return
        finally:
            self.free += slots
        self.pool.stats.complete_calls += 1
        for code in result.codes:
            if code == OK:
                self.pool.stats.completed += 1
            else:
                self.pool.stats.stale_rejections += 1
        self._start(result.claims)
        self.throttled_ready = result.throttled_ready
        if result.status.terminal:
            self.terminal = result.status
        if len(result.claims) < slots or self.terminal or result.throttled_ready:
            self.wake.set()  # slots left over, or something else to look at

    # -- lease renewal -------------------------------------------------------------------

    async def _renewer(self) -> None:
        every = self.settings.lease_ms / 3000
        while True:
            await asyncio.sleep(every)
            running = [r for r in self.running.values() if not r.lost]
            if not running:
                continue
            try:
                alive = await self.store.renew(
                    self.eid,
                    self.settings.lease_ms,
                    [(r.claim.step_id, r.claim.token) for r in running],
                )
            except EngineError:
                continue
            for r, ok in zip(running, alive, strict=True):
                if not ok and r.task is not None:
                    self.pool.stats.lost_claims += 1
                    r.lost = True
                    r.task.cancel()
                elif r.lease is not None:
                    scope, holder, ttl = r.lease
                    await self.pool.leases.renew(scope, holder, ttl)
