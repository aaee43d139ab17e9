"""The vocabulary of a worker pool: its settings, its counters, how an attempt ended.

Why a module of its own: :mod:`~airuntime.engine.worker_pool` (the pool) and
:mod:`~airuntime.engine.participation` (one pool's part in one execution) both speak
it, and the pool creates participations, so the shared words live below both.
``airuntime.engine.worker_pool`` re-exports them.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from airuntime.core.supervision import Backoff

__all__ = ["AttemptOutcome", "PoolSettings", "PoolStats", "StepObserver", "StepSlots"]


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
    control_poll_ms: int = 200
    """While steps run, how often the execution's control state is read: the fallback
    that stops cancelled steps when a control notice was missed (subscription down)."""
    control_feed: bool = True
    """Subscribe to the control channel (one subscription per pool) to stop the steps
    of a cancelled execution at once."""
    redis_backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.05, maximum=1.0))
    """Between retries of a call that failed on a transient Redis error."""

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.claim_batch < 1:
            raise ValueError(f"claim_batch must be >= 1, got {self.claim_batch}")
        if self.lease_ms < 10:
            raise ValueError(f"lease_ms must be >= 10, got {self.lease_ms}")
        if self.control_poll_ms < 1:
            raise ValueError(f"control_poll_ms must be >= 1, got {self.control_poll_ms}")


@dataclass(slots=True)
class PoolStats:
    claimed: int = 0
    completed: int = 0
    failed_attempts: int = 0
    retries_scheduled: int = 0
    stale_rejections: int = 0
    late_reports: int = 0
    """Completions or failures answered "already finalized": nothing was recorded (a
    recovered claim's worker, or the retry of the call that finalized)."""
    lost_claims: int = 0
    crashed_steps: int = 0
    stopped_steps: int = 0
    """Steps stopped because their execution was cancelled (recorded by stopSteps)."""
    policy_denied: int = 0
    lease_denied: int = 0
    claim_conflicts: int = 0
    claim_calls: int = 0
    complete_calls: int = 0
    recovered: int = 0
    redis_errors: int = 0
    """Calls that failed on a transient Redis error (and were retried)."""
    dropped_reports: int = 0
    """Completions, failures or stops given up on: the claim's lease ran out during an
    outage, so the step is recovered and run again elsewhere (at-least-once)."""


class AttemptOutcome(StrEnum):
    """How one attempt of a step ended, as far as this pool saw it."""

    COMPLETED = "completed"
    """The handler returned; the completion is flushed in a batch."""
    FAILED = "failed"
    """The handler raised; the failure was reported (retry or not is the script's call)."""
    STOPPED = "stopped"
    """The execution was cancelled: the handler was stopped (or never started) and the
    stop is recorded with stopSteps."""
    CRASHED = "crashed"
    """The attempt was cancelled without a report; its claim expires and is recovered."""


StepObserver = Callable[[str, str, AttemptOutcome, float], None]
"""(execution_id, step_id, outcome, seconds) after each step attempt."""
