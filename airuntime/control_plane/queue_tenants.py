"""The index of tenants whose shared queue may hold work, and a look at their queues.

Why this module exists: the shared queue is sharded per tenant (``air:{q:<tenant>}:*``,
one hash slot per tenant) so its traffic spreads over a Redis Cluster, but a pump
must still see every tenant's queue to claim the oldest items first. The index
``air:{air}:squeue:tenants`` (zset, score = announce generation) names the tenants
that may have work; :meth:`QueueTenants.heads` reads the head of each listed
tenant's queue in one pipelined round trip (on a standalone server, as a rule, in the
same round trip as the index).

The index lives in another slot than the queues, so it cannot change in the same
script as an item. The protocol keeps it from ever losing a tenant that has work:

* an enqueue puts the item Pending *first*, then announces the tenant
  (``ZINCRBY 1``: a new generation);
* a pump that finds a tenant's queue empty (nothing pending, nothing claimed) drops
  the tenant only if its generation is still the one it read before looking
  (``retireQueueTenant-1.lua``). An announce that came after the read changed the
  generation (the tenant stays); one that comes after the drop puts it back.

A process that dies between its item and its announce leaves a Pending item of an
unlisted tenant: the reconciler announces the tenant of every QueuedGlobally run
whose item waits (:meth:`SharedQueue.enqueue` announces even when the item was
already queued), so it is found again within one reconciler pass.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from airuntime.core import keys
from airuntime.core.redis_client import RedisClient, is_cluster
from airuntime.core.reply_text import reply_text as _s
from airuntime.core.scripts import ScriptLibrary


@dataclass(frozen=True, slots=True)
class TenantHead:
    """The head of one tenant's queue as one pump saw it."""

    tenant_id: str
    generation: int
    pending: list[tuple[str, float]]
    """The first Pending items, oldest first: (SharedRunId, score)."""
    has_claims: bool
    """Some items are claimed by pumps (not yet settled)."""
    claim_expired: bool
    """The oldest claim's lease has run out (its pump died): it needs recovering."""
    depth: int
    """How many Pending items were asked for: fewer came back, so none is left out."""

    @property
    def complete(self) -> bool:
        """Every Pending item of the tenant was read (fewer than ``depth`` came back)."""
        return len(self.pending) < self.depth

    @property
    def empty(self) -> bool:
        return not self.pending and not self.has_claims


