"""The run request a runtime instance accepts, and the run record it keeps.

A *run request* travels from the control plane (or a test, or ``airt submit``) to a
runtime instance's local queue through a provider (in-process, Redis stream inbox,
HTTP). It must carry the :class:`~airuntime.core.context.ExecutionContextSnapshot`: a
request without one is refused, because the snapshot's ``tenant_id`` is the only
tenant boundary. Delivering the same ``shared_run_id`` twice creates one ``RunId``.

The *run record* is the run execution index entry (``air:{air}:run:<RunId>``): RunId ->
ExecutionId, instance, status, failure reason, timestamps, snapshot, metadata.
Status and cancel by RunId read it under the caller's tenant first.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from airuntime.core.context import ExecutionContextSnapshot


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


class RunRequest(BaseModel):
    """A pipeline run handed to a runtime instance."""

    model_config = ConfigDict(extra="forbid")

    shared_run_id: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:-]+$")
    pipeline: dict[str, Any] = Field(description="The pipeline document (validated on accept).")
    inputs: dict[str, Any] = Field(default_factory=dict)
    snapshot: ExecutionContextSnapshot
    metadata: dict[str, str] = Field(default_factory=dict)


class RunRecord(BaseModel):
    """One entry of the run execution index."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    shared_run_id: str
    instance_id: str
    tenant_id: str
    tenant_group_id: str | None = None
    status: RunStatus
    execution_id: str | None = None
    failure_reason: str | None = None
    created_at_ms: int
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    snapshot: ExecutionContextSnapshot
    metadata: dict[str, str] = Field(default_factory=dict)
    step_slots: dict[str, int] | None = None
    """Step-slot evidence of the owning instance (admitted, succeeded, failed, cancelled,
    queue_ns, execution_ns, version), recorded when the run finished."""
