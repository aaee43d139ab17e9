"""What a runtime instance is configured with, and where a runtime process reads it.

Why this exists here and not in ``runtime_pod``: the settings of a runtime process are
a contract between the process and whoever starts it. ``airt runtime`` reads them;
the operator writes them into a pod's environment and the control plane's ``local``
scale-out provider into a child's. Both sides derive the variable names from
:class:`InstanceSettings` (``workers`` -> ``AIRUNTIME_WORKERS``), so they cannot
drift, and neither side imports the other.

* :class:`InstanceConfig` -- one instance: owner tenant, isolation, capacity limits,
  heartbeat and lease. A plain validated model: code that builds an instance (tests,
  a host of several instances) passes every value it means and reads no environment.
* :class:`InstanceSettings` -- what ``airt runtime`` reads from ``AIRUNTIME_*`` (its
  options override them): the instance fields plus the host's HTTP endpoint, its
  settings file and the shared Redis.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from airuntime.core.settings import EnvSettings
from airuntime.fleet.run_index import DEFAULT_RUN_RETENTION_S
from airuntime.fleet.tenancy import IsolationMode, TenantSettings

__all__ = ["RUNTIME_TOKEN_ENV", "SECRET_SETTINGS", "InstanceConfig", "InstanceSettings"]

_DNS_LABEL = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


class _InstanceFields(BaseModel):
    """The fields of one instance that a runtime process reads from its environment."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    tenant_id: str | None = Field(default=None, pattern=_DNS_LABEL)
    """Owner tenant (a DNS label); default none: a Shared runtime serving every tenant."""
    tenant_group_id: str | None = Field(default=None, pattern=_DNS_LABEL)
    """Owner tenant group (a DNS label); default none. A Hybrid runtime serves the group."""
    isolation_mode: IsolationMode = IsolationMode.SHARED
    """Shared (default), Dedicated (its tenant only) or Hybrid (tenant or group)."""
    prefer_dedicated: bool = False
    """Published for admission: the tenant prefers its own runtimes (default false)."""
    allow_shared_fallback: bool = True
    """Published for admission: the tenant may fall back to Shared runtimes (default true)."""
    runtime_prefix: str = Field(default="runtime-instance", pattern=_DNS_LABEL, max_length=50)
    """Instances are named ``<prefix>-<n>``; the scale-out unit (default runtime-instance)."""
    instance_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,126}$")
    """Explicit id (e.g. the pod name); default none: ``<prefix>-<n>`` with n from Redis."""
    workers: int = Field(default=10, ge=1, le=4096)
    """Worker slots of the instance, shared by all its executions (default 10)."""
    max_concurrent_runs: int = Field(default=3, ge=1, le=10_000)
    """Runs executing at once; more wait in the local queue (default 3)."""
    queue_capacity: int = Field(default=100, ge=1, le=1_000_000)
    """Runs the local queue holds before the instance refuses more (default 100)."""
    max_local_workers_per_execution: int = Field(default=4, ge=1, le=4096)
    """Workers one execution may use on this instance (default 4), so one run cannot
    take every worker."""
    max_concurrent_step_tasks: int = Field(default=0, ge=0)
    """Step handlers running at once across executions; 0 (default) = unlimited.
    The start value: changed live through the settings API and the tenant settings."""
    step_slots_from_tenant: bool = False
    """Take the step-handler limit from the tenant's settings in Redis from the start
    (before the first run is accepted), not only its later changes. The operator sets
    it: a pool's ``maxConcurrentStepTasks`` lives in the tenant settings it publishes,
    so a change never needs a rollout and the pod needs no object of its own for it."""
    provider: str = Field(default="redis", pattern=r"^(local|redis|http)$")
    """How runs reach the instance: ``redis`` (default; a stream inbox), ``http`` or
    ``local`` (in-process)."""
    heartbeat_s: float = Field(default=2.0, gt=0, le=60)
    """Registry heartbeat in seconds (default 2); the descriptor expires after 3
    heartbeats without one, and adoption/assistance run once per heartbeat."""
    lease_ms: int = Field(default=15_000, ge=100)
    """Step claim lease in milliseconds (default 15000): a crashed instance's steps
    are recovered after this."""
    run_retention_s: int = Field(default=DEFAULT_RUN_RETENTION_S, ge=1)
    """Seconds a finished run stays in Redis (its record, index entries, SharedRunId
    mapping and execution) before it expires (default 604800, 7 days)."""
    archive: bool = True
    """Queue every finished execution on the archive outbox (default true): its keys
    then stay until the archiver (the control plane's) has written it to the durable
    history, and expire run_retention_s after that. False: they expire run_retention_s
    after finalization and nothing is archived."""
    archive_hold_s: int | None = Field(default=None, ge=0)
    """With archive on, how long a finished execution's keys are held when no archiver
    takes them (the fallback TTL; default 2 x run_retention_s), so a system without
    an archiver never leaks."""

    def archive_hold(self) -> int | None:
        """The fallback TTL for ``ExecutionStore.create`` (None: archiving off)."""
        if not self.archive:
            return None
        return self.archive_hold_s if self.archive_hold_s is not None else 2 * self.run_retention_s

    @model_validator(mode="after")
    def _consistent(self) -> _InstanceFields:
        if self.isolation_mode is not IsolationMode.SHARED and not (
            self.tenant_id or self.tenant_group_id
        ):
            raise ValueError(
                f"isolation_mode {self.isolation_mode.value} needs tenant_id or tenant_group_id "
                "(an unowned dedicated/hybrid runtime would be visible to nobody)"
            )
        return self