class QueueTenants:
    """The per-tenant queue index: announce, look at the heads, retire empty tenants."""

    def __init__(self, redis: RedisClient, scripts: ScriptLibrary) -> None:
        self.redis = redis
        self.scripts = scripts
        self._listed: list[str] = []
        """The tenants the index listed at the last look (the next look's guess)."""

    async def announce(self, tenant_id: str) -> None:
        """``tenant_id`` has (or may have) work: listed, with a new generation."""
        await self.redis.zincrby(keys.squeue_tenants(), 1, tenant_id)

    @staticmethod
    def announce_command(tenant_id: str) -> tuple[str, str, int, str]:
        """The command of :meth:`announce`, for a caller that sends it with others (after
        the tenant's item is Pending)."""
        return ("ZINCRBY", keys.squeue_tenants(), 1, tenant_id)

    async def listed(self) -> list[tuple[str, int]]:
        """Every listed tenant with its generation."""
        raw: Any = await self.redis.zrange(keys.squeue_tenants(), 0, -1, withscores=True)
        return [(_s(t), int(g)) for t, g in raw]

    async def heads(self, count: int, skip: frozenset[str] = frozenset()) -> list[TenantHead]:
        """The first Pending items and the claims of every listed tenant not in
        ``skip``: enough items per tenant for the ``count`` oldest over all of them when
        the tenants' queues are alike (twice a fair share; :meth:`older_than` reads the
        rest of a tenant that may have more).

        The generations must be read before the queues (a retire passes on the
        generation read before an empty queue was seen). On a standalone server one
        pipeline keeps that order, so the queues of the tenants listed last time are
        read in the same round trip as the index, and again only when the index lists
        others; a cluster could run a pipeline's queue reads (other shards) first, so
        there the index is read in a round trip of its own."""
        guess = [t for t in self._listed if t not in skip]
        if guess and not is_cluster(self.redis):
            depth = self._depth(count, len(guess))
            pipe = self.redis.pipeline(transaction=False)
            pipe.zrange(keys.squeue_tenants(), 0, -1, withscores=True)
            self._queue_reads(pipe, guess, depth)
            replies = await pipe.execute()
            listed = self._remember(replies[0], skip)
            if {t for t, _ in listed} == set(guess):
                read = dict(zip(guess, self._pairs(replies[1:]), strict=True))
                return self._heads(listed, read, depth)
        else:
            listed = self._remember(
                await self.redis.zrange(keys.squeue_tenants(), 0, -1, withscores=True), skip
            )
        if not listed:
            return []
        depth = self._depth(count, len(listed))
        pipe = self.redis.pipeline(transaction=False)
        self._queue_reads(pipe, [t for t, _ in listed], depth)
        read = dict(zip([t for t, _ in listed], self._pairs(await pipe.execute()), strict=True))
        return self._heads(listed, read, depth)

    def _remember(self, raw: Any, skip: frozenset[str]) -> list[tuple[str, int]]:
        """The listed tenants (with their generations) not in ``skip``; all of them are
        the next guess. An empty index keeps the guess: a pump polls it while idle, and
        the tenant whose queue it drained last is the likeliest to come back (a wrong
        guess costs two reads of empty keys in the same round trip)."""
        listed = [(_s(t), int(g)) for t, g in raw]
        if listed:
            self._listed = [t for t, _ in listed]
        return [(t, g) for t, g in listed if t not in skip]

    @staticmethod
    def _depth(count: int, tenants: int) -> int:
        return min(max(1, count), max(4, -(-2 * count // tenants)))

    @staticmethod
    def _queue_reads(pipe: Any, tenants: list[str], depth: int) -> None:
        for tenant in tenants:
            pipe.zrange(keys.squeue_pending(tenant), 0, depth - 1, withscores=True)
            pipe.zrange(keys.squeue_claimed(tenant), 0, 0, withscores=True)

    @staticmethod
    def _pairs(replies: list[Any]) -> list[tuple[Any, Any]]:
        return [(replies[i], replies[i + 1]) for i in range(0, len(replies), 2)]

    @staticmethod
    def _heads(
        listed: list[tuple[str, int]], read: dict[str, tuple[Any, Any]], depth: int
    ) -> list[TenantHead]:
        now_ms = time.time() * 1000
        out = []
        for tenant, generation in listed:
            pending, first_claim = read[tenant]
            expired = bool(first_claim) and float(first_claim[0][1]) <= now_ms
            items = [(_s(m), float(score)) for m, score in pending]
            out.append(TenantHead(tenant, generation, items, bool(first_claim), expired, depth))
        return out

    async def older_than(self, heads: list[TenantHead], cut: float, count: int) -> bool:
        """Complete, in place, the heads that stop before ``cut`` (their queue may hold
        more items older than it) with up to ``count`` of their items up to ``cut``;
        whether any head needed it (one more round trip)."""
        short = [h for h in heads if not h.complete and h.pending and h.pending[-1][1] < cut]
        if not short:
            return False
        pipe = self.redis.pipeline(transaction=False)
        for head in short:
            pending = keys.squeue_pending(head.tenant_id)
            pipe.zrangebyscore(pending, "-inf", cut, start=0, num=count, withscores=True)
        for head, found in zip(short, await pipe.execute(), strict=True):
            head.pending[:] = [(_s(m), float(score)) for m, score in found]
        return True

    async def retire(self, head: TenantHead) -> bool:
        """Drop ``head``'s tenant from the index if it was empty and nobody announced
        it since ``head`` was read (see the module docstring)."""
        reply = await self.scripts.call(
            self.redis,
            "retireQueueTenant",
            [keys.squeue_tenants()],
            [head.tenant_id, head.generation],
        )
        return int(reply) == 1
