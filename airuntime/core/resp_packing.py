"""Commands onto the wire: packed by hiredis (C) instead of Python, sent without a Task.

Why this exists: redis-py's asyncio connections parse replies with hiredis but pack
commands with a pure-Python loop (``redis.asyncio.connection.Connection.pack_command``;
only the synchronous client uses hiredis's packer). airuntime's scripts take many
keys -- an execution script 21 to 24, a batch settle of the archiver one call per
execution -- so packing an EVALSHA of ~35 arguments cost ~38 µs of Python per call
against ~4.5 µs with ``hiredis.pack_command``, on every hot path (claim, complete,
dispatch, archive). :func:`use_hiredis_packing` swaps the connection class of a
client's pool for a subclass that packs with hiredis; the bytes on the wire are the
same (the tests compare both packers), and an argument neither accepts (``None``, a
bool) is the same :class:`redis.exceptions.DataError`. hiredis comes with the core
dependency ``redis[hiredis]``.

The same connection class also sends without a Task (:class:`TaskFreeSend`): with a
``socket_timeout`` (airuntime always sets one, so a frozen server is noticed), redis-py
sends each command or pipeline through ``asyncio.wait_for``, which on Python 3.11
wraps the write in a new Task scheduled on the next loop turn -- about 4.5 Tasks per
dispatched run, ~8 % of the runtime's CPU. :class:`TaskFreeSend` bounds the same write
with ``asyncio.timeout`` in the caller's own task: the same timeout, the same errors
(``TimeoutError("Timeout writing to socket")``, a ``ConnectionError`` naming the
errno), the connection dropped after any failure, as redis-py does. A write that leaves
the transport's buffer under its low-water mark (almost every one) has nothing to wait
for, so it is not bounded at all: ``drain()`` returns at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar, cast

import hiredis
from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = [
    "BufferedRead",
    "HiredisPacking",
    "TaskFreeSend",
    "hiredis_connection_class",
    "pack_command",
    "use_hiredis_packing",
]


def pack_command(args: Sequence[Any]) -> bytes:
    """One command's bytes, as redis-py packs them, by hiredis."""
    # As redis-py's packers: a command given as "CONFIG GET" is two arguments.
    if isinstance(args[0], str):
        words = args[0].split()
        if len(words) != 1 or words[0] != args[0]:  # the usual one word passes as is
            args = (*args[0].encode().split(), *args[1:])
    elif b" " in args[0]:
        args = (*args[0].split(), *args[1:])
    try:
        return hiredis.pack_command(tuple(args))  # type: ignore[no-any-return]
    except TypeError:
        pass
    # Rare: hiredis takes bytes, str, int and float; redis-py also bytearray and
    # memoryview. Converting only here keeps the common call one C call.
    args = tuple(bytes(a) if isinstance(a, bytearray | memoryview) else a for a in args)
    try:
        return hiredis.pack_command(args)  # type: ignore[no-any-return]
    except TypeError as exc:
        raise DataError(str(exc)) from None


class HiredisPacking:
    """Mixin for a redis-py asyncio connection class: ``pack_command`` by hiredis."""

    def pack_command(self, *args: Any) -> list[bytes]:
        return [pack_command(args)]


class TaskFreeSend(AbstractConnection):
    """Mixin for a redis-py asyncio connection class: ``send_packed_command`` bounded by
    ``asyncio.timeout`` in the calling task instead of ``asyncio.wait_for`` (a Task per
    send on Python 3.11); otherwise redis-py's own steps and errors, in its order."""

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        if not self.socket_timeout:
            await super().send_packed_command(command, check_health)
            return
        if not self.is_connected:
            await self.connect_check_health(check_health=False)
        if check_health:
            await self.check_health()  # type: ignore[no-untyped-call]
        try:
            if isinstance(command, str):
                command = command.encode()
            if isinstance(command, bytes):
                command = [command]
            writer = cast(asyncio.StreamWriter, self._writer)  # connected above
            writer.writelines(command)
            transport = writer.transport
            if transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[0]:
                # At or under the low-water mark the protocol is not paused (it resumes
                # as soon as the buffer drains that far): drain() returns without
                # waiting for the peer, so there is nothing to bound, and no Timeout to
                # make on every command of every hot path.
                await writer.drain()
            else:
                async with asyncio.timeout(self.socket_timeout):
                    await writer.drain()
        except TimeoutError:
            # Builtin (asyncio's) TimeoutError: the bound above fired. It is an OSError,
            # so it is matched first, as redis-py matches asyncio.TimeoutError first.
            await self.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as e:
            await self.disconnect(nowait=True)
            if len(e.args) == 1:
                err_no, errmsg = "UNKNOWN", e.args[0]
            else:
                err_no, errmsg = e.args[0], e.args[1]
            raise RedisConnectionError(f"Error {err_no} while writing to socket. {errmsg}.") from e
        except BaseException:
            # A send cut short (cancelled) leaves the connection unusable: drop it.
            await self.disconnect(nowait=True)
            raise


