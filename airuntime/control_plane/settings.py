"""How a control plane is configured: submit mode, pumps, scale-out, identity.

The reference's settings map onto these fields: ``SubmitMode`` (how ``submit`` places a
run), the shared-queue pump switch (manual drain allowed), the background pump service,
and whether admission may ask for scale-out.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from enum import StrEnum


class SubmitMode(StrEnum):
    QUEUE_FIRST = "QueueFirst"
    DIRECT_DISPATCH = "DirectDispatch"


@dataclass(frozen=True)
class ControlPlaneSettings:
    submit_mode: SubmitMode = SubmitMode.QUEUE_FIRST
    """How ``submit`` places a run (``AiSharedRuntimeController:SubmitMode``)."""
    pump_enabled: bool = True
    """Manual drain allowed (``AiSharedQueuePump:Enabled`` / ``EnableSharedQueuePump``)."""
    background_pump: bool = True
    """Pump continuously after the readiness gate (``AiSharedQueueBackgroundService:Enabled``)."""
    scale_out_enabled: bool = True
    """Admission may answer RequestScaleOut."""
    control_plane_id: str = field(
        default_factory=lambda: f"cp-{socket.gethostname()}-{os.getpid()}"
    )
    """Logical identity, published for runtime-only hosts (discovery)."""
    claim_lease_ms: int = 30_000
    """A pump that dies between claim and settle loses its item after this."""
