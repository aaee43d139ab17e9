"""The bodies of the HTTP API: what each route accepts and what it returns.

Routes declare these as ``response_model``; the run bodies
(:class:`~airuntime.control_plane.run_details.SharedRunView`,
:class:`~airuntime.control_plane.run_details.SharedRunDetails`), instance descriptors and
tenant settings are the control plane's own models.
"""

from __future__ import annotations

from typing import Any

import yaml
from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field, model_validator

from airuntime.control_plane.pump import PumpStop
from airuntime.control_plane.settings import SubmitMode
from airuntime.control_plane.shared_runs import SharedRunStatus


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SubmitRequest(_Body):
    pipeline: dict[str, Any] | None = Field(default=None, description="Pipeline document.")
    pipeline_yaml: str | None = Field(default=None, description="Pipeline as YAML text.")
    inputs: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, str] = Field(default_factory=dict)
    mode: SubmitMode | None = None
    project: str | None = None

    @model_validator(mode="after")
    def _one_pipeline(self) -> SubmitRequest:
        if (self.pipeline is None) == (self.pipeline_yaml is None):
            raise ValueError("give exactly one of pipeline or pipeline_yaml")
        return self

    def document(self) -> dict[str, Any]:
        if self.pipeline is not None:
            return self.pipeline
        try:
            doc = yaml.safe_load(self.pipeline_yaml or "")
        except yaml.YAMLError as exc:
            raise HTTPException(400, f"pipeline_yaml: not valid YAML: {exc}") from None
        if not isinstance(doc, dict):
            raise HTTPException(400, "pipeline_yaml: must be a mapping")
        return doc


class SubmitResponse(_Body):
    shared_run_id: str
    status: SharedRunStatus
    assigned_instance_id: str | None
    run_id: str | None


class CancelResponse(_Body):
    shared_run_id: str
    status: SharedRunStatus
    reason: str | None


class DrainRequest(_Body):
    max_count: int = Field(default=100, ge=1, le=100_000)
    stop_on_failure: bool = Field(
        default=False, description="Stop at the first failed dispatch; the rest stays queued."
    )


class DrainResponse(_Body):
    dispatched: int
    failed: int
    cycles: int
    stopped: PumpStop
    seconds: float


class QueueResponse(_Body):
    pending: int
    pending_by_tenant: dict[str, int]


class Health(_Body):
    status: str


class Ready(_Body):
    status: str
    background_pump_ready: bool


class NotReady(_Body):
    status: str
    detail: str


class ErrorBody(_Body):
    detail: str
