"""How a control plane is configured: submit mode, pumps, scale-out, identity, and
where the ``airt control-plane`` process reads that from.

The reference's settings map onto these fields: ``SubmitMode`` (how ``submit`` places a
run), the shared-queue pump switch (manual drain allowed), the background pump service,
and whether admission may ask for scale-out.

* :class:`ControlPlaneSettings` -- what a :class:`~airuntime.control_plane.service.ControlPlane`
  takes. A plain validated model: code that builds a control plane (``airt up``, tests)
  passes what it means and reads no environment.
* :class:`ControlPlaneServerSettings` -- what ``airt control-plane`` reads from
  ``AIRUNTIME_*`` (its options override them): the same behaviour fields plus the API's
  address, the tokens and tenants files, the scale-out provider and the shared Redis.
"""

from __future__ import annotations

import os
import socket
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from airuntime.core.settings import EnvSettings

__all__ = [
    "ControlPlaneServerSettings",
    "ControlPlaneSettings",
    "ScaleOutProviderKind",
    "SubmitMode",
]


class SubmitMode(StrEnum):
    QUEUE_FIRST = "QueueFirst"
    DIRECT_DISPATCH = "DirectDispatch"


class ScaleOutProviderKind(StrEnum):
    """Who starts runtime instances when admission asks for more."""

    LOCAL = "local"
    """``airt runtime`` child processes on this machine."""
    KUBERNETES = "kubernetes"
    """ScaleOutRequest resources, fulfilled by the operator."""
    NONE = "none"
    """Nobody: requests are recorded, an outside scaler may act on them."""


class _BehaviourFields(BaseModel):
    """The control plane's behaviour that its process reads from the environment."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    submit_mode: SubmitMode = SubmitMode.QUEUE_FIRST
    """How ``submit`` places a run; default QueueFirst: into the shared queue, the pump
    dispatches it."""
    pump_enabled: bool = True
    """Manual drain allowed (default true)."""
    background_pump: bool = True
    """Pump continuously after the readiness gate (default true)."""
    scale_out_enabled: bool = True
    """Admission may answer RequestScaleOut (default true)."""
    runtime_token: SecretStr | None = None
    """Bearer token the control plane presents to runtime instances' HTTP intake (the
    runtimes' ``AIRUNTIME_RUNTIME_TOKEN``); default none."""
    claim_lease_ms: int = Field(default=30_000, ge=100, le=3_600_000)
    """A pump that dies (or loses Redis) between claiming a queue item and settling it
    holds the item this many milliseconds before another pump takes it (default 30000;
    keep it above ``delivery_timeout_s``: a live pump's delivery must end within it)."""
    delivery_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """How long a delivery waits for a runtime to accept a run (default 10 s); the
    ``redis`` provider's blocking wait gets a socket timeout 5 s longer."""
    delivery_failures_before_suspect: int = Field(default=3, ge=1, le=1000)
    """Consecutive failures to reach an instance before admission skips it (default 3)."""
    suspect_initial_s: float = Field(default=5.0, gt=0)
    """How long admission skips a suspect instance the first time (default 5 s); each
    repeated suspicion doubles it."""
    suspect_max_s: float = Field(default=300.0, gt=0)
    """The longest admission skips a suspect instance (default 300 s)."""
    scale_out_backoff_initial_s: float = Field(default=5.0, gt=0)
    """After a failed scale-out, the wait before the next attempt for that runtime
    prefix (default 5 s); doubled after each further failure."""
    scale_out_backoff_max_s: float = Field(default=300.0, gt=0)
    """The longest wait between scale-out attempts for one prefix (default 300 s)."""
    idempotency_ttl_s: float = Field(default=24 * 3600, gt=0, le=30 * 24 * 3600)
    """How long a submission's idempotency key names the run it created (default 24
    h): sent again within it, the request is that run
    (:mod:`~airuntime.control_plane.submit_idempotency`)."""
    retention_s: float = Field(default=7 * 24 * 3600, gt=0)
    """How long terminal shared runs, their queue items and scale-out records are kept
    (default 7 days, counted from the end of the run)."""
    archiver_enabled: bool = True
    """Archive finished executions and shared runs into the durable history
    (AIRUNTIME_HISTORY_DSN) and delete shared runs from Redis only once archived
    (default true; needs a history store)."""
    retention_interval_s: float = Field(default=60.0, gt=0)
    """Seconds between retention passes (default 60)."""
    reconcile_interval_s: float = Field(default=30.0, gt=0)
    """Seconds between passes of the reconciler over open shared runs (default 30)."""
    mcp_enabled: bool = True
    """Serve the MCP server (streamable HTTP) at ``/mcp`` on the API's port, with the
    API's bearer tokens (default true)."""
    max_request_bytes: int = Field(default=1024 * 1024, ge=1024)
    """Largest request body the API reads (default 1 MiB = 1048576 bytes; larger: 413).
    Submitting a larger pipeline needs a higher value."""


class ControlPlaneSettings(_BehaviourFields):
    """What one control plane runs with."""

    control_plane_id: str = Field(
        default_factory=lambda: f"cp-{socket.gethostname()}-{os.getpid()}"
    )
    """Logical identity, published for runtime-only hosts (discovery); default
    ``cp-<hostname>-<pid>``."""


class ControlPlaneServerSettings(EnvSettings, _BehaviourFields):
    """What ``airt control-plane`` reads from ``AIRUNTIME_*``."""

    model_config = EnvSettings.model_config

    api_host: str = "127.0.0.1"
    """Interface the HTTP API listens on (default 127.0.0.1; 0.0.0.0 in the image)."""
    api_port: int = Field(default=8780, ge=0, le=65535)
    """Port of the HTTP API (default 8780; 0 = any free port)."""
    tokens_file: Path | None = None
    """YAML file of the API's bearer tokens (required: the API serves no anonymous caller)."""
    tenants_file: Path | None = None
    """YAML file of tenant settings published at startup; default none: the tenants
    already in Redis."""
    scale_out_provider: ScaleOutProviderKind = ScaleOutProviderKind.LOCAL
    """Who starts runtime instances on RequestScaleOut (default local)."""
    namespace: str | None = None
    """Namespace of the ScaleOutRequests of the ``kubernetes`` provider; default none:
    the provider's own default."""
    redis_url: str | None = None
    """The shared Redis/Valkey of the system (required)."""

    def control_plane_settings(self) -> ControlPlaneSettings:
        """The settings of the control plane this process runs."""
        return ControlPlaneSettings.model_validate(
            self.model_dump(include=set(_BehaviourFields.model_fields))
        )
