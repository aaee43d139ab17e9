"""``CountingRedis.send_batch``: commands in one round trip, every batch of a client on
its one pipelined connection (:mod:`airuntime.core.pipelined_connection`), on a real
server.

* Replies come back in order, an error reply as its exception, one round trip counted.
* The batches sent in one turn of the event loop are written together at its end: the
  server reads them in a handful of reads, not one a batch.
* Hundreds of batches in flight at once on the one connection each get their own
  replies; so do the batches sent after some callers gave up (cancelled): the replies
  nobody waits for any more are read and dropped, the connection stays in step.
* A connection lost inside a batch raises, as a pipeline's does, in every batch in
  flight, and the next batch runs on a new connection. A server that stops answering
  times the batches out after ``socket_timeout``; once it is back the next batch works.
* A blocking command is refused before anything is sent; closing the client closes
  the connection; a client used by a second event loop still works; RESP3 push
  messages between replies are skipped.
* Over TLS (Debian's redis-server, which is built with it) the same: batches in flight
  together, megabytes a batch, a lost connection replaced.
* The script library sends through it: a script-cache loss is still repaired.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from airuntime.core.redis_client import CountingRedis, connect
from airuntime.core.scripts import ScriptCall, library
from airuntime.devstack.embedded import EmbeddedServer
from tests.conftest import REDIS7_EXECUTABLE, REDIS7_MISSING, RedisServerInfo
from tests.control_plane.support import wait_for

pytestmark = pytest.mark.timeout(60)


def _client(url: str, **options: object) -> CountingRedis:
    client = connect(url, **options)
    assert isinstance(client, CountingRedis)
    return client


async def _channel_id(client: CountingRedis) -> int:
    [client_id] = await client.send_batch([("CLIENT", "ID")])
    return int(client_id)


async def test_replies_in_order_an_error_as_its_exception_one_round_trip(
    redis_server: RedisServerInfo,
) -> None:
    client = _client(redis_server.url)
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
        assert await client.send_batch([("GET", "sb:n")]) == [b"2"], "nothing left unread"
    finally:
        await client.aclose()


async def test_hundreds_of_batches_in_flight_share_one_connection_each_with_its_replies(
    redis_server: RedisServerInfo,
) -> None:
    client = _client(redis_server.url)
    n = 300
    start, all_waiting = asyncio.Event(), asyncio.Event()
    waiting = 0

    async def one(i: int) -> list[object]:
        nonlocal waiting
        waiting += 1
        if waiting == n:
            all_waiting.set()
        await start.wait()  # every batch is sent in the same loop turn
        return await client.send_batch(
            [("SET", f"sb:c{i}", i), ("INCRBY", f"sb:c{i}", i), ("CLIENT", "ID")]
        )

    try:
        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        await all_waiting.wait()
        start.set()
        replies = await asyncio.gather(*tasks)
        assert [r[:2] for r in replies] == [[b"OK", 2 * i] for i in range(n)]
        assert len({r[2] for r in replies}) == 1, "one connection carried every batch"
    finally:
        await client.aclose()


async def test_batches_sent_in_one_loop_turn_reach_the_server_in_one_write(
    redis_server: RedisServerInfo,
) -> None:
    """Batches sent by many tasks in the same turn of the event loop go out together
    at its end: the server reads them in a handful of reads (its read buffer is 16 KiB)
    instead of one read a batch, and each batch still gets its own replies."""
    client = _client(redis_server.url)
    observer = _client(redis_server.url)
    n = 200

    async def reads() -> int:
        info = await observer.info("stats")
        return int(info["total_reads_processed"])

    try:
        await client.send_batch([("PING",)])  # the connection is open
        before = await reads()
        replies = await asyncio.gather(
            *(client.send_batch([("ECHO", f"w{i}"), ("INCR", "sb:w")]) for i in range(n))
        )
        after = await reads()
        assert [r[0] for r in replies] == [f"w{i}".encode() for i in range(n)]
        assert sorted(r[1] for r in replies) == list(range(1, n + 1))
        # ~5 KiB of commands: one write; the two INFO calls are a read each.
        assert after - before <= 6, f"{after - before} reads for {n} batches"
    finally:
        await client.aclose()
        await observer.aclose()


async def test_batches_whose_callers_gave_up_leave_the_connection_in_step(
    redis_server: RedisServerInfo,
) -> None:
    """Half of the batches are cancelled after they were written and before their
    replies arrived: the other half, and the batches sent after, get their own replies
    (redis-py had to drop a connection whose reply would never be read)."""
    client = _client(redis_server.url)
    try:
        await client.set("sb:k", "mine")
        channel = await _channel_id(client)
        tasks = [
            asyncio.create_task(client.send_batch([("INCR", f"sb:g{i}"), ("ECHO", f"e{i}")]))
            for i in range(100)
        ]
        await asyncio.sleep(0)  # every batch is written; no reply has been read yet
        for task in tasks[::2]:
            task.cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        for i, result in enumerate(done):
            if i % 2:
                assert result == [1, f"e{i}".encode()]
            else:
                assert isinstance(result, asyncio.CancelledError)
        assert await client.send_batch([("GET", "sb:k")]) == [b"mine"]
        assert await _channel_id(client) == channel, "the same connection, still in step"
        assert await client.mget([f"sb:g{i}" for i in range(100)]) == [b"1"] * 100, (
            "a cancelled batch that was written still ran, as a lone EVALSHA would"
        )
    finally:
        await client.aclose()


async def test_callers_waiting_on_an_interrupted_opening_get_a_transient_error(
    redis_server: RedisServerInfo,
) -> None:
    """The first caller of a new client opens the connection and the others wait for
    it; the opener is cancelled: the others get a connection error (their retries open
    it again), not a cancellation of their own, and the next batch works."""
    client = _client(redis_server.url)
    try:
        tasks = [asyncio.create_task(client.send_batch([("PING",)])) for _ in range(10)]
        await asyncio.sleep(0)  # the first is opening, the others wait for it
        tasks[0].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError)
        for result in results[1:]:
            assert isinstance(result, RedisConnectionError), result
            assert "interrupted (CancelledError)" in str(result)
        assert await client.send_batch([("PING",)]) == [b"PONG"]
    finally:
        await client.aclose()


async def test_a_connection_lost_inside_a_batch_raises_and_the_next_batch_gets_a_new_one(
    redis_server: RedisServerInfo,
) -> None:
    """The batch's first command makes the server close this very connection, so no
    reply comes: a ``ConnectionError`` in it and in the batch sent behind it, as from
    a redis-py pipeline (``connect()``'s clients retry nothing themselves; the caller's
    transient-error retry decides). The next batch runs on a new connection."""
    client = _client(redis_server.url)
    try:
        await client.set("sb:k", "v")
        first = await _channel_id(client)
        killing = asyncio.create_task(
            client.send_batch([("CLIENT", "KILL", "ID", first, "SKIPME", "no"), ("GET", "sb:k")])
        )
        behind = asyncio.create_task(client.send_batch([("GET", "sb:k")]))
        for task in (killing, behind):
            with pytest.raises(RedisConnectionError, match="lost"):
                await task
        assert await client.send_batch([("GET", "sb:k")]) == [b"v"]
        assert await _channel_id(client) != first
    finally:
        await client.aclose()


async def test_a_server_that_stops_answering_times_the_batches_out_and_is_used_again() -> None:
    server = EmbeddedServer().start()
    client = _client(server.url, socket_timeout=0.5)
    try:
        await client.send_batch([("SET", "sb:before", 1)])
        first = await _channel_id(client)
        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)
        try:
            waiting = [
                asyncio.create_task(client.send_batch([("GET", "sb:before")])) for _ in range(3)
            ]
            for task in waiting:
                with pytest.raises(RedisTimeoutError, match="Timeout reading from"):
                    await task
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert await client.send_batch([("GET", "sb:before")]) == [b"1"]
        assert await _channel_id(client) != first, "the silent connection was dropped"
    finally:
        await client.aclose()
        server.stop()


async def test_slow_replies_within_the_timeout_are_waited_for_past_it_in_all() -> None:
    """The watchdog counts silence, not time since it was armed: six scripts of ~0.2 s,
    one after the other with another batch queued behind each, last 1.2 s in all, twice
    ``socket_timeout``, and every one is answered. (Valkey writes the replies of what
    it read in one go after running it all, so a pipeline of slow scripts is silent for
    their sum: as long as with redis-py's per-read timeout.)"""
    server = EmbeddedServer().start()
    client = _client(server.url, socket_timeout=0.6)
    spin = "local n = 0; for i = 1, tonumber(ARGV[1]) do n = n + 1 end; return n"
    try:
        loop = asyncio.get_running_loop()
        await client.send_batch([("EVAL", spin, 0, 1)])  # connected, script compiled
        sent = loop.time()
        await client.send_batch([("EVAL", spin, 0, 2_000_000)])
        count = int(0.2 / ((loop.time() - sent) / 2_000_000))
        sent = loop.time()
        for _ in range(6):
            replies = await asyncio.gather(
                client.send_batch([("EVAL", spin, 0, count)]), client.send_batch([("PING",)])
            )
            assert list(replies) == [[count], [b"PONG"]]
        assert loop.time() - sent > 0.6, "longer in all than the timeout"
    finally:
        await client.aclose()
        server.stop()


async def test_a_blocking_command_is_refused_before_anything_is_sent(
    redis_server: RedisServerInfo,
) -> None:
    client = _client(redis_server.url)
    try:
        for command in (("BLPOP", "sb:q", 1), (b"xread", "BLOCK", 0, "STREAMS", "s", "$")):
            with pytest.raises(ValueError, match=r"BLPOP|XREAD"):
                await client.send_batch([("GET", "sb:k"), command])
        with pytest.raises(ValueError, match="no commands"):
            await client.send_batch([])
        assert client.round_trips == 0
    finally:
        await client.aclose()


async def test_closing_the_client_closes_its_connection(
    redis_server: RedisServerInfo, redis: Redis
) -> None:
    client = _client(redis_server.url)
    await client.send_batch([("CLIENT", "SETNAME", "sb-closing")])

    async def named() -> int:
        return sum(1 for c in await redis.client_list() if c.get("name") == "sb-closing")

    async def closed() -> bool:
        return await named() == 0

    assert await named() == 1
    await client.aclose()
    await wait_for(closed, interval_s=0.01, what="the connection to close")


def test_a_client_closed_in_one_event_loop_sends_again_in_the_next(
    redis_server: RedisServerInfo,
) -> None:
    """Two ``asyncio.run`` with one client, closed at the end of each (a connection
    belongs to the loop that made it, as redis-py's do): the second opens its own."""
    client = _client(redis_server.url)

    async def use(value: int) -> list[object]:
        try:
            return await client.send_batch([("SET", "sb:loops", value), ("GET", "sb:loops")])
        finally:
            await client.aclose()

    assert asyncio.run(use(1)) == [b"OK", b"1"]
    assert asyncio.run(use(2)) == [b"OK", b"2"]


async def test_push_messages_between_replies_are_skipped(
    redis_server: RedisServerInfo, redis: Redis
) -> None:
    """RESP3: with client-side caching on, the server pushes an invalidation onto the
    connection when a read key changes; the replies around it still reach their
    batches."""
    client = _client(redis_server.url, protocol=3)
    try:
        await redis.set("sb:tracked", "a")
        tracking = [("CLIENT", "TRACKING", "ON"), ("GET", "sb:tracked")]
        assert await client.send_batch(tracking) == [b"OK", b"a"]
        await redis.set("sb:tracked", "b")  # an invalidation push for the connection
        for _ in range(3):
            assert await client.send_batch([("GET", "sb:tracked"), ("ECHO", "x")]) == [
                b"b",
                b"x",
            ]
            await redis.set("sb:tracked", "b")
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


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A TLS-only port of Debian's redis-server with a certificate of a CA made here;
    the URL of that port, trusting the CA."""
    if not os.access(REDIS7_EXECUTABLE, os.X_OK):
        pytest.skip(REDIS7_MISSING)
    d = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             "/CN=airuntime-test-ca", "-keyout", d / "ca.key", "-out", d / "ca.crt")  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
             "-keyout", d / "server.key", "-out", d / "server.csr")  # fmt: skip
    (d / "ext.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", d / "server.csr", "-CA", d / "ca.crt", "-CAkey",
             d / "ca.key", "-CAcreateserial", "-days", "2", "-extfile", d / "ext.cnf",
             "-out", d / "server.crt")  # fmt: skip
    for _ in range(5):  # a free port may be taken between the probe and the bind
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        tls = ["--tls-port", str(port), "--tls-cert-file", str(d / "server.crt"),
               "--tls-key-file", str(d / "server.key"), "--tls-ca-cert-file",
               str(d / "ca.crt"), "--tls-auth-clients", "no"]  # fmt: skip
        server = EmbeddedServer(executable=REDIS7_EXECUTABLE, extra_args=tls)
        try:
            server.start()
        except Exception:
            continue
        try:
            yield f"rediss://localhost:{port}/0?ssl_ca_certs={d / 'ca.crt'}"
        finally:
            server.stop()
        return
    pytest.fail("no free port for the TLS server after 5 attempts")


async def test_batches_over_tls_share_the_connection_carry_megabytes_and_reconnect(
    tls_server: str,
) -> None:
    client = _client(tls_server, socket_timeout=5)
    big = "x" * (4 << 20)
    try:
        replies = await asyncio.gather(
            *(
                client.send_batch([("SET", f"sb:tls{i}", big), ("STRLEN", f"sb:tls{i}")])
                for i in range(5)
            )
        )
        assert replies == [[b"OK", 4 << 20]] * 5
        first = await _channel_id(client)
        with pytest.raises(RedisConnectionError):
            await client.send_batch(
                [("CLIENT", "KILL", "ID", first, "SKIPME", "no"), ("STRLEN", "sb:tls0")]
            )
        assert await client.send_batch([("STRLEN", "sb:tls0")]) == [4 << 20]
        assert await _channel_id(client) != first
    finally:
        await client.aclose()
