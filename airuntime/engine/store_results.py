"""What the execution store's calls return: the execution scripts' replies as values.

Why this exists apart from :mod:`~airuntime.engine.execution_store`: the store is the
calls (arguments in, script, reply checked); these are the plain, immutable results
the engine, the runtimes and the read views pass around.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from airuntime.core.context import ExecutionContextSnapshot
from airuntime.engine.status import ExecutionStatus

__all__ = [
    "Claim",
    "ClaimBatch",
    "CompletionResult",
    "ControlState",
    "ExecutionInfo",
    "FailOutcome",
    "FailResult",
    "LedgerEvent",
    "PruneResult",
    "RecoverResult",
    "RenewResult",
    "StopResult",
]


@dataclass(frozen=True, slots=True)
class Claim:
    """Ownership of one step: present ``token`` to complete or fail it."""

    execution_id: str
    step_id: str
    token: str
    attempt: int
    ref_outputs: dict[str, Any]

    @property
    def sequence(self) -> int:
        """The claim's number in its execution (``claim_seq``): every claim of an
        execution gets a higher one than all claims before it, so a claim that replaced
        a lost one (recovery) always carries a higher number."""
        return int(self.token.rsplit("#", 1)[1])


class FailOutcome(StrEnum):
    """What ``failStep`` did with a failed attempt."""

    RETRY = "retry"
    """Attempts left: the step waits for its retry."""
    FAILED = "failed"
    """The step failed for good."""


@dataclass(frozen=True, slots=True)
class ClaimBatch:
    status: ExecutionStatus
    wake_ms: int
    throttled_ready: int
    claims: list[Claim]
    recovered: int = 0


@dataclass(frozen=True, slots=True)
class CompletionResult:
    status: ExecutionStatus
    readied: int
    codes: list[int]
    throttled_ready: int = 0
    claims: list[Claim] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class StopResult:
    """What ``stopSteps`` did: the execution status after it and one code per step
    (:data:`~airuntime.core.errors.OK` stopped, negative: an engine error code)."""

    status: ExecutionStatus
    codes: list[int]


@dataclass(frozen=True, slots=True)
class RenewResult:
    """The execution status and, per step, whether its lease was extended (False: the
    claim is lost, stop the step)."""

    status: ExecutionStatus
    alive: list[bool]


@dataclass(frozen=True, slots=True)
class ControlState:
    """What workers of an execution must know to react to pause, resume and cancel."""

    status: ExecutionStatus
    cancel_requested: bool
    """A cancel was accepted (the execution is Cancelling, or ended Cancelled)."""


@dataclass(frozen=True, slots=True)
class PruneResult:
    """One pass of :meth:`ExecutionStore.prune_index`."""

    examined: int
    """Index entries looked at (both indexes)."""
    unlisted: int
    """Executions removed from ``air:executions``: their keys had expired."""
    deactivated: int
    """Executions removed from ``air:executions:active``: gone, or already finalized."""


@dataclass(frozen=True, slots=True)
class FailResult:
    status: ExecutionStatus
    outcome: FailOutcome
    attempt: int
    next_retry_at_ms: int


@dataclass(frozen=True, slots=True)
class RecoverResult:
    status: ExecutionStatus
    promoted: int
    recovered: int
    wake_ms: int


@dataclass(frozen=True, slots=True)
class ExecutionInfo:
    execution_id: str
    pipeline_id: str
    status: ExecutionStatus
    tenant_id: str
    total: int
    done: int
    completed: int
    failed: int
    skipped: int
    cancelled: int
    running: int
    created_at_ms: int
    finished_at_ms: int | None
    context: ExecutionContextSnapshot | None

    @property
    def terminal(self) -> bool:
        return self.status.terminal


@dataclass(frozen=True, slots=True)
class LedgerEvent:
    id: str
    type: str
    fields: dict[str, str]

    def get(self, name: str, default: str = "") -> str:
        return self.fields.get(name, default)
