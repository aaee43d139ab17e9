"""How long a blocking Redis call may block on a given client.

Why this module exists: redis-py gives every connection a socket timeout (5 s by
default); a blocking command (``XREADGROUP BLOCK``, ``BLPOP``) that blocks longer than
that fails with ``TimeoutError`` although nothing is wrong, and a loop that does not
expect it dies. Callers that block therefore block in slices shorter than the client's
socket timeout, whatever that client was configured with.

A failover ends blocked commands too: a master that turns replica answers each with
``UNBLOCKED ...`` (nothing was delivered). :func:`unless_unblocked` turns that into an
empty reply, so the caller simply blocks again (the next call follows the MOVED to the
new master) instead of failing its loop.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from redis.exceptions import ResponseError

from airuntime.core.redis_client import RedisClient, connection_options

__all__ = ["block_slice_s", "unless_unblocked"]

T = TypeVar("T")

log = logging.getLogger(__name__)

_UNBLOCKED: Final = "UNBLOCKED"
"""The error a server answers a blocked command with when it turns from master to
replica (``UNBLOCKED force unblock from blocking operation, instance state changed``)."""

_MIN_SLICE_S = 0.01


def block_slice_s(redis: RedisClient, wanted_s: float) -> float:
    """At most ``wanted_s``, and at most half the socket timeout of ``redis``'s
    connections (no timeout configured: ``wanted_s``)."""
    timeout = connection_options(redis).get("socket_timeout")
    if timeout is None:
        return max(_MIN_SLICE_S, wanted_s)
    return max(_MIN_SLICE_S, min(wanted_s, float(timeout) / 2))


async def unless_unblocked(call: Callable[[], Awaitable[T]], what: str) -> T | None:
    """``await call()`` (a blocking command); None when a role change (a failover) ended
    it with nothing delivered: block again."""
    try:
        return await call()
    except ResponseError as exc:
        if not str(exc).startswith(_UNBLOCKED):
            raise
        log.info("%s unblocked by a role change; blocking again", what)
        return None
