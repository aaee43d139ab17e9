"""Commands packed by hiredis are the bytes redis-py's own packer writes, and reach a
real server through every client airuntime makes."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import DataError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from airuntime.core.redis_client import CountingRedisCluster, connect
from airuntime.core.resp_packing import HiredisPacking, use_hiredis_packing
from airuntime.devstack.embedded import EmbeddedServer
from tests.conftest import RedisServerInfo
from tests.task_counting import tasks_started

PYTHON = Connection()
HIREDIS = use_hiredis_packing(Redis()).connection_pool.connection_class()

ARGUMENT = st.one_of(
    st.text(),
    st.binary(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
)


@given(st.sampled_from(["SET", "EVALSHA", "CONFIG GET", "CLIENT\tSETNAME", " GET", b"HSET",
                        b"CLIENT SETNAME"]),
       st.lists(ARGUMENT, max_size=40))  # fmt: skip
def test_the_bytes_are_the_python_packers(command: str | bytes, args: list[Any]) -> None:
    expected = b"".join(PYTHON.pack_command(command, *args))
    assert b"".join(HIREDIS.pack_command(command, *args)) == expected


def test_buffers_are_packed_as_their_bytes() -> None:
    packed = HIREDIS.pack_command("SET", bytearray(b"k"), memoryview(b"\x00v"))
    assert b"".join(packed) == b"".join(PYTHON.pack_command("SET", b"k", b"\x00v"))


@pytest.mark.parametrize("bad", [None, True, object()], ids=["none", "bool", "object"])
def test_an_argument_no_packer_accepts_is_a_data_error(bad: object) -> None:
    with pytest.raises(DataError):
        PYTHON.pack_command("SET", "k", bad)
    with pytest.raises(DataError):
        HIREDIS.pack_command("SET", "k", bad)


def test_the_url_still_chooses_the_transport() -> None:
    tcp = use_hiredis_packing(Redis.from_url("redis://127.0.0.1:1"))
    unix = use_hiredis_packing(Redis.from_url("unix:///tmp/none.sock"))
    for client, transport in ((tcp, Connection), (unix, UnixDomainSocketConnection)):
        cls = client.connection_pool.connection_class
        assert issubclass(cls, HiredisPacking) and issubclass(cls, transport)
    assert use_hiredis_packing(tcp).connection_pool.connection_class is (
        tcp.connection_pool.connection_class
    ), "applied twice, wrapped once"


async def test_a_connected_client_speaks_to_the_server_through_it(
    redis_server: RedisServerInfo,
) -> None:
    client = connect(redis_server.url)
    try:
        assert issubclass(client.connection_pool.connection_class, HiredisPacking)
        value = "ключ \x00 " * 1000  # larger than redis-py's buffer cutoff
        await client.set("packing:k", value)
        assert (await client.get("packing:k")) == value.encode()
        keys = [f"packing:{{t}}:{i}" for i in range(30)]
        script = "for i, k in ipairs(KEYS) do redis.call('SET', k, ARGV[i]) end return #KEYS"
        assert await client.eval(script, len(keys), *keys, *range(30)) == 30
        assert await client.mget(keys) == [str(i).encode() for i in range(30)]
    finally:
        await client.aclose()


async def test_a_cluster_client_packs_with_hiredis_on_every_node(
    cluster_redis: CountingRedisCluster,
) -> None:
    keys = [f"packing:{i}" for i in range(60)]  # spread over the shards' slots
    for i, key in enumerate(keys):
        await cluster_redis.set(key, f"ключ {i}")
    assert await cluster_redis.mget_nonatomic(keys) == [f"ключ {i}".encode() for i in range(60)]
    nodes = cluster_redis.get_nodes()
    assert len({n.port for n in cluster_redis.get_primaries()}) == 3
    for node in nodes:
        assert issubclass(node.connection_class, HiredisPacking), node


async def test_a_send_starts_no_task(redis_server: RedisServerInfo) -> None:
    # redis-py bounds each write by asyncio.wait_for, a new Task per command on 3.11.
    client = connect(redis_server.url, socket_timeout=5)
    try:
        await client.ping()  # connect outside the count
        with tasks_started() as made:
            for i in range(50):
                await client.set(f"packing:send:{i}", i)
            async with client.pipeline(transaction=False) as pipe:
                for i in range(50):
                    pipe.get(f"packing:send:{i}")
                values = await pipe.execute()
        assert values == [str(i).encode() for i in range(50)]
    finally:
        await client.aclose()
    assert "AbstractConnection._send_packed_command" not in made, made


async def test_a_write_the_kernel_takes_makes_no_timeout(
    redis_server: RedisServerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing to wait for: the bound is only made when drain() could block (the test
    # below shows that write still times out on a frozen server).
    client = connect(redis_server.url, socket_timeout=5)
    made = TimeoutCount(asyncio, "timeout")
    try:
        conn = await client.connection_pool.get_connection()
        try:
            made.install(monkeypatch)
            for i in range(50):
                await conn.send_command("SET", f"packing:fast:{i}", i)
            monkeypatch.undo()
            replies = [await conn.read_response() for _ in range(50)]
        finally:
            await client.connection_pool.release(conn)
        assert replies == [b"OK"] * 50
        assert made.count == 0, f"{made.count} Timeouts for 50 writes the kernel took at once"
        assert await client.get("packing:fast:49") == b"49"
    finally:
        await client.aclose()


async def test_a_write_to_a_frozen_server_times_out_or_is_cancelled_and_drops_the_connection() -> (
    None
):
    server = EmbeddedServer().start()
    client = connect(server.url, socket_timeout=0.5)
    big = b"x" * (64 << 20)  # far more than the kernel's socket buffers: it cannot drain
    try:
        await client.set("packing:before", 1)
        timing_out = await client.connection_pool.get_connection()
        cancelled = await client.connection_pool.get_connection()
        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)
        try:
            with pytest.raises(RedisTimeoutError, match="Timeout writing to socket"):
                await timing_out.send_command("SET", "packing:big", big)
            assert not timing_out.is_connected, "a half-sent command must not be reused"

            sending = asyncio.ensure_future(cancelled.send_command("SET", "packing:big", big))
            while not _stuck(cancelled):
                await asyncio.sleep(0)  # one loop turn, until the write waits on the kernel
            sending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sending
            assert not cancelled.is_connected, "a cancelled send drops the connection"
        finally:
            os.kill(server.pid, signal.SIGCONT)
        for conn in (timing_out, cancelled):
            await client.connection_pool.release(conn)
        assert await client.get("packing:before") == b"1", "the client connects again"
    finally:
        await client.aclose()
        server.stop()


class TimeoutCount:
    """Counts the timeouts made through ``module.name`` (``asyncio.timeout`` or the
    name redis-py imported it as) while installed."""

    def __init__(self, module: Any, name: str) -> None:
        self.module, self.name = module, name
        self.real = getattr(module, name)
        self.count = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(self.module, self.name, self._counting)

    def _counting(self, delay: float | None) -> asyncio.Timeout:
        self.count += 1
        timeout: asyncio.Timeout = self.real(delay)
        return timeout


def _stuck(conn: Any) -> bool:
    """The connection's transport holds bytes the kernel did not take."""
    writer = conn._writer
    return writer is not None and writer.transport.get_write_buffer_size() > 0


