"""Which Redis a process uses, and what server it is.

Why this exists: every ``airt`` entry point takes an optional ``--redis-url``; without
one it uses ``AIRUNTIME_REDIS_URL``, and without that a private embedded server
(:class:`~airuntime.devstack.embedded.EmbeddedServer`) that lives as long as the
process. That choice is made here, once, for all of them:

* :func:`redis_for_process` - *synchronous* context manager yielding a URL: the
  value given or of ``AIRUNTIME_REDIS_URL`` if set, else the URL of an embedded server
  that lives for the duration of the block (and, should it exit before the block
  ends, interrupts the process and raises :class:`EmbeddedServerLost` with the reason:
  a process whose only store is gone must not keep retrying against it).
* :func:`default_embedded_server` - that embedded server, as it is started: on a unix
  socket in a private directory (mode 700), not a loopback TCP port. A loopback port
  without a password is open to every local user and process of the machine, and the
  server holds every tenant's state; the socket is reachable by this user only. It
  is also the shorter path: a 2,000-step chain, one round trip a step, ran ~7 %
  faster over it (4,330 -> 4,660 steps/s, means of seven alternated pairs).
* :func:`open_redis` - a client (:func:`airuntime.core.redis_client.connect`) for an
  explicit URL or ``AIRUNTIME_REDIS_URL``, checked with PING.
* :func:`server_info_version` - ``("valkey", "8.1.8")`` / ``("redis", "7.0.15")``
  from ``INFO server``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import redis

from airuntime.core.redis_client import RedisClient, connect
from airuntime.core.settings import REDIS_URL_ENV
from airuntime.devstack.embedded import EmbeddedServer, EmbeddedServerError, EmbeddedServerLost

__all__ = [
    "EmbeddedServerLost",
    "default_embedded_server",
    "open_redis",
    "parse_server_version",
    "redis_for_process",
    "resolve_redis_url",
    "server_info_version",
]

_LOG = logging.getLogger(__name__)


def resolve_redis_url(url: str | None = None) -> str | None:
    """``url`` if given, else ``$AIRUNTIME_REDIS_URL`` (empty/blank counts as unset)."""
    if url:
        return url
    env = os.environ.get(REDIS_URL_ENV, "").strip()
    return env or None


async def open_redis(
    url: str | None = None, *, decode_responses: bool = False, **kwargs: Any
) -> RedisClient:
    """Connect to ``url`` (or ``$AIRUNTIME_REDIS_URL``) and return a checked client.

    The client is PINGed before it is returned, so a wrong URL fails here with the
    URL in the message.  The caller owns it and must ``await client.aclose()``.
    Raises :class:`EmbeddedServerError` if neither a URL nor the env var is given
    (use :func:`redis_for_process` to fall back to an embedded server).
    """
    resolved = resolve_redis_url(url)
    if resolved is None:
        raise EmbeddedServerError(
            f"no Redis URL: pass one or set {REDIS_URL_ENV} (or use redis_for_process())"
        )
    client = connect(resolved, decode_responses=decode_responses, **kwargs)
    try:
        await client.ping()
    except BaseException as exc:
        await client.aclose()
        if isinstance(exc, redis.RedisError):
            raise EmbeddedServerError(f"cannot reach Redis at {resolved}: {exc}") from exc
        raise
    return client


def default_embedded_server(**options: Any) -> EmbeddedServer:
    """The embedded server a process without a Redis URL starts (not yet started):
    ``options`` are :class:`EmbeddedServer` arguments; ``unix_socket`` defaults to
    True (see the module docstring)."""
    options.setdefault("unix_socket", True)
    return EmbeddedServer(**options)


@contextlib.contextmanager
def redis_for_process(url: str | None = None, **server_options: Any) -> Iterator[str]:
    """Synchronous context manager yielding the Redis URL this process should use.

    If ``url`` is given (e.g. a ``--redis-url`` option), or else
    ``$AIRUNTIME_REDIS_URL`` is set (non-empty), that value is yielded and nothing
    is started.  Otherwise :func:`default_embedded_server` (``server_options`` are its
    arguments) runs for the duration of the block.  Use it around
    ``asyncio.run(...)`` in entry points; inside a running loop prefer
    ``async with EmbeddedServer(...)`` (the sync form blocks the loop while the
    server starts, typically well under 100 ms).
    """
    given = resolve_redis_url(url)
    if given is not None:
        yield given
        return
    with default_embedded_server(**server_options) as server:
        watch = _ServerWatch(server)
        try:
            yield server.url
        except BaseException as exc:
            # The watch's interrupt, or an error the lost server caused first (a
            # command that gives up on a refused connection): the reason is the loss.
            lost = watch.stop()
            if lost is not None:
                raise EmbeddedServerLost(lost) from exc
            raise
        lost = watch.stop()
        if lost is not None:  # a command that stops on SIGINT and returns
            raise EmbeddedServerLost(lost)


_WATCH_INTERVAL_S = 0.5


class _ServerWatch:
    """Ends the process, with the reason, when its embedded server exits under it.

    The server is the process's only store: once it is gone (killed, out of memory)
    every call fails, and a command that retries (a supervised loop, a worker) would
    retry forever and answer 503 "retry later" for a server that will not come back
    -- with its data gone too, unless it was started with a data directory. So the
    watch (a daemon thread, checking every 0.5 s, reaping the process) records why,
    logs it and interrupts the main thread (SIGINT: ``airt up`` stops as on Ctrl-C,
    ``airt run`` is interrupted); :func:`redis_for_process` then raises
    :class:`EmbeddedServerLost` with that reason, which ``airt`` prints, exit 1.
    """

    def __init__(self, server: EmbeddedServer) -> None:
        self.server = server
        self.pid = server.pid
        self.lost: str | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="embedded-server-watch", daemon=True)
        self._thread.start()

    def stop(self) -> str | None:
        """Ends the watch (before the server is stopped on purpose: that exit is no
        loss); the reason the server was lost, if it was, seen now or by the watch."""
        with self._lock:
            self._stopping.set()
            self._lose()
        self._thread.join()
        return self.lost

    def _lose(self) -> bool:
        """Records the reason if the server has exited and none is recorded yet (under
        the lock); whether this call recorded it."""
        code = self.server.wait(0)
        if code is None or self.lost is not None:
            return False
        self.lost = self._reason(code)
        return True

    def _run(self) -> None:
        while not self._stopping.wait(_WATCH_INTERVAL_S):
            with self._lock:
                if self._stopping.is_set() or not self._lose():
                    continue
            _LOG.error("%s", self.lost)
            os.kill(os.getpid(), signal.SIGINT)
            return

    def _reason(self, code: int) -> str:
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        kept = self.server.data_dir
        data = (
            f"its data in {kept} is kept: start again with the same data directory"
            if kept is not None
            else "its data, held in memory only, is gone"
        )
        tail = self.server.log_tail().splitlines()[-3:]
        said = "; it last logged: " + " | ".join(tail) if tail else ""
        return f"the embedded Valkey (pid {self.pid}) exited unexpectedly ({how}); {data}{said}"


def parse_server_version(info: Mapping[Any, Any]) -> tuple[str, str]:
    """``(name, version)`` from an ``INFO server`` mapping.

    Valkey reports ``server_name:valkey`` and ``valkey_version`` (its
    ``redis_version`` is a compatibility value); Redis has only ``redis_version``.
    """
    norm = {
        (k.decode() if isinstance(k, bytes) else str(k)): (
            v.decode() if isinstance(v, bytes) else str(v)
        )
        for k, v in info.items()
    }
    name = norm.get("server_name", "redis") or "redis"
    version = norm.get(f"{name}_version") or norm.get("redis_version")
    if version is None:
        raise ValueError(f"INFO server has no version field: {sorted(norm)}")
    return name, version


def server_info_version(url: str, *, timeout: float = 5.0) -> tuple[str, str]:
    """``("valkey", "8.1.8")`` / ``("redis", "7.0.15")`` for the server at ``url``.

    Synchronous (usable from fixtures and CLIs); async code can use
    ``parse_server_version(await client.info("server"))``.
    """
    client = redis.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout, decode_responses=True
    )
    try:
        return parse_server_version(client.info("server"))
    finally:
        client.close()
