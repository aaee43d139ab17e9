"""What a caller sees of a shared run: the record without its pipeline, then the details.

:class:`SharedRunView` is a listed run; :class:`SharedRunDetails` adds the queue item
and, once a runtime accepted the run, its run record, execution progress and step
states. The parts that are not known yet are *absent* from the JSON (not ``null``),
so the details are serialised with ``exclude_unset`` (see
:meth:`SharedRunDetails.to_json`) and built through :meth:`SharedRunDetails.of`,
which sets every field of the record.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from airuntime.control_plane.shared_runs import SharedRun
from airuntime.engine.status import ExecutionStatus, StepStatus
from airuntime.engine.store_results import ExecutionInfo
from airuntime.fleet.runs import RunRecord, RunStatus


class SharedRunView(SharedRun):
    """A shared run as listed: everything but the pipeline document."""

    # A view is built for one answer and filled in place (run, execution, steps); the
    # stored record it copies stays frozen (its parsed form is shared between readers).
    model_config = ConfigDict(extra="forbid", frozen=False)

    # Never serialised; the default lets a dump/validate round trip (what some
    # FastAPI versions do with response models) rebuild the view.
    pipeline: dict[str, Any] = Field(default_factory=dict, exclude=True)

    @classmethod
    def of(cls, run: SharedRun) -> SharedRunView:
        return cls.model_validate(run.model_dump())


class RunRecordView(BaseModel):
    """What the API shows of the runtime's run record: all of it but the snapshot (the
    shared run carries that one)."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    shared_run_id: str
    instance_id: str
    tenant_id: str
    tenant_group_id: str | None
    status: RunStatus
    execution_id: str | None
    failure_reason: str | None
    created_at_ms: int
    started_at_ms: int | None
    finished_at_ms: int | None
    metadata: dict[str, str]

    @classmethod
    def of(cls, record: RunRecord) -> RunRecordView:
        return cls.model_validate(record.model_dump(include=set(cls.model_fields)))


class ExecutionProgress(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: ExecutionStatus
    total: int
    done: int
    completed: int
    failed: int

    @classmethod
    def of(cls, info: ExecutionInfo) -> ExecutionProgress:
        return cls(
            status=info.status,
            total=info.total,
            done=info.done,
            completed=info.completed,
            failed=info.failed,
        )


class SharedRunDetails(SharedRunView):
    """One shared run with its queue item and, once known, the runtime's side.

    ``run``, ``execution`` and ``steps`` are left unset (absent from the JSON) until
    the runtime accepted the run / created its execution.
    """

    queue_item: dict[str, str]
    """The queue item's hash, as the shared-queue scripts wrote it."""
    run: RunRecordView | None = None
    execution: ExecutionProgress | None = None
    steps: dict[str, StepStatus] | None = None

    @classmethod
    def of(cls, run: SharedRun, queue_item: dict[str, str] | None = None) -> SharedRunDetails:
        return cls.model_validate({**run.model_dump(), "queue_item": queue_item or {}})

    def to_json(self) -> dict[str, Any]:
        """The JSON body ``GET /v1/runs/{id}`` returns."""
        return self.model_dump(mode="json", exclude_unset=True)
