"""Which Redis failures pass by themselves, and how a runtime waits them out.

Why this module exists: a participation (the task running one execution on an
instance) is not a loop the supervisor can restart -- it holds the run's place, its
workers and its step-slot evidence. When Redis restarts, fails over or drops the
connection for a while, the participation must keep its place and retry what it was
doing (every step of it is idempotent: creating the execution, joining it, finishing
the run), so that the run is marked finished once Redis is back. Anything else (an
engine refusal, a bug) is not waited out: it fails the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from airuntime.core.supervision import Backoff
from airuntime.core.tasks import raise_if_cancelling

__all__ = ["TRANSIENT_ERRORS", "retry_transient"]

log = logging.getLogger(__name__)

T = TypeVar("T")

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError,  # refused, reset, closed; also BusyLoadingError (AOF loading)
    RedisTimeoutError,
    ReadOnlyError,  # a replica answering during a failover
)
"""Redis errors that end when the server is reachable (and writable) again."""

RETRY_BACKOFF = Backoff(initial=0.05, maximum=2.0)
"""Between two attempts: bounded, so a participation notices Redis back within ~2 s."""


async def retry_transient(
    what: str,
    attempt: Callable[[], Awaitable[T]],
    *,
    backoff: Backoff = RETRY_BACKOFF,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """``await attempt()`` until it does not fail with a transient Redis error.

    ``attempt`` must be safe to repeat. The first failure of an outage is logged with
    ``what``; the recovery once more. Cancellation ends the wait at once.
    """
    failures = 0
    while True:
        try:
            result = await attempt()
        except TRANSIENT_ERRORS as exc:
            raise_if_cancelling()  # a stop that surfaced as a connection error
            failures += 1
            if failures == 1:
                log.warning("%s: Redis unavailable (%s); retrying", what, exc)
            if on_retry is not None:
                on_retry(exc)
            await asyncio.sleep(backoff.delay(failures))
            continue
        if failures:
            log.warning("%s: Redis back after %d failed attempts", what, failures)
        return result
