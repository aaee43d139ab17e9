"""Settings of the airuntime operator, read once from the environment.

Why a module of its own: the same settings drive ``python -m airuntime_operator``
(from the environment of the operator's pod) and the tests (built explicitly),
and every tunable the operator has is listed -- with unit, default and reason --
in one place, like kopf's own ``OperatorSettings``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

__all__ = ["OperatorSettings", "SettingsError"]

_PREFIX: Final = "AIRUNTIME_OPERATOR_"


class SettingsError(ValueError):
    """An operator setting in the environment is missing or malformed."""


@dataclass(frozen=True)
class OperatorSettings:
    """Everything the operator needs besides the cluster's custom resources."""

    redis_url: str
    """URL of the Redis the runtimes register in and tenant settings are published to
    (``AIRUNTIME_REDIS_URL``, required). The operator only reads the registry and writes
    tenant settings; it never touches execution state."""

    kubeconfig: str | None = None
    """Path of a kubeconfig file (``KUBECONFIG``); ``None`` = in-cluster service account."""

    namespaces: tuple[str, ...] = ()
    """Namespaces (or kopf glob patterns) to serve (``AIRUNTIME_OPERATOR_NAMESPACES``,
    comma-separated); empty = the whole cluster."""

    peering_name: str = "airuntime"
    """kopf peering object shared by the operator's replicas, so that only one of them
    (the highest priority) handles resources at a time (``AIRUNTIME_OPERATOR_PEERING``)."""

    standalone: bool = False
    """Run without peering (``AIRUNTIME_OPERATOR_STANDALONE=1``): for a single replica,
    tests and local development."""

    priority: int | None = None
    """kopf peering priority of this replica (``AIRUNTIME_OPERATOR_PRIORITY``); the highest
    live priority handles resources, the others stand by. ``None`` = random."""

    liveness_endpoint: str | None = None
    """kopf's liveness probe endpoint, e.g. ``http://0.0.0.0:8080/healthz``
    (``AIRUNTIME_OPERATOR_LIVENESS``); ``None`` = no probe server."""

    runtime_image: str = "ghcr.io/airuntime/airuntime:0.1.0"
    """Image of runtime pods whose pool sets no ``spec.image``
    (``AIRUNTIME_OPERATOR_RUNTIME_IMAGE``)."""

    status_interval_seconds: float = 10.0
    """Seconds between refreshes of a pool's ``readyReplicas`` / ``visibleInstances``
    (``AIRUNTIME_OPERATOR_STATUS_INTERVAL``). The registry lives in Redis, which has no
    watch, so it is polled; a status is only patched when it changed."""

    fulfilment_poll_seconds: float = 2.0
    """Seconds between checks of an Observed scale-out request for a new, ready runtime
    instance (``AIRUNTIME_OPERATOR_FULFILMENT_POLL``)."""

    fulfilment_timeout_seconds: float = 900.0
    """An Observed request with no new ready instance after this long is Rejected, so the
    control plane stops waiting for it (``AIRUNTIME_OPERATOR_FULFILMENT_TIMEOUT``)."""

    retention_seconds: float = 3600.0
    """Fulfilled or Rejected scale-out requests older than this are deleted
    (``AIRUNTIME_OPERATOR_RETENTION``; default one hour)."""

    gc_interval_seconds: float = 60.0
    """Seconds between checks of a finished request against the retention
    (``AIRUNTIME_OPERATOR_GC_INTERVAL``)."""

    registry_cache_seconds: float = 0.5
    """How long one read of the Redis registry is reused by every pool and request, which
    bounds the registry reads per second regardless of the number of resources."""

    scale_in: bool = True
    """Remove idle runtime pods of a pool after its ``idleScaleInDelaySeconds``
    (``AIRUNTIME_OPERATOR_SCALE_IN``)."""

    api_threads: int = 8
    """Threads running blocking Kubernetes API calls (``AIRUNTIME_OPERATOR_API_THREADS``)."""

    field_manager: str = "airuntime-operator"
    """Server-side-apply field manager and user agent of the operator's own requests."""

    extra_labels: Mapping[str, str] = field(default_factory=dict)
    """Labels added to every object the operator creates."""

    def __post_init__(self) -> None:
        if not self.redis_url:
            raise SettingsError("The operator needs a Redis URL: set AIRUNTIME_REDIS_URL.")
        for name in (
            "status_interval_seconds",
            "fulfilment_poll_seconds",
            "fulfilment_timeout_seconds",
            "retention_seconds",
            "gc_interval_seconds",
        ):
            value = getattr(self, name)
            if value <= 0:
                raise SettingsError(f"{name} must be positive, not {value}.")
        if self.api_threads < 1:
            raise SettingsError(f"Can't run the Kubernetes API with {self.api_threads} threads.")

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OperatorSettings:
        """Read the settings from ``environ`` (default: ``os.environ``)."""
        env = os.environ if environ is None else environ

        def number(name: str, default: float) -> float:
            raw = env.get(_PREFIX + name)
            if raw is None or raw == "":
                return default
            try:
                return float(raw)
            except ValueError:
                raise SettingsError(f"{_PREFIX}{name} must be a number, not {raw!r}.") from None

        def flag(name: str, default: bool) -> bool:
            raw = env.get(_PREFIX + name)
            if raw is None or raw == "":
                return default
            return raw.strip().lower() in ("1", "true", "yes", "on")

        namespaces = tuple(
            n.strip() for n in env.get(_PREFIX + "NAMESPACES", "").split(",") if n.strip()
        )
        return cls(
            redis_url=env.get("AIRUNTIME_REDIS_URL", ""),
            kubeconfig=env.get("KUBECONFIG") or None,
            namespaces=namespaces,
            peering_name=env.get(_PREFIX + "PEERING") or "airuntime",
            standalone=flag("STANDALONE", False),
            priority=int(number("PRIORITY", 0)) if env.get(_PREFIX + "PRIORITY") else None,
            liveness_endpoint=env.get(_PREFIX + "LIVENESS") or None,
            runtime_image=env.get(_PREFIX + "RUNTIME_IMAGE") or cls.runtime_image,
            status_interval_seconds=number("STATUS_INTERVAL", cls.status_interval_seconds),
            fulfilment_poll_seconds=number("FULFILMENT_POLL", cls.fulfilment_poll_seconds),
            fulfilment_timeout_seconds=number("FULFILMENT_TIMEOUT", cls.fulfilment_timeout_seconds),
            retention_seconds=number("RETENTION", cls.retention_seconds),
            gc_interval_seconds=number("GC_INTERVAL", cls.gc_interval_seconds),
            scale_in=flag("SCALE_IN", cls.scale_in),
            api_threads=int(number("API_THREADS", cls.api_threads)),
        )
