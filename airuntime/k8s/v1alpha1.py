"""Custom resources of the ``airuntime.io/v1alpha1`` API: the Kubernetes contract.

Why this module exists: the RuntimePool and ScaleOutRequest resources are a
contract between three parties -- the Kubernetes API server (which validates
them), the operator (which reconciles them) and the control plane (whose
``kubernetes`` scale-out provider creates ScaleOutRequests). The contract is
written once, here, as pydantic models plus the names everyone must agree on: the
API group and version, kinds and plurals, the phases of a request, the condition
types and reasons of a pool's status, the reasons of the events the operator posts.
The CustomResourceDefinitions are *generated* from these models
(:mod:`airuntime.k8s.crdgen`, ``airt crds generate --out crds/``) and a test fails
when the checked-in files drift.

The models are camelCase on the wire (Kubernetes convention) and snake_case in
Python (``populate_by_name``). Every rule the API server enforces with a CEL
expression (``x-kubernetes-validations``) is mirrored by a pydantic validator, so
a client building a resource in Python gets the same answer before it sends it.

This module lives in :mod:`airuntime` (not in the operator) because the control
plane needs it too; it imports no Kubernetes client library and no kopf.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from airuntime.engine.model_budget import MAX_BUDGET_TOKENS, BudgetWindow
from airuntime.fleet.instance_settings import InstanceSettings
from airuntime.fleet.tenancy import (
    DEFAULT_ALLOWED_HANDLERS,
    HANDLER_NAME_PATTERN,
    MODEL_PROVIDER_PATTERN,
    IsolationMode,
    TenantSettings,
)

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "LABEL_PREFIX",
    "LABEL_TENANT",
    "OPERATOR_MANAGED_ENV",
    "OPERATOR_MANAGED_SETTINGS",
    "RUNTIME_POOL",
    "SCALE_OUT_REQUEST",
    "Condition",
    "ConditionStatus",
    "CrdNames",
    "EnvVar",
    "RedisSecretRef",
    "ResourceRequirements",
    "RuntimePoolSpec",
    "RuntimePoolStatus",
    "ScaleOutPhase",
    "ScaleOutRequestSpec",
    "ScaleOutRequestStatus",
    "TenantSettingsSnapshot",
    "runtime_pool_manifest",
    "scale_out_request_manifest",
]

API_GROUP: Final = "airuntime.io"
API_VERSION: Final = "v1alpha1"
LABEL_TENANT: Final = "airuntime.io/tenant"
"""Label naming the tenant of an object made for one (runtime pods and their objects,
ScaleOutRequests)."""
LABEL_PREFIX: Final = "airuntime.io/prefix"
"""Label naming the runtime prefix an object belongs to (as ``LABEL_TENANT``)."""

_DNS_LABEL: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS_SUBDOMAIN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_ENV_NAME: Final = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
_MAX_PREFIX_LENGTH: Final = 50
"""A pod is named ``<prefix>-<10 chars>-<5 chars>``; 50 keeps that a 63-char DNS label."""

OPERATOR_MANAGED_SETTINGS: Final[tuple[str, ...]] = (
    "redis_url",
    "tenant_id",
    "tenant_group_id",
    "isolation_mode",
    "prefer_dedicated",
    "allow_shared_fallback",
    "runtime_prefix",
    "instance_id",
    "workers",
    "max_concurrent_runs",
    "queue_capacity",
    "max_local_workers_per_execution",
    "step_slots_from_tenant",
    "http_port",
    "http_host",
    "advertise_host",
)
"""Fields of the runtime's :class:`InstanceSettings` the operator sets on runtime pods,
in the order of the pod's env."""
OPERATOR_MANAGED_ENV: Final[tuple[str, ...]] = tuple(
    InstanceSettings.env_var(field)
    for field in (*OPERATOR_MANAGED_SETTINGS, "max_concurrent_step_tasks")
)
"""Environment variables a pool's ``env`` may not set: the ones the operator sets on
runtime pods, and the step-handler limit (the pod takes it from the tenant settings)."""


def _cel(rule: str, message: str, **extra: str) -> dict[str, str]:
    return {"rule": rule, "message": message, **extra}


def _validations(*rules: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(rules)}


class _Resource(BaseModel):
    """camelCase on the wire, snake_case in Python, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready camelCase form, without unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# -- shared pieces ---------------------------------------------------------------------


class RedisSecretRef(_Resource):
    """Where runtime pods read the Redis URL: a key of a Secret in the pool's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)
    """Name of the Secret."""
    key: str = Field(default="url", min_length=1, max_length=253)
    """Key in the Secret whose value is the Redis URL (``redis://`` or ``rediss://``)."""