class BufferedRead(AbstractConnection):
    """Mixin for a redis-py asyncio connection class: a reply already complete in the
    hiredis reader's buffer is returned without making a timeout (nothing can wait);
    any other read is redis-py's, bounded by ``socket_timeout``. The reply is handled as
    redis-py's hiredis parser and connection handle it, in their order: a connection
    error drops the connection and is raised, a push notification goes to its handler,
    a server error reply is raised as :class:`~redis.exceptions.ResponseError`."""

    async def read_response(
        self,
        disable_decoding: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 (redis-py's signature)
        *,
        disconnect_on_error: bool = True,
        push_request: bool | None = False,
    ) -> Any:
        parser = self._parser
        if (
            timeout is None
            and type(parser) is _AsyncHiredisParser
            and getattr(parser, "_connected", False)
        ):
            reader: Any = parser._reader  # a hiredis.Reader once connected
            try:
                reply = reader.gets(False) if disable_decoding else reader.gets()
            except BaseException:  # a protocol error: the stream cannot be trusted
                if disconnect_on_error:
                    await self.disconnect(nowait=True)
                raise
            if reply is not NOT_ENOUGH_DATA:
                return await self._buffered_reply(
                    parser, reply, disable_decoding, disconnect_on_error, bool(push_request)
                )
        return await super().read_response(
            disable_decoding,
            timeout,
            disconnect_on_error=disconnect_on_error,
            push_request=push_request,
        )

    async def _buffered_reply(
        self,
        parser: _AsyncHiredisParser,
        reply: Any,
        disable_decoding: bool,
        disconnect_on_error: bool,
        push_request: bool,
    ) -> Any:
        push_type = parser._hiredis_PushNotificationType
        if push_type is not None and isinstance(reply, push_type):
            try:
                reply = await parser.handle_push_response(reply)
            except BaseException:
                if disconnect_on_error:
                    await self.disconnect(nowait=True)
                raise
            if not push_request:
                return await self.read_response(
                    disable_decoding, disconnect_on_error=disconnect_on_error
                )
            return reply
        if isinstance(reply, RedisConnectionError) or (
            isinstance(reply, list) and reply and isinstance(reply[0], RedisConnectionError)
        ):
            if disconnect_on_error:
                await self.disconnect(nowait=True)
            raise reply if isinstance(reply, RedisConnectionError) else reply[0]
        if self.health_check_interval:
            self.next_health_check = asyncio.get_running_loop().time() + self.health_check_interval
        if isinstance(reply, ResponseError):
            raise reply from None
        return reply


C = TypeVar("C", bound=AbstractConnection)

_FAST: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def hiredis_connection_class(cls: type[C]) -> type[C]:
    """``cls`` (a redis-py asyncio connection class) packing with hiredis, sending
    without a Task and reading buffered replies without a timeout."""
    if issubclass(cls, HiredisPacking):
        return cls
    if cls not in _FAST:
        _FAST[cls] = type(
            f"Hiredis{cls.__name__}", (HiredisPacking, TaskFreeSend, BufferedRead, cls), {}
        )
    return cast(type[C], _FAST[cls])


def use_hiredis_packing(client: Redis) -> Redis:
    """Make ``client``'s future connections pack with hiredis (TCP, TLS or unix socket:
    whichever class its URL chose). Call it before the first command."""
    pool = client.connection_pool
    pool.connection_class = hiredis_connection_class(pool.connection_class)
    return client
