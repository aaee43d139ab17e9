"""A connection pool that lends connections without redis-py 8's per-borrow bookkeeping.

Why this exists: every command and every pipeline borrows a connection from the pool
and returns it. In redis-py 8 each borrow also records OpenTelemetry connection counts
(three awaited recorder calls, a pool-name lookup) and each return dispatches an
``AfterConnectionReleasedEvent`` (whose one listener re-authenticates connections of a
*streaming* credential provider) and records again: about a dozen coroutine calls per
round trip, ~8 % of the CPU of a run that arrives alone (profiled: 0.62 of 7.3 s).
airuntime configures neither OpenTelemetry for redis-py nor a streaming credential
provider, so :class:`LeanConnectionPool` keeps what matters -- the lock, the check that
a borrowed connection is connected and has no unread data (reconnecting once if it
has), the drop of a connection marked for reconnection -- and skips the rest. A pool
whose connections do take a credential provider keeps redis-py's own path.

The unread-data check is made always, whatever redis-py's own pool does: redis-py
8.0 and 8.1 skipped it while "maintenance notifications" were enabled, which they are
by default (``"auto"``), so a connection given back with a reply still unread (a
command cancelled between its write and its read) was lent as it was and its next
command read the previous command's reply (8.2 checks again). Valkey and Redis OSS
send no unsolicited data on a command connection, so data found there is always a
leftover, and the connection is made again (tests/core/test_connection_pool.py).

Its connections also carry no HIMPORT fieldset registry: redis-py 8 otherwise parses
every command of every pipeline (``pipeline_prepares``) looking for ``HIMPORT SET``,
which airuntime never sends (profiled: ~3 % of a backlog's CPU). A client that wants
HIMPORT uses redis-py's own pool.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["LeanConnectionPool"]


class LeanConnectionPool(ConnectionPool):
    """:class:`redis.asyncio.ConnectionPool` without per-borrow metrics and events."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lean = self.connection_kwargs.get("credential_provider") is None

    def make_connection(self) -> AbstractConnection:
        connection = super().make_connection()  # type: ignore[no-untyped-call]
        if self._lean:
            connection.himport_registry = None
        return connection  # type: ignore[no-any-return]

    async def get_connection(self, *args: Any, **kwargs: Any) -> AbstractConnection:
        if not self._lean:
            return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call,no-any-return]
        async with self._lock:
            connection = self.get_available_connection()  # type: ignore[no-untyped-call]
        try:
            await self._ensure_clean(connection)
        except BaseException:
            await self.release(connection)
            raise
        return connection  # type: ignore[no-any-return]

    async def release(self, connection: AbstractConnection) -> None:
        if not self._lean:
            await super().release(connection)
            return
        async with self._lock:
            self._in_use_connections.remove(connection)
            if connection.should_reconnect():  # type: ignore[no-untyped-call]
                await connection.disconnect()
            self._available_connections.append(connection)

    async def _ensure_clean(self, connection: AbstractConnection) -> None:
        """Connected, with nothing left to read (else made again, once). A connected
        connection skips ``connect()``, which would return at once but only after
        entering its retry wrapper."""
        if not connection.is_connected:
            await connection.connect()  # type: ignore[no-untyped-call]
        try:
            if await connection.can_read():
                raise RedisConnectionError("Connection has data")
        except (RedisConnectionError, TimeoutError, OSError):
            await connection.disconnect()
            await connection.connect()  # type: ignore[no-untyped-call]
            if await connection.can_read():
                raise RedisConnectionError("Connection not ready") from None
