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

from pydantic import BaseModel, ConfigDict, Field

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


class ControlPlaneSettings(_BehaviourFields):
    """What one control plane runs with."""

    control_plane_id: str = Field(
        default_factory=lambda: f"cp-{socket.gethostname()}-{os.getpid()}"
    )
    """Logical identity, published for runtime-only hosts (discovery); default
    ``cp-<hostname>-<pid>``."""
    claim_lease_ms: int = 30_000
    """A pump that dies between claim and settle loses its item after this many
    milliseconds (default 30000)."""


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