class ModelTokenBudgetSpec(_Resource):
    """A tenant's model token budget (see airuntime/engine/model_budget.py)."""

    tokens: int = Field(ge=1, le=MAX_BUDGET_TOKENS)
    """Tokens (prompt and reply, every provider) the tenant's model steps may use in one window."""
    window: BudgetWindow = BudgetWindow.DAY
    """The calendar hour, day or month (UTC) the budget is for; it renews at the next."""


class EnvVar(
    _Resource,
    json_schema_extra=_validations(
        _cel(
            "!(has(self.value) && has(self.valueFrom))",
            "set either value or valueFrom, not both",
        )
    ),
):
    """An extra environment variable of the runtime container (as in a Pod spec)."""

    name: str = Field(min_length=1, max_length=256, pattern=_ENV_NAME)
    """Variable name."""
    value: str | None = None
    """Literal value (mutually exclusive with ``valueFrom``)."""
    value_from: dict[str, Any] | None = None
    """A Kubernetes ``EnvVarSource`` (secretKeyRef, configMapKeyRef, fieldRef, ...)."""

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env {self.name}: set either value or valueFrom, not both")
        return self


class ResourceRequirements(_Resource):
    """CPU/memory requests and limits of the runtime container (Kubernetes quantities)."""

    requests: dict[str, int | str] | None = None
    """E.g. ``{"cpu": "500m", "memory": "512Mi"}``."""
    limits: dict[str, int | str] | None = None
    """E.g. ``{"memory": "1Gi"}``."""


