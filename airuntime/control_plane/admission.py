"""Dispatch-time admission: where may this run go now?

Admission runs with the run's ExecutionContextSnapshot restored and decides (an
:class:`Assign` result carries the instance and its reservation, a
:class:`NotAssigned` one the reason):

* ``AssignToInstance`` — a tenant-visible, ready instance can accept the run and one
  of its run slots was **reserved atomically** (``reserveSlot-1.lua``, with TTL); the
  reservation is released if dispatch fails;
* ``RequestScaleOut`` — nothing visible can take it, scale-out is enabled, and the
  tenant has fewer instances with its runtime prefix than its ``max_instances``;
* ``QueueGlobally`` — nothing can take it now, but capacity exists or is coming;
* ``Reject`` — the tenant can never be served (``max_instances`` 0 and no visible
  runtime).

Candidate order: a tenant preferring dedicated capacity (or a Dedicated/Hybrid
tenant) gets its own instances first, shared fallback after; among equals the one
with the most free run slots. Only the restored snapshot's tenant decides what is
visible.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Literal

from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.core.context import DEFAULT_TENANT, current_context
from airuntime.core.scripts import ScriptLibrary, library
from airuntime.fleet.registry import InstanceDescriptor, InstanceStatus, Registry
from airuntime.fleet.tenancy import IsolationMode, TenantSettings


class Decision(StrEnum):
    ASSIGN = "AssignToInstance"
    QUEUE = "QueueGlobally"
    SCALE_OUT = "RequestScaleOut"
    REJECT = "Reject"


@dataclass(frozen=True, slots=True)
class Reservation:
    instance_id: str
    reservation_id: str


@dataclass(frozen=True, slots=True)
class Assign:
    """AssignToInstance: one run slot of ``instance`` is reserved for this run."""

    tenant: TenantSettings
    instance: InstanceDescriptor
    reservation: Reservation
    decision: ClassVar[Literal[Decision.ASSIGN]] = Decision.ASSIGN


@dataclass(frozen=True, slots=True)
class NotAssigned:
    """QueueGlobally, RequestScaleOut or Reject: no instance, nothing reserved."""

    decision: Literal[Decision.QUEUE, Decision.SCALE_OUT, Decision.REJECT]
    tenant: TenantSettings
    reason: str


AdmissionResult = Assign | NotAssigned
"""What admission decided; ``decision`` tells the two apart, and so does the type."""


def free_run_slots(d: InstanceDescriptor) -> int:
    """Runs the instance can start now, queued runs already counted against its slots."""
    c = d.capacity
    if not c.can_accept_run:
        return 0
    return max(0, c.max_concurrent_runs - c.running_run_count - c.queued_run_count)


class Admission:
    """Tenant-aware admission over the registry, with atomic slot reservations."""

    def __init__(
        self,
        redis: Redis,
        *,
        scale_out_enabled: bool = True,
        reservation_ttl_ms: int = 10_000,
        reservation_grace_ms: int = 500,
        scripts: ScriptLibrary | None = None,
    ) -> None:
        self.redis = redis
        self.registry = Registry(redis)
        self.scale_out_enabled = scale_out_enabled
        self.reservation_ttl_ms = reservation_ttl_ms
        self.reservation_grace_ms = reservation_grace_ms
        self.scripts = scripts or library()

    async def admit(self, *, target: str | None = None) -> AdmissionResult:
        """Decide for the run whose snapshot is the current context.

        ``target`` restricts the choice to one instance (tests that need a
        pump-local dispatch inject it explicitly; the pump's own identity never is one).
        """
        ctx = current_context()
        tenant_id = ctx.tenant_id if ctx is not None else DEFAULT_TENANT
        tenant = await self.registry.tenant(tenant_id)
        if ctx is not None and ctx.tenant_group_id and tenant.tenant_group_id is None:
            tenant = tenant.model_copy(update={"tenant_group_id": ctx.tenant_group_id})
        visible = [
            d for d in await self.registry.list_visible(tenant) if d.status is InstanceStatus.READY
        ]
        if target is not None:
            visible = [d for d in visible if d.instance_id == target]
        for candidate in self._ordered(visible, tenant):
            slots = free_run_slots(candidate)
            if slots <= 0:
                continue
            reservation = await self._reserve(candidate, slots)
            if reservation is not None:
                return Assign(tenant, candidate, reservation)
        if target is not None:
            return NotAssigned(Decision.QUEUE, tenant, f"target {target} cannot accept now")
        own = await self.registry.list_by_prefix(tenant.runtime_prefix)
        if self.scale_out_enabled and len(own) < tenant.max_instances:
            return NotAssigned(
                Decision.SCALE_OUT,
                tenant,
                (
                    f"no visible capacity; {len(own)} of {tenant.max_instances} "
                    f"{tenant.runtime_prefix} instances"
                ),
            )
        if not visible and tenant.max_instances == 0:
            return NotAssigned(
                Decision.REJECT,
                tenant,
                f"tenant {tenant.tenant_id} has max_instances 0 and no visible runtime",
            )
        return NotAssigned(Decision.QUEUE, tenant, "no visible runtime can accept the run now")

    @staticmethod
    def _ordered(
        visible: list[InstanceDescriptor], tenant: TenantSettings
    ) -> list[InstanceDescriptor]:
        prefer_own = tenant.prefer_dedicated or tenant.isolation_mode is not IsolationMode.SHARED

        def key(d: InstanceDescriptor) -> tuple[int, int, str]:
            own = d.isolation_mode is not IsolationMode.SHARED
            rank = 0 if (own == prefer_own) else 1
            return (rank, -free_run_slots(d), d.instance_id)

        return sorted(visible, key=key)

    async def _reserve(self, d: InstanceDescriptor, slots: int) -> Reservation | None:
        rid = uuid.uuid4().hex
        reply: Any = await self.scripts.call(
            self.redis,
            "reserveSlot",
            [keys.reservations(d.instance_id)],
            [
                rid,
                slots,
                d.capacity.snapshot_at_ms,
                self.reservation_ttl_ms,
                self.reservation_grace_ms,
            ],
        )
        return Reservation(d.instance_id, rid) if int(reply[0]) == 1 else None

    async def release(self, reservation: Reservation) -> None:
        """Give a reserved slot back (dispatch failed)."""
        await self.redis.zrem(
            keys.reservations(reservation.instance_id), reservation.reservation_id
        )
