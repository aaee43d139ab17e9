"""The control plane's global queue of shared runs, kept in Redis by Lua scripts.

Every submitted run gets one queue *item*. Pumps claim the oldest Pending item
(``claimSharedRun-2.lua``; a batch of them: ``claimSharedRuns-2.lua``; one given
item: ``claimSharedRunById-2.lua``) under a
claim lease, dispatch it, and settle it (``settleSharedRun-2.lua``): Dispatched only
after the runtime accepted, else back to Pending in its original place, or parked
(ScaleOutRequested / Rejected / Cancelled). ``cancelSharedRun-2.lua`` takes an item
out of the queue unless it was Dispatched. The scripts write the statuses of
:class:`QueueItemStatus` and only the moves of :data:`QUEUE_ITEM_TRANSITIONS`.

The queue is sharded per tenant: each tenant's keys share the ``{q:<tenant>}`` hash
tag (one slot per tenant, so every script is single-slot and the tenants spread over a
Redis Cluster): ``air:{q:<t>}:pending`` zset (score = enqueue time, us),
``air:{q:<t>}:claimed`` zset (score = lease expiry), ``air:{q:<t>}:item:<SharedRunId>``
hash. The pumps find the tenants through the index of
:mod:`~airuntime.control_plane.queue_tenants` and claim the oldest items across them
(by enqueue time: FIFO over the whole queue, as with one zset; on a cluster the
scores come from each shard's clock).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from airuntime.control_plane.queue_tenants import QueueTenants, TenantHead
from airuntime.core import keys
from airuntime.core.redis_client import RedisClient, is_cluster
from airuntime.core.reply_text import reply_text as _s
from airuntime.core.scripts import ScriptCall, ScriptLibrary, library

log = logging.getLogger(__name__)


class QueueItemStatus(StrEnum):
    """The ``status`` field of a queue item, exactly as the Lua scripts write it."""

    PENDING = "Pending"
    CLAIMED = "Claimed"
    DISPATCHED = "Dispatched"
    SCALE_OUT_REQUESTED = "ScaleOutRequested"
    REJECTED = "Rejected"
    CANCELLED = "Cancelled"


QUEUE_ITEM_TRANSITIONS: Final[Mapping[QueueItemStatus, frozenset[QueueItemStatus]]] = {
    # A new item starts Pending (enqueue). Claim; cancel takes it out of the queue.
    QueueItemStatus.PENDING: frozenset({QueueItemStatus.CLAIMED, QueueItemStatus.CANCELLED}),
    # Settle (any outcome; Pending = back in its place), lease expiry (Pending), cancel.
    QueueItemStatus.CLAIMED: frozenset(
        {
            QueueItemStatus.PENDING,
            QueueItemStatus.DISPATCHED,
            QueueItemStatus.SCALE_OUT_REQUESTED,
            QueueItemStatus.REJECTED,
            QueueItemStatus.CANCELLED,
        }
    ),
    # Items that left the queue come back only through a requeue (enqueue with
    # requeue=1); a Dispatched item is never cancelled (its runtime run is).
    QueueItemStatus.DISPATCHED: frozenset({QueueItemStatus.PENDING}),
    QueueItemStatus.SCALE_OUT_REQUESTED: frozenset(
        {QueueItemStatus.PENDING, QueueItemStatus.CANCELLED}
    ),
    QueueItemStatus.REJECTED: frozenset({QueueItemStatus.PENDING, QueueItemStatus.CANCELLED}),
    QueueItemStatus.CANCELLED: frozenset({QueueItemStatus.PENDING}),
}
"""Which status an item may move to from each status (``settleSharedRun`` accepts the
outcomes of the Claimed row)."""


@dataclass(frozen=True, slots=True)
class PendingItem:
    """A Pending item as listed: which run, whose, and since when."""

    shared_run_id: str
    tenant_id: str
    enqueued_at_ms: int


@dataclass(frozen=True, slots=True)
class ClaimedItem:
    """An item this pump holds: settling it needs the claim token."""

    shared_run_id: str
    token: str
    tenant_id: str
    """The tenant the item was queued for (whose queue holds it)."""


def _oldest(heads: list[TenantHead], count: int) -> list[tuple[float, str, str]]:
    """The ``count`` oldest items seen in ``heads``: (score, tenant, SharedRunId)."""
    return sorted((score, h.tenant_id, srid) for h in heads for srid, score in h.pending)[:count]


class SharedQueue:
    """The shared queue of runs, one Redis queue per tenant behind one interface."""

    def __init__(
        self, redis: RedisClient, scripts: ScriptLibrary | None = None, claim_lease_ms: int = 30_000
    ) -> None:
        self.redis = redis
        self.scripts = scripts or library()
        self.claim_lease_ms = claim_lease_ms
        self.tenants = QueueTenants(redis, self.scripts)

    @staticmethod
    def _call(tenant_id: str, *args: str | int) -> tuple[list[str], list[str | int]]:
        """KEYS and ARGV of a queue script on ``tenant_id``'s queue: its two zsets, then
        its item prefix (every key the script touches is in the tenant's slot)."""
        keys_ = [keys.squeue_pending(tenant_id), keys.squeue_claimed(tenant_id)]
        return keys_, [keys.squeue_item_prefix(tenant_id), *args]

    async def _run(self, name: str, tenant_id: str, *args: str | int) -> Any:
        return await self.scripts.call(self.redis, name, *self._call(tenant_id, *args))

    def enqueue_call(
        self, shared_run_id: str, tenant_id: str, *, requeue: bool = False
    ) -> ScriptCall:
        """The ``enqueueSharedRun`` call of :meth:`enqueue`, for a caller that sends it
        with others; the tenant's announce (:meth:`QueueTenants.announce_command`) must
        follow it."""
        return ScriptCall(
            "enqueueSharedRun",
            *self._call(tenant_id, shared_run_id, "1" if requeue else "0", tenant_id),
        )

    async def enqueue(self, shared_run_id: str, tenant_id: str, *, requeue: bool = False) -> bool:
        """Put the run Pending at the tail of its tenant's queue (idempotent), then
        announce the tenant to the pumps -- also when the item was already queued, so a
        call repairs an enqueue that died before its announce."""
        reply = await self._run(
            "enqueueSharedRun", tenant_id, shared_run_id, "1" if requeue else "0", tenant_id
        )
        await self.tenants.announce(tenant_id)
        return int(reply) == 1

    async def _heads(self, count: int, skip: frozenset[str]) -> list[TenantHead]:
        """The listed tenants' queue heads, after putting back expired claims (a dead
        pump's) and retiring tenants whose queue is empty."""
        heads = await self.tenants.heads(count, skip)
        stale = [h.tenant_id for h in heads if h.claim_expired]
        if stale:
            replies = await self.scripts.call_many(
                self.redis, "recoverSharedRuns", [self._call(t) for t in stale]
            )
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            if recovered := sum(int(r) for r in replies):
                log.warning("%d expired claims went back to Pending (a pump died)", recovered)
            heads = await self.tenants.heads(count, skip)
        for head in heads:
            if head.empty:
                await self.tenants.retire(head)
        return [h for h in heads if h.pending]

    async def claim_next(
        self, claimer: str, skip_tenants: frozenset[str] = frozenset()
    ) -> ClaimedItem | None:
        """The oldest Pending item not belonging to ``skip_tenants``, claimed for ``claimer``."""
        heads = await self._heads(1, skip_tenants)
        for head in sorted(heads, key=lambda h: h.pending[0][1]):
            reply: Any = await self._run(
                "claimSharedRun", head.tenant_id, claimer, self.claim_lease_ms
            )
            if reply:
                self._log_recovered(int(reply[2]))
                return ClaimedItem(_s(reply[0]), _s(reply[1]), head.tenant_id)
        return None  # other pumps took what was there

    async def claim_batch(
        self, claimer: str, count: int, skip_tenants: frozenset[str] = frozenset()
    ) -> list[ClaimedItem]:
        """Up to ``count`` of the oldest Pending items over every tenant's queue but
        those of ``skip_tenants``, in queue order, claimed for ``claimer``: one read of
        the heads, then one claim per tenant with items among the oldest ``count``, all
        in one round trip."""
        return [item for item, _ in await self.claim_and_read(claimer, count, skip_tenants)]

    async def claim_and_read(
        self,
        claimer: str,
        count: int,
        skip_tenants: frozenset[str] = frozenset(),
        record_key: Callable[[str], str] | None = None,
    ) -> list[tuple[ClaimedItem, Any]]:
        """:meth:`claim_batch`, each claimed item with the value at
        ``record_key(shared_run_id)`` (None without ``record_key``) read after its
        claim. The records of the items the heads showed are read in the claims' round
        trip, after them (:meth:`ScriptLibrary.call_in_order`: one round trip on a
        standalone server); an item claimed beyond those (another pump took some of
        them) is read in one more."""
        count = max(1, count)
        heads = await self._heads(count, skip_tenants)
        oldest = _oldest(heads, count)
        # A tenant whose read stopped before the cut (the count-th oldest seen; none
        # when fewer were seen) may hold more of the oldest: read on up to the cut.
        cut = oldest[-1][0] if len(oldest) == count else math.inf
        if await self.tenants.older_than(heads, cut, count):
            oldest = _oldest(heads, count)
        shares: dict[str, int] = {}
        for _, tenant, _ in oldest:
            shares[tenant] = shares.get(tenant, 0) + 1
        if not shares:
            return []
        calls = [
            ScriptCall("claimSharedRuns", *self._call(t, claimer, self.claim_lease_ms, n))
            for t, n in shares.items()
        ]
        records: dict[str, Any] = {}
        if record_key is not None and not is_cluster(self.redis):
            seen = [srid for _, _, srid in oldest]
            then = [["MGET", *(record_key(srid) for srid in seen)]]
            replies = await self.scripts.call_in_order(self.redis, calls, then)
            records = dict(zip(seen, replies.pop(), strict=True))
        else:  # no records, or a cluster (claims in several slots): the claims together
            replies = await self.scripts.call_many(
                self.redis, "claimSharedRuns", [(c.keys, c.args) for c in calls]
            )
        claimed: list[tuple[float, ClaimedItem]] = []
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
            self._log_recovered(int(reply[0]))
            rest = [_s(v) for v in reply[1:]]
            for i in range(0, len(rest), 4):
                srid, token, tenant, score = rest[i : i + 4]
                claimed.append((float(score), ClaimedItem(srid, token, tenant)))
        # In queue order: by each item's own score (another pump may have taken some
        # of the items seen in the heads, and the claim then took the next ones).
        items = [item for _, item in sorted(claimed, key=lambda c: c[0])]
        if record_key is None:
            return [(item, None) for item in items]
        unseen = [i.shared_run_id for i in items if i.shared_run_id not in records]
        if unseen:
            raws = await self.redis.mget([record_key(srid) for srid in unseen])
            records.update(zip(unseen, raws, strict=True))
        return [(item, records[item.shared_run_id]) for item in items]

    async def claim(self, claimer: str, shared_run_id: str, tenant_id: str) -> ClaimedItem | None:
        """Claim one specific Pending item (DirectDispatch)."""
        reply: Any = await self._run(
            "claimSharedRunById", tenant_id, claimer, self.claim_lease_ms, shared_run_id
        )
        return ClaimedItem(_s(reply[0]), _s(reply[1]), tenant_id) if reply else None

    @staticmethod
    def _log_recovered(recovered: int) -> None:
        if recovered:
            log.warning("%d expired claims went back to Pending (a pump died mid-cycle)", recovered)

    async def settle(self, item: ClaimedItem, outcome: QueueItemStatus, detail: str = "") -> bool:
        """Settle a claimed item; False when the claim is no longer this pump's (expired
        and recovered, or the item was cancelled meanwhile)."""
        return (await self.settle_many([(item, outcome, detail)]))[0]

    async def release_many(self, items: list[ClaimedItem], detail: str) -> list[bool]:
        """Give claimed items that were never tried back to Pending, in their places (a
        pump's batch claimed more than it could try); their failure counts stay."""
        return await self.settle_many(
            [(item, QueueItemStatus.PENDING, detail) for item in items], tried=False
        )

    async def settle_many(
        self, settlements: list[tuple[ClaimedItem, QueueItemStatus, str]], *, tried: bool = True
    ) -> list[bool]:
        """:meth:`settle` for many items in one round trip; one answer per item."""
        calls = self.settle_calls(settlements, tried=tried)
        return self.settled(await self.scripts.call_mixed(self.redis, calls))

    def settle_calls(
        self, settlements: list[tuple[ClaimedItem, QueueItemStatus, str]], *, tried: bool = True
    ) -> list[tuple[str, list[str], list[str | int]]]:
        """The ``settleSharedRun`` calls of :meth:`settle_many`, for a caller that sends
        them with other calls; :meth:`settled` reads their replies."""
        for _, outcome, _ in settlements:
            if outcome not in QUEUE_ITEM_TRANSITIONS[QueueItemStatus.CLAIMED]:
                raise ValueError(f"a claimed item cannot be settled as {outcome!r}")
        return [
            (
                "settleSharedRun",
                *self._call(
                    item.tenant_id,
                    item.shared_run_id,
                    item.token,
                    outcome,
                    detail,
                    "1" if tried else "0",
                ),
            )
            for item, outcome, detail in settlements
        ]

    @staticmethod
    def settled(replies: list[Any]) -> list[bool]:
        """Whether each settlement took (its item was still claimed by its token)."""
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return [int(r) == 1 for r in replies]

    async def cancel(self, shared_run_id: str, tenant_id: str) -> int:
        """1 cancelled, 0 already Dispatched (cancel the runtime run instead), -2 no item."""
        return int(await self._run("cancelSharedRun", tenant_id, shared_run_id))

    async def item(self, shared_run_id: str, tenant_id: str) -> dict[str, str]:
        """The item's hash as the scripts wrote it (empty when there is no item)."""
        raw = await self.redis.hgetall(keys.squeue_item(tenant_id, shared_run_id))
        return {_s(k): _s(v) for k, v in raw.items()}

    async def status(self, shared_run_id: str, tenant_id: str) -> QueueItemStatus | None:
        raw = await self.redis.hget(keys.squeue_item(tenant_id, shared_run_id), "status")
        return QueueItemStatus(_s(raw)) if raw else None

    async def pending_count(self) -> int:
        return sum((await self.pending_by_tenant()).values())

    async def claimed_count(self) -> int:
        """Items claimed by pumps and not settled yet, over every tenant's queue."""
        listed = await self.tenants.listed()
        pipe = self.redis.pipeline(transaction=False)
        for tenant, _ in listed:
            pipe.zcard(keys.squeue_claimed(tenant))
        return sum(int(n) for n in await pipe.execute()) if listed else 0

    async def pending_by_tenant(self) -> dict[str, int]:
        """Pending items per listed tenant (tenants with none are left out)."""
        listed = await self.tenants.listed()
        if not listed:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for tenant, _ in listed:
            pipe.zcard(keys.squeue_pending(tenant))
        counts = await pipe.execute()
        return {t: int(n) for (t, _), n in zip(listed, counts, strict=True) if int(n)}

    async def pending_items(self, tenant_id: str | None, limit: int = 10_000) -> list[PendingItem]:
        """The Pending items in queue order (oldest first), of ``tenant_id`` only unless
        it is None; at most ``limit`` items of each tenant's queue are looked at."""
        if tenant_id is not None:
            tenants = [tenant_id]
        else:
            tenants = [t for t, _ in await self.tenants.listed()]
        pipe = self.redis.pipeline(transaction=False)
        for tenant in tenants:
            pipe.zrange(keys.squeue_pending(tenant), 0, limit - 1, withscores=True)
        found = await pipe.execute() if tenants else []
        ordered = sorted(
            (float(score), tenant, _s(srid))
            for tenant, members in zip(tenants, found, strict=True)
            for srid, score in members
        )[:limit]
        pipe = self.redis.pipeline(transaction=False)
        for _, tenant, srid in ordered:
            pipe.hget(keys.squeue_item(tenant, srid), "enqueued_at_ms")
        enqueued = await pipe.execute() if ordered else []
        return [
            PendingItem(srid, tenant, int(_s(at or b"0")))
            for (_, tenant, srid), at in zip(ordered, enqueued, strict=True)
        ]
