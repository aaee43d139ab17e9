"""Runtime instances as the operator sees them: entries of the Redis registry.

The real ``airt runtime`` process does not exist yet, so the tests register
instances the way it will -- an :class:`~airuntime.fleet.registry.InstanceDescriptor`
published with a TTL through :meth:`airuntime.fleet.registry.Registry.publish`. Tests
depend only on the :class:`RuntimeLauncher` protocol; a launcher that starts a real
``airt runtime`` with the environment of the pool's Deployment can replace
:class:`PublishedRuntimes` without touching them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from redis.asyncio import Redis

from airuntime.fleet.registry import CapacityDescriptor, InstanceDescriptor, Registry
from airuntime.fleet.tenancy import IsolationMode

HEARTBEAT_TTL_MS = 120_000


@dataclass(frozen=True)
class RuntimeSpec:
    """What a launched runtime instance is (the pod's env in the real thing)."""

    instance_id: str
    tenant_id: str
    runtime_prefix: str
    isolation_mode: IsolationMode = IsolationMode.DEDICATED
    can_accept_run: bool = True
    busy: bool = False


class RuntimeLauncher(Protocol):
    async def start(self, spec: RuntimeSpec) -> None:
        """Bring the instance up; returns once it is registered (visible in the registry)."""

    async def stop(self, instance_id: str) -> None:
        """Stop the instance; returns once it left the registry."""


class PublishedRuntimes:
    """Registers instances directly in Redis (one heartbeat with a long TTL)."""

    def __init__(self, redis: Redis) -> None:
        self.registry = Registry(redis)

    async def start(self, spec: RuntimeSpec) -> None:
        paused = not spec.can_accept_run
        capacity = CapacityDescriptor.compute(
            worker_count=4,
            active_worker_count=1 if spec.busy else 0,
            max_local_workers_per_execution=2,
            queued_run_count=0,
            running_run_count=1 if spec.busy else 0,
            queue_capacity=10,
            max_concurrent_runs=3,
            is_queue_paused=paused,
        )
        await self.registry.publish(
            InstanceDescriptor(
                instance_id=spec.instance_id,
                heartbeat_at_ms=int(time.time() * 1000),
                tenant_id=spec.tenant_id,
                isolation_mode=spec.isolation_mode,
                runtime_prefix=spec.runtime_prefix,
                capacity=capacity,
            ),
            ttl_ms=HEARTBEAT_TTL_MS,
        )

    async def stop(self, instance_id: str) -> None:
        await self.registry.unregister(instance_id)
