"""The names of execution and step states, and which changes between them are allowed.

The Lua scripts write these values (``meta.status`` of an execution, the ``status``
hash of its steps) and Python reads them back; this module is the one place Python
spells them. The transition tables are the rules the scripts implement, written as
data so tests can hold every recorded change against them.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType


class ExecutionStatus(StrEnum):
    """``meta.status``: derived by the scripts from control fields and counters."""

    RUNNING = "Running"
    """Claims allowed (the only status that allows them)."""
    PAUSING = "Pausing"
    """Paused, some steps still running."""
    PAUSED = "Paused"
    WAITING_FOR_INPUT = "WaitingForInput"
    """An ``input`` step waits for a value; claims are blocked until it arrives."""
    FAILING = "Failing"
    """fail_fast: a step failed for good; running steps drain, then Failed."""
    CANCELLING = "Cancelling"
    """Cancel requested; running steps drain, then Cancelled."""
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_EXECUTION_STATUSES


class StepStatus(StrEnum):
    """A step's entry in the execution's ``status`` hash."""

    PENDING = "pending"
    """Dependencies not complete yet."""
    READY = "ready"
    """In a ready set, claimable."""
    RUNNING = "running"
    """Claimed: a worker holds its claim token and lease."""
    RETRY_WAIT = "retry_wait"
    """A failed attempt with attempts left: ready again at ``next_retry_at``."""
    INPUT_WAIT = "input_wait"
    """An ``input`` step whose dependencies completed: waits for ``provideInput``."""
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"
    """Never ran: a dependency failed (policy continue) or the execution failed first."""
    CANCELLED = "cancelled"
    """Never finished: the execution was cancelled first."""

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STEP_STATUSES


TERMINAL_EXECUTION_STATUSES = frozenset(
    {ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED}
)
TERMINAL_STEP_STATUSES = frozenset(
    {StepStatus.COMPLETED, StepStatus.FAILED, StepStatus.SKIPPED, StepStatus.CANCELLED}
)

_E = ExecutionStatus
_S = StepStatus

#: From each status, what one script call may leave behind (``refreshStatus`` and
#: ``finalize`` in ``lua/includes``). Cancel wins over everything not yet final and
#: cannot be taken back; a failure under fail_fast cannot be either.
ALLOWED_EXECUTION_TRANSITIONS: Mapping[ExecutionStatus, frozenset[ExecutionStatus]] = (
    MappingProxyType(
        {
            _E.RUNNING: frozenset(
                {
                    _E.PAUSING,
                    _E.PAUSED,
                    _E.WAITING_FOR_INPUT,
                    _E.FAILING,
                    _E.CANCELLING,
                    *TERMINAL_EXECUTION_STATUSES,
                }
            ),
            _E.PAUSING: frozenset(
                {
                    _E.RUNNING,
                    _E.PAUSED,
                    _E.WAITING_FOR_INPUT,
                    _E.FAILING,
                    _E.CANCELLING,
                    *TERMINAL_EXECUTION_STATUSES,
                }
            ),
            _E.PAUSED: frozenset(
                {
                    _E.RUNNING,
                    _E.WAITING_FOR_INPUT,
                    _E.CANCELLING,
                    _E.SUCCEEDED,
                    _E.CANCELLED,
                }
            ),
            _E.WAITING_FOR_INPUT: frozenset(
                {
                    _E.RUNNING,
                    _E.PAUSING,
                    _E.PAUSED,
                    _E.FAILING,
                    _E.CANCELLING,
                    *TERMINAL_EXECUTION_STATUSES,
                }
            ),
            _E.FAILING: frozenset({_E.CANCELLING, _E.FAILED, _E.CANCELLED}),
            _E.CANCELLING: frozenset({_E.CANCELLED}),
            _E.SUCCEEDED: frozenset(),
            _E.FAILED: frozenset(),
            _E.CANCELLED: frozenset(),
        }
    )
)

#: Every change the scripts make to a step's status. Finalization turns whatever is
#: not terminal yet into ``skipped`` (Failed) or ``cancelled`` (Cancelled).
ALLOWED_STEP_TRANSITIONS: Mapping[StepStatus, frozenset[StepStatus]] = MappingProxyType(
    {
        _S.PENDING: frozenset({_S.READY, _S.INPUT_WAIT, _S.SKIPPED, _S.CANCELLED}),
        _S.READY: frozenset({_S.RUNNING, _S.SKIPPED, _S.CANCELLED}),
        _S.RUNNING: frozenset(
            {_S.COMPLETED, _S.FAILED, _S.RETRY_WAIT, _S.READY, _S.SKIPPED, _S.CANCELLED}
        ),
        _S.RETRY_WAIT: frozenset({_S.READY, _S.SKIPPED, _S.CANCELLED}),
        _S.INPUT_WAIT: frozenset({_S.COMPLETED, _S.SKIPPED, _S.CANCELLED}),
        _S.COMPLETED: frozenset(),
        _S.FAILED: frozenset(),
        _S.SKIPPED: frozenset(),
        _S.CANCELLED: frozenset(),
    }
)
