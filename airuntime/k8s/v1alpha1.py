"""Custom resources of the ``airuntime.io`` API group, and the CRDs generated from them.

Why this module exists: the RuntimePool and ScaleOutRequest resources are a
contract between three parties -- the Kubernetes API server (which validates
them), the operator (which reconciles them) and the control plane (whose
``kubernetes`` scale-out provider creates ScaleOutRequests). Writing the schema
once, as pydantic models, and *generating* the CustomResourceDefinitions from
those models keeps the three in agreement: ``crds/*.yaml`` are the output of
``python -m airuntime.k8s.v1alpha1 --out crds/`` and a test fails when they drift.

The models are camelCase on the wire (Kubernetes convention) and snake_case in
Python (``populate_by_name``). Every rule the API server enforces with a CEL
expression (``x-kubernetes-validations``) is mirrored by a pydantic validator, so
a client building a resource in Python gets the same answer before it sends it.

This module lives in :mod:`airuntime` (not in the operator) because the control
plane needs it too; it imports nothing from Kubernetes client libraries.

Command line::

    python -m airuntime.k8s.v1alpha1 --out crds/      # (re)write the CRD files
    python -m airuntime.k8s.v1alpha1 --check crds/    # exit 1 when the files differ
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from airuntime.fleet.instance_settings import InstanceSettings
from airuntime.fleet.tenancy import IsolationMode, TenantSettings

__all__ = [
    "API_GROUP",
    "API_VERSION",
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
    "check_files",
    "crd_files",
    "kopf_peering_crds",
    "main",
    "render_files",
    "runtime_pool_crd",
    "runtime_pool_manifest",
    "scale_out_request_crd",
    "scale_out_request_manifest",
    "structural_schema",
    "write_files",
]

API_GROUP: Final = "airuntime.io"
API_VERSION: Final = "v1alpha1"

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
    "max_concurrent_step_tasks",
    "http_port",
    "http_host",
    "advertise_host",
)
"""Fields of the runtime's :class:`InstanceSettings` the operator sets on runtime pods,
in the order of the pod's env."""
OPERATOR_MANAGED_ENV: Final[tuple[str, ...]] = tuple(
    InstanceSettings.env_var(field) for field in OPERATOR_MANAGED_SETTINGS
)
"""Environment variables the operator sets on runtime pods; a pool's ``env`` may not set them."""


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
    """Reconciled, TenantSettingsPublished, Available."""
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


# -- schema generation ------------------------------------------------------------------------

_DROPPED_KEYS: Final = frozenset({"title", "examples"})


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema rewritten as a Kubernetes *structural* OpenAPI v3 schema.

    Pydantic emits JSON Schema 2020-12; a CRD needs every node typed, no ``$ref``, no
    ``null`` types and OpenAPI 3.0 keywords. So: ``$ref`` is inlined, ``X | None`` becomes
    ``X`` (optional fields are simply not required), ``int | str`` becomes
    ``x-kubernetes-int-or-string``, ``dict[str, Any]`` preserves unknown fields, and
    titles are dropped.
    """
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs: dict[str, Any] = raw.pop("$defs", {})
    schema: dict[str, Any] = _convert(raw, defs)
    return schema


def _convert(node: Any, defs: Mapping[str, Any]) -> Any:
    if isinstance(node, list):
        return [_convert(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _convert(merged, defs)
    if "anyOf" in node:
        return _convert_any_of(node, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "properties":
            out[key] = {name: _convert(prop, defs) for name, prop in value.items()}
        elif key == "additionalProperties":
            if value is False:
                continue  # extra="forbid": the API server prunes unknown fields anyway
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            else:
                out[key] = _convert(value, defs)
        elif key == "description":
            out[key] = _plain_text(value)
        elif key == "default" and value is None:
            continue
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            raise ValueError(f"{key} is not portable to OpenAPI v3.0; use ge/le bounds")
        else:
            out[key] = _convert(value, defs)
    if out.get("type") == "object" and not {"properties", "additionalProperties"} & out.keys():
        out["x-kubernetes-preserve-unknown-fields"] = True
    first = {k: out.pop(k) for k in ("type", "description") if k in out}
    return {**first, **out}


def _plain_text(docstring: str) -> str:
    """One line of text from a docstring: reST roles and double backquotes removed."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", docstring)
    return " ".join(text.replace("``", "`").split())


def _convert_any_of(node: dict[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    options = [o for o in node["anyOf"] if o.get("type") != "null"]
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    types = sorted(str(o.get("type")) for o in options)
    if len(options) == 1:
        converted: dict[str, Any] = _convert({**options[0], **rest}, defs)
        return converted
    if types == ["integer", "string"]:
        converted = {k: _convert(v, defs) for k, v in rest.items() if k not in _DROPPED_KEYS}
        return {**converted, "x-kubernetes-int-or-string": True}
    raise ValueError(f"unsupported union in a CRD schema: {node['anyOf']}")


def _resource_schema(
    description: str, spec: type[BaseModel], status: type[BaseModel]
) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": structural_schema(spec),
            "status": structural_schema(status),
        },
    }


