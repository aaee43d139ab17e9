"""A blocked read that the server ends with ``UNBLOCKED`` delivered nothing: it is read
again, not a failure of the loop reading it.

A master that turns replica in a failover answers every blocked command so; here the
same reply comes from ``CLIENT UNBLOCK <id> ERROR`` on a real server, while a read is
blocked on another connection.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from airuntime.fleet.blocking import unless_unblocked
from tests.runtime.support import eventually

pytestmark = pytest.mark.timeout(60)


async def _blocked_client_id(redis: Redis, name: str) -> int | None:
    clients = await redis.client_list()
    ids = [int(c["id"]) for c in clients if c.get("name") == name and c.get("cmd") == "blpop"]
    return ids[0] if ids else None


async def _is_blocked(redis: Redis, name: str) -> bool:
    return await _blocked_client_id(redis, name) is not None


async def test_a_read_ended_by_unblocked_gives_nothing_and_other_errors_still_raise(
    redis: Redis,
) -> None:
    reader = redis.client()
    await reader.client_setname("blocked-reader")
    try:
        reading = asyncio.create_task(
            unless_unblocked(lambda: reader.blpop(["no-such-list"], timeout=30), "test read")
        )
        await eventually(lambda: _is_blocked(redis, "blocked-reader"), "the reader blocked")
        client_id = await _blocked_client_id(redis, "blocked-reader")
        assert client_id is not None
        assert await redis.client_unblock(client_id, error=True)
        assert await asyncio.wait_for(reading, 10) is None

        async def wrong_type() -> object:
            await redis.set("a-string", "x")
            return await redis.blpop(["a-string"], timeout=1)

        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await unless_unblocked(wrong_type, "test read")
    finally:
        await reader.aclose()
