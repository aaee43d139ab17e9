"""The operator's process-wide resources: API client, Redis registry, shared caches.

Why this exists: kopf calls handlers as plain functions; what they share -- one
Kubernetes API client, one Redis connection pool, one recent read of the runtime
registry, the instances already promised to scale-out requests -- lives in one
:class:`OperatorContext`, opened by the startup handler inside kopf's event loop and
closed by the cleanup handler.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from airuntime.core.redis_client import RedisClient, connect
from airuntime.fleet.registry import InstanceDescriptor, Registry
from airuntime.k8s.client import KubeApi, load_configuration
from airuntime_operator.settings import OperatorSettings

__all__ = ["OperatorContext", "RegistryView"]


class RegistryView:
    """Recent reads of the runtime registry, shared by every pool and request.

    The registry has no change feed, so it is polled; one read (``ZRANGEBYSCORE`` +
    ``MGET``) is reused for ``max_age`` seconds, which bounds the Redis load however
    many resources the operator serves. Concurrent callers share one read.
    """

    def __init__(self, registry: Registry, max_age: float) -> None:
        self.registry = registry
        self.max_age = max_age
        self._instances: list[InstanceDescriptor] = []
        self._read_at: float | None = None
        self._lock = asyncio.Lock()

    async def instances(self, *, fresh: bool = False) -> list[InstanceDescriptor]:
        """Live instances, read at most ``max_age`` seconds ago (now when ``fresh``)."""
        started = time.monotonic()
        if not fresh and self._is_recent(started):
            return self._instances
        async with self._lock:
            # Another caller may have read while this one waited for the lock.
            if self._read_at is not None and self._read_at >= started:
                return self._instances
            self._instances = await self.registry.list_all()
            self._read_at = time.monotonic()
            return self._instances

    async def by_prefix(self, prefix: str, *, fresh: bool = False) -> list[InstanceDescriptor]:
        return [d for d in await self.instances(fresh=fresh) if d.runtime_prefix == prefix]

    def _is_recent(self, now: float) -> bool:
        return self._read_at is not None and now - self._read_at < self.max_age


@dataclass
class OperatorContext:
    """Resources shared by every handler of one running operator."""

    settings: OperatorSettings
    _kube: KubeApi | None = None
    _redis: RedisClient | None = None
    _view: RegistryView | None = None
    claimed_instances: dict[str, str] = field(default_factory=dict)
    """Runtime instance id -> uid of the scale-out request it fulfilled (this process)."""
    idle_since: dict[str, dict[str, float]] = field(default_factory=dict)
    """Runtime prefix -> instance id -> monotonic time it was first seen idle (scale-in)."""

    @property
    def kube(self) -> KubeApi:
        if self._kube is None:
            self._kube = KubeApi(
                load_configuration(self.settings.kubeconfig),
                field_manager=self.settings.field_manager,
                threads=self.settings.api_threads,
            )
        return self._kube

    @property
    def registry(self) -> Registry:
        return self.view.registry

    @property
    def view(self) -> RegistryView:
        if self._view is None:
            raise RuntimeError("The operator context is not open (no startup handler ran).")
        return self._view

    async def open(self) -> None:
        """Connect to Redis (checked with PING) and to the API server."""
        redis = connect(self.settings.redis_url, client_name="airt-operator")
        await redis.ping()
        self._redis = redis
        self._view = RegistryView(Registry(redis), self.settings.registry_cache_seconds)
        _ = self.kube

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None
            self._view = None
        if self._kube is not None:
            self._kube.close()
            self._kube = None
