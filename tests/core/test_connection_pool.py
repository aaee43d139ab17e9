"""The lean connection pool keeps what a pool must guarantee on a real server.

* ``connect()`` gives a standalone client on :class:`LeanConnectionPool`; closing the
  client closes its pool's connections.
* Many borrowers released together each get a connection of their own, every one comes
  back, and the cap holds.
* A connection that comes back with an unread reply is not lent dirty: the next borrow
  reconnects it. A connection the server killed is replaced on the next command.
* A pool whose connections take a credential provider keeps redis-py's own path.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from redis.credentials import UsernamePasswordCredentialProvider
from redis.exceptions import MaxConnectionsError

from airuntime.core.connection_pool import LeanConnectionPool
from airuntime.core.redis_client import CountingRedis, clone, connect
from tests.conftest import RedisServerInfo

pytestmark = pytest.mark.timeout(60)


async def test_connect_uses_the_lean_pool_and_closing_the_client_closes_it(
    redis_server: RedisServerInfo,
) -> None:
    client = connect(redis_server.url)
    assert isinstance(client, CountingRedis)
    pool = client.connection_pool
    assert isinstance(pool, LeanConnectionPool)
    assert await client.ping()
    assert isinstance(clone(client).connection_pool, LeanConnectionPool)
    [connection] = pool._available_connections
    assert connection.is_connected
    await client.aclose()
    assert not connection.is_connected


async def test_many_borrowers_at_once_each_get_their_own_connection_and_return_it(
    redis_server: RedisServerInfo,
) -> None:
    contenders = 40
    client = connect(redis_server.url, max_connections=contenders)
    pool = client.connection_pool
    barrier = asyncio.Barrier(contenders)
    held = []

    async def borrower() -> None:
        await barrier.wait()
        connection = await pool.get_connection()
        held.append(connection)
        await barrier.wait()  # all of them hold one at the same time
        await pool.release(connection)

    try:
        await asyncio.gather(*(borrower() for _ in range(contenders)))
        assert len({id(c) for c in held}) == contenders
        assert not pool._in_use_connections
        assert len(pool._available_connections) == contenders
        borrowed = [await pool.get_connection() for _ in range(contenders)]
        with pytest.raises(MaxConnectionsError):
            await pool.get_connection()
        for connection in borrowed:
            await pool.release(connection)
    finally:
        await client.aclose()


async def _lend_with_unread_reply(client: Redis) -> None:
    """Borrow the one connection, send a GET, give it back with the reply unread."""
    pool = client.connection_pool
    connection = await pool.get_connection()
    await connection.send_command("GET", "k")  # its reply is never read
    while not await connection.can_read():  # until the reply is in the socket
        await asyncio.sleep(0)
    await pool.release(connection)


async def test_a_connection_returned_with_an_unread_reply_is_not_lent_dirty(
    redis_server: RedisServerInfo,
) -> None:
    client = connect(redis_server.url, max_connections=1)
    pool = client.connection_pool
    try:
        await client.set("k", "v")
        await client.delete("n")
        connection = await pool.get_connection()
        await pool.release(connection)
        await _lend_with_unread_reply(client)
        assert await client.incr("n") == 1 and await client.incr("n") == 2
        [again] = pool._available_connections
        assert again is connection, "the same connection, made again"
    finally:
        await client.aclose()


async def test_a_connection_the_server_killed_is_replaced_on_the_next_command(
    redis_server: RedisServerInfo, redis: Redis
) -> None:
    client = connect(redis_server.url, max_connections=1)
    try:
        client_id = await client.client_id()
        await redis.client_kill_filter(_id=client_id)
        assert await client.ping()
        assert await client.client_id() != client_id
    finally:
        await client.aclose()


async def test_a_pool_with_a_credential_provider_keeps_redis_pys_path(
    redis_server: RedisServerInfo,
) -> None:
    provider = UsernamePasswordCredentialProvider("default", "")
    pool = LeanConnectionPool.from_url(redis_server.url, credential_provider=provider)
    lean = LeanConnectionPool.from_url(redis_server.url)
    assert (pool._lean, lean._lean) == (False, True)
    client = Redis(connection_pool=pool)
    try:
        assert await client.ping()
    finally:
        await client.aclose()
        await pool.disconnect()
        await lean.disconnect()


async def test_pipelines_are_not_scanned_for_himport_and_still_work(
    redis_server: RedisServerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lean pool's connections carry no HIMPORT registry, so redis-py does not parse
    each queued command of a pipeline looking for ``HIMPORT SET``; plain and MULTI/EXEC
    pipelines still answer in order."""
    from redis.asyncio import _himport_exec

    parsed: list[object] = []
    original = _himport_exec.parse_himport_set_args

    def counting(args: object) -> object:
        parsed.append(args)
        return original(args)

    monkeypatch.setattr(_himport_exec, "parse_himport_set_args", counting)
    lean = connect(redis_server.url)
    stock = Redis.from_url(redis_server.url)
    try:
        for transaction in (False, True):
            pipe = lean.pipeline(transaction=transaction)
            pipe.set("hx", "1").incr("hx").get("hx")
            assert await pipe.execute() == [True, 2, b"2"]
        assert parsed == []
        assert all(c.himport_registry is None for c in lean.connection_pool._available_connections)
        # redis-py's own pool does scan (what the lean pool saves): the test can fail.
        pipe = stock.pipeline(transaction=False)
        pipe.get("hx")
        assert await pipe.execute() == [b"2"]
        assert parsed
    finally:
        await lean.aclose()
        await stock.aclose()
