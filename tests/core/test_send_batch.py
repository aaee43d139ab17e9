"""``CountingRedis.send_batch``: commands in one round trip without a redis-py pipeline,
with what a pipeline guarantees, on a real server.

* Replies come back in order, an error reply as its exception, one round trip counted,
  and the connection goes back with nothing unread.
* A connection lost inside a batch raises, as a pipeline's does, and the next batch
  runs on a new connection.
* A batch cancelled while its reply is still to come closes its connection: the next
  borrower of the pool never reads that reply.
* The script library sends through it: a script-cache loss is still repaired.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from airuntime.core.redis_client import CountingRedis, connect
from airuntime.core.scripts import ScriptCall, library
from tests.conftest import RedisServerInfo
from tests.control_plane.support import wait_for

pytestmark = pytest.mark.timeout(60)


def _client(url: str, **options: object) -> CountingRedis:
    client = connect(url, **options)
    assert isinstance(client, CountingRedis)
    return client


async def test_replies_in_order_an_error_as_its_exception_one_round_trip(
    redis_server: RedisServerInfo,
) -> None:
    client = _client(redis_server.url, max_connections=1)
    try:
        await client.delete("sb:n")
        before = client.round_trips
        replies = await client.send_batch(
            [("INCR", "sb:n"), ("HGET", "sb:n", "f"), ("INCR", "sb:n"), ("EVALSHA", "0" * 40, 0)]
        )
        assert client.round_trips == before + 1
        assert replies[0] == 1 and replies[2] == 2
        assert isinstance(replies[1], ResponseError) and "WRONGTYPE" in str(replies[1])
        assert isinstance(replies[3], NoScriptError)
        [connection] = client.connection_pool._available_connections
        assert not await connection.can_read(), "every reply was read"
        assert await client.send_batch([("GET", "sb:n")]) == [b"2"]
    finally:
        await client.aclose()


async def test_a_connection_lost_inside_a_batch_raises_and_the_next_batch_gets_a_new_one(
    redis_server: RedisServerInfo,
) -> None:
    """The batch's first command makes the server close this very connection, so no
    reply comes: a ``ConnectionError``, as from a redis-py pipeline (``connect()``'s
    clients retry nothing themselves; the caller's transient-error retry decides). The
    connection is dropped, and the next batch runs on a new one."""
    client = _client(redis_server.url, max_connections=1)
    try:
        await client.set("sb:k", "v")
        first = await client.client_id()
        with pytest.raises(RedisConnectionError):
            await client.send_batch(
                [("CLIENT", "KILL", "ID", first, "SKIPME", "no"), ("GET", "sb:k")]
            )
        assert await client.send_batch([("GET", "sb:k"), ("CLIENT", "ID")]) == [
            b"v",
            await client.client_id(),
        ]
        assert await client.client_id() != first
    finally:
        await client.aclose()


async def test_a_batch_cancelled_before_its_reply_leaves_no_reply_for_the_next_borrower(
    redis_server: RedisServerInfo, redis: Redis
) -> None:
    client = _client(redis_server.url, max_connections=1)
    try:
        await client.delete("sb:q")
        await client.set("sb:k", "mine")
        waiting = asyncio.create_task(client.send_batch([("BLPOP", "sb:q", 30)]))

        async def blocked() -> bool:
            return int((await redis.info("clients"))["blocked_clients"]) == 1

        # The server holds the BLPOP: its reply is still to come.
        await wait_for(blocked, interval_s=0.005, what="the BLPOP to block")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await redis.rpush("sb:q", "theirs")  # would be the BLPOP's reply on that socket
        assert await client.send_batch([("GET", "sb:k")]) == [b"mine"]
        assert await redis.lrange("sb:q", 0, -1) == [b"theirs"], "no BLPOP took it"
    finally:
        await client.aclose()


async def test_scripts_sent_in_batches_are_loaded_again_after_a_cache_loss(
    redis_server: RedisServerInfo,
) -> None:
    """One call, many calls, calls in order: each after a ``SCRIPT FLUSH`` (a restarted
    server), through this client's batches."""
    client = _client(redis_server.url)
    lib = library()
    holders = [f"air:{{l:sb{i}}}:holders" for i in range(3)]
    try:
        await client.zadd(holders[1], {"h1": 1})
        await client.script_flush()
        assert await lib.call(client, "releaseLease", [holders[0]], ["h0"]) == 0
        await client.script_flush()
        replies = await lib.call_many(
            client, "releaseLease", [([k], [f"h{i}"]) for i, k in enumerate(holders)]
        )
        assert replies == [0, 1, 0]
        await client.script_flush()
        before = client.round_trips
        in_order = await lib.call_in_order(
            client,
            [ScriptCall("releaseLease", [k], ["h"]) for k in holders],
            then=[("ZADD", holders[2], 1, "h2")],
        )
        # ``then`` ran with the refused calls and once more after them (safe to repeat):
        # the second ZADD found its member.
        assert in_order == [0, 0, 0, 0]
        assert await client.zrange(holders[2], 0, -1) == [b"h2"]
        assert client.round_trips > before + 1, "refused, loaded, sent again"
    finally:
        await client.aclose()