class ConditionStatus(StrEnum):
    """The status of a condition, as ``metav1.Condition`` spells it."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(_Resource):
    """A ``metav1.Condition``: one observed aspect of the resource's state."""

    type: str = Field(min_length=1, max_length=316)
    """CamelCase condition type, e.g. ``Reconciled``."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: str = Field(min_length=1, max_length=1024)
    """CamelCase, machine-readable reason of the last transition."""
    message: str = Field(default="", max_length=32768)
    """Human-readable details."""
    last_transition_time: datetime
    """When ``status`` last changed."""
    observed_generation: int | None = Field(default=None, ge=0)
    """``metadata.generation`` the condition was computed from."""


# -- RuntimePool ----------------------------------------------------------------------------


class RuntimePoolSpec(
    _Resource,
    json_schema_extra=_validations(
        _cel(
            "self.minInstances <= self.maxInstances",
            "minInstances must be less than or equal to maxInstances",
            fieldPath=".minInstances",
        ),
        _cel(
            "self.maxLocalWorkersPerExecution <= self.workersPerInstance",
            "maxLocalWorkersPerExecution must be less than or equal to workersPerInstance",
            fieldPath=".maxLocalWorkersPerExecution",
        ),
        _cel(
            "!(self.isolationMode == 'Shared' && self.preferDedicated)",
            "preferDedicated requires isolationMode Dedicated or Hybrid",
            fieldPath=".preferDedicated",
        ),
        _cel(
            "!has(self.env) || self.env.all(e, !(e.name in "
            + "["
            + ", ".join(f"'{n}'" for n in OPERATOR_MANAGED_ENV)
            + "]))",
            "env must not set a variable the operator manages ("
            + ", ".join(OPERATOR_MANAGED_ENV)
            + ")",
            fieldPath=".env",
        ),
    ),
):
    """Desired state of one tenant runtime pool: one Deployment of ``airt runtime`` pods
    named after ``runtimePrefix``, plus the tenant settings the operator publishes."""

    tenant_id: str = Field(
        min_length=1,
        max_length=63,
        pattern=_DNS_LABEL,
        json_schema_extra=_validations(_cel("self == oldSelf", "tenantId is immutable")),
    )
    """Tenant that owns the pool (DNS label). Immutable."""
    tenant_group_id: str | None = Field(
        default=None, min_length=1, max_length=63, pattern=_DNS_LABEL
    )
    """Tenant group sharing Dedicated/Hybrid runtimes with the tenant."""
    isolation_mode: IsolationMode = IsolationMode.SHARED
    """Shared, Dedicated or Hybrid (see :mod:`airuntime.fleet.tenancy`)."""
    prefer_dedicated: bool = False
    """Prefer the tenant's dedicated runtimes over shared ones when both are visible."""
    allow_shared_fallback: bool | None = None
    """Whether the tenant may run on Shared runtimes; default: true only for Shared tenants."""
    runtime_prefix: str = Field(
        min_length=1,
        max_length=_MAX_PREFIX_LENGTH,
        pattern=_DNS_LABEL,
        json_schema_extra=_validations(
            _cel(
                f"self.matches('{_DNS_LABEL}') && size(self) <= {_MAX_PREFIX_LENGTH}",
                f"runtimePrefix must be a DNS label of at most {_MAX_PREFIX_LENGTH} characters",
            ),
            _cel("self == oldSelf", "runtimePrefix is immutable"),
        ),
    )
    """Name of the Deployment and prefix of every runtime instance id. Immutable."""
    min_instances: int = Field(default=1, ge=0, le=1000)
    """Fewest runtime pods; ``spec.replicas`` is clamped up to it."""
    max_instances: int = Field(default=1, ge=1, le=1000)
    """Most runtime pods; scale-out requests beyond it are rejected."""
    replicas: int = Field(default=1, ge=0, le=1000)
    """Desired pods, written by ``kubectl scale``, an HPA or the operator (scale-out)."""
    workers_per_instance: int = Field(default=10, ge=1, le=1024)
    """Worker tasks per runtime pod."""
    max_concurrent_runs_per_instance: int = Field(default=3, ge=1, le=10_000)
    """Runs executing at once on one pod."""
    local_queue_capacity: int = Field(default=100, ge=1, le=1_000_000)
    """Runs a pod's local queue holds."""
    max_local_workers_per_execution: int = Field(default=4, ge=1, le=1024)
    """Workers one execution may use on one pod."""
    max_concurrent_step_tasks: int = Field(default=0, ge=0, le=1_000_000)
    """Step handlers executing at once on one pod (0 = unlimited). Applied live, without a
    pod restart, through the published tenant settings."""
    allowed_handlers: list[Annotated[str, Field(pattern=HANDLER_NAME_PATTERN)]] | None = Field(
        default=None, max_length=256
    )
    """Handlers the tenant's pipelines may use (checked at submit and when a runtime
    accepts a run); default: the built-ins that run no code a pipeline names."""
    allowed_model_providers: list[Annotated[str, Field(pattern=MODEL_PROVIDER_PATTERN)]] | None = (
        Field(default=None, max_length=256)
    )
    """Model providers the tenant's ``model`` steps may call, of those the platform
    defines (checked at submit and when a runtime accepts a run); default: all of them."""
    model_token_budget: ModelTokenBudgetSpec | None = None
    """Tokens the tenant's model steps may use in a calendar hour, day or month (UTC),
    counted across all its runtimes; a call that could pass it fails its step, naming it.
    Default: not limited."""
    idle_scale_in_delay_seconds: int = Field(default=300, ge=0, le=86_400)
    """Seconds a pod must stay idle before the operator removes it (scale-in, never below
    minInstances); 0 disables scale-in (e.g. when an HPA drives the pool)."""
    image: str | None = Field(default=None, min_length=1, max_length=1024)
    """Container image; default: the operator's ``AIRUNTIME_OPERATOR_RUNTIME_IMAGE``."""
    resources: ResourceRequirements | None = None
    """Container resources."""
    redis: RedisSecretRef
    """Secret holding the Redis URL the runtime pods use."""
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    """Extra environment variables of the runtime container."""

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Self:
        """Mirror of the CRD's CEL rules (same messages)."""
        if self.min_instances > self.max_instances:
            raise ValueError(
                f"minInstances must be less than or equal to maxInstances "
                f"(minInstances={self.min_instances}, maxInstances={self.max_instances})"
            )
        if self.max_local_workers_per_execution > self.workers_per_instance:
            raise ValueError(
                "maxLocalWorkersPerExecution must be less than or equal to workersPerInstance "
                f"({self.max_local_workers_per_execution} > {self.workers_per_instance})"
            )
        if self.isolation_mode is IsolationMode.SHARED and self.prefer_dedicated:
            raise ValueError("preferDedicated requires isolationMode Dedicated or Hybrid")
        managed = sorted({e.name for e in self.env} & set(OPERATOR_MANAGED_ENV))
        if managed:
            raise ValueError(
                f"env must not set a variable the operator manages: {', '.join(managed)}"
            )
        return self

    @property
    def effective_replicas(self) -> int:
        """``replicas`` clamped to ``[minInstances, maxInstances]``."""
        return max(self.min_instances, min(self.max_instances, self.replicas))

    def tenant_settings(self) -> TenantSettings:
        """The tenant settings this pool publishes to Redis."""
        data: dict[str, Any] = {
            "tenant_id": self.tenant_id,
            "tenant_group_id": self.tenant_group_id,
            "isolation_mode": self.isolation_mode,
            "prefer_dedicated": self.prefer_dedicated,
            "max_instances": self.max_instances,
            "runtime_prefix": self.runtime_prefix,
            "workers_per_instance": self.workers_per_instance,
            "max_concurrent_runs": self.max_concurrent_runs_per_instance,
            "queue_capacity": self.local_queue_capacity,
            "max_local_workers_per_execution": self.max_local_workers_per_execution,
            "max_concurrent_step_tasks": self.max_concurrent_step_tasks,
        }
        if self.allowed_handlers is not None:
            data["allowed_handlers"] = tuple(self.allowed_handlers)
        if self.allowed_model_providers is not None:
            data["allowed_model_providers"] = tuple(self.allowed_model_providers)
        if self.model_token_budget is not None:
            data["model_token_budget"] = self.model_token_budget.model_dump()
        if self.allow_shared_fallback is not None:
            data["allow_shared_fallback"] = self.allow_shared_fallback
        return TenantSettings.model_validate(data)


