"""FIFO admission control for step handlers on one runtime instance.

Why this exists: a runtime instance runs step handlers for many executions at once, and
without a bound a burst of ready steps (one wide fan-out, or many executions arriving
together) starts every handler immediately and oversubscribes CPU, memory or downstream
services.  ``max_concurrent_step_tasks`` lets an operator bound how many step handlers
execute concurrently *across all executions* on the instance.  The default ``0`` keeps the
previous behaviour (no bound).

One :class:`StepSlotController` is owned by the runtime instance and shared by every code
path that invokes a step handler::

    async with controller.slot(execution_id):
        result = await handler(ctx)

Admission rules:

* FIFO by arrival across all executions (not round-robin per execution): a later arrival
  never bypasses an earlier queued waiter, even when capacity frees up at that instant.
* Raising the limit admits queued waiters immediately (each waiter owns a future that is
  resolved on grant; nothing polls).  Lowering it never pre-empts running handlers: the
  active count may temporarily exceed the new limit and new admissions wait until it falls
  below.  ``0`` lifts the cap and admits every waiter without replacing the controller.
* Cancelling a queued waiter removes only that waiter.  A waiter granted a slot at the same
  instant it was cancelled gives the slot back, so capacity never leaks.
* Every outcome of the body (return, ``Exception``, other ``BaseException``, cancellation)
  releases the slot; the exception propagates unchanged.
* :meth:`StepSlotController.shutdown` closes admission: queued waiters and new ``slot()``
  calls raise :class:`SlotControllerClosed`, while already running handlers drain
  (:meth:`StepSlotController.drained`).

Scope and limits: only code inside ``slot()`` is counted, so orchestration that awaits
slotted work must not itself hold a slot.  Slots are not re-entrant: a handler that holds a
slot and awaits more slotted work on the same controller can exhaust the slots (with a
limit of one it waits forever).  The controller imposes no queue-size, memory or
cluster-wide limit and does not control threads or processes a handler starts itself.

Per-execution :class:`SlotEvidence` (versioned, JSON-serialisable) records admissions,
outcomes and summed queue/execution time.  Records accumulate until the owner calls
:meth:`StepSlotController.pop_evidence` when the execution finishes (or is rolled back).

The controller is not thread-safe: use it from a single asyncio event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Literal, NoReturn

__all__ = [
    "SETTING_NAME",
    "AdmitHook",
    "Outcome",
    "ReleaseHook",
    "SlotControllerClosed",
    "SlotEvidence",
    "StepSlot",
    "StepSlotController",
    "validate_limit",
]

_log = logging.getLogger(__name__)

SETTING_NAME: Final = "max_concurrent_step_tasks"
"""Name of the instance setting that configures the limit (see ``settings_store``)."""

Outcome = Literal["succeeded", "failed", "cancelled"]
AdmitHook = Callable[[str, float], None]
"""``on_admit(execution_id, wait_s)``: called when a slot is granted."""
ReleaseHook = Callable[[str, Outcome, float], None]
"""``on_release(execution_id, outcome, exec_s)``: called when a granted slot is released."""


class SlotControllerClosed(RuntimeError):
    """Raised for queued and new step tasks once the controller has been shut down."""

    def __init__(self, execution_id: str) -> None:
        super().__init__(
            f"step slot controller is shut down: step task for execution {execution_id!r} "
            "was not admitted (the runtime instance is stopping)"
        )
        self.execution_id = execution_id


def validate_limit(value: object) -> int:
    """Return ``value`` as a limit, or raise ``ValueError`` naming the setting and value.

    Accepts ``int`` values ``>= 0`` only (``bool`` is rejected even though it is an ``int``).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{SETTING_NAME} must be an integer >= 0, got {value!r}")
    return value