class InstanceConfig(_InstanceFields):
    """One runtime instance."""

    assist: bool = True
    """Lend idle workers to running executions of tenants this instance may serve
    (default true)."""

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


class InstanceSettings(EnvSettings, _InstanceFields):
    """What ``airt runtime`` reads from ``AIRUNTIME_*``: its instances and its host."""

    model_config = EnvSettings.model_config

    redis_url: str | None = None
    """The control plane's shared Redis/Valkey (required: an instance on a private
    server could never receive a run)."""
    http_host: str = "127.0.0.1"
    """Interface the host's HTTP API listens on (default 127.0.0.1; 0.0.0.0 in a pod)."""
    http_port: int = Field(default=0, ge=0, le=65535)
    """Port of the host's HTTP API; 0 (default) = any free port."""
    advertise_host: str | None = None
    """Address published in the registry instead of the listening one (the pod IP on
    Kubernetes); default none."""
    wait_for_control_plane_s: float = Field(default=0.0, ge=0)
    """Seconds to wait for the control plane's discovery record at startup (default 0)."""
    settings_file: Path | None = None
    """Live settings file; default none: ``$AIRUNTIME_HOME/runtime/settings.yaml``."""
    runtime_token: SecretStr | None = None
    """Bearer token the control plane sends to the host's run intake and settings API
    (a secret; default none: both answer 401). Required with the ``http`` provider."""

    @field_validator(
        "tenant_id",
        "tenant_group_id",
        "instance_id",
        "advertise_host",
        "runtime_token",
        mode="before",
    )
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        # `--tenant ""` means "no tenant", as an empty variable does.
        return None if value == "" else value

    def instance_config(self) -> InstanceConfig:
        """The configuration of the instances this process hosts."""
        return InstanceConfig.model_validate(
            self.model_dump(include=set(_InstanceFields.model_fields))
        )


RUNTIME_TOKEN_ENV = InstanceSettings.env_var("runtime_token")
"""``AIRUNTIME_RUNTIME_TOKEN``: the variable of the runtime API's bearer token, for
whoever starts runtimes (the local scaler, the chart) and clients of the API."""

SECRET_SETTINGS: tuple[str, ...] = ("redis_url", "runtime_token")
"""Fields of :class:`InstanceSettings` that carry credentials: a runtime process removes
their variables from its environment once it has read them."""
