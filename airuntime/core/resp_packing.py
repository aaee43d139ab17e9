"""Commands packed into the Redis protocol by hiredis (C) instead of Python.

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
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import DataError

__all__ = ["HiredisPacking", "hiredis_connection_class", "use_hiredis_packing"]


class HiredisPacking:
    """Mixin for a redis-py asyncio connection class: ``pack_command`` by hiredis."""

    def pack_command(self, *args: Any) -> list[bytes]:
        # As redis-py's packers: a command given as "CONFIG GET" is two arguments.
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError:
            pass
        # Rare: hiredis takes bytes, str, int and float; redis-py also bytearray and
        # memoryview. Converting only here keeps the common call one C call.
        args = tuple(bytes(a) if isinstance(a, bytearray | memoryview) else a for a in args)
        try:
            return [hiredis.pack_command(args)]
        except TypeError as exc:
            raise DataError(str(exc)) from None


C = TypeVar("C", bound=AbstractConnection)

_FAST: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def hiredis_connection_class(cls: type[C]) -> type[C]:
    """``cls`` (a redis-py asyncio connection class) packing with hiredis."""
    if issubclass(cls, HiredisPacking):
        return cls
    if cls not in _FAST:
        _FAST[cls] = type(f"Hiredis{cls.__name__}", (HiredisPacking, cls), {})
    return cast(type[C], _FAST[cls])


def use_hiredis_packing(client: Redis) -> Redis:
    """Make ``client``'s future connections pack with hiredis (TCP, TLS or unix socket:
    whichever class its URL chose). Call it before the first command."""
    pool = client.connection_pool
    pool.connection_class = hiredis_connection_class(pool.connection_class)
    return client
