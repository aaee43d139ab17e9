"""The instance table of the MCP server: one flat row per runtime instance.

Why this exists: the reference makes the MCP instance listing "a temporary operational
dashboard" with fixed columns (identity, role, status, workers, run slots, queue,
can-accept-run, heartbeat, ownership, isolation, provider). The API answers the nested
:class:`~airuntime.control_plane.api.models.InstanceView`; an agent reads a flat row
better, so :class:`InstanceRow` is that view flattened, nothing added.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from airuntime.control_plane.api.models import InstanceView, ModelProviderView, SecretView
from airuntime.fleet.registry import InstanceStatus
from airuntime.fleet.tenancy import IsolationMode, TenantSettings


class InstanceRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    instance_id: str
    role: str
    status: InstanceStatus
    worker_count: int
    active_worker_count: int
    available_worker_count: int
    max_local_workers_per_execution: int
    queued_run_count: int
    running_run_count: int
    active_run_count: int
    queue_capacity: int
    max_concurrent_runs: int
    available_run_slots: int
    is_queue_paused: bool
    can_accept_run: bool
    last_heartbeat_at_ms: int = Field(description="Redis time of the last heartbeat (ms).")
    capacity_at_ms: int = Field(description="Redis time the capacity was published (ms).")
    tenant_id: str | None
    tenant_group_id: str | None
    isolation_mode: IsolationMode
    prefer_dedicated: bool
    allow_shared_fallback: bool
    runtime_prefix: str
    provider_name: str
    provider_endpoint: str
    suspect_remaining_ms: int | None = Field(
        description="Admission skips the instance this much longer (deliveries failed); "
        "None: not suspect."
    )
    unhealthy_loops: list[str]

    @classmethod
    def of(cls, view: InstanceView) -> InstanceRow:
        c = view.capacity
        return cls(
            instance_id=view.instance_id,
            role=view.role,
            status=view.status,
            worker_count=c.worker_count,
            active_worker_count=c.active_worker_count,
            available_worker_count=c.available_worker_count,
            max_local_workers_per_execution=c.max_local_workers_per_execution,
            queued_run_count=c.queued_run_count,
            running_run_count=c.running_run_count,
            active_run_count=c.active_run_count,
            queue_capacity=c.queue_capacity,
            max_concurrent_runs=c.max_concurrent_runs,
            available_run_slots=c.available_run_slots,
            is_queue_paused=c.is_queue_paused,
            can_accept_run=c.can_accept_run,
            last_heartbeat_at_ms=view.heartbeat_at_ms,
            capacity_at_ms=c.snapshot_at_ms,
            tenant_id=view.tenant_id,
            tenant_group_id=view.tenant_group_id,
            isolation_mode=view.isolation_mode,
            prefer_dedicated=view.prefer_dedicated,
            allow_shared_fallback=view.allow_shared_fallback,
            runtime_prefix=view.runtime_prefix,
            provider_name=view.provider,
            provider_endpoint=view.endpoint,
            suspect_remaining_ms=view.suspect.remaining_ms if view.suspect else None,
            unhealthy_loops=list(view.unhealthy_loops),
        )


class InstanceTable(BaseModel):
    """The instances the caller's tenant may run on."""

    model_config = ConfigDict(extra="forbid")

    tenant_id: str = Field(description="The tenant whose view this is (the caller's).")
    instances: list[InstanceRow]


class ModelProviderTable(BaseModel):
    """The model providers the caller's tenant may name in ``model`` steps."""

    model_config = ConfigDict(extra="forbid")

    tenant_id: str = Field(description="The tenant whose view this is (the caller's).")
    providers: list[ModelProviderView]


class SecretTable(BaseModel):
    """A tenant's secrets by name: never their values."""

    model_config = ConfigDict(extra="forbid")

    tenant_id: str = Field(description="The tenant whose secrets these are.")
    secrets: list[SecretView]


class TenantSettingsResult(BaseModel):
    """A tenant's settings after a read or a change."""

    model_config = ConfigDict(extra="forbid")

    settings: TenantSettings