class RuntimePoolStatus(_Resource):
    """Observed state of a RuntimePool, written by the operator."""

    desired_replicas: int | None = Field(default=None, ge=0)
    """``spec.replicas`` clamped to ``[minInstances, maxInstances]``."""
    ready_replicas: int | None = Field(default=None, ge=0)
    """Ready pods of the Deployment (the scale subresource's status replicas)."""
    visible_instances: int | None = Field(default=None, ge=0)
    """Live runtime instances with this prefix in the Redis registry."""
    conditions: list[Condition] | None = Field(default=None, max_length=16)
    """Reconciled, TenantSettingsPublished and Ready."""
    observed_generation: int | None = Field(default=None, ge=0)
    """``metadata.generation`` of the last reconciled spec."""
    selector: str | None = None
    """Label selector of the pool's pods (for the scale subresource and HPAs)."""
    deployment_name: str | None = None
    """Name of the pool's Deployment."""


# -- ScaleOutRequest ---------------------------------------------------------------------------


class TenantSettingsSnapshot(_Resource):
    """The requesting tenant's settings when the control plane asked for more capacity."""

    tenant_id: str = Field(min_length=1, max_length=63, pattern=_DNS_LABEL)
    """Tenant id."""
    tenant_group_id: str | None = Field(
        default=None, min_length=1, max_length=63, pattern=_DNS_LABEL
    )
    """Tenant group id."""
    isolation_mode: IsolationMode
    """Shared, Dedicated or Hybrid."""
    prefer_dedicated: bool
    """Prefer dedicated runtimes."""
    allow_shared_fallback: bool
    """May run on Shared runtimes."""
    max_instances: int = Field(ge=0, le=1000)
    """Most instances of the tenant's prefix."""
    runtime_prefix: str = Field(min_length=1, max_length=_MAX_PREFIX_LENGTH, pattern=_DNS_LABEL)
    """Runtime prefix."""
    workers_per_instance: int = Field(ge=1, le=1024)
    """Workers per instance."""
    max_concurrent_runs: int = Field(ge=1, le=10_000)
    """Concurrent runs per instance."""
    queue_capacity: int = Field(ge=1, le=1_000_000)
    """Local queue capacity."""
    max_local_workers_per_execution: int = Field(ge=1, le=1024)
    """Workers per execution."""
    max_concurrent_step_tasks: int = Field(ge=0)
    """Step handlers at once per instance (0 = unlimited)."""
    allowed_handlers: list[Annotated[str, Field(pattern=HANDLER_NAME_PATTERN)]] = Field(
        default_factory=lambda: list(DEFAULT_ALLOWED_HANDLERS), max_length=256
    )
    """Handlers the tenant's pipelines may use."""
    allowed_model_providers: list[Annotated[str, Field(pattern=MODEL_PROVIDER_PATTERN)]] | None = (
        Field(default=None, max_length=256)
    )
    """Model providers the tenant's model steps may call (absent: all)."""
    model_token_budget: ModelTokenBudgetSpec | None = None
    """Tokens the tenant's model steps may use in a window (absent: not limited)."""

    @classmethod
    def of(cls, settings: TenantSettings) -> TenantSettingsSnapshot:
        return cls.model_validate(settings.model_dump())

    def to_settings(self) -> TenantSettings:
        return TenantSettings.model_validate(self.model_dump())