async def test_replies_already_buffered_are_read_without_a_timeout(
    redis_server: RedisServerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    # redis-py makes a timeout per reply; a pipeline's replies after the first arrive
    # in the same socket read, so there is nothing to bound. Errors stay in place.
    import redis.asyncio.connection as redis_connection

    client = connect(redis_server.url, socket_timeout=5)
    made = TimeoutCount(redis_connection, "async_timeout")
    try:
        await client.set("packing:text", "not a number")
        made.install(monkeypatch)
        async with client.pipeline(transaction=False) as pipe:
            for i in range(25):
                pipe.set(f"packing:read:{i}", i)
            pipe.incr("packing:text")  # an error reply in the middle
            for i in range(25):
                pipe.get(f"packing:read:{i}")
            replies = await pipe.execute(raise_on_error=False)
        monkeypatch.undo()
    finally:
        await client.aclose()
    assert replies[:25] == [True] * 25
    assert isinstance(replies[25], ResponseError) and "not an integer" in str(replies[25])
    assert replies[26:] == [str(i).encode() for i in range(25)]
    assert made.count < 10, f"{made.count} timeouts for 51 replies that came in one read"


async def test_a_reply_from_a_frozen_server_still_times_out() -> None:
    server = EmbeddedServer().start()
    client = connect(server.url, socket_timeout=0.5)
    try:
        await client.set("packing:before", 1)
        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)
        try:
            async with client.pipeline(transaction=False) as pipe:
                pipe.get("packing:before")
                pipe.get("packing:before")
                with pytest.raises(RedisTimeoutError, match="Timeout reading from"):
                    await pipe.execute()
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert await client.get("packing:before") == b"1", "the client connects again"
    finally:
        await client.aclose()
        server.stop()
