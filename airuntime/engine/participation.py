"""One worker pool's part in one execution: claim steps, run them, report how they ended.

Why this module exists: it is the loop that turns the Lua transitions of
:mod:`~airuntime.engine.execution_store` into work, and the place where three faults are
handled that a plain loop gets wrong:

* **Redis goes away.** Every call that carries finished work -- a completion batch, a
  failure report, a stop, a lease renewal -- is retried on transient Redis errors with
  the capped, jittered backoff of :mod:`~airuntime.core.transient` until the claim's
  lease would have expired (after that another worker recovers the step: at-least-once).
  Claim rounds are retried for as long as it takes. A participation never dies of an
  outage; it resumes where it was when the server is back.
* **A cancel arrives.** The pool's control feed, the status in every claim, completion,
  failure and renewal reply, and the pool's periodic read while steps run
  (``control_poll_ms``; one round trip for all its executions,
  :mod:`~airuntime.engine.control_poll`) all lead to
  :meth:`Participation.cancel_running`: async handlers have their task cancelled, sync
  handlers (in a thread) get ``ctx.is_cancelled()`` and stop when they notice it, steps
  still waiting for a step slot are dropped before their handler starts, and a step
  whose handler had not started never starts. The stopped steps are recorded with
  ``stopSteps`` in batches, which finalizes the execution Cancelled as soon as the last
  running step is stopped. Pause is not a stop: running steps drain.
* **A worker is frozen or crashes.** A step task cancelled by anything but the pool is a
  crashed worker: nothing is reported, its claim and concurrency lease expire, and
  another worker recovers the step with its attempt count unchanged. A renewal that
  finds the claim gone (recovered meanwhile) stops the local run of the step; its late
  completion, if any, is rejected as stale by the token check.

Round trips stay below one per step by batching: idle worker slots are filled by one
``claimSteps`` call, finished steps are completed in batches by one flusher task
(whatever finished while the previous flush was in flight goes in the next one), and
every completion call also claims the next ready steps for the slots it frees.
Throttled steps take the policy -> lease -> claim path of :mod:`~airuntime.engine.concurrency`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from airuntime.core.errors import OK, EngineError, ExecutionNotFound, ExecutionTerminal
from airuntime.core.tasks import cancel_and_wait
from airuntime.core.transient import TRANSIENT_ERRORS, retry_transient
from airuntime.engine.concurrency import ConcurrencyContext
from airuntime.engine.pipeline import Plan, PlanStep, ResolvedThrottle
from airuntime.engine.pool_settings import AttemptOutcome
from airuntime.engine.status import ExecutionStatus
from airuntime.engine.step_run import REPORT_ERRORS, Report, StepRun
from airuntime.engine.store_results import Claim, ClaimBatch, ControlState

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from airuntime.engine.worker_pool import WorkerPool

__all__ = ["Participation"]

log = logging.getLogger(__name__)

T = TypeVar("T")

DUPLICATE = 2
"""completeSteps: the same claim completed before (a retried call); nothing changed."""


class Participation:
    """One pool's part in one execution (see the module doc)."""

    def __init__(
        self,
        pool: WorkerPool,
        execution_id: str,
        plan: Plan,
        run_inputs: dict[str, Any],
        tenant_id: str,
        workers: int,
        first_claims: tuple[ClaimBatch, float] | None = None,
    ) -> None:
        self.pool = pool
        self.first_claims = first_claims
        """Steps claimed for this pool by the call that created the execution, and the
        ``loop.time()`` that call was sent at (their leases count from it): the first
        claim round uses them instead of a round trip."""
        self.store = pool.store
        self.settings = pool.settings
        self.stats = pool.stats
        self.eid = execution_id
        self.plan = plan
        self.steps: dict[str, PlanStep] = {s.id: s for s in plan.steps}
        self.run_inputs = run_inputs
        self.tenant_id = tenant_id
        self.free = workers
        self.idle_workers = [f"{pool.pool_id}/w{i}" for i in range(workers - 1, -1, -1)]
        """The names of the worker slots free now (the last is taken first)."""
        self.running: dict[str, StepRun] = {}
        self.completions: list[Report] = []
        self.stops: list[Report] = []
        self.have_reports = asyncio.Event()
        self.wake = asyncio.Event()
        self.terminal: ExecutionStatus | None = None
        self.cancelling = False
        self.throttled_ready = 0
        self.throttle_retry_ms = -1
        self._lease_s = self.settings.lease_ms / 1000
        self._check: asyncio.Task[None] | None = None
        self._recheck = False
        self._helper_failure: BaseException | None = None
        self._flushing = False
        self._flushed = asyncio.Event()

    # -- main loop -----------------------------------------------------------------

    async def run(self) -> ExecutionStatus:
        helpers = [asyncio.create_task(self._flusher(), name=f"flush:{self.eid}")]
        helpers[0].add_done_callback(self._helper_done)
        # The renewer's first round is a third of a lease away: most participations end
        # before it, so its task is made only then (a timer costs less than a task that
        # starts, sleeps and is cancelled).
        renew_later = asyncio.get_running_loop().call_later(
            self._renew_every_s, self._start_renewer, helpers
        )
        try:
            await self._loop()
            await self._let_flush_land()
        finally:
            renew_later.cancel()
            for run in list(self.running.values()):
                run.lose()  # stopped by the pool: not a crash; a handler thread notices
            tasks = [run.task for run in self.running.values() if run.task is not None]
            if self._check is not None:
                tasks.append(self._check)
            await cancel_and_wait([*helpers, *tasks])
        assert self.terminal is not None
        return self.terminal

    async def _let_flush_land(self) -> None:
        """The execution ended (perhaps through another worker's report) while a batch
        of ours was in flight: let its reply arrive rather than cut the call short."""
        if self._flushing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flushed.wait(), self._lease_s)

    def _start_renewer(self, helpers: list[asyncio.Task[None]]) -> None:
        renewer = asyncio.create_task(self._renewer(), name=f"renew:{self.eid}")
        renewer.add_done_callback(self._helper_done)
        helpers.append(renewer)

    def _helper_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._helper_failure = task.exception()
            self.wake.set()

    async def _loop(self) -> None:
        backoff_ms = 1
        outage = 0
        while self.terminal is None:
            if self._helper_failure is not None:
                raise self._helper_failure
            self.wake.clear()
            wait_ms: float | None = None
            if self.free > 0:
                want = min(self.free, self.settings.claim_batch)
                try:
                    batch, claimed = await self._claim_round(want)
                except TRANSIENT_ERRORS as exc:
                    outage += 1
                    self._redis_error(exc, "claim round", outage)
                    wait_ms = self.settings.redis_backoff.delay(outage) * 1000
                else:
                    outage = 0
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

    def _redis_error(self, exc: BaseException, what: str = "", failures: int = 0) -> None:
        self.stats.redis_errors += 1
        if failures == 1:
            log.warning("%s of %s failed on Redis (%s); retrying", what, self.eid, exc)

    async def _claim_round(self, want: int) -> tuple[ClaimBatch, int]:
        """Claim up to ``want`` plain steps in one round trip, then throttled ones into
        the slots left; returns the batch and how many steps were claimed."""
        if self.first_claims is not None:
            # Claimed by the call that created the execution: no round trip.
            batch, sent = self.first_claims
            self.first_claims = None
        else:
            loop = asyncio.get_running_loop()
            self.free -= want
            try:
                sent = loop.time()
                batch = await self.store.claim(
                    self.eid, self.pool.pool_id, want, self.settings.lease_ms
                )
            finally:
                self.free += want
            self.stats.claim_calls += 1
        self.stats.recovered += batch.recovered
        self._start(batch.claims, sent)
        self.throttled_ready = batch.throttled_ready
        self.observe(batch.status)
        if batch.status.terminal:
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

    def _start(self, claims: Sequence[Claim], sent: float) -> None:
        for claim in claims:
            self._spawn(claim, None, sent)

    def _spawn(self, claim: Claim, lease: tuple[str, str, int] | None, sent: float) -> None:
        self.stats.claimed += 1
        self.free -= 1
        worker = self.idle_workers.pop()
        run = StepRun(self, claim, worker, sent + self._lease_s, lease)
        self.running[claim.step_id] = run
        run.start()

    # -- control: pause, resume, cancel -------------------------------------------------

    def observe(self, status: ExecutionStatus) -> None:
        """React to the execution status a reply carried."""
        if status.terminal:
            self.terminal = status
            self.wake.set()
        elif status is ExecutionStatus.CANCELLING:
            self.cancel_running()

    def cancel_running(self) -> None:
        """The execution is cancelled: stop every step this participation runs."""
        if not self.cancelling:
            self.cancelling = True
            log.info("execution %s cancelled: stopping %d steps", self.eid, len(self.running))
        runs = list(self.running.values())
        # Withdraw the attempts still waiting for a handler thread before stopping the
        # ones a thread runs: a running sync handler that notices its cancel frees its
        # thread at once, and a queued attempt not yet withdrawn would start on it.
        for run in sorted(runs, key=lambda r: r.thread_running()):
            run.stop()

    def control_notice(self) -> None:
        """The control channel announced a change of this execution (or the feed
        resubscribed and may have missed one): read the control state soon."""
        self.wake.set()  # resumed: claim at once; paused or cancelled: the loop sees it
        if self._check is None or self._check.done():
            self._check = asyncio.create_task(self._check_control(), name=f"check:{self.eid}")
        else:
            self._recheck = True

    async def _check_control(self) -> None:
        while True:
            self._recheck = False
            try:
                state = await self.store.control_state(self.eid)
            except TRANSIENT_ERRORS as exc:
                self._redis_error(exc)
                return  # the periodic check and the next reply will tell
            except ExecutionNotFound:
                return
            except Exception:  # a read that failed otherwise: the next one tries again
                log.exception("reading the control state of %s failed", self.eid)
                return
            self.apply_control(state)
            if not self._recheck:
                return

    def apply_control(self, state: ControlState) -> None:
        """Act on a read of the control state (a notice's, or the pool's periodic
        :class:`~airuntime.engine.control_poll.ControlPoll`): stop on a cancel, and
        learn the status."""
        if state.cancel_requested:
            self.cancel_running()
        self.observe(state.status)

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
                self.stats.policy_denied += 1
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
            self.stats.lease_denied += 1
            if self.throttle_retry_ms < 0 or lease.retry_after_ms < self.throttle_retry_ms:
                self.throttle_retry_ms = lease.retry_after_ms
            return False
        sent = asyncio.get_running_loop().time()
        try:
            claim = await self.store.claim_step(
                self.eid, self.pool.pool_id, step.id, self.settings.lease_ms, holder
            )
        except REPORT_ERRORS as exc:
            with contextlib.suppress(Exception):
                await self.pool.leases.release(thr.scope, holder)
            if not isinstance(exc, EngineError):
                raise
            self.stats.claim_conflicts += 1
            return False
        self._spawn(claim, (thr.scope, holder, ttl_ms), sent)
        return True

    # -- what step runs hand back -------------------------------------------------------

    def queue_completion(self, report: Report) -> None:
        self.completions.append(report)
        self.have_reports.set()

    def queue_stop(self, report: Report) -> None:
        self.stops.append(report)
        self.have_reports.set()

    def attempt_ended(self, run: StepRun, outcome: AttemptOutcome, seconds: float) -> None:
        self.running.pop(run.claim.step_id, None)
        self.idle_workers.append(run.worker)
        if outcome is not AttemptOutcome.COMPLETED:
            self.free += 1  # a completion keeps its slot until its batch is flushed
        if self.pool.observer is not None:
            self.pool.observer(self.eid, run.claim.step_id, outcome, seconds)
        if outcome is not AttemptOutcome.COMPLETED:
            self.wake.set()

    # -- reporting in batches ------------------------------------------------------------

    async def retry(self, call: Callable[[], Awaitable[T]], what: str, deadline: float) -> T:
        """``call()``, retried on transient Redis errors until ``deadline``."""
        return await retry_transient(
            call,
            what=f"{what} of {self.eid}",
            backoff=self.settings.redis_backoff,
            deadline=deadline,
            on_error=lambda exc: self._redis_error(exc),
        )

    def report_lost(self, what: str, steps: list[str], err: BaseException) -> None:
        """A report could not be recorded: an engine refusal, or the claim's lease ran
        out during an outage (the step is recovered and runs again elsewhere)."""
        if not isinstance(err, EngineError):
            self.stats.dropped_reports += len(steps)
        log.warning("%s of %s/%s not recorded: %s", what, self.eid, ",".join(steps), err)
        self.wake.set()

    async def _flusher(self) -> None:
        while True:
            await self.have_reports.wait()
            self.have_reports.clear()
            self._flushing = True
            self._flushed.clear()
            try:
                if self.completions:
                    items, self.completions = self.completions, []
                    await self._flush(items)
                if self.stops:
                    items, self.stops = self.stops, []
                    await self._flush_stops(items)
            finally:
                self._flushing = False
                self._flushed.set()

    async def _flush(self, items: list[Report]) -> None:
        # Each completed step still holds its worker slot; the same round trip that
        # completes it claims the next ready steps into those slots and into the free
        # ones (reserved here like a claim round does), so a completion that releases a
        # fan-out fills the pool at once (not on a retry: a first call that went through
        # would have claimed them already).
        loop = asyncio.get_running_loop()
        slots = len(items)
        claiming = not (self.terminal or self.cancelling)
        extra = max(0, min(self.free, self.settings.claim_batch - slots)) if claiming else 0
        self.free -= extra
        want = min(slots + extra, self.settings.claim_batch) if claiming else 0
        batch = [(i.step, i.token, i.worker, i.output) for i in items]
        calls = 0
        sent = loop.time()

        async def complete() -> Any:
            nonlocal calls, sent
            calls += 1
            sent = loop.time()
            return await self.store.complete(
                self.eid,
                self.pool.pool_id,
                batch,
                claim_next=want if calls == 1 else 0,
                lease_ms=self.settings.lease_ms,
            )

        try:
            result = await self.retry(complete, "completion batch", _deadline(items))
        except REPORT_ERRORS as err:
            self.report_lost("completion batch", [i.step for i in items], err)
            return
        finally:
            self.free += slots + extra
        self.stats.complete_calls += 1
        for code in result.codes:
            if code in (OK, DUPLICATE):
                self.stats.completed += 1
            elif code == ExecutionTerminal.code:
                self.stats.late_reports += 1
            else:
                self.stats.stale_rejections += 1
        self._start(result.claims, sent)
        self.throttled_ready = result.throttled_ready
        self.observe(result.status)
        if len(result.claims) < slots or self.terminal or result.throttled_ready:
            self.wake.set()  # slots left over, or something else to look at

    async def _flush_stops(self, items: list[Report]) -> None:
        batch = [(i.step, i.token, i.worker) for i in items]
        try:
            result = await self.retry(
                lambda: self.store.stop(self.eid, batch), "stop batch", _deadline(items)
            )
        except ExecutionTerminal:
            self.wake.set()  # finalized meanwhile: the next claim round reads the status
            return
        except REPORT_ERRORS as err:
            self.report_lost("stop batch", [i.step for i in items], err)
            return
        self.stats.stopped_steps += sum(1 for code in result.codes if code == OK)
        self.stats.stale_rejections += sum(1 for code in result.codes if code != OK)
        self.observe(result.status)
        self.wake.set()

    # -- lease renewal -------------------------------------------------------------------

    @property
    def _renew_every_s(self) -> float:
        return self.settings.lease_ms / 3000

    async def _renewer(self) -> None:
        """Every third of a lease, from a third of a lease after the start (the timer
        of :meth:`run` starts this task then): renew the claims still running here."""
        while True:
            running = [r for r in self.running.values() if not r.lost]
            if running:
                await self._renew(running)
            await asyncio.sleep(self._renew_every_s)

    async def _renew(self, running: list[StepRun]) -> None:
        sent = asyncio.get_running_loop().time()
        claims = [(r.claim.step_id, r.claim.token) for r in running]
        try:
            result = await self.retry(
                functools.partial(self.store.renew, self.eid, self.settings.lease_ms, claims),
                "lease renewal",
                min(r.lease_until for r in running),
            )
        except REPORT_ERRORS:
            return
        for r, ok in zip(running, result.alive, strict=True):
            if not ok and not r.lost:
                self.stats.lost_claims += 1
                r.lose()
            elif ok:
                r.lease_until = sent + self._lease_s
                if r.lease is not None:
                    scope, holder, ttl = r.lease
                    with contextlib.suppress(Exception):
                        await self.pool.leases.renew(scope, holder, ttl)
        self.observe(result.status)


def _deadline(items: Sequence[Report]) -> float:
    """When the first of these claims' leases runs out: retrying after it is pointless."""
    return min(i.lease_until for i in items)
