"""How the control plane reaches runtime instances: one provider per transport, with
timeouts that hold and the runtime token.

Why this module exists: a delivery waits for a runtime's answer -- the ``redis``
provider blocks on a reply list (BLPOP), the ``http`` provider on a POST. A blocking
Redis call on a connection whose socket timeout is shorter than its block time fails
with ``redis.TimeoutError`` while the runtime is merely slow (a runtime frozen for 10 s
killed the pump that way), so blocking calls get their own client whose socket timeout
is longer than the longest block (:func:`with_socket_timeout`). HTTP deliveries carry
the runtime token (``AIRUNTIME_RUNTIME_TOKEN``) the runtimes' intake requires.
"""

from __future__ import annotations

import httpx

from airuntime.core.redis_client import RedisClient, clone
from airuntime.fleet.providers import (
    HttpProvider,
    LocalProvider,
    RedisProvider,
    RuntimeProvider,
    provider_for,
)
from airuntime.fleet.registry import InstanceDescriptor

__all__ = ["BLOCK_MARGIN_S", "Deliveries", "with_socket_timeout"]

BLOCK_MARGIN_S = 5.0
"""How much longer than its longest block a blocking client's socket timeout is."""


def with_socket_timeout(redis: RedisClient, socket_timeout_s: float) -> RedisClient:
    """A client of the same server as ``redis`` whose connections time out after
    ``socket_timeout_s`` (its own pool; close it with ``aclose``)."""
    return clone(redis, socket_timeout=socket_timeout_s)


class Deliveries:
    """The providers deliveries go through, chosen per instance."""

    def __init__(
        self,
        redis: RedisClient,
        local: LocalProvider,
        *,
        timeout_s: float = 10.0,
        runtime_token: str | None = None,
        blocking_redis: RedisClient | None = None,
    ) -> None:
        self.redis = redis
        self.local = local
        self.timeout_s = timeout_s
        self.blocking_redis = blocking_redis or with_socket_timeout(
            redis, timeout_s + BLOCK_MARGIN_S
        )
        headers = {"authorization": f"Bearer {runtime_token}"} if runtime_token else {}
        self._http_client = httpx.AsyncClient(timeout=timeout_s, headers=headers)
        self._providers: dict[str, RuntimeProvider] = {}

    def provider(self, instance: InstanceDescriptor) -> RuntimeProvider:
        """The provider of ``instance``: ``local`` for instances hosted in this process."""
        name = instance.provider if instance.instance_id not in self.local.instances else "local"
        if name not in self._providers:
            self._providers[name] = self._make(name)
        return self._providers[name]

    def _make(self, name: str) -> RuntimeProvider:
        if name == "redis":
            return RedisProvider(self.blocking_redis, timeout_s=self.timeout_s)
        if name == "http":
            return HttpProvider(self._http_client, timeout_s=self.timeout_s)
        return provider_for(name, redis=self.redis, local=self.local)

    async def close(self) -> None:
        await self._http_client.aclose()
        await self.blocking_redis.aclose()
