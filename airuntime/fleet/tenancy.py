"""Tenant settings and the visibility rules between tenants and runtime instances.

A runtime instance is *visible* to a tenant when the tenant's runs may be
dispatched onto it, and its runs read or cancelled through it. The rules (docs/architecture.md §8
"Tenancy") are:

* a ``Shared`` runtime is visible to Shared/default tenants, and to Hybrid or
  Dedicated tenants only when their settings allow shared fallback;
* ``Dedicated`` and ``Hybrid`` runtimes are visible only on a tenant match (or a
  tenant-group match);
* an unowned Hybrid (or Dedicated) runtime is visible to nobody.

``ExecutionContextSnapshot.tenant_id`` is the only partition key; these rules are
the single place that compares it with an instance's owner.
"""

from __future__ import annotations

import functools
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, model_validator

from airuntime.core.context import DEFAULT_TENANT
from airuntime.core.parsed_records import ParsedRecords
from airuntime.engine.handlers.model_providers import PROVIDER_NAME
from airuntime.engine.model_budget import ModelTokenBudget

_DNS_LABEL = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


DEFAULT_ALLOWED_HANDLERS: tuple[str, ...] = (
    "noop",
    "sleep",
    "echo",
    "template",
    "input",
    "fail",
    "http",
    "model",
)
"""Handlers a tenant's pipelines may use unless its settings say otherwise: the built-ins
that run no code a pipeline names (``http`` refuses internal addresses, ``model`` calls
only the providers the platform defines, none by default). ``python`` and
custom handlers must be listed explicitly in the tenant's ``allowed_handlers``."""

HANDLER_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,99}$"
MODEL_PROVIDER_PATTERN = PROVIDER_NAME.pattern


class IsolationMode(StrEnum):
    SHARED = "Shared"
    DEDICATED = "Dedicated"
    HYBRID = "Hybrid"


class TenantSettings(BaseModel):
    """How one tenant's runs are placed. Stored in Redis (``air:{air}:tenant:<id>:settings``),
    written from a YAML file locally and from RuntimePool resources on Kubernetes."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    tenant_id: str = Field(pattern=_DNS_LABEL)
    tenant_group_id: str | None = Field(default=None, pattern=_DNS_LABEL)
    isolation_mode: IsolationMode = IsolationMode.SHARED
    prefer_dedicated: bool = False
    allow_shared_fallback: bool = True
    max_instances: int = Field(default=1, ge=0, le=1000)
    runtime_prefix: str = Field(default="runtime-instance", pattern=_DNS_LABEL, max_length=50)
    workers_per_instance: int = Field(default=10, ge=1, le=1024)
    max_concurrent_runs: int = Field(default=3, ge=1, le=10_000)
    queue_capacity: int = Field(default=100, ge=1, le=1_000_000)
    max_local_workers_per_execution: int = Field(default=4, ge=1, le=1024)
    max_concurrent_step_tasks: int = Field(default=0, ge=0)
    allowed_handlers: tuple[Annotated[str, Field(pattern=HANDLER_NAME_PATTERN)], ...] = Field(
        default=DEFAULT_ALLOWED_HANDLERS, max_length=256
    )
    """Handlers this tenant's pipelines may use; checked at submit and again when a
    runtime accepts the run."""
    allowed_model_providers: (
        tuple[Annotated[str, Field(pattern=MODEL_PROVIDER_PATTERN)], ...] | None
    ) = Field(default=None, max_length=256)
    """Model providers this tenant's ``model`` steps may call (of those the platform
    defines in ``AIRUNTIME_MODEL_PROVIDERS``); None: all of them. Checked at submit and
    again when a runtime accepts the run."""
    model_token_budget: ModelTokenBudget | None = None
    """Tokens this tenant's ``model`` steps may use in an hour, a day or a month (UTC),
    drawn from by every runtime at each call (:mod:`airuntime.engine.model_budget`);
    None: not limited."""

    @model_validator(mode="before")
    @classmethod
    def _fallback_default_follows_mode(cls, data: Any) -> Any:
        """Unless set, shared fallback is on for Shared tenants and off for the others
        (a Dedicated tenant must opt in to ever running on shared capacity)."""
        if isinstance(data, dict) and "allow_shared_fallback" not in data:
            mode = data.get("isolation_mode", IsolationMode.SHARED)
            data = {
                **data,
                "allow_shared_fallback": str(mode) in ("Shared", "IsolationMode.SHARED"),
            }
        return data

    @model_validator(mode="after")
    def _shared_has_no_fallback(self) -> TenantSettings:
        if self.isolation_mode is IsolationMode.SHARED and self.prefer_dedicated:
            raise ValueError("prefer_dedicated: a Shared tenant has no dedicated runtime to prefer")
        return self


@functools.lru_cache(maxsize=1024)
def default_settings(tenant_id: str) -> TenantSettings:
    """Settings of a tenant nobody configured: Shared, on the shared runtimes. The model
    is frozen (its collections are tuples), so one object per tenant serves every run:
    submit, admission, intake and start each ask for it."""
    return TenantSettings(tenant_id=tenant_id)


_PARSED: Final = ParsedRecords(TenantSettings, entries=1024)


def parse_settings(raw: bytes | str) -> TenantSettings:
    """Stored settings parsed once per distinct stored text (the cache key is the text
    itself, so a changed setting is seen at the next read; a malformed one raises every
    time, as only parsed records are kept)."""
    return _PARSED.parse(raw)


def stored_settings(tenant_id: str, raw: bytes | str | None) -> TenantSettings:
    """The settings stored as ``raw`` for ``tenant_id`` (:func:`parse_settings`), or
    its defaults when nothing is stored (``raw`` None: the GET found no key)."""
    return default_settings(tenant_id) if raw is None else parse_settings(raw)


def is_visible(
    *,
    tenant: TenantSettings,
    instance_mode: IsolationMode,
    instance_tenant_id: str | None,
    instance_tenant_group_id: str | None = None,
) -> bool:
    """Whether ``tenant`` may use (see, dispatch onto, read and cancel through) an instance."""
    if instance_mode is IsolationMode.SHARED:
        if tenant.isolation_mode is IsolationMode.SHARED or tenant.tenant_id == DEFAULT_TENANT:
            return True
        return tenant.allow_shared_fallback
    if not instance_tenant_id and not instance_tenant_group_id:
        return False  # an unowned Dedicated/Hybrid runtime is visible to nobody
    if instance_tenant_id and instance_tenant_id == tenant.tenant_id:
        return True
    return bool(
        instance_tenant_group_id
        and tenant.tenant_group_id
        and instance_tenant_group_id == tenant.tenant_group_id
    )
