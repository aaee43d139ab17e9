"""Settings of one runtime instance (and of a pooled host of several).

Values come from ``airt runtime`` options, which default to ``AIRUNTIME_*``
environment variables (how the operator's pod template configures a pod). Every
field is validated; a bad value stops startup with a message naming the field and
the value.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from airuntime.fleet.tenancy import IsolationMode, TenantSettings

_DNS_LABEL = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


class InstanceConfig(BaseModel):
    """One runtime instance."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant_id: str | None = Field(default=None, pattern=_DNS_LABEL)
    """Owner tenant; None for a Shared runtime."""
    tenant_group_id: str | None = Field(default=None, pattern=_DNS_LABEL)
    isolation_mode: IsolationMode = IsolationMode.SHARED
    prefer_dedicated: bool = False
    allow_shared_fallback: bool = True
    runtime_prefix: str = Field(default="runtime-instance", pattern=_DNS_LABEL, max_length=50)
    instance_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,126}$")
    """Explicit id (e.g. the pod name); else ``<prefix>-<n>`` with n from Redis."""
    workers: int = Field(default=10, ge=1, le=4096)
    """Worker slots of the instance, shared by all its executions."""
    max_concurrent_runs: int = Field(default=3, ge=1, le=10_000)
    queue_capacity: int = Field(default=100, ge=1, le=1_000_000)
    max_local_workers_per_execution: int = Field(default=4, ge=1, le=4096)
    max_concurrent_step_tasks: int = Field(default=0, ge=0)
    """Step-slot admission limit (0 = unlimited); changed live through the settings API."""
    provider: str = Field(default="redis", pattern=r"^(local|redis|http)$")
    heartbeat_s: float = Field(default=2.0, gt=0, le=60)
    """Registry heartbeat; the descriptor expires after 3 heartbeats without one."""
    lease_ms: int = Field(default=15_000, ge=100)
    """Step claim lease; a crashed instance's steps are recovered after this."""
    assist: bool = True
    """Lend idle workers to running executions of tenants this instance may serve."""

    @model_validator(mode="after")
    def _consistent(self) -> InstanceConfig:
        if self.isolation_mode is not IsolationMode.SHARED and not (
            self.tenant_id or self.tenant_group_id
        ):
            raise ValueError(
                f"isolation_mode {self.isolation_mode.value} needs tenant_id or tenant_group_id "
                "(an unowned dedicated/hybrid runtime would be visible to nobody)"
            )
        return self

    @property
    def heartbeat_ttl_ms(self) -> int:
        return int(self.heartbeat_s * 3000)

    def as_tenant(self) -> TenantSettings:
        """The tenant settings this instance serves, for visibility checks of adoption."""
        return TenantSettings(
            tenant_id=self.tenant_id or "default",
            tenant_group_id=self.tenant_group_id,
            isolation_mode=self.isolation_mode,
            allow_shared_fallback=self.allow_shared_fallback,
            runtime_prefix=self.runtime_prefix,
        )
