"""Which execution bucket layout a client's deployment uses, and the guard against
switching it with data in place.

Why this exists: on a Redis Cluster every execution script must stay in one hash slot,
so executions are grouped in buckets that carry their own indexes (the slot layout in
:mod:`airuntime.core.keys`). The bucket count follows from the client: 1 on a standalone
server, :data:`~airuntime.core.keys.CLUSTER_EXECUTION_BUCKETS` on a cluster. Data
written under one count is invisible under another (its index entries live in other
keys), so the count is recorded once in ``air:execution-layout`` and every process that
creates executions checks it before its first write (:func:`check_layout`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from airuntime.core import keys
from airuntime.core.errors import ConfigError
from airuntime.core.redis_client import RedisClient, is_cluster
from airuntime.core.reply_text import reply_text

__all__ = [
    "LayoutGuard",
    "LayoutMismatch",
    "buckets_for",
    "check_layout",
    "check_recorded",
    "execution_keys_for",
]


class LayoutMismatch(ConfigError):
    """The server holds executions written with another bucket count."""


def buckets_for(client: RedisClient) -> int:
    """1 on a standalone server, the cluster bucket count on a cluster."""
    return keys.CLUSTER_EXECUTION_BUCKETS if is_cluster(client) else 1


def execution_keys_for(client: RedisClient, execution_id: str) -> keys.ExecutionKeys:
    """The keys of ``execution_id`` in ``client``'s layout."""
    return keys.execution_keys(execution_id, buckets_for(client))


async def check_layout(client: RedisClient) -> int:
    """Record the bucket count if none is recorded yet; raise :class:`LayoutMismatch`
    when another one is. Returns the bucket count."""
    return await check_recorded(client, keys.execution_layout(), buckets_for(client), "executions")


async def check_recorded(client: RedisClient, key: str, buckets: int, what: str) -> int:
    """Record ``buckets`` at ``key`` unless a count is recorded; raise
    :class:`LayoutMismatch` naming ``what`` when another count is (the guard of every
    bucketed layout: executions, the run index)."""
    await client.set(key, str(buckets), nx=True)
    raw = await client.get(key)
    found = reply_text(raw)
    if found != str(buckets):
        raise LayoutMismatch(
            f"{key} says the {what} here were written with {found} bucket(s), this "
            f"client uses {buckets} ({'cluster' if buckets > 1 else 'standalone'}): "
            f"moving between a standalone server and a cluster needs the {what} "
            "drained (or the keys migrated), not a restart with another URL."
        )
    return buckets


class LayoutGuard:
    """A layout check made once per client object, before its first write.

    The first writes of a fresh runtime come together (a pool starting 64 executions at
    once): they wait for the one check in flight instead of each making it (two round
    trips apiece). A check that fails (:class:`LayoutMismatch`, a Redis error) is made
    again by the next writer."""

    def __init__(self, check: Callable[[], Awaitable[int]]) -> None:
        self._check = check
        self._done = False
        self._lock = asyncio.Lock()

    async def ensure(self) -> None:
        if self._done:
            return
        async with self._lock:
            if not self._done:
                await self._check()
                self._done = True