class ScaleOutRequestSpec(
    _Resource,
    json_schema_extra=_validations(
        _cel("self == oldSelf", "spec is immutable"),
        _cel(
            "!has(self.tenantSettings) || self.tenantSettings.tenantId == self.tenantId",
            "tenantSettings.tenantId must equal tenantId",
            fieldPath=".tenantSettings.tenantId",
        ),
    ),
):
    """A request of the control plane for ``requestedInstances`` more runtime instances
    of one tenant prefix, on behalf of one shared run. Immutable."""

    tenant_id: str = Field(min_length=1, max_length=63, pattern=_DNS_LABEL)
    """Tenant whose pool is scaled."""
    runtime_prefix: str = Field(min_length=1, max_length=_MAX_PREFIX_LENGTH, pattern=_DNS_LABEL)
    """Prefix of the pool to scale."""
    shared_run_id: str = Field(min_length=1, max_length=256)
    """The shared run waiting for the capacity (requeued on fulfilment)."""
    requested_instances: int = Field(default=1, ge=1, le=100)
    """How many instances to add."""
    tenant_settings: TenantSettingsSnapshot | None = None
    """The tenant's settings at request time."""
    pool_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN
    )
    """RuntimePool to scale; default: the pool of (tenantId, runtimePrefix) in the namespace."""

    @model_validator(mode="after")
    def _snapshot_matches(self) -> Self:
        if self.tenant_settings is not None and self.tenant_settings.tenant_id != self.tenant_id:
            raise ValueError("tenantSettings.tenantId must equal tenantId")
        return self


class ScaleOutPhase(StrEnum):
    """Where a scale-out request stands: the same phases in the resource's status (written
    by the operator) and in the control plane's own record of the request (in Redis)."""

    PENDING = "Pending"
    OBSERVED = "Observed"
    FULFILLED = "Fulfilled"
    REJECTED = "Rejected"


class ScaleOutRequestStatus(_Resource):
    """Progress of a scale-out request, written by the operator."""

    phase: ScaleOutPhase | None = None
    """Pending -> Observed (pool scaled) -> Fulfilled (new instance ready), or Rejected."""
    fulfilled_runtime_instance_id: str | None = None
    """The new runtime instance that can accept the run."""
    reason: str | None = Field(default=None, max_length=4096)
    """Why the request was rejected (or a note on its progress)."""
    pool_name: str | None = None
    """The RuntimePool that was scaled."""
    previous_replicas: int | None = Field(default=None, ge=0)
    """Pool replicas before the scale-out."""
    target_replicas: int | None = Field(default=None, ge=0)
    """Pool replicas after the scale-out."""
    baseline_instance_ids: list[str] | None = Field(default=None, max_length=1000)
    """Registry instances of the prefix at observation time (none of them fulfils)."""
    requested_at: datetime | None = None
    """When the request was created."""
    observed_at: datetime | None = None
    """When the operator scaled the pool."""
    fulfilled_at: datetime | None = None
    """When a new instance was ready."""
    rejected_at: datetime | None = None
    """When the request was rejected."""


# -- manifests --------------------------------------------------------------------------------


class CrdNames(BaseModel):
    """Names of one custom resource kind."""

    model_config = ConfigDict(frozen=True)

    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{API_GROUP}"

    @property
    def api_version(self) -> str:
        return f"{API_GROUP}/{API_VERSION}"


RUNTIME_POOL: Final = CrdNames(
    kind="RuntimePool", plural="runtimepools", singular="runtimepool", short_names=("rp",)
)
SCALE_OUT_REQUEST: Final = CrdNames(
    kind="ScaleOutRequest",
    plural="scaleoutrequests",
    singular="scaleoutrequest",
    short_names=("sor",),
)


def runtime_pool_manifest(
    name: str, namespace: str, spec: RuntimePoolSpec, *, labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A RuntimePool object ready to be created."""
    return _manifest(RUNTIME_POOL, name, namespace, spec.to_wire(), labels)


def scale_out_request_manifest(
    name: str,
    namespace: str,
    spec: ScaleOutRequestSpec,
    *,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A ScaleOutRequest object ready to be created (by the control plane's provider)."""
    return _manifest(SCALE_OUT_REQUEST, name, namespace, spec.to_wire(), labels)


def _manifest(
    names: CrdNames,
    name: str,
    namespace: str,
    spec: dict[str, Any],
    labels: Mapping[str, str] | None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    return {"apiVersion": names.api_version, "kind": names.kind, "metadata": metadata, "spec": spec}
