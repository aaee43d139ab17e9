"""Redis errors that go away by themselves, and retrying a call through them.

Why this module exists: a Redis or Valkey server restarts, fails over or drops a
connection, and the client raises for every command in flight. For a worker those
commands carry work already done -- a finished step's completion, a failure report, a
lease renewal -- and dropping them on the first error turns a seconds-long outage into
lost work and a dead participation. :func:`retry_transient` retries such a call with the
capped, jittered :class:`~airuntime.core.supervision.Backoff` of the supervised loops
(so many workers coming back from one outage do not retry in step) until it succeeds,
fails for another reason, or a deadline passes (for work under a claim: the moment its
lease would have expired, after which another worker recovers the step anyway).

A retried script may already have run once (the connection dropped after the server
executed it, before the reply arrived); the execution scripts are written so that a
repeat is harmless (a repeated completion is a recognised duplicate, a repeated
failure or stop finds the step already moved on and changes nothing).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis import exceptions as redis_errors

from airuntime.core.supervision import Backoff
from airuntime.core.tasks import raise_if_cancelling

__all__ = ["TRANSIENT_ERRORS", "is_transient", "retry_transient"]

log = logging.getLogger(__name__)

T = TypeVar("T")

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    redis_errors.ConnectionError,  # includes BusyLoadingError (a restarted server loading)
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,  # talking to a former primary during a failover
    # Redis Cluster: slots without a live primary until a replica is promoted, a
    # multi-key call during a slot migration, a slot map not refreshed yet.
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
    redis_errors.SlotNotCoveredError,
    ConnectionError,
)
"""Errors after which the same call may succeed once the server is back."""


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT_ERRORS)


async def retry_transient(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    backoff: Backoff,
    deadline: float | None = None,
    on_error: Callable[[BaseException], None] | None = None,
    rng: random.Random | None = None,
) -> T:
    """``await call()`` until it returns; on a transient error wait ``backoff`` and call
    again. ``deadline`` (``loop.time()``; None = no limit): no new attempt starts after
    it, the last error is raised instead. Other errors propagate at once. ``on_error``
    sees every transient error (counting, metrics)."""
    loop = asyncio.get_running_loop()
    failures = 0
    while True:
        try:
            result = await call()
        except TRANSIENT_ERRORS as exc:
            raise_if_cancelling()  # a stop that surfaced as a connection error
            failures += 1
            if on_error is not None:
                on_error(exc)
            delay = backoff.delay(failures, rng)
            if deadline is not None and loop.time() + delay > deadline:
                log.warning("%s: giving up after %d attempts: %s", what, failures, exc)
                raise
            level = logging.WARNING if failures == 1 else logging.DEBUG
            log.log(level, "%s failed (%s); retrying in %.2f s", what, exc, delay)
            await asyncio.sleep(delay)
            continue
        if failures:
            log.warning("%s: Redis back after %d failed attempts", what, failures)
        return result
