"""Runtime instance registry, capacity descriptors and tenant settings in Redis.

Runtime instances register themselves and publish a capacity descriptor on every
heartbeat; the descriptor key carries a TTL, so a crashed instance (or one that cannot
reach Redis any more) disappears by itself. The control plane's admission, the pump's
readiness gate, ``airt instances`` and the operator's ``visibleInstances`` all read
this one registry, always through the tenant visibility rules of
:mod:`airuntime.fleet.tenancy` when a tenant is asking.

Keys (see :mod:`airuntime.core.keys`):

* ``air:{air}:instances`` zset: instance id -> heartbeat expiry (Redis time, ms). Pruned on
  every publication; readers take the descriptors that still exist.
* ``air:{air}:instance:<id>`` string: the :class:`InstanceDescriptor` JSON, with PX TTL,
  written by ``publishInstance-2.lua`` (``publishInstanceQueued-3.lua`` where the local
  queue shares the slot: the queue length checked in the same call).

Time: a descriptor's ``heartbeat_at_ms`` and ``capacity.snapshot_at_ms`` are **Redis
time**, stamped by the publishing script (``TIME``), never the runtime's clock. This is
the contract with admission: ``reserveSlot-1.lua`` compares ``snapshot_at_ms`` with its
own ``TIME`` to decide which reservations the descriptor already reflects, so a runtime
whose clock is off can neither drop live reservations nor keep stale ones.
* ``air:{air}:tenant:<id>:settings`` string: :class:`~airuntime.fleet.tenancy.TenantSettings` JSON.
* ``air:{air}:tenants`` set: tenant ids with stored settings.
* ``air:{air}:tenant-seeds`` string: written with a tenants file's settings
  (:meth:`Registry.put_seeds`); its absence means Redis lost them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from airuntime.core import keys
from airuntime.core.redis_client import RedisClient
from airuntime.core.scripts import ScriptLibrary, library
from airuntime.core.slots import ensure_transaction_slot
from airuntime.fleet.tenancy import (
    IsolationMode,
    TenantSettings,
    is_visible,
    stored_settings,
)


class InstanceStatus(StrEnum):
    STARTING = "Starting"
    READY = "Ready"
    DRAINING = "Draining"


class CapacityDescriptor(BaseModel):
    """What an instance can take right now (docs/architecture.md §8)."""

    model_config = ConfigDict(extra="forbid")

    worker_count: int = Field(ge=0)
    active_worker_count: int = Field(ge=0)
    available_worker_count: int = Field(ge=0)
    max_local_workers_per_execution: int = Field(ge=1)
    queued_run_count: int = Field(ge=0)
    running_run_count: int = Field(ge=0)
    active_run_count: int = Field(ge=0)
    queue_capacity: int = Field(ge=0)
    max_concurrent_runs: int = Field(ge=0)
    available_run_slots: int = Field(ge=0)
    is_queue_paused: bool
    can_accept_run: bool
    snapshot_at_ms: int
    """When this capacity was published, Redis time (ms; see the module docstring)."""

    @staticmethod
    def compute(
        *,
        worker_count: int,
        active_worker_count: int,
        max_local_workers_per_execution: int,
        queued_run_count: int,
        running_run_count: int,
        queue_capacity: int,
        max_concurrent_runs: int,
        is_queue_paused: bool,
        controller_healthy: bool = True,
    ) -> CapacityDescriptor:
        """Derive the availability fields: CanAcceptRun = not paused and queue has room
        and a run slot is free and a worker is free -- and the instance's controller
        (which starts queued runs) is healthy, since a run accepted while it is down
        would only wait. ``snapshot_at_ms`` is replaced by Redis time on publication."""
        available_workers = max(0, worker_count - active_worker_count)
        active_runs = queued_run_count + running_run_count
        slots = max(0, max_concurrent_runs - running_run_count)
        queue_room = queued_run_count < queue_capacity
        return CapacityDescriptor(
            worker_count=worker_count,
            active_worker_count=active_worker_count,
            available_worker_count=available_workers,
            max_local_workers_per_execution=max_local_workers_per_execution,
            queued_run_count=queued_run_count,
            running_run_count=running_run_count,
            active_run_count=active_runs,
            queue_capacity=queue_capacity,
            max_concurrent_runs=max_concurrent_runs,
            available_run_slots=slots,
            is_queue_paused=is_queue_paused,
            can_accept_run=(
                controller_healthy
                and not is_queue_paused
                and queue_room
                and slots > 0
                and available_workers > 0
            ),
            snapshot_at_ms=int(time.time() * 1000),
        )


class InstanceDescriptor(BaseModel):
    """A registered runtime instance: identity, ownership, provider, capacity."""

    model_config = ConfigDict(extra="forbid")

    instance_id: str
    role: str = "runtime"
    status: InstanceStatus = InstanceStatus.READY
    heartbeat_at_ms: int
    provider: str = "redis"
    endpoint: str = ""
    host: str = ""
    tenant_id: str | None = None
    tenant_group_id: str | None = None
    isolation_mode: IsolationMode = IsolationMode.SHARED
    prefer_dedicated: bool = False
    allow_shared_fallback: bool = True
    runtime_prefix: str
    capacity: CapacityDescriptor
    control_plane_id: str | None = None
    """Logical control plane the host resolved at startup (discovery), if any."""
    unhealthy_loops: tuple[str, ...] = ()
    """Background loops of the instance failing right now (restarting with backoff)."""

    def visible_to(self, tenant: TenantSettings) -> bool:
        return is_visible(
            tenant=tenant,
            instance_mode=self.isolation_mode,
            instance_tenant_id=self.tenant_id,
            instance_tenant_group_id=self.tenant_group_id,
        )


class Registry:
    """Reads and writes instance descriptors and tenant settings."""

    def __init__(self, redis: RedisClient, scripts: ScriptLibrary | None = None) -> None:
        self.redis = redis
        self.scripts = scripts or library()

    # -- instances ---------------------------------------------------------------

    async def publish(self, descriptor: InstanceDescriptor, ttl_ms: int) -> int:
        """Register or refresh an instance (one round trip, stamped with Redis time);
        returns that time (ms)."""
        reply: Any = await self.scripts.call(
            self.redis,
            "publishInstance",
            [keys.instance(descriptor.instance_id), keys.instances()],
            [descriptor.instance_id, descriptor.model_dump_json(), ttl_ms],
        )
        return int(reply[1])

    async def publish_if_queued(
        self, descriptor: InstanceDescriptor, ttl_ms: int, queue_key: str
    ) -> tuple[bool, int]:
        """:meth:`publish` of a descriptor computed with a guess of the instance's local
        queue length (its ``capacity.queued_run_count``), only if the queue at
        ``queue_key`` (the descriptor's slot: a standalone server) has that length, in
        one round trip (``publishInstanceQueued-3``): ``(True, Redis time)`` when
        published, ``(False, the queue's length)`` when nothing was written."""
        reply: Any = await self.scripts.call(
            self.redis,
            "publishInstanceQueued",
            [keys.instance(descriptor.instance_id), keys.instances(), queue_key],
            [
                descriptor.instance_id,
                descriptor.model_dump_json(),
                ttl_ms,
                descriptor.capacity.queued_run_count,
            ],
        )
        return int(reply[0]) == 1, int(reply[1])

    async def unregister(self, instance_id: str) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(keys.instance(instance_id))
        pipe.zrem(keys.instances(), instance_id)
        ensure_transaction_slot("Registry.unregister", pipe)
        await pipe.execute()

    async def get(self, instance_id: str) -> InstanceDescriptor | None:
        raw = await self.redis.get(keys.instance(instance_id))
        return InstanceDescriptor.model_validate_json(raw) if raw else None

    async def list_all(self) -> list[InstanceDescriptor]:
        """Every live instance, regardless of tenant (operators and admins only): those
        whose descriptor has not expired (Redis decides, not this process's clock)."""
        ids: list[Any] = await self.redis.zrange(keys.instances(), 0, -1)
        if not ids:
            return []
        raws = await self.redis.mget(
            [keys.instance(i.decode() if isinstance(i, bytes) else i) for i in ids]
        )
        out = [InstanceDescriptor.model_validate_json(r) for r in raws if r]
        return sorted(out, key=lambda d: d.instance_id)

    async def list_visible(self, tenant: TenantSettings) -> list[InstanceDescriptor]:
        """The instances ``tenant`` may use, see and dispatch onto."""
        return [d for d in await self.list_all() if d.visible_to(tenant)]

    async def list_by_prefix(self, prefix: str) -> list[InstanceDescriptor]:
        return [d for d in await self.list_all() if d.runtime_prefix == prefix]

    # -- tenant settings -------------------------------------------------------------

    @staticmethod
    def _stage_tenant(pipe: Any, settings: TenantSettings, *, nx: bool = False) -> None:
        """Queue the writes of one tenant's settings: the JSON, and its id in the set."""
        pipe.set(keys.tenant_settings(settings.tenant_id), settings.model_dump_json(), nx=nx)
        pipe.sadd(keys.tenants(), settings.tenant_id)

    async def put_tenant(self, settings: TenantSettings) -> None:
        pipe = self.redis.pipeline(transaction=True)
        self._stage_tenant(pipe, settings)
        ensure_transaction_slot("Registry.put_tenant", pipe)
        await pipe.execute()

    async def put_tenant_if_absent(self, settings: TenantSettings) -> bool:
        """:meth:`put_tenant` unless the tenant has settings stored (then nothing is
        changed); whether they were written."""
        pipe = self.redis.pipeline(transaction=True)
        self._stage_tenant(pipe, settings, nx=True)
        ensure_transaction_slot("Registry.put_tenant_if_absent", pipe)
        written, _ = await pipe.execute()
        return bool(written)

    async def put_seeds(self, seeds: Sequence[TenantSettings], source: str) -> None:
        """Store ``seeds`` (a tenants file's settings) and the seed marker naming
        ``source``, in one transaction: the marker is there exactly when they are."""
        pipe = self.redis.pipeline(transaction=True)
        for settings in seeds:
            self._stage_tenant(pipe, settings)
        pipe.set(keys.tenant_seeds(), source)
        ensure_transaction_slot("Registry.put_seeds", pipe)
        await pipe.execute()

    async def seeds_present(self) -> bool:
        """Whether the seed marker :meth:`put_seeds` wrote is still there."""
        return bool(await self.redis.exists(keys.tenant_seeds()))

    async def delete_tenant(self, tenant_id: str) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(keys.tenant_settings(tenant_id))
        pipe.srem(keys.tenants(), tenant_id)
        ensure_transaction_slot("Registry.delete_tenant", pipe)
        await pipe.execute()

    async def tenant(self, tenant_id: str) -> TenantSettings:
        """Stored settings of ``tenant_id``, or the Shared defaults when none are stored."""
        return (await self.tenant_with_text(tenant_id))[0]

    async def tenant_with_text(self, tenant_id: str) -> tuple[TenantSettings, bytes]:
        """:meth:`tenant`, and the stored text those settings were read from, byte for
        byte (``b""``: none stored), for a caller that later checks, in a script, that
        they are still what it decided on (``submitSharedRun-7.lua``)."""
        raw = await self.redis.get(keys.tenant_settings(tenant_id))
        text = raw.encode() if isinstance(raw, str) else (raw or b"")
        return stored_settings(tenant_id, raw), text

    async def tenants(self, tenant_ids: Iterable[str]) -> dict[str, TenantSettings]:
        """:meth:`tenant` of each of ``tenant_ids`` in one round trip (their keys share
        the control slot)."""
        ids = sorted(set(tenant_ids))
        if not ids:
            return {}
        raws = await self.redis.mget([keys.tenant_settings(t) for t in ids])
        return {t: stored_settings(t, raw) for t, raw in zip(ids, raws, strict=True)}

    async def tenant_ids(self) -> list[str]:
        return sorted(
            m.decode() if isinstance(m, bytes) else m
            for m in await self.redis.smembers(keys.tenants())
        )
