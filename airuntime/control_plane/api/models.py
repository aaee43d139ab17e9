"""The bodies of the HTTP API: what each route accepts and what it returns.

Routes declare these as ``response_model``; the run bodies
(:class:`~airuntime.control_plane.run_details.SharedRunView`,
:class:`~airuntime.control_plane.run_details.SharedRunDetails`), instance descriptors and
tenant settings are the control plane's own models. Request bodies are validated with
the rules of the models they become (the snapshot fields with the snapshot's), and are
bounded: the whole body by ``max_request_bytes`` (413), ``inputs`` by
:data:`MAX_INPUTS_BYTES` of JSON, ``metadata`` by :data:`MAX_METADATA_ENTRIES` short
entries.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Final

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from airuntime.control_plane.pump import PumpStop
from airuntime.control_plane.rbac import TENANT_ID_PATTERN
from airuntime.control_plane.settings import SubmitMode
from airuntime.control_plane.shared_runs import SharedRunStatus
from airuntime.control_plane.suspects import SuspectMark
from airuntime.engine.model_budget import BudgetWindow
from airuntime.fleet.registry import InstanceDescriptor

MAX_INPUTS_BYTES: Final = 256 * 1024
"""Largest ``inputs`` of a submission, as compact JSON (256 KiB)."""
MAX_METADATA_ENTRIES: Final = 64
"""Most ``metadata`` entries of a submission (keys up to 128, values up to 1024 characters)."""

MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=128)]
MetadataValue = Annotated[str, StringConstraints(max_length=1024)]
Namespace = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"\S")]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PipelineYamlError(ValueError):
    """``pipeline_yaml`` is not a YAML mapping."""


def _one_pipeline_schema(schema: dict[str, Any]) -> None:
    """Document what the validator enforces: exactly one of the two pipeline fields."""
    props = schema.get("properties")
    if isinstance(props, dict):
        props["pipeline"] = {
            "type": "object",
            "title": "Pipeline",
            "description": "Pipeline document (exactly one of pipeline, pipeline_yaml).",
        }
        props["pipeline_yaml"] = {
            "type": "string",
            "title": "Pipeline Yaml",
            "description": "Pipeline as YAML text (exactly one of pipeline, pipeline_yaml).",
        }
    schema["oneOf"] = [{"required": ["pipeline"]}, {"required": ["pipeline_yaml"]}]


class SubmitRequest(_Body):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_one_pipeline_schema)

    pipeline: dict[str, Any] | None = None
    pipeline_yaml: str | None = None
    inputs: dict[str, Any] = Field(
        default_factory=dict,
        description=f"Run inputs; at most {MAX_INPUTS_BYTES} bytes as JSON.",
    )
    metadata: dict[MetadataKey, MetadataValue] = Field(
        default_factory=dict, max_length=MAX_METADATA_ENTRIES
    )
    mode: SubmitMode | None = None
    project: str | None = Field(
        default=None, max_length=200, description="One of the token's projects."
    )
    current_namespace: Namespace | None = Field(
        default=None, description="One of the token's namespaces."
    )
    namespaces: list[Namespace] = Field(
        default_factory=list, max_length=64, description="Each one of the token's namespaces."
    )
    context_key: str | None = Field(
        default=None, max_length=200, description="Needs a token that allows a context key."
    )
    tenant_group_id: str | None = Field(
        default=None, pattern=TENANT_ID_PATTERN, description="Only the token's own group."
    )

    @model_validator(mode="after")
    def _one_pipeline_and_bounded_inputs(self) -> SubmitRequest:
        if (self.pipeline is None) == (self.pipeline_yaml is None):
            raise ValueError("give exactly one of pipeline or pipeline_yaml")
        size = len(json.dumps(self.inputs, separators=(",", ":")).encode())
        if size > MAX_INPUTS_BYTES:
            raise ValueError(f"inputs: {size} bytes of JSON, more than {MAX_INPUTS_BYTES}")
        return self

    def document(self) -> dict[str, Any]:
        """The pipeline document; :class:`PipelineYamlError` for YAML that is no mapping."""
        if self.pipeline is not None:
            return self.pipeline
        try:
            doc = yaml.safe_load(self.pipeline_yaml or "")
        except yaml.YAMLError as exc:
            raise PipelineYamlError(f"not valid YAML: {exc}") from None
        if not isinstance(doc, dict):
            raise PipelineYamlError("must be a mapping")
        return doc


class SubmitResponse(_Body):
    shared_run_id: str
    status: SharedRunStatus
    assigned_instance_id: str | None
    run_id: str | None
    replayed: bool = Field(
        default=False,
        description="The Idempotency-Key created this run before: nothing was created now "
        "(the answer also carries `Idempotent-Replayed: true`).",
    )


class CancelResponse(_Body):
    shared_run_id: str
    status: SharedRunStatus
    reason: str | None


class DrainRequest(_Body):
    max_count: int = Field(default=100, ge=1, le=100_000)
    stop_on_failure: bool = Field(
        default=False, description="Stop at the first failed dispatch; the rest stays queued."
    )


class StepSlotsRequest(_Body):
    limit: int = Field(
        ge=0,
        le=1_000_000,
        description="Step handlers the tenant's runtimes run at once (0 = unlimited); "
        "applied live, no restart.",
    )


class SecretRequest(_Body):
    value: str = Field(
        description="The secret's value: 4 to 4096 printable ASCII characters (it "
        "is sent in an HTTP header). Never answered back by any read.",
        json_schema_extra={"writeOnly": True},
    )


class SecretView(_Body):
    """A stored secret as anyone may see it: never its value."""

    name: str = Field(description="What an http step's header names: ${secrets.<name>}.")
    updated_at_ms: int = Field(description="When the value was last set (Unix ms).")
    updated_by: str = Field(description="Who set it (the token's user).")
    sealed_with: str | None = Field(
        default=None,
        description="Fingerprint of the platform key the value is sealed under at rest "
        "(AIRUNTIME_SECRETS_KEYS); null: stored as written.",
    )


class ModelUsageView(_Body):
    """A tenant's model token budget and where it stands in the current window."""

    tenant_id: str
    budget: int | None = Field(
        default=None,
        description="Tokens the tenant's model steps may use in a window; null: not limited "
        "(the rest is then null too).",
    )
    window: BudgetWindow | None = Field(
        default=None, description="The budget's calendar window (UTC)."
    )
    window_started_at_ms: int | None = Field(
        default=None, description="When the current window began (Unix ms)."
    )
    resets_at_ms: int | None = Field(
        default=None, description="When the next window begins (Unix ms)."
    )
    used: int | None = Field(
        default=None, description="Tokens the calls that ended in this window reported."
    )
    reserved: int | None = Field(
        default=None,
        description="Tokens held by calls going on now (the longest reply each may get).",
    )
    remaining: int | None = Field(
        default=None,
        description="What a call may still reserve: budget - used - reserved, at least 0.",
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


class InstanceView(InstanceDescriptor):
    """A runtime instance as the API shows it: its descriptor, and whether admission
    skips it because it could not be reached lately."""

    suspect: SuspectMark | None = None


class ModelProviderView(_Body):
    """A model provider a tenant's ``model`` steps may name: what a pipeline author needs
    to write the step, never where the provider is or the key it is called with."""

    name: str = Field(description="What a model step's `provider` names.")
    api: str = Field(description="openai (Chat Completions) or anthropic (Messages).")
    models: list[str] = Field(description="The models a step may ask for; empty: any.")
    max_output_tokens: int = Field(description="The most `max_tokens` a step may ask for.")


class Health(_Body):
    status: str


class Ready(_Body):
    status: str
    background_pump_ready: bool


class NotReady(_Body):
    status: str
    detail: str
    unhealthy_loops: list[str] = Field(default_factory=list)
    """Background loops that are failing (restarting with backoff) or not started yet."""


class ErrorBody(_Body):
    detail: str
