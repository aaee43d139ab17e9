"""The bodies of the run read & steer routes (events, trace, report, list, input,
pause/resume, replay), so the OpenAPI document names every answer.

Why a module of its own: :mod:`~airuntime.control_plane.api.models` holds the submit,
queue and fleet bodies; these belong to issue 12's views of a run, computed from its
material (:mod:`~airuntime.control_plane.run_material`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from airuntime.control_plane.run_details import SharedRunView


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EventBody(_Body):
    seq: int = Field(description="Position in the ledger (0 = first entry).")
    id: str = Field(description="The Redis stream entry id (its milliseconds: Redis time).")
    type: str
    fields: dict[str, str]


class EventsPage(_Body):
    execution_id: str | None = Field(description="None until the runtime started the run.")
    events: list[EventBody]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; None: end.")


class TraceBody(_Body):
    execution_id: str
    status: str
    created_at_ms: int
    finished_at_ms: int | None
    instances: list[str]
    steps: list[dict[str, Any]] = Field(
        description="Plan order: step, handler, depends_on, status, start_ms, end_ms, attempts "
        "(attempt, worker, instance_id, claimed_at_ms, ended_at_ms, outcome, error), "
        "input_requested_at_ms / input_provided_at_ms / skipped_at_ms when they happened."
    )
    slot_waits: list[dict[str, Any]]
    step_slots: list[dict[str, Any]]


class ReportBody(_Body):
    execution_id: str
    status: str
    wall_ms: int | None
    steps: list[dict[str, Any]]
    critical_path: dict[str, Any]
    retries: int
    recoveries: int
    slot_wait_ns: int
    step_slots: list[dict[str, Any]]
    model_usage: list[dict[str, Any]] = Field(
        description="Per provider and model (as reported): calls, input_tokens, "
        "output_tokens of the completed model steps."
    )


class RunsPageBody(_Body):
    runs: list[SharedRunView]
    next_cursor: str | None


class InputRequest(_Body):
    step: str = Field(min_length=1, max_length=256)
    value: Any = None


class SteerResponse(_Body):
    shared_run_id: str
    execution_id: str
    status: str = Field(description="The execution's status after the action.")
    replayed: bool = Field(
        default=False,
        description="An answer the input step had received already, value for value (a "
        "request sent again after its answer was lost): nothing changed now.",
    )


class ReplayResponse(_Body):
    shared_run_id: str = Field(description="The new run.")
    replay_of: str
    status: str
    replayed: bool = Field(
        default=False,
        description="The Idempotency-Key created this replay before: nothing was created now.",
    )
