"""What admission reads about the runtime instances before it reserves: in one round trip.

Why this exists: to place a run, admission needs the tenant's settings, the registered
instances and their descriptors, which of them are suspect or have a delivery-failure
record, and how old each descriptor is (Redis time: the TTL it was written with less
the TTL its key has left). Read one after the other that was five round trips per
admission -- per dispatched run when runs arrive one at a time -- each costing the
pump about a tenth of a millisecond of Python and the run a third of a millisecond of
latency.

The members of the registry change rarely (an instance starts, stops or expires), so a
reader asks for the keys of the members it saw last time in the same pipeline as the
tenant's settings and the member list itself. When the member list read in that round
trip is the one guessed, everything is there; when it differs, the descriptors (and
marks) of the members read come in a second round trip -- with more than
:data:`GUESS_UP_TO` members, the marks of the visible instances only, in a third.
Nothing is kept between reads but that guess: every value admission uses was read in
the admission that uses it, so a changed descriptor, a new suspect mark or a changed
tenant setting is seen exactly as before.

Keys (:mod:`airuntime.core.keys`): ``air:{air}:tenant:<id>:settings``,
``air:{air}:instances`` (member -> heartbeat expiry, read with scores),
``air:{air}:instance:<id>`` (descriptor, with its PTTL), ``air:suspect:<id>`` and
``air:delivery-failures:<id>`` (:mod:`~airuntime.control_plane.suspects`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airuntime.core import keys
from airuntime.core.redis_client import RedisClient
from airuntime.core.reply_text import reply_text
from airuntime.fleet.registry import InstanceDescriptor, InstanceStatus
from airuntime.fleet.tenancy import TenantSettings, stored_settings

__all__ = ["GUESS_UP_TO", "InstanceView", "InstanceViews"]

GUESS_UP_TO = 32
"""Registries of at most this many members are read whole (descriptors, marks and TTLs
of every member) in the first round trip; above it the guess would cost more commands
than the round trips it saves, and marks are read for the visible instances only."""


@dataclass(frozen=True)
class InstanceView:
    """One admission's reading of the fleet for one tenant."""

    tenant: TenantSettings
    descriptors: list[InstanceDescriptor]
    """Every live instance (descriptor still present), sorted by id, whatever its tenant."""
    visible: list[InstanceDescriptor]
    """The Ready ones ``tenant`` may use (and, with a target, only that one), by id."""
    suspect: frozenset[str] = frozenset()
    """Visible instances admission skips while their suspect mark lives."""
    failing: frozenset[str] = frozenset()
    """Visible instances with a delivery-failure record (a success clears it)."""
    ages_ms: Mapping[str, int] = field(default_factory=dict)
    """How long ago each visible descriptor was published (absent: unknown)."""


@dataclass
class _Marks:
    suspect: set[str] = field(default_factory=set)
    failing: set[str] = field(default_factory=set)
    ttl_left_ms: dict[str, int] = field(default_factory=dict)
    read: set[str] = field(default_factory=set)

    def queue(self, pipe: Any, ids: Sequence[str]) -> None:
        for iid in ids:
            pipe.exists(keys.suspect_instance(iid))
            pipe.exists(keys.delivery_failures(iid))
            pipe.pttl(keys.instance(iid))

    def take(self, ids: Sequence[str], replies: Sequence[Any]) -> None:
        for k, iid in enumerate(ids):
            suspect, failing, left = replies[3 * k : 3 * k + 3]
            if suspect:
                self.suspect.add(iid)
            if failing:
                self.failing.add(iid)
            self.ttl_left_ms[iid] = int(left)
            self.read.add(iid)


class InstanceViews:
    """Reads :class:`InstanceView` s, carrying the last member list over as its guess."""

    def __init__(self, redis: RedisClient) -> None:
        self.redis = redis
        self._members: list[str] = []

    async def read(
        self, tenant_id: str, *, target: str | None = None, group_id: str | None = None
    ) -> InstanceView:
        """The view for ``tenant_id`` (its stored settings, or the Shared defaults); a
        ``group_id`` (the run's snapshot's) stands in for a tenant group the settings do
        not name; ``target`` leaves only that instance visible."""
        guess = self._members if 0 < len(self._members) <= GUESS_UP_TO else []
        marks = _Marks()
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(keys.tenant_settings(tenant_id))
        pipe.zrange(keys.instances(), 0, -1, withscores=True)
        for iid in guess:  # GETs, not MGET: a cluster pipeline refuses MGET
            pipe.get(keys.instance(iid))
        marks.queue(pipe, guess)
        replies = await pipe.execute()
        raw_tenant, scored = replies[0], replies[1]
        tenant = stored_settings(tenant_id, raw_tenant)
        if group_id and tenant.tenant_group_id is None:
            tenant = tenant.model_copy(update={"tenant_group_id": group_id})
        scores = {reply_text(m): int(float(s)) for m, s in scored}
        members = sorted(scores)
        n = len(guess)
        if guess and members == guess:
            raws = replies[2 : 2 + n]
            marks.take(guess, replies[2 + n :])
        else:
            self._members = members
            if len(members) > GUESS_UP_TO:
                raws = await self.redis.mget([keys.instance(i) for i in members])
            elif members:
                pipe = self.redis.pipeline(transaction=False)
                for iid in members:
                    pipe.get(keys.instance(iid))
                marks.queue(pipe, members)
                replies = await pipe.execute()
                raws = replies[: len(members)]
                marks.take(members, replies[len(members) :])
            else:
                raws = []
        descriptors = sorted(
            (InstanceDescriptor.model_validate_json(r) for r in raws if r),
            key=lambda d: d.instance_id,
        )
        visible = [
            d
            for d in descriptors
            if d.status is InstanceStatus.READY
            and d.visible_to(tenant)
            and (target is None or d.instance_id == target)
        ]
        unread = [d.instance_id for d in visible if d.instance_id not in marks.read]
        if unread:
            pipe = self.redis.pipeline(transaction=False)
            marks.queue(pipe, unread)
            marks.take(unread, await pipe.execute())
        ages: dict[str, int] = {}
        for d in visible:
            score, left = scores.get(d.instance_id), marks.ttl_left_ms[d.instance_id]
            if score is None or left < 0:
                continue
            written_with = score - d.heartbeat_at_ms
            ages[d.instance_id] = max(0, written_with - left)
        ids = {d.instance_id for d in visible}
        return InstanceView(
            tenant=tenant,
            descriptors=descriptors,
            visible=visible,
            suspect=frozenset(marks.suspect & ids),
            failing=frozenset(marks.failing & ids),
            ages_ms=ages,
        )
