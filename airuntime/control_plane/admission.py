"""Dispatch-time admission: where may this run go now?

Admission runs with the run's ExecutionContextSnapshot restored and decides (an
:class:`Assign` result carries the instance and its reservation, a
:class:`NotAssigned` one the reason):

* ``AssignToInstance`` — a tenant-visible, ready, not suspect instance can accept the
  run, and one of its run slots **and the workers the run will take** were **reserved
  atomically** (``reserveSlot-1.lua``, with TTL, in Redis time); the reservation is
  released if dispatch fails;
* ``RequestScaleOut`` — nothing visible can take it, scale-out is enabled, and the
  tenant has fewer instances with its runtime prefix than its ``max_instances``;
* ``QueueGlobally`` — nothing can take it now, but capacity exists or is coming;
* ``Reject`` — the tenant can never be served (``max_instances`` 0 and no visible
  runtime).

Candidate order: a tenant preferring dedicated capacity (or a Dedicated/Hybrid
tenant) gets its own instances first, shared fallback after; among equals the one
with the most free run slots. Only the restored snapshot's tenant decides what is
visible. Suspect instances (:mod:`~airuntime.control_plane.suspects`: recently
unreachable) are skipped while their mark lives.

A reservation counts until the instance's descriptor reflects it: reservations made
before the descriptor was published (its age measured by Redis, from the TTL left on
its key) are dropped, so are expired ones; once the runtime accepted the run the
reservation is confirmed (:meth:`Admission.confirm`) and the next descriptor the
instance publishes retires it. A run takes ``min(workers per run,
available workers)`` of the instance's workers when it starts, and so does its
reservation: admission never promises more workers than are free, as it never
promises more run slots.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Literal

from redis.asyncio import Redis

from airuntime.control_plane.suspects import SuspectMarks
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
    """The reservation's member in the instance's reservations zset."""
    workers: int = 1
    """Workers reserved with the run slot."""
    instance_had_failures: bool = False
    """The instance has a delivery-failure record: a successful delivery clears it."""


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


def free_workers(d: InstanceDescriptor) -> int:
    """Workers a new run could take now: the available ones, less what the runs in the
    instance's local queue will take when they start."""
    c = d.capacity
    return max(0, c.available_worker_count - c.queued_run_count * workers_per_run(d))


def workers_per_run(d: InstanceDescriptor) -> int:
    """The most workers one run takes on the instance."""
    c = d.capacity
    return max(1, min(c.worker_count, c.max_local_workers_per_execution))


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
        suspects: SuspectMarks | None = None,
    ) -> None:
        self.redis = redis
        self.registry = Registry(redis)
        self.scale_out_enabled = scale_out_enabled
        self.reservation_ttl_ms = reservation_ttl_ms
        self.reservation_grace_ms = reservation_grace_ms
        self.scripts = scripts or library()
        self.suspects = suspects or SuspectMarks(redis, scripts=self.scripts)

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
        candidates = [d for d in self._ordered(visible, tenant) if free_run_slots(d) > 0]
        if candidates:
            reservation = await self._reserve_first(candidates)
            if reservation is not None:
                return Assign(tenant, reservation[0], reservation[1])
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

    async def _reserve_first(
        self, candidates: list[InstanceDescriptor]
    ) -> tuple[InstanceDescriptor, Reservation] | None:
        """Reserve on the first candidate that is not suspect and has room."""
        ids = [d.instance_id for d in candidates]
        (suspect, failing), ages = await self.suspects.state(ids), await self._ages(candidates)
        for d in candidates:
            if d.instance_id in suspect:
                continue
            reservation = await self._reserve(d, ages.get(d.instance_id, -1))
            if reservation is not None:
                if d.instance_id in failing:
                    reservation = Reservation(
                        reservation.instance_id,
                        reservation.reservation_id,
                        reservation.workers,
                        instance_had_failures=True,
                    )
                return d, reservation
        return None

    async def _ages(self, candidates: list[InstanceDescriptor]) -> dict[str, int]:
        """How long ago (Redis time, ms) each descriptor was published: the TTL it was
        written with (its registry score less its heartbeat stamp, both from the
        instance's own clock) less the TTL its key has left."""
        pipe = self.redis.pipeline(transaction=False)
        for d in candidates:
            pipe.zscore(keys.instances(), d.instance_id)
            pipe.pttl(keys.instance(d.instance_id))
        replies = await pipe.execute()
        ages: dict[str, int] = {}
        for d, score, left in zip(candidates, replies[0::2], replies[1::2], strict=True):
            if score is None or int(left) < 0:
                continue
            written_with = int(float(score)) - d.heartbeat_at_ms
            ages[d.instance_id] = max(0, written_with - int(left))
        return ages

    async def _reserve(self, d: InstanceDescriptor, age_ms: int) -> Reservation | None:
        reply: Any = await self.scripts.call(
            self.redis,
            "reserveSlot",
            [keys.reservations(d.instance_id)],
            [
                uuid.uuid4().hex,
                free_run_slots(d),
                age_ms,
                self.reservation_ttl_ms,
                self.reservation_grace_ms,
                free_workers(d),
                workers_per_run(d),
            ],
        )
        if int(reply[0]) != 1:
            return None
        member = reply[2].decode() if isinstance(reply[2], bytes) else str(reply[2])
        return Reservation(d.instance_id, member, int(member.rsplit("|", 1)[1]))

    async def confirm(self, reservation: Reservation) -> None:
        """The runtime accepted the run: the reservation counts until the instance next
        publishes its descriptor (which then reflects the run), not for its whole TTL."""
        await self.scripts.call(
            self.redis,
            "confirmReservation",
            [keys.reservations(reservation.instance_id)],
            [reservation.reservation_id, self.reservation_grace_ms],
        )

    async def release(self, reservation: Reservation) -> None:
        """Give a reserved slot back (dispatch failed)."""
        await self.redis.zrem(
            keys.reservations(reservation.instance_id), reservation.reservation_id
        )