def _crd(
    names: CrdNames,
    *,
    description: str,
    spec: type[BaseModel],
    status: type[BaseModel],
    columns: Sequence[dict[str, Any]],
    subresources: dict[str, Any],
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": names.crd_name,
            "labels": {"app.kubernetes.io/part-of": "airuntime"},
        },
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": names.kind,
                "listKind": f"{names.kind}List",
                "plural": names.plural,
                "singular": names.singular,
                "shortNames": list(names.short_names),
                "categories": ["airuntime"],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": _resource_schema(description, spec, status)},
                    "subresources": subresources,
                    "additionalPrinterColumns": list(columns),
                }
            ],
        },
    }


def _column(name: str, json_path: str, type_: str = "string", **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, "jsonPath": json_path, **extra}


def runtime_pool_crd() -> dict[str, Any]:
    """The RuntimePool CRD, with the status and scale subresources."""
    return _crd(
        RUNTIME_POOL,
        description="A tenant's pool of airuntime runtime instances (one Deployment).",
        spec=RuntimePoolSpec,
        status=RuntimePoolStatus,
        subresources={
            "status": {},
            "scale": {
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.readyReplicas",
                "labelSelectorPath": ".status.selector",
            },
        },
        columns=[
            _column("Tenant", ".spec.tenantId"),
            _column("Mode", ".spec.isolationMode"),
            _column("Prefix", ".spec.runtimePrefix"),
            _column("Ready", ".status.readyReplicas", "integer"),
            _column("Desired", ".status.desiredReplicas", "integer"),
            _column("Visible", ".status.visibleInstances", "integer"),
            _column("Age", ".metadata.creationTimestamp", "date"),
        ],
    )


def scale_out_request_crd() -> dict[str, Any]:
    """The ScaleOutRequest CRD, with the status subresource."""
    return _crd(
        SCALE_OUT_REQUEST,
        description="A request for more runtime instances of one tenant prefix.",
        spec=ScaleOutRequestSpec,
        status=ScaleOutRequestStatus,
        subresources={"status": {}},
        columns=[
            _column("Tenant", ".spec.tenantId"),
            _column("Prefix", ".spec.runtimePrefix"),
            _column("Phase", ".status.phase"),
            _column("Instance", ".status.fulfilledRuntimeInstanceId"),
            _column("Age", ".metadata.creationTimestamp", "date"),
        ],
    )


def kopf_peering_crds() -> list[dict[str, Any]]:
    """The ClusterKopfPeering and KopfPeering CRDs kopf needs for operator HA (peering)."""
    docs = []
    for scope, kind, plural in (
        ("Cluster", "ClusterKopfPeering", "clusterkopfpeerings"),
        ("Namespaced", "KopfPeering", "kopfpeerings"),
    ):
        docs.append(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.kopf.dev"},
                "spec": {
                    "scope": scope,
                    "group": "kopf.dev",
                    "names": {
                        "kind": kind,
                        "plural": plural,
                        "singular": kind.lower(),
                    },
                    "versions": [
                        {
                            "name": "v1",
                            "served": True,
                            "storage": True,
                            "schema": {
                                "openAPIV3Schema": {
                                    "type": "object",
                                    "properties": {
                                        "status": {
                                            "type": "object",
                                            "x-kubernetes-preserve-unknown-fields": True,
                                        }
                                    },
                                }
                            },
                        }
                    ],
                },
            }
        )
    return docs


_PROG: Final = "python -m airuntime.k8s.v1alpha1"
_HEADER: Final = (
    "# GENERATED by `python -m airuntime.k8s.v1alpha1 --out crds/` from the models in\n"
    "# airuntime/k8s/v1alpha1.py.\n"
    "# Do not edit by hand: change the models and regenerate.\n"
)


def crd_files() -> dict[str, list[dict[str, Any]]]:
    """File name -> the CRD documents it holds."""
    return {
        f"{RUNTIME_POOL.crd_name}.yaml": [runtime_pool_crd()],
        f"{SCALE_OUT_REQUEST.crd_name}.yaml": [scale_out_request_crd()],
        "kopf-peering.yaml": kopf_peering_crds(),
    }


def render_files() -> dict[str, str]:
    """File name -> YAML text, exactly as checked in under ``crds/``."""
    return {
        name: _HEADER
        + "---\n".join(
            yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100)
            for doc in docs
        )
        for name, docs in crd_files().items()
    }


def write_files(out_dir: Path) -> list[Path]:
    """(Re)write every CRD file into ``out_dir``; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_files().items():
        path = out_dir / name
        path.write_text(text)
        written.append(path)
    return written


def check_files(out_dir: Path) -> list[str]:
    """Names of the files under ``out_dir`` that are missing or differ from the generator."""
    stale = []
    for name, text in render_files().items():
        path = out_dir / name
        if not path.is_file() or path.read_text() != text:
            stale.append(name)
    return stale


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=_PROG, description="Generate the airuntime.io CRDs.")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", type=Path, help="directory to (re)write the CRD files into")
    group.add_argument("--check", type=Path, help="directory whose CRD files must be current")
    args = parser.parse_args(argv)
    if args.out is not None:
        for path in write_files(args.out):
            print(path)
        return 0
    stale = check_files(args.check)
    for name in stale:
        print(f"{args.check / name} is stale; run: {_PROG} --out {args.check}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
