"""Cancelling a runtime run, whatever moment the cancel lands in.

A run moves from queued (in its instance's local queue) to running with a named
ExecutionId (``startRun``) to running with a created execution (``createExecution``,
the runtime's next round trip). A cancel reads the record at one moment and acts at a
later one, so each window between those states must keep it:

* **queued**: the run leaves its queue Cancelled in one script that refuses when the
  run started meanwhile (``finishRun`` only if still queued). Removing it from the
  queue and then finishing it unconditionally, as the control plane once did, could
  mark a run Cancelled that a runtime had just started and would run to its end.
* **started meanwhile**: the record is read again and the execution it now names is
  cancelled.
* **named, not created yet**: :meth:`ExecutionStore.cancel_announced` keeps the cancel
  and the execution is created cancelled; a plain cancel found nothing and was lost.

The control plane's cancel of a dispatched run, its pump's cancel in flight and a
runtime's own API share this one sequence. The caller's tenant is checked on every
read: a run another tenant owns is "not found".
"""

from __future__ import annotations

import contextlib
from enum import StrEnum

from airuntime.core.errors import ExecutionTerminal
from airuntime.engine.execution_store import ExecutionStore
from airuntime.fleet.run_index import RunIndex
from airuntime.fleet.runs import RunStatus

__all__ = ["CancelOutcome", "cancel_run"]


class CancelOutcome(StrEnum):
    NOT_FOUND = "not_found"
    """No such run for this tenant."""
    ENDED = "ended"
    """It had ended already; nothing changed."""
    CANCELLED_QUEUED = "cancelled_queued"
    """It had not started: it left its queue Cancelled."""
    REQUESTED = "requested"
    """Its execution was told (or will be created cancelled); the run ends Cancelled
    once the execution did, unless it finished first."""


async def cancel_run(
    index: RunIndex, executions: ExecutionStore, run_id: str, tenant_id: str
) -> CancelOutcome:
    """Cancel ``run_id`` for ``tenant_id`` (see the module doc for the windows)."""
    # Two reads suffice: a run that was queued at the first read and is not any more
    # started (it has its ExecutionId) or ended. The third read is only defensive.
    for _ in range(3):
        record = await index.get_for_tenant(run_id, tenant_id)
        if record is None:
            return CancelOutcome.NOT_FOUND
        if record.status.terminal:
            return CancelOutcome.ENDED
        if record.execution_id:
            with contextlib.suppress(ExecutionTerminal):  # it ended on its own first
                await executions.cancel_announced(record.execution_id, f"tenant {tenant_id}")
            return CancelOutcome.REQUESTED
        if record.status is RunStatus.QUEUED and await index.cancel_queued(
            record, "cancelled while queued"
        ):
            return CancelOutcome.CANCELLED_QUEUED
    raise RuntimeError(f"run {run_id} kept changing state under a cancel")
