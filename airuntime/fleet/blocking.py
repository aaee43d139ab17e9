"""How long a blocking Redis call may block on a given client.

Why this module exists: redis-py gives every connection a socket timeout (5 s by
default); a blocking command (``XREADGROUP BLOCK``, ``BLPOP``) that blocks longer than
that fails with ``TimeoutError`` although nothing is wrong, and a loop that does not
expect it dies. Callers that block therefore block in slices shorter than the client's
socket timeout, whatever that client was configured with.
"""

from __future__ import annotations

from airuntime.core.redis_client import RedisClient, connection_options

__all__ = ["block_slice_s"]

_MIN_SLICE_S = 0.01


def block_slice_s(redis: RedisClient, wanted_s: float) -> float:
    """At most ``wanted_s``, and at most half the socket timeout of ``redis``'s
    connections (no timeout configured: ``wanted_s``)."""
    timeout = connection_options(redis).get("socket_timeout")
    if timeout is None:
        return max(_MIN_SLICE_S, wanted_s)
    return max(_MIN_SLICE_S, min(wanted_s, float(timeout) / 2))
