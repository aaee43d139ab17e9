"""The control plane's global queue of shared runs, kept in Redis by Lua scripts.

Every submitted run gets one queue *item*. Pumps claim the oldest Pending item
(``claimSharedRun-2.lua``; a batch of them: ``claimSharedRuns-2.lua``; one given
item: ``claimSharedRunById-2.lua``) under a
claim lease, dispatch it, and settle it (``settleSharedRun-2.lua``): Dispatched only
after the runtime accepted, else back to Pending in its original place, or parked
(ScaleOutRequested / Rejected / Cancelled). ``cancelSharedRun-2.lua`` takes an item
out of the queue unless it was Dispatched. The scripts write the statuses of
:class:`QueueItemStatus` and only the moves of :data:`QUEUE_ITEM_TRANSITIONS`.

Keys share the ``{squeue}`` hash tag (one slot, Redis-Cluster safe):
``air:{squeue}:pending`` zset, ``air:{squeue}:claimed`` zset (score = lease expiry),
``air:{squeue}:item:<SharedRunId>`` hash.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from airuntime.core import keys
from airuntime.core.redis_client import RedisClient
from airuntime.core.scripts import ScriptLibrary, library

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


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


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
    tenant_id: str = ""
    """The tenant the item was queued for (batch claims report it)."""


class SharedQueue:
    """The global queue of shared runs."""

    def __init__(
        self, redis: RedisClient, scripts: ScriptLibrary | None = None, claim_lease_ms: int = 30_000
    ) -> None:
        self.redis = redis
        self.scripts = scripts or library()
        self.claim_lease_ms = claim_lease_ms
        self._keys = [keys.squeue_pending(), keys.squeue_claimed()]

    async def enqueue(self, shared_run_id: str, tenant_id: str, *, requeue: bool = False) -> bool:
        reply = await self.scripts.call(
            self.redis,
            "enqueueSharedRun",
            self._keys,
            [keys.squeue_item_prefix(), shared_run_id, "1" if requeue else "0", tenant_id],
        )
        return int(reply) == 1

    async def claim_next(
        self, claimer: str, skip_tenants: frozenset[str] = frozenset()
    ) -> ClaimedItem | None:
        """The oldest Pending item not belonging to ``skip_tenants``, claimed for ``claimer``."""
        reply: Any = await self.scripts.call(
            self.redis,
            "claimSharedRun",
            self._keys,
            [keys.squeue_item_prefix(), claimer, self.claim_lease_ms, *sorted(skip_tenants)],
        )
        return self._claimed(reply)

    async def claim_batch(
        self, claimer: str, count: int, skip_tenants: frozenset[str] = frozenset()
    ) -> list[ClaimedItem]:
        """Up to ``count`` of the oldest Pending items not belonging to ``skip_tenants``,
        in queue order, claimed for ``claimer`` in one call."""
        reply: Any = await self.scripts.call(
            self.redis,
            "claimSharedRuns",
            self._keys,
            [
                keys.squeue_item_prefix(),
                claimer,
                self.claim_lease_ms,
                max(1, count),
                *sorted(skip_tenants),
            ],
        )
        if recovered := int(reply[0]):
            log.warning("%d expired claims went back to Pending (a pump died mid-cycle)", recovered)
        rest = [_s(v) for v in reply[1:]]
        return [ClaimedItem(*rest[i : i + 3]) for i in range(0, len(rest), 3)]

    async def claim(self, claimer: str, shared_run_id: str) -> ClaimedItem | None:
        """Claim one specific Pending item (DirectDispatch)."""
        reply: Any = await self.scripts.call(
            self.redis,
            "claimSharedRunById",
            self._keys,
            [keys.squeue_item_prefix(), claimer, self.claim_lease_ms, shared_run_id],
        )
        return self._claimed(reply)

    @staticmethod
    def _claimed(reply: Any) -> ClaimedItem | None:
        if not reply:
            return None
        if recovered := int(reply[2]):
            log.warning("%d expired claims went back to Pending (a pump died mid-cycle)", recovered)
        return ClaimedItem(_s(reply[0]), _s(reply[1]))

    async def settle(self, item: ClaimedItem, outcome: QueueItemStatus, detail: str = "") -> bool:
        """Settle a claimed item; False when the claim is no longer this pump's (expired
        and recovered, or the item was cancelled meanwhile)."""
        if outcome not in QUEUE_ITEM_TRANSITIONS[QueueItemStatus.CLAIMED]:
            raise ValueError(f"a claimed item cannot be settled as {outcome!r}")
        reply = await self.scripts.call(
            self.redis,
            "settleSharedRun",
            self._keys,
            [keys.squeue_item_prefix(), item.shared_run_id, item.token, outcome, detail],
        )
        return int(reply) == 1

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
        for _, outcome, _ in settlements:
            if outcome not in QUEUE_ITEM_TRANSITIONS[QueueItemStatus.CLAIMED]:
                raise ValueError(f"a claimed item cannot be settled as {outcome!r}")
        replies = await self.scripts.call_many(
            self.redis,
            "settleSharedRun",
            [
                (
                    self._keys,
                    [
                        keys.squeue_item_prefix(),
                        item.shared_run_id,
                        item.token,
                        outcome,
                        detail,
                        "1" if tried else "0",
                    ],
                )
                for item, outcome, detail in settlements
            ],
        )
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return [int(r) == 1 for r in replies]

    async def cancel(self, shared_run_id: str) -> int:
        """1 cancelled, 0 already Dispatched (cancel the runtime run instead), -2 no item."""
        return int(
            await self.scripts.call(
                self.redis,
                "cancelSharedRun",
                self._keys,
                [keys.squeue_item_prefix(), shared_run_id],
            )
        )

    async def item(self, shared_run_id: str) -> dict[str, str]:
        """The item's hash as the scripts wrote it (empty when there is no item)."""
        raw = await self.redis.hgetall(keys.squeue_item(shared_run_id))
        return {_s(k): _s(v) for k, v in raw.items()}

    async def status(self, shared_run_id: str) -> QueueItemStatus | None:
        raw = await self.redis.hget(keys.squeue_item(shared_run_id), "status")
        return QueueItemStatus(_s(raw)) if raw else None

    async def pending_count(self) -> int:
        return int(await self.redis.zcard(keys.squeue_pending()))

    async def pending_by_tenant(self) -> dict[str, int]:
        ids = await self.redis.zrange(keys.squeue_pending(), 0, -1)
        counts: dict[str, int] = {}
        for srid in ids:
            tenant = await self.redis.hget(keys.squeue_item(_s(srid)), "tenant_id")
            t = _s(tenant) if tenant else "unknown"
            counts[t] = counts.get(t, 0) + 1
        return counts

    async def pending_items(self, tenant_id: str | None, limit: int = 10_000) -> list[PendingItem]:
        """The Pending items in queue order (oldest first), of ``tenant_id`` only unless
        it is None; at most ``limit`` items of the queue are looked at."""
        ids = [_s(i) for i in await self.redis.zrange(keys.squeue_pending(), 0, limit - 1)]
        pipe = self.redis.pipeline(transaction=False)
        for srid in ids:
            pipe.hmget(keys.squeue_item(srid), "tenant_id", "enqueued_at_ms")
        items = []
        for srid, (tenant, enqueued) in zip(ids, await pipe.execute(), strict=True):
            owner = _s(tenant) if tenant else "unknown"
            if tenant_id is None or owner == tenant_id:
                items.append(PendingItem(srid, owner, int(_s(enqueued or b"0"))))
        return items
