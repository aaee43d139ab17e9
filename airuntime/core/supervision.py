"""Supervised background loops: a fault never stops one for good, and never silently.

Why this module exists: every process of airuntime runs loops in the background (the
control plane's pump, scale-out watcher, requeuer and discovery heartbeat; a runtime
instance's controller, heartbeat, capacity publisher, inbox reader, adoption and
assistance). Redis restarts, a frozen peer makes a blocking call outlive its socket
timeout, a network drops: a loop written as ``while True: ...`` dies with the first
exception, and nothing notices while the process goes on reporting itself ready.

A :class:`Supervisor` owns named loops. Each loop is an ``async`` function taking a
:class:`LoopContext`; it calls :meth:`LoopContext.ok` after each iteration that
succeeded. When the function raises (anything but cancellation) or returns, the
supervisor logs it with the loop's name, counts it, waits a backoff with jitter
(:class:`Backoff`: exponential, capped, randomised so that many processes recovering
from the same outage do not retry in step) and starts the function again. A loop is
*healthy* once it has reported an ``ok()`` since its last failure; ``/readyz`` of every
process reports :meth:`Supervisor.unhealthy` and fails while any loop is unhealthy.

Loops keep no state across a restart that they cannot rebuild from Redis: a restart
is the recovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from airuntime.core.tasks import cancel_and_wait, raise_if_cancelling

__all__ = [
    "Backoff",
    "LoopContext",
    "LoopHealth",
    "LoopState",
    "Supervisor",
    "log_task_failure",
]

log = logging.getLogger(__name__)

Loop = Callable[["LoopContext"], Awaitable[None]]
ErrorHook = Callable[[str, BaseException], None]


class LoopState(StrEnum):
    """Where a supervised loop is; transitions: STARTING -> RUNNING <-> BACKING_OFF,
    any -> STOPPED (supervisor stopped)."""

    STARTING = "starting"
    RUNNING = "running"
    BACKING_OFF = "backing_off"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff with full jitter (seconds).

    ``delay(n)`` for the n-th consecutive failure (n >= 1) is uniform in
    ``[initial, min(maximum, initial * factor**(n-1))]``.
    """

    initial: float = 0.05
    """First delay's lower bound, seconds."""
    maximum: float = 2.0
    """Upper bound of every delay, seconds: bounds the recovery time after an outage."""
    factor: float = 2.0

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        try:
            grown = self.initial * self.factor ** max(0, failures - 1)
        except OverflowError:
            # factor ** n leaves the floats past ~1,024 failures in a row (2.0): an
            # outage of ~20 minutes at a 2 s cap. The cap was reached long before.
            grown = self.maximum
        ceiling = min(self.maximum, grown)
        return (rng or random).uniform(self.initial, max(self.initial, ceiling))


@dataclass
class LoopHealth:
    """What the supervisor knows about one loop (shown by ``/readyz``)."""

    name: str
    state: LoopState = LoopState.STARTING
    healthy: bool = False
    errors: int = 0
    """Failures since the supervisor started."""
    consecutive_errors: int = 0
    restarts: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    last_ok_at: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "healthy": self.healthy,
            "errors": self.errors,
            "consecutive_errors": self.consecutive_errors,
            "restarts": self.restarts,
            "last_error": self.last_error,
            "seconds_since_ok": (
                round(time.monotonic() - self.last_ok_at, 3) if self.last_ok_at else None
            ),
        }


@dataclass
class LoopContext:
    """Handed to a loop function: report progress with :meth:`ok`."""

    health: LoopHealth
    owner: str = ""
    """Who runs the loop (the supervisor's owner), for the recovery log line."""
    _first_ok: asyncio.Event = field(default_factory=asyncio.Event)

    def ok(self) -> None:
        """One iteration succeeded: the loop is healthy and its backoff resets. Raises
        ``CancelledError`` instead when the loop's task was asked to stop meanwhile
        (:func:`~airuntime.core.tasks.raise_if_cancelling`)."""
        raise_if_cancelling()
        h = self.health
        if h.consecutive_errors:
            log.warning(
                "%s: loop %s recovered after %d failures", self.owner, h.name, h.consecutive_errors
            )
        h.healthy = True
        h.state = LoopState.RUNNING
        h.consecutive_errors = 0
        h.last_ok_at = time.monotonic()
        self._first_ok.set()


class Supervisor:
    """Runs named loops forever: restart with backoff on failure, report health."""

    def __init__(
        self,
        owner: str,
        *,
        backoff: Backoff | None = None,
        on_error: ErrorHook | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.owner = owner
        self.backoff = backoff or Backoff()
        self.on_error = on_error
        self._rng = rng
        self.loops: dict[str, LoopHealth] = {}
        self._contexts: dict[str, LoopContext] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, name: str, loop: Loop) -> asyncio.Task[None]:
        """Run ``loop`` under supervision as ``name`` (unique per supervisor)."""
        if name in self._tasks and not self._tasks[name].done():
            raise ValueError(f"{self.owner}: a loop named {name!r} is already running")
        health = LoopHealth(name)
        ctx = LoopContext(health, self.owner)
        self.loops[name] = health
        self._contexts[name] = ctx
        task = asyncio.create_task(self._supervise(name, loop, ctx), name=f"{self.owner}:{name}")
        # Supervision itself failing (a bug here, not in the loop) is logged, never
        # silent; the loop then stays unhealthy in the report.
        task.add_done_callback(log_task_failure)
        self._tasks[name] = task
        return task

    async def wait_ok(self, name: str) -> None:
        """Wait until the loop ``name`` reported its first ``ok()``."""
        await self._contexts[name]._first_ok.wait()

    def unhealthy(self) -> list[str]:
        """Names of the loops that are not healthy right now."""
        return [n for n, h in self.loops.items() if not h.healthy]

    def report(self) -> dict[str, dict[str, Any]]:
        return {n: h.as_dict() for n, h in self.loops.items()}

    async def stop(self) -> None:
        """Cancel every loop and wait until each has really ended."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        await cancel_and_wait(tasks)
        for h in self.loops.values():
            h.state = LoopState.STOPPED
            h.healthy = False

    async def _supervise(self, name: str, loop: Loop, ctx: LoopContext) -> None:
        health = ctx.health
        while True:
            try:
                await loop(ctx)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise_if_cancelling()  # a stop that surfaced as an error is a stop
                self._failed(name, health, exc)
            else:
                self._failed(name, health, RuntimeError("the loop returned; restarting it"))
            await asyncio.sleep(self.backoff.delay(health.consecutive_errors, self._rng))
            health.restarts += 1

    def _failed(self, name: str, health: LoopHealth, exc: BaseException) -> None:
        health.errors += 1
        health.consecutive_errors += 1
        health.healthy = False
        health.state = LoopState.BACKING_OFF
        health.last_error = f"{type(exc).__name__}: {exc}"
        health.last_error_at = time.monotonic()
        # Logged once per outage (with the traceback), and once when it recovers
        # (LoopContext.ok); the repeats in between only at debug level.
        if health.consecutive_errors == 1:
            log.warning(
                "%s: loop %s failed; restarting with backoff", self.owner, name, exc_info=exc
            )
        else:
            log.debug(
                "%s: loop %s failed again (%d in a row): %s",
                self.owner,
                name,
                health.consecutive_errors,
                health.last_error,
            )
        if self.on_error is not None:
            with contextlib.suppress(Exception):
                self.on_error(name, exc)


def log_task_failure(task: asyncio.Task[Any]) -> None:
    """A done-callback for tasks that are not supervised loops: no task dies silently."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("task %s failed", task.get_name(), exc_info=exc)
