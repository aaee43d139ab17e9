"""One connection on which any number of command batches are in flight at once.

Why this exists: every script call of airuntime (claim, complete, dispatch, settle,
archive...) is a round trip through :meth:`~airuntime.core.redis_client.CountingRedis.
send_batch`. Through redis-py's connection it cost ~64 µs of client CPU on this
project's 2-core box against ~40 µs for the same bytes through a bare asyncio
protocol (``EVALSHA`` of a one-line script, a loop of 6,000): a pool checkout and
return under an ``asyncio.Lock``, a ``Timeout`` (a timer pushed on the loop's heap and
cancelled) around every read, and five coroutine layers between the socket and the
caller. A chain step is one such round trip and a dispatched run two, so the
difference is a tenth of a run's CPU.

:class:`PipelinedConnection` is that bare protocol, on a connection redis-py opened:
redis-py makes the connection and its handshake (TLS, ``AUTH``, ``HELLO``, ``SELECT``,
client name: everything the URL asks for), then the transport is handed to this
protocol (``transport.set_protocol``), which writes the batches and hands the
replies, in order, to the batches waiting for them (a FIFO of futures; hiredis parses,
with the reader redis-py configured, so error replies are the same exception classes).
A batch sent while replies are awaited is written at the end of the event loop's
turn, together with the other batches sent in that turn (one ``send`` instead of one a
batch: a ``send`` to a local server costs the client the wake-up of the server's
thread, and the server one read each): when a runtime's tasks complete steps, or a
pump's runs settle, in the same turn, their round trips share the syscall. A batch on
an idle connection (a chain's step, a lone call) is written at once.

What a caller sees is what :meth:`send_batch` gave before:

* its replies, error replies included as exceptions; a reply that is a connection
  error (``LOADING``: the server is not ready) raised, and the connection dropped, as
  redis-py does;
* a lost connection (a restart, a reset) raises :class:`redis.exceptions.ConnectionError`
  in every batch in flight, and the next call opens a new connection;
* a server that stops answering: when no byte has arrived for ``socket_timeout`` while
  a batch waits, every batch in flight gets :class:`redis.exceptions.TimeoutError` and
  the connection is dropped (one timer per connection, re-armed lazily, instead of one
  per read);
* a caller cancelled while it waits leaves its batch in the FIFO: the replies are read
  and dropped, so the connection stays in step (redis-py had to drop the connection).

The connection and timeout errors are transient for :mod:`airuntime.core.transient`:
the callers' retries decide, as before (a protocol error, a stream that cannot be
trusted, is raised as redis-py's ``InvalidResponse`` and drops the connection too).
Blocking commands do not belong here (they would hold every batch behind them;
``CountingRedis.send_batch`` refuses them). Push messages (RESP3: client-side
caching, maintenance notices, which airuntime does not subscribe to) are skipped.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable
from typing import Any

from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["PipelinedConnection"]


class _Batch:
    __slots__ = ("count", "future", "replies")

    def __init__(self, future: asyncio.Future[list[Any]], count: int) -> None:
        self.future = future
        self.count = count
        self.replies: list[Any] = []


class PipelinedConnection(asyncio.Protocol):
    """Batches of commands on one connection, replies matched in order (module doc)."""

    def __init__(self, connection: AbstractConnection, timeout: float | None) -> None:
        self.loop = asyncio.get_running_loop()
        parser: Any = connection._parser
        writer: Any = connection._writer
        self._reader: Any = parser._reader
        self._push_type: Any = parser._hiredis_PushNotificationType
        self._where = connection._host_error()
        self._transport: asyncio.Transport = writer.transport
        # The transport is this protocol's from now on: redis-py's connection object
        # lets go of its streams (it would otherwise close them when collected), and
        # they are kept here until the transport is closed (a StreamWriter collected
        # before that closes it).
        self._streams = (writer, connection._reader)
        connection._writer = connection._reader = None
        self._timeout = timeout
        self._batches: collections.deque[_Batch] = collections.deque()
        self._lost: BaseException | None = None
        self._watch: asyncio.TimerHandle | None = None
        self._unsent: list[bytes] | None = None
        """The bytes of the batches sent in this loop turn while replies were awaited,
        written together at its end (:meth:`_send`); None: none yet."""
        self._heard = self.loop.time()
        """``loop.time()`` of the last bytes received or of the oldest batch's send."""
        self._transport.set_protocol(self)

    @classmethod
    async def open(cls, connection: AbstractConnection) -> PipelinedConnection:
        """Connect ``connection`` (a new one of a redis-py pool: its handshake is
        redis-py's) and take over its transport."""
        await connection.connect()  # type: ignore[no-untyped-call]
        if type(connection._parser) is not _AsyncHiredisParser:
            await connection.disconnect()
            raise TypeError("a pipelined connection parses with hiredis")
        timeout = connection.socket_timeout
        return cls(connection, float(timeout) if timeout else None)

    @property
    def closed(self) -> bool:
        return self._lost is not None

    def close(self) -> None:
        """Close the connection; batches in flight get a connection error."""
        self._fail(RedisConnectionError(f"Connection to {self._where} closed by the client."))

    async def exchange(self, packed: Iterable[bytes], count: int) -> list[Any]:
        """Send ``packed`` (``count`` commands) and return their replies in order."""
        if self._lost is not None:
            raise self._lost
        batch = _Batch(self.loop.create_future(), count)
        if not self._batches:
            # An idle connection: written at once (a lone call waits for nothing).
            self._heard = self.loop.time()  # the wait for this batch starts now
            self._transport.writelines(packed)
        elif (unsent := self._unsent) is not None:
            unsent.extend(packed)
        else:
            # Replies are awaited: the batches of this turn are written at its end.
            self._unsent = list(packed)
            self.loop.call_soon(self._send)
        self._batches.append(batch)
        if self._timeout is not None and self._watch is None:
            self._watch = self.loop.call_at(self._heard + self._timeout, self._check)
        # No wait for the transport's buffer to drain: the replies cannot come before
        # the whole batch is written, and a server that reads nothing answers nothing
        # (the watchdog's case).
        return await batch.future

    def _send(self) -> None:
        unsent, self._unsent = self._unsent, None
        if unsent and self._lost is None:
            self._transport.writelines(unsent)

    # -- asyncio.Protocol ------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._heard = self.loop.time()
        reader = self._reader
        reader.feed(data)
        batches = self._batches
        while True:
            try:
                reply = reader.gets()
            except Exception as exc:  # a protocol error: the stream cannot be trusted
                self._fail(exc)
                return
            if reply is NOT_ENOUGH_DATA:
                return
            if self._push_type is not None and isinstance(reply, self._push_type):
                continue
            if not batches:
                self._fail(RedisConnectionError(f"Reply without a command from {self._where}."))
                return
            if isinstance(reply, RedisConnectionError):
                # As redis-py: such a reply (LOADING...) raises and drops the connection.
                self._fail(reply)
                return
            head = batches[0]
            head.replies.append(reply)
            if len(head.replies) == head.count:
                batches.popleft()
                if not head.future.done():  # its caller may have been cancelled
                    head.future.set_result(head.replies)

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lost is None:
            reason = f": {exc}" if exc is not None else ""
            self._fail(RedisConnectionError(f"Connection to {self._where} lost{reason}."), exc)

    # -- faults -----------------------------------------------------------------------

    def _check(self) -> None:
        self._watch = None
        if not self._batches or self._lost is not None or self._timeout is None:
            return
        due = self._heard + self._timeout
        if self.loop.time() >= due:
            self._fail(RedisTimeoutError(f"Timeout reading from {self._where}"))
        else:
            self._watch = self.loop.call_at(due, self._check)

    def _fail(self, error: BaseException, cause: BaseException | None = None) -> None:
        if self._lost is None:
            self._lost = error
        if cause is not None and error.__cause__ is None:
            error.__cause__ = cause
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        batches, self._batches = self._batches, collections.deque()
        for batch in batches:
            if not batch.future.done():
                batch.future.set_exception(error)
        self._transport.abort()