@dataclass(slots=True)
class SlotEvidence:
    """Versioned admission evidence for one execution.

    Every attempt to enter a slot ends in exactly one of ``succeeded``, ``failed`` or
    ``cancelled``; ``admitted`` counts the attempts that acquired a slot (including ones
    that later failed or were cancelled).  Time sums may exceed wall-clock time when step
    tasks overlap.
    """

    version: int = 1
    admitted: int = 0
    """Tasks that acquired a slot, including subsequently failed/cancelled ones."""
    succeeded: int = 0
    """Bodies that returned without an observed cancellation."""
    failed: int = 0
    """Bodies that raised (excluding cancellation), plus admissions refused by shutdown."""
    cancelled: int = 0
    """Tasks cancelled while queued or while running."""
    queue_ns: int = 0
    """Sum of time spent waiting for admission, including cancelled and refused waits."""
    execution_ns: int = 0
    """Sum of time slots were held (grant to release)."""

    def to_dict(self) -> dict[str, int]:
        # By hand: dataclasses.asdict deep-copies field by field (tens of µs, twice a
        # run); tests/runtime/test_step_slots.py checks it names every field.
        return {
            "version": self.version,
            "admitted": self.admitted,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "queue_ns": self.queue_ns,
            "execution_ns": self.execution_ns,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


@dataclass(slots=True, eq=False)
class _Waiter:
    execution_id: str
    future: asyncio.Future[int]
    """Resolved with the grant timestamp (ns), or with ``SlotControllerClosed``."""
    arrived_ns: int


class StepSlot(AbstractAsyncContextManager[None]):
    """One admission of one step task; returned by :meth:`StepSlotController.slot`."""

    __slots__ = ("_cancelling", "_controller", "_entered", "_execution_id", "_granted_ns")

    def __init__(self, controller: StepSlotController, execution_id: str) -> None:
        self._controller = controller
        self._execution_id = execution_id
        self._entered = False
        self._granted_ns: int | None = None
        self._cancelling = 0

    async def __aenter__(self) -> None:
        if self._entered:
            raise RuntimeError("a StepSlot can be entered only once; call slot() again")
        self._entered = True
        self._granted_ns = await self._controller._acquire(self._execution_id)
        task = asyncio.current_task()
        self._cancelling = task.cancelling() if task is not None else 0

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        granted_ns = self._granted_ns
        if granted_ns is None:  # pragma: no cover - __aexit__ only runs after __aenter__
            return
        self._granted_ns = None
        outcome: Outcome
        if exc is None:
            # A cancellation requested while the body ran but swallowed by it still
            # prevents the task from counting as a success.
            task = asyncio.current_task()
            observed = task is not None and task.cancelling() > self._cancelling
            outcome = "cancelled" if observed else "succeeded"
        elif isinstance(exc, asyncio.CancelledError):
            outcome = "cancelled"
        else:
            outcome = "failed"
        self._controller._release(self._execution_id, outcome, granted_ns)
        # Returning None never suppresses the body's exception.


class StepSlotController:
    """Bounds concurrently executing step handlers with FIFO admission (see module doc)."""

    def __init__(
        self,
        limit: int = 0,
        *,
        on_admit: AdmitHook | None = None,
        on_release: ReleaseHook | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        """``clock`` returns monotonic nanoseconds (injectable for deterministic tests)."""
        self._limit = validate_limit(limit)
        self._active = 0
        self._waiters: deque[_Waiter] = deque()
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._evidence: dict[str, SlotEvidence] = {}
        self._on_admit = on_admit
        self._on_release = on_release
        self._clock = clock

    # -- configuration -----------------------------------------------------------------

    @property
    def limit(self) -> int:
        """Current limit; ``0`` means unlimited."""
        return self._limit

    def set_limit(self, limit: int) -> None:
        """Change the limit live.

        Raising it (or setting ``0``) admits queued waiters immediately; lowering it never
        pre-empts running handlers.  Invalid values raise ``ValueError`` and leave the
        current limit unchanged.
        """
        self._limit = validate_limit(limit)
        self._wake()

    # -- introspection -----------------------------------------------------------------

    @property
    def active(self) -> int:
        """Slots currently granted (may exceed ``limit`` right after it was lowered)."""
        return self._active

    @property
    def queued(self) -> int:
        """Step tasks waiting for a slot (a cancelled waiter leaves when its task next runs)."""
        return len(self._waiters)

    @property
    def closed(self) -> bool:
        return self._closed

    def evidence(self, execution_id: str) -> SlotEvidence:
        """A copy of the evidence recorded for ``execution_id`` (empty if none)."""
        record = self._evidence.get(execution_id)
        return dataclasses.replace(record) if record is not None else SlotEvidence()

    def pop_evidence(self, execution_id: str) -> SlotEvidence:
        """Remove and return the evidence for ``execution_id`` (empty if none).

        Call when the execution finishes or is rolled back; records are kept until then.
        """
        return self._evidence.pop(execution_id, None) or SlotEvidence()

    # -- admission ---------------------------------------------------------------------

    def slot(self, execution_id: str) -> StepSlot:
        """Context manager holding one slot for a step task of ``execution_id``.

        Raises :class:`SlotControllerClosed` immediately if the controller is shut down
        (and on entry if it is shut down before or while waiting).
        """
        if self._closed:
            self._refuse(execution_id, self._clock())
        return StepSlot(self, execution_id)

    def shutdown(self) -> None:
        """Close admission: wake queued waiters with :class:`SlotControllerClosed`.

        Running handlers are not interrupted; await :meth:`drained` to wait for them.
        Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        waiters = list(self._waiters)
        self._waiters.clear()
        for waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_exception(SlotControllerClosed(waiter.execution_id))

    async def wait_idle(self) -> None:
        """Return once no slot is held (``active == 0``)."""
        while self._active > 0:
            await self._idle.wait()

    async def drained(self) -> None:
        """Await running handlers after :meth:`shutdown` (same as :meth:`wait_idle`)."""
        await self.wait_idle()

    # -- internals (used by StepSlot) --------------------------------------------------

    def _has_capacity(self) -> bool:
        return self._limit == 0 or self._active < self._limit

    def _record(self, execution_id: str) -> SlotEvidence:
        record = self._evidence.get(execution_id)
        if record is None:
            record = self._evidence[execution_id] = SlotEvidence()
        return record

    def _refuse(self, execution_id: str, arrived_ns: int) -> NoReturn:
        record = self._record(execution_id)
        record.failed += 1
        record.queue_ns += self._clock() - arrived_ns
        raise SlotControllerClosed(execution_id)

    async def _acquire(self, execution_id: str) -> int:
        arrived_ns = self._clock()
        if self._closed:
            self._refuse(execution_id, arrived_ns)
        # Waiters are granted eagerly whenever capacity exists, so a non-empty queue means
        # there is no capacity for a newcomer either: it must queue behind them.
        if not self._waiters and self._has_capacity():
            return self._grant(execution_id, arrived_ns)
        waiter = _Waiter(execution_id, asyncio.get_running_loop().create_future(), arrived_ns)
        self._waiters.append(waiter)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._abandon(waiter)
            raise
        except SlotControllerClosed:
            record = self._record(execution_id)
            record.failed += 1
            record.queue_ns += self._clock() - arrived_ns
            raise

    def _abandon(self, waiter: _Waiter) -> None:
        """Clean up after a waiter whose task was cancelled."""
        future = waiter.future
        if future.done() and not future.cancelled():
            if future.exception() is None:
                # Granted at the same instant it was cancelled: the slot is ours, give it
                # back (recorded as admitted + cancelled) so capacity does not leak.
                self._release(waiter.execution_id, "cancelled", future.result())
                return
            # Shutdown raced the cancellation; the exception was retrieved above and the
            # task reports cancellation.
        else:
            future.cancel()
            with suppress(ValueError):  # already skipped by _wake()
                self._waiters.remove(waiter)
        record = self._record(waiter.execution_id)
        record.cancelled += 1
        record.queue_ns += self._clock() - waiter.arrived_ns

    def _grant(
        self, execution_id: str, arrived_ns: int, future: asyncio.Future[int] | None = None
    ) -> int:
        now = self._clock()
        self._active += 1
        self._idle.clear()
        record = self._record(execution_id)
        record.admitted += 1
        record.queue_ns += now - arrived_ns
        if future is not None:
            # Resolve before running the hook: the slot is owned from here on, so even a
            # hook that cancels the waiter's task leads to a clean give-back.
            future.set_result(now)
        if self._on_admit is not None:
            self._call_hook(self._on_admit, execution_id, (now - arrived_ns) / 1e9)
        return now

    def _release(self, execution_id: str, outcome: Outcome, granted_ns: int) -> None:
        now = self._clock()
        self._active -= 1
        record = self._record(execution_id)
        if outcome == "succeeded":
            record.succeeded += 1
        elif outcome == "failed":
            record.failed += 1
        else:
            record.cancelled += 1
        record.execution_ns += now - granted_ns
        if self._on_release is not None:
            self._call_hook(self._on_release, execution_id, outcome, (now - granted_ns) / 1e9)
        self._wake()
        if self._active == 0:
            self._idle.set()

    def _wake(self) -> None:
        while self._waiters and self._has_capacity():
            waiter = self._waiters.popleft()
            if waiter.future.done():
                # Cancelled, but its task has not run its cleanup yet; skip it.
                continue
            self._grant(waiter.execution_id, waiter.arrived_ns, waiter.future)

    @staticmethod
    def _call_hook(hook: Callable[..., None], *args: object) -> None:
        # A failing metrics hook must never leak or double-release a slot.
        try:
            hook(*args)
        except Exception:
            _log.exception("step slot metrics hook %r failed", hook)
