"""What ``GET /v1/runs/{id}`` answers: a run's details, computed from its material only.

Why this exists: the details of a run must read the same while it is hot in Redis and
after retention moved it to the archive. :func:`run_details` looks at nothing but a
:class:`~airuntime.control_plane.run_material.RunMaterial` (the shared run, the
execution's step states, timings and terminal snapshot), so both sources give the
same JSON. The parts not known yet are absent (``exclude_unset``), as before.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from airuntime.control_plane.run_details import SharedRunView
from airuntime.control_plane.run_material import ExecutionMaterial, RunMaterial
from airuntime.control_plane.shared_runs import SharedRunStatus

__all__ = ["ExecutionView", "RunDetails", "RunSummary", "StepView", "instance_of", "run_details"]

_RUN_STATUS = {"Succeeded": "completed", "Failed": "failed", "Cancelled": "cancelled"}
_SHARED_ENDED = {
    SharedRunStatus.SUCCEEDED: "completed",
    SharedRunStatus.FAILED: "failed",
    SharedRunStatus.CANCELLED: "cancelled",
}


def instance_of(worker: str | None) -> str | None:
    """The runtime instance of a worker id (``<instance>@<host>/w<n>``), if it names one."""
    if not worker or "@" not in worker:
        return None
    return worker.split("@", 1)[0]


class StepView(BaseModel):
    """One step: the terminal snapshot's per-step record (or the same built live)."""

    model_config = ConfigDict(extra="forbid")

    status: str
    attempts: int
    output: Any = Field(
        default=None,
        description="The output; a large one is a payload reference "
        '{"$payload", "size", "sha256"}.',
    )
    error: str | None = None
    worker: str | None = None
    instance_id: str | None = None
    claimed_at_ms: int | None = None
    finished_at_ms: int | None = None


class ExecutionView(BaseModel):
    model_config = ConfigDict(extra="forbid")

    execution_id: str
    status: str
    pipeline_id: str
    created_at_ms: int
    started_at_ms: int | None
    finished_at_ms: int | None
    total: int
    done: int
    completed: int
    failed: int
    skipped: int
    cancelled: int
    snapshot: dict[str, Any] | None = Field(
        default=None, description="The terminal snapshot, once the execution ended."
    )


class RunSummary(BaseModel):
    """Where the run ran and how it ended, as the shared run and execution say."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    instance_id: str | None
    status: str = Field(description="queued | running | completed | failed | cancelled")


class RunDetails(SharedRunView):
    """A shared run, its runtime run and execution, and every step's record.

    ``run``, ``execution`` and ``steps`` are absent until the runtime accepted the run
    / created its execution."""

    run: RunSummary | None = None
    execution: ExecutionView | None = None
    steps: dict[str, StepView] | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)


def _execution(ex: ExecutionMaterial) -> ExecutionView:
    counts = {k: ex.counts.get(k, 0) for k in ("total", "completed", "failed")}
    skipped, cancelled = ex.counts.get("skipped", 0), ex.counts.get("cancelled", 0)
    return ExecutionView(
        execution_id=ex.execution_id,
        status=ex.status,
        pipeline_id=ex.pipeline_id,
        created_at_ms=ex.created_at_ms,
        started_at_ms=ex.started_at_ms,
        finished_at_ms=ex.finished_at_ms,
        done=counts["completed"] + counts["failed"] + skipped + cancelled,
        skipped=skipped,
        cancelled=cancelled,
        snapshot=ex.snapshot,
        **counts,
    )


def _steps(ex: ExecutionMaterial) -> dict[str, StepView]:
    """Every step's view, in plan order (what ``airt runs show`` and the console list)."""
    views: dict[str, StepView] = {}
    for step in ex.step_ids():
        record = ex.steps[step]
        views[step] = StepView(**record, instance_id=instance_of(record.get("worker")))
    return views


def _run_status(material: RunMaterial) -> str:
    ex = material.execution
    if ex is not None:
        return _RUN_STATUS.get(ex.status, "running")
    return _SHARED_ENDED.get(material.run.status, "queued")


def run_details(material: RunMaterial) -> RunDetails:
    """The details of a run, from its material only."""
    run = material.run
    details = RunDetails.model_validate(run.model_dump())
    if run.run_id:
        details.run = RunSummary(
            run_id=run.run_id, instance_id=run.assigned_instance_id, status=_run_status(material)
        )
    ex = material.execution
    if ex is not None:
        details.execution_id = ex.execution_id
        details.execution = _execution(ex)
        details.steps = _steps(ex)
    return details
