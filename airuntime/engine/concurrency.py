"""Distributed concurrency admission for throttled steps: policy, then lease, then claim.

A step with a ``concurrency`` spec that matches a pipeline throttle rule belongs to a
*scope* (provider/model/operation[/key]) whose concurrently running steps, across all
workers, processes and executions, are bounded by the rule's limit. Admission is:

1. policies (local, pure) may deny — a denial acquires nothing;
2. a lease is acquired in the scope's Redis zset (``acquireLease-1.lua``) — a denial
   attempts no claim;
3. the step is claimed (``claimStep-21.lua``) — a failed claim releases the lease at once;
4. the lease is held (and renewed) until the step's attempt ends, then released.

Leases carry a TTL, so a crashed holder's capacity returns without anyone's help.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from airuntime.core import keys
from airuntime.core.errors import OK
from airuntime.core.redis_client import RedisClient
from airuntime.core.scripts import ScriptLibrary, library


@dataclass(frozen=True, slots=True)
class ConcurrencyContext:
    """What admission knows about one step attempt."""

    pipeline_id: str
    execution_id: str
    step_id: str
    tenant_id: str
    provider: str | None
    model: str | None
    operation: str | None
    key: str | None
    scope: str
    limit: int


class AdmissionPolicy(Protocol):
    """A local admission rule; returning a reason string denies, None allows."""

    def deny_reason(self, ctx: ConcurrencyContext) -> str | None: ...


class ZeroLimitPolicy:
    """A throttle rule with ``limit: 0`` closes its scope: deny before any lease."""

    def deny_reason(self, ctx: ConcurrencyContext) -> str | None:
        if ctx.limit <= 0:
            return f"throttle scope {ctx.scope!r} has limit 0"
        return None


@dataclass(frozen=True, slots=True)
class LeaseResult:
    acquired: bool
    holders: int = 0
    retry_after_ms: int = 0


class ConcurrencyLeases:
    """Lease operations on throttle scopes."""

    def __init__(self, redis: RedisClient, scripts: ScriptLibrary | None = None) -> None:
        self.redis = redis
        self.scripts = scripts or library()

    async def acquire(self, scope: str, holder: str, limit: int, ttl_ms: int) -> LeaseResult:
        reply: Any = await self.scripts.call(
            self.redis, "acquireLease", [keys.lease_holders(scope)], [holder, limit, ttl_ms]
        )
        if int(reply[0]) == OK:
            return LeaseResult(True, holders=int(reply[1]))
        return LeaseResult(False, retry_after_ms=int(reply[1]))

    async def release(self, scope: str, holder: str) -> bool:
        reply = await self.scripts.call(
            self.redis, "releaseLease", [keys.lease_holders(scope)], [holder]
        )
        return int(reply) == OK

    async def renew(self, scope: str, holder: str, ttl_ms: int) -> bool:
        reply = await self.scripts.call(
            self.redis, "renewLease", [keys.lease_holders(scope)], [holder, ttl_ms]
        )
        return int(reply) == OK

    async def holders(self, scope: str) -> int:
        """Current holders, expired ones included until the next acquire drops them."""
        return int(await self.redis.zcard(keys.lease_holders(scope)))
