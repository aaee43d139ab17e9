"""Redis connections for airuntime, with a round-trip counter, standalone or cluster.

Every process talks to Redis through :func:`connect`, so connection options are
set in one place and benchmarks can report *client round trips per step*: each
command sent (an EVALSHA counts once, whatever the script runs inside) and each
pipeline sent count as one round trip.

A Redis/Valkey Cluster is reached with a ``redis+cluster://host:port[,host:port...]``
URL (any node works as a seed; more seeds survive a seed being down), or with a plain
``redis://host:port`` URL and ``AIRUNTIME_REDIS_CLUSTER=1``. Either gives a
:class:`CountingRedisCluster` (redis-py's asyncio cluster client: it follows
``MOVED``/``ASK`` and refreshes the slot map after a failover). Code that only passes a
client around types it :data:`RedisClient`.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Awaitable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from redis import exceptions as redis_errors
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import (
    AbstractStrategy,
    ClusterNode,
    ClusterPipeline,
    TransactionStrategy,
)
from redis.asyncio.connection import Connection, SSLConnection
from redis.exceptions import CrossSlotTransactionError, RedisClusterException

from airuntime.core.connection_pool import LeanConnectionPool
from airuntime.core.pipelined_connection import PipelinedConnection
from airuntime.core.resp_packing import (
    hiredis_connection_class,
    pack_command,
    use_hiredis_packing,
)
from airuntime.core.slots import command_keys, slots_of

__all__ = [
    "BLOCKING_COMMANDS",
    "CLUSTER_ENV",
    "CLUSTER_MAX_CONNECTIONS",
    "CLUSTER_SCHEME",
    "CountingRedis",
    "CountingRedisCluster",
    "RedisClient",
    "RedisUrlError",
    "clone",
    "connect",
    "connection_options",
    "is_cluster",
    "is_cluster_url",
    "redacted",
    "server_ms",
]

CLUSTER_SCHEME = "redis+cluster"
CLUSTER_ENV = "AIRUNTIME_REDIS_CLUSTER"

CLUSTER_MAX_CONNECTIONS = 10_000
"""Per node and client (the standalone client's pool has no practical cap either)."""

RedisClient = Redis | RedisCluster
"""A client of a standalone server or of a cluster: what stores and loops are given."""


class CountingRedis(Redis):
    """``redis.asyncio.Redis`` that counts client round trips in ``round_trips``."""

    round_trips: int = 0
    _pipelined: PipelinedConnection | None = None
    _opening: asyncio.Future[PipelinedConnection] | None = None

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.round_trips += 1
        return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

    async def send_batch(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """``commands`` in one round trip without MULTI (each atomic on its own, run in
        this order): each one's raw reply, or the ``ResponseError`` it answered.

        Sent on the client's :class:`~airuntime.core.pipelined_connection.
        PipelinedConnection` (one per client, opened on first use by the event loop
        that uses it first; batches of concurrent callers share it, in flight at once),
        not through redis-py's pool: no pipeline object, pool checkout or timeout per
        read (see that module for the figures and for how faults surface: a lost
        connection or a silent server raises in every batch in flight, and the next
        call opens a new connection; the caller's transient-error retry decides, as
        :mod:`airuntime.core.transient` says). A call from another event loop (a client
        shared by two ``asyncio.run``) borrows a pooled connection instead.

        A blocking command (``BLPOP``, ``XREAD``...) would hold every batch behind it
        on the shared connection: it is refused (``ValueError``), as is an empty batch."""
        if not commands:
            raise ValueError("send_batch: no commands")
        for command in commands:
            name = command[0]
            if name != "EVALSHA" and _command_name(name) in BLOCKING_COMMANDS:
                raise ValueError(
                    f"send_batch: {_command_name(name)} blocks the connection every batch "
                    "shares; send it with execute_command on a client of its own"
                )
        self.round_trips += 1
        loop = asyncio.get_running_loop()
        channel = self._pipelined
        if channel is not None and channel.loop is not loop:
            if not channel.loop.is_closed():
                return await self._pooled_batch(commands)  # another live loop's connection
            channel = self._pipelined = None  # its loop is gone, and the connection with it
        if channel is None or channel.closed:
            channel = await self._open_pipelined(loop)
        return await channel.exchange([pack_command(c) for c in commands], len(commands))

    async def _open_pipelined(self, loop: asyncio.AbstractEventLoop) -> PipelinedConnection:
        """The pipelined connection, opened once for all the callers that need it now."""
        opening = self._opening
        if opening is None or opening.get_loop() is not loop:
            opening = self._opening = loop.create_future()
            try:
                connection = self.connection_pool.make_connection()  # type: ignore[no-untyped-call]
                channel = await PipelinedConnection.open(connection)
            except BaseException as exc:
                self._opening = None
                # The callers waiting on this opening (if any) raise a transient error,
                # a cancelled opener's too: their own retries open it again.
                shared = (
                    exc
                    if isinstance(exc, Exception)
                    else redis_errors.ConnectionError(
                        f"opening a connection was interrupted ({type(exc).__name__})"
                    )
                )
                opening.set_exception(shared)
                opening.exception()  # retrieved: nobody may be waiting
                raise
            self._pipelined, self._opening = channel, None
            opening.set_result(channel)
            return channel
        return await asyncio.shield(opening)

    async def _pooled_batch(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """``commands`` on a connection of the pool (redis-py's connection handling: a
        connection interrupted in the middle of the exchange is closed before it goes
        back, so no later borrower reads these replies)."""
        pool = self.connection_pool
        connection = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            packed = connection.pack_commands(commands)
            return await connection.retry.call_with_retry(  # type: ignore[no-any-return]
                lambda: _exchange(connection, packed, len(commands)),
                lambda error: connection.disconnect(),
            )
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
        finally:
            await pool.release(connection)

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        channel, self._pipelined = self._pipelined, None
        if channel is not None and not channel.loop.is_closed():
            channel.close()
        await super().aclose(close_connection_pool)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        self.round_trips += 1
        return super().pipeline(transaction=transaction, shard_hint=shard_hint)


BLOCKING_COMMANDS = frozenset(
    {
        "BLPOP", "BRPOP", "BRPOPLPUSH", "BLMOVE", "BLMPOP", "BZPOPMIN", "BZPOPMAX",
        "BZMPOP", "XREAD", "XREADGROUP", "WAIT", "WAITAOF", "SUBSCRIBE", "PSUBSCRIBE",
        "SSUBSCRIBE", "MONITOR",
    }
)  # fmt: skip
"""Commands :meth:`CountingRedis.send_batch` refuses: they hold (or take over) the
connection every batch shares."""


def _command_name(name: Any) -> str:
    text = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    return text.split(" ", 1)[0].upper()


async def _exchange(connection: Connection, packed: Any, count: int) -> list[Any]:
    """Send ``packed`` (``count`` commands) and read every reply, error replies included
    (all of them are read, so the connection is left with nothing unread)."""
    await connection.send_packed_command(packed)
    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(await connection.read_response())
        except redis_errors.ResponseError as error:
            replies.append(error)
    return replies


def _torn(exc: AttributeError) -> redis_errors.ConnectionError:
    """redis-py's asyncio cluster client re-learns the slot map after a connection
    error (a failover) and closes the nodes' connections while other coroutines are
    still using them; their commands fail with an AttributeError on the closed
    connection. It is a connection lost like any other: the engine retries it."""
    return redis_errors.ConnectionError(f"connection closed under the command ({exc})")


def _is_torn(exc: AttributeError) -> bool:
    return "'NoneType' object has no attribute" in str(exc)


class _TransactionStrategy(TransactionStrategy):
    """redis-py's cluster transaction strategy queues each command through a thread
    running an event loop of its own (``execute_command`` must stay synchronous while
    its slot lookup is async): a thread per queued command, and on a client that has
    not learnt the slot map yet, connections made in that thread's loop and then used
    in the caller's ("Event loop is closed", "attached to a different loop"). The keys
    of a transaction's commands are in the commands (:func:`command_keys`), so the slot
    is computed where the command is queued, and the slot map is learnt, if need be,
    before the first round trip (WATCH, or the MULTI/EXEC at ``execute``)."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        name = str(args[0]).upper()
        slots = set(slots_of(command_keys(args)))
        if len(slots) > 1:
            raise CrossSlotTransactionError(f"{name} names keys of {len(slots)} hash slots")
        if (self._watching or name in self.IMMEDIATE_EXECUTE_COMMANDS) and not (
            self._explicit_transaction
        ):
            if name == "WATCH":
                self._validate_watch()  # type: ignore[no-untyped-call]
            if slots and self._pipeline_slots and not slots <= self._pipeline_slots:
                raise CrossSlotTransactionError("Cannot watch or send commands on different slots")
            if not slots and name not in self.NO_SLOTS_COMMANDS:
                raise RedisClusterException(f"no key to route {name} in a transaction")
            self._pipeline_slots |= slots
            pending = self._immediate_execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
            return self._learnt_then(pending)
        self._pipeline_slots |= slots
        return AbstractStrategy.execute_command(self, *args, **kwargs)

    async def _learnt_then(self, command: Awaitable[Any]) -> Any:
        client = self._pipe.cluster_client
        if client._initialize:
            await client.initialize()
        return await command


class _CountingClusterPipeline(ClusterPipeline):
    def __init__(self, client: RedisCluster, transaction: bool | None = None) -> None:
        super().__init__(client, transaction)
        if transaction:
            self._execution_strategy = _TransactionStrategy(self)

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        if self.cluster_client._initialize:
            await self.cluster_client.initialize()
        try:
            return await super().execute(raise_on_error, allow_redirections)
        except AttributeError as exc:
            if _is_torn(exc):
                raise _torn(exc) from exc
            raise


class CountingRedisCluster(RedisCluster):
    """``redis.asyncio.RedisCluster`` counting round trips like :class:`CountingRedis`
    (a pipeline counts once, though the cluster client sends one per node it spans)."""

    round_trips: int = 0

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        self.round_trips += 1
        if self._initialize:
            # Learn the slot map before routing: redis-py routes the first commands of
            # a fresh client (many at once, from a pool's participations) to nodes its
            # own initialization then closes under them ("Connection lost", a
            # connection without a writer). initialize() is locked and idempotent.
            await self.initialize()
        try:
            return await super().execute_command(*args, **kwargs)
        except AttributeError as exc:
            if _is_torn(exc):
                raise _torn(exc) from exc
            raise

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        self.round_trips += 1
        if shard_hint:
            return super().pipeline(transaction=transaction, shard_hint=shard_hint)
        return _CountingClusterPipeline(self, transaction)  # type: ignore[abstract]  # as redis-py does


def connection_options(client: RedisClient) -> dict[str, Any]:
    """The options ``client``'s connections are made with (``socket_timeout``...)."""
    if isinstance(client, RedisCluster):
        return dict(client.connection_kwargs)
    return dict(client.connection_pool.connection_kwargs)


def clone(client: RedisClient, **overrides: Any) -> RedisClient:
    """A new client of the same server or cluster as ``client``, with its own
    connections made with ``overrides`` (e.g. a longer ``socket_timeout`` for blocking
    calls); close it with ``aclose``."""
    if isinstance(client, RedisCluster):
        kwargs = {**connection_options(client), **overrides}
        known = client.get_nodes() or list(client.nodes_manager.startup_nodes.values())
        seeds = [ClusterNode(n.host, n.port) for n in known]
        cls = type(client)
        return cls(startup_nodes=seeds, **_cluster_kwargs(kwargs))
    pool = client.connection_pool
    kwargs = {
        k: v
        for k, v in pool.connection_kwargs.items()
        if not k.startswith(("maint_notifications", "orig_"))
    }
    kwargs.update(overrides)
    new_pool = type(pool)(
        connection_class=pool.connection_class, max_connections=pool.max_connections, **kwargs
    )
    return type(client)(connection_pool=new_pool)


def _cluster_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The connection options the cluster client's constructor takes again."""
    accepted = set(inspect.signature(RedisCluster.__init__).parameters) - {"host", "port", "self"}
    out = {k: v for k, v in kwargs.items() if k in accepted}
    if kwargs.get("connection_class") is SSLConnection:
        out["ssl"] = True
    return out


async def server_ms(client: RedisClient) -> int:
    """The server's clock (``TIME``) in milliseconds: what retention, repair and lease
    decisions compare with, never the caller's clock."""
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def is_cluster(client: RedisClient) -> bool:
    return isinstance(client, RedisCluster)


def is_cluster_url(url: str) -> bool:
    """True for ``redis+cluster://`` URLs, and for any URL with ``AIRUNTIME_REDIS_CLUSTER=1``."""
    if url.startswith(f"{CLUSTER_SCHEME}://"):
        return True
    return os.environ.get(CLUSTER_ENV, "").strip().lower() in {"1", "true", "yes"}


def _cluster(url: str, options: dict[str, Any]) -> CountingRedisCluster:
    """``redis+cluster://[user:pass@]h:p[,h:p...][?option=value]`` or a plain URL."""
    if not url.startswith(f"{CLUSTER_SCHEME}://"):
        client = CountingRedisCluster.from_url(url, **options)
        assert isinstance(client, CountingRedisCluster)
        return client
    parts = urlsplit(url)
    seeds = parts.netloc.rsplit("@", 1)[-1]
    if parts.username:
        options.setdefault("username", parts.username)
    if parts.password:
        options.setdefault("password", parts.password)
    nodes: list[ClusterNode] = []
    for seed in seeds.split(","):
        host, sep, port = seed.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise RedisUrlError(
                f"redis+cluster URL seed {seed!r} is not host:port (in {redacted(url)!r})"
            )
        nodes.append(ClusterNode(host, int(port)))
    options.update(dict(parse_qsl(parts.query)))
    return CountingRedisCluster(startup_nodes=nodes, **options)


def _packing_with_hiredis(client: CountingRedisCluster) -> CountingRedisCluster:
    """The cluster client's connections pack with hiredis (as :func:`use_hiredis_packing`
    makes a standalone client's): its constructor takes no connection class, so the
    one its nodes are made with is replaced, for the seeds and for nodes learnt later."""
    cls = hiredis_connection_class(client.connection_kwargs.get("connection_class", Connection))
    client.connection_kwargs["connection_class"] = cls
    for node in client.startup_nodes:
        node.connection_class = cls
    return client


class RedisUrlError(ValueError):
    """A Redis URL airuntime cannot use (its scheme, its seeds); the message names the
    URL without its password."""


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def connect(url: str, **options: Any) -> CountingRedis | CountingRedisCluster:
    """A client for ``url`` (``redis://``, ``rediss://``, ``unix://``, or a cluster: see
    the module doc); bytes replies; commands packed by hiredis
    (:mod:`airuntime.core.resp_packing`). :class:`RedisUrlError` for a URL it cannot
    use (nothing is connected before the first command)."""
    try:
        return _connect(url, options)
    except RedisUrlError:
        raise
    except ValueError as exc:  # redis-py's own URL checks (scheme, port, options)
        raise RedisUrlError(
            f"invalid Redis URL {redacted(url)!r}: {exc} "
            f"(a cluster: {CLUSTER_SCHEME}://host:port[,host:port...])"
        ) from None


def _connect(url: str, options: dict[str, Any]) -> CountingRedis | CountingRedisCluster:
    options.setdefault("health_check_interval", 30)
    if not url.startswith("unix:"):
        options.setdefault("socket_keepalive", True)
    if is_cluster_url(url):
        options.pop("db", None)
        # redis-py's cluster client caps connections per node (100 by default) and
        # treats hitting the cap as a connection error, which drops the node's other
        # connections mid-command; a pool of many slots exceeds 100 calls in flight.
        options.setdefault("max_connections", CLUSTER_MAX_CONNECTIONS)
        return _packing_with_hiredis(_cluster(url, options))
    # As Redis.from_url, with the lean pool (airuntime.core.connection_pool).
    client = CountingRedis(connection_pool=LeanConnectionPool.from_url(url, **options))
    client.auto_close_connection_pool = True
    use_hiredis_packing(client)
    return client
