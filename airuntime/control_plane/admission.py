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

A pump's batch (:meth:`Admission.admit_many`) is admitted at once for runs of one
tenant context: the runs are **placed by free capacity** (:func:`plan_placement`:
each run goes to the candidate with the most run slots left after the runs already
placed in the batch, ties rotating, so identical instances get equal shares) and
each instance's share is reserved by one ``reserveSlot`` call carrying a count, all
instances' calls in one round trip.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Literal

from airuntime.control_plane.instance_view import InstanceView, InstanceViews
from airuntime.control_plane.suspects import SuspectMarks
from airuntime.core import keys
from airuntime.core.context import DEFAULT_TENANT, current_context
from airuntime.core.redis_client import RedisClient
from airuntime.core.scripts import ScriptLibrary, library
from airuntime.fleet.registry import InstanceDescriptor, Registry
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


def room(d: InstanceDescriptor) -> int:
    """Runs the instance can take now: free run slots, bounded by its free workers."""
    return min(free_run_slots(d), free_workers(d) // workers_per_run(d))


def plan_placement(
    groups: list[list[InstanceDescriptor]], count: int, rotation: int = 0
) -> dict[str, int]:
    """How many of ``count`` runs go to each instance. ``groups`` are candidates in
    preference order (own instances before shared fallback): a later group only gets
    the runs every earlier one has no room for. Within a group one run at a time goes
    to the instance with the most room left after the runs already placed; ties go
    round the group starting at ``rotation``, so identical instances take turns."""
    plan: dict[str, int] = {}
    remaining = count
    for group in groups:
        left = {d.instance_id: room(d) for d in group}
        n = len(group)
        while remaining > 0:
            best = min(
                (d for d in group if left[d.instance_id] > 0),
                key=lambda d: (-left[d.instance_id], (group.index(d) - rotation) % n),
                default=None,
            )
            if best is None:
                break
            left[best.instance_id] -= 1
            plan[best.instance_id] = plan.get(best.instance_id, 0) + 1
            remaining -= 1
    return plan


class Admission:
    """Tenant-aware admission over the registry, with atomic slot reservations."""

    def __init__(
        self,
        redis: RedisClient,
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
        self.views = InstanceViews(redis)
        self._rotation = 0

    async def admit(self, *, target: str | None = None) -> AdmissionResult:
        """Decide for the run whose snapshot is the current context.

        ``target`` restricts the choice to one instance (tests that need a
        pump-local dispatch inject it explicitly; the pump's own identity never is one).
        """
        view = await self._view(target)
        tenant = view.tenant
        candidates = [d for d in self._ordered(view.visible, tenant) if free_run_slots(d) > 0]
        if candidates:
            reservation = await self._reserve_first(view, candidates)
            if reservation is not None:
                return Assign(tenant, reservation[0], reservation[1])
        if target is not None:
            return NotAssigned(Decision.QUEUE, tenant, f"target {target} cannot accept now")
        own = [d for d in view.descriptors if d.runtime_prefix == tenant.runtime_prefix]
        if self.scale_out_enabled and len(own) < tenant.max_instances:
            return NotAssigned(
                Decision.SCALE_OUT,
                tenant,
                (
                    f"no visible capacity; {len(own)} of {tenant.max_instances} "
                    f"{tenant.runtime_prefix} instances"
                ),
            )
        if not view.visible and tenant.max_instances == 0:
            return NotAssigned(
                Decision.REJECT,
                tenant,
                f"tenant {tenant.tenant_id} has max_instances 0 and no visible runtime",
            )
        return NotAssigned(Decision.QUEUE, tenant, "no visible runtime can accept the run now")

    async def _view(self, target: str | None) -> InstanceView:
        """The current context's tenant, the Ready instances it may use (``target``: only
        that one), their marks and ages: one round trip as a rule
        (:mod:`~airuntime.control_plane.instance_view`)."""
        ctx = current_context()
        tenant_id = ctx.tenant_id if ctx is not None else DEFAULT_TENANT
        group = ctx.tenant_group_id if ctx is not None else None
        return await self.views.read(tenant_id, target=target, group_id=group)

    async def admit_many(self, count: int, *, target: str | None = None) -> list[Assign]:
        """Place and reserve up to ``count`` runs of the current context (a pump's batch),
        spread by free capacity (:func:`plan_placement`). Fewer (maybe none) when the
        visible instances have no more room; the caller decides for the rest with
        :meth:`admit` (scale-out, queue, reject)."""
        view = await self._view(target)
        tenant, failing, ages = view.tenant, view.failing, view.ages_ms
        ordered = [d for d in self._ordered(view.visible, tenant) if room(d) > 0]
        if not ordered or count < 1:
            return []
        usable = [d for d in ordered if d.instance_id not in view.suspect]
        prefer_own = tenant.prefer_dedicated or tenant.isolation_mode is not IsolationMode.SHARED
        groups = [
            [d for d in usable if (d.isolation_mode is not IsolationMode.SHARED) == own]
            for own in (prefer_own, not prefer_own)
        ]
        self._rotation = (self._rotation + 1) % 1_000_003
        plan = plan_placement([g for g in groups if g], count, self._rotation)
        by_id = {d.instance_id: d for d in usable}
        shares = [(by_id[i], n) for i, n in plan.items()]
        replies = await self.scripts.call_many(
            self.redis,
            "reserveSlot",
            [self._reserve_call(d, ages.get(d.instance_id, -1), n) for d, n in shares],
        )
        assigned: list[Assign] = []
        for (d, _), reply in zip(shares, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            if int(reply[0]) != 1:
                continue
            for raw in reply[2:]:
                member = raw.decode() if isinstance(raw, bytes) else str(raw)
                workers = int(member.rsplit("|", 1)[1])
                had = d.instance_id in failing
                reservation = Reservation(d.instance_id, member, workers, had)
                assigned.append(Assign(tenant, d, reservation))
        return assigned

    def _reserve_call(
        self, d: InstanceDescriptor, age_ms: int, count: int | None = None
    ) -> tuple[list[str], list[str | int]]:
        args: list[str | int] = [
            uuid.uuid4().hex,
            free_run_slots(d),
            age_ms,
            self.reservation_ttl_ms,
            self.reservation_grace_ms,
            free_workers(d),
            workers_per_run(d),
        ]
        if count is not None:
            args.append(count)
        return [keys.reservations(d.instance_id)], args

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
        self, view: InstanceView, candidates: list[InstanceDescriptor]
    ) -> tuple[InstanceDescriptor, Reservation] | None:
        """Reserve on the first candidate that is not suspect and has room."""
        for d in candidates:
            if d.instance_id in view.suspect:
                continue
            reservation = await self._reserve(d, view.ages_ms.get(d.instance_id, -1))
            if reservation is not None:
                if d.instance_id in view.failing:
                    reservation = Reservation(
                        reservation.instance_id,
                        reservation.reservation_id,
                        reservation.workers,
                        instance_had_failures=True,
                    )
                return d, reservation
        return None

    async def _reserve(self, d: InstanceDescriptor, age_ms: int) -> Reservation | None:
        reply: Any = await self.scripts.call(
            self.redis, "reserveSlot", *self._reserve_call(d, age_ms)
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

    async def confirm_many(self, reservations: list[Reservation]) -> None:
        """:meth:`confirm` for a batch, in one round trip."""
        await self.scripts.call_mixed(self.redis, self.confirm_calls(reservations))

    def confirm_calls(
        self, reservations: list[Reservation]
    ) -> list[tuple[str, list[str], list[str | int]]]:
        """The ``confirmReservation`` calls of :meth:`confirm_many`, for a caller that
        sends them with other calls (a confirmation that fails leaves the reservation
        to its TTL: nothing waits on the reply)."""
        return [
            (
                "confirmReservation",
                [keys.reservations(r.instance_id)],
                [r.reservation_id, self.reservation_grace_ms],
            )
            for r in reservations
        ]

    async def release(self, reservation: Reservation) -> None:
        """Give a reserved slot back (dispatch failed)."""
        await self.redis.zrem(
            keys.reservations(reservation.instance_id), reservation.reservation_id
        )
