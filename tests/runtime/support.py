"""Helpers for the runtime instance tests: run requests, latched handlers, watchers.

Nothing here sleeps to synchronise: handlers block on ``asyncio.Event`` latches, and
tests wait on :class:`Signal` conditions that the code under test (through hooks and
handlers) notifies. Every wait has a generous deadline that only turns a hang into
a readable failure.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from airuntime.core.context import ExecutionContextSnapshot, current_context
from airuntime.engine.handlers import HandlerRegistry, StepContext
from airuntime.engine.store_results import LedgerEvent
from airuntime.fleet.registry import InstanceDescriptor
from airuntime.fleet.runs import RunRequest
from airuntime.fleet.tenancy import DEFAULT_ALLOWED_HANDLERS, TenantSettings
from runtime_pod.instance import RuntimeInstance

DEADLINE_S = 20.0
AIRT = str(Path(sys.executable).parent / "airt")


class Signal:
    """Something changed: waiters re-check their predicate (no polling, no sleeps)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait_for(
        self, predicate: Callable[[], bool], what: str, timeout: float = DEADLINE_S
    ) -> None:
        try:
            async with asyncio.timeout(timeout):
                while not predicate():
                    await self._event.wait()
        except TimeoutError:
            raise AssertionError(f"not reached within {timeout} s: {what}") from None


class Gate:
    """The ``gate`` handler: records who entered and blocks until released.

    ``entered`` lists ``<execution>/<step>`` in entry order; ``contexts`` keeps the
    execution context a handler saw; ``active``/``max_active`` count handlers inside
    the gate per execution, ``max_total`` across executions.
    """

    def __init__(self) -> None:
        self.signal = Signal()
        self.entered: list[str] = []
        self.finished: list[str] = []
        self.contexts: dict[str, ExecutionContextSnapshot | None] = {}
        self.active: Counter[str] = Counter()
        self.max_active: Counter[str] = Counter()
        self.total = 0
        self.max_total = 0
        self._opened = False
        self._latches: dict[str, asyncio.Event] = defaultdict(asyncio.Event)

    async def handler(self, ctx: StepContext) -> dict[str, str]:
        key = f"{ctx.execution_id}/{ctx.step_id}"
        eid = ctx.execution_id
        self.entered.append(key)
        self.contexts[eid] = current_context()
        self.active[eid] += 1
        self.max_active[eid] = max(self.max_active[eid], self.active[eid])
        self.total += 1
        self.max_total = max(self.max_total, self.total)
        self.signal.notify()
        try:
            if not self._opened:
                await self._latches[key].wait()
        finally:
            self.active[eid] -= 1
            self.total -= 1
            self.finished.append(key)
            self.signal.notify()
        return {"step": ctx.step_id}

    def release(self, key: str) -> None:
        self._latches[key].set()

    def open(self) -> None:
        """Release everything, now and later."""
        self._opened = True
        for latch in self._latches.values():
            latch.set()

    def inside(self) -> list[str]:
        done = Counter(self.finished)
        out = []
        for key in self.entered:
            if done[key]:
                done[key] -= 1
            else:
                out.append(key)
        return out

    async def wait_entered(self, n: int, what: str = "") -> None:
        await self.signal.wait_for(
            lambda: len(self.entered) >= n, what or f"{n} handlers entered the gate"
        )


class RunWatcher:
    """``InstanceHooks.on_run_state``: the states each run went through, in order."""

    def __init__(self) -> None:
        self.states: dict[str, list[str]] = defaultdict(list)
        self.signal = Signal()

    def __call__(self, run_id: str, state: str) -> None:
        self.states[run_id].append(state)
        self.signal.notify()

    async def reached(self, run_id: str, *states: str, timeout: float = DEADLINE_S) -> str:
        """Wait until ``run_id`` entered one of ``states``; return which."""
        await self.signal.wait_for(
            lambda: any(s in self.states[run_id] for s in states),
            f"run {run_id} reached {states} (went through {self.states[run_id]})",
            timeout,
        )
        return next(s for s in self.states[run_id] if s in states)


class StepCounter:
    """``InstanceHooks.on_step``: step attempt outcomes per execution."""

    def __init__(self) -> None:
        self.outcomes: dict[str, Counter[str]] = defaultdict(Counter)
        self.signal = Signal()

    def __call__(self, execution_id: str, step_id: str, outcome: str, seconds: float) -> None:
        self.outcomes[execution_id][outcome] += 1
        self.signal.notify()


class HeartbeatProbe:
    """Counts registry publications of one instance (heartbeats and change publications)."""

    def __init__(self, instance: RuntimeInstance) -> None:
        self.count = 0
        self.last: InstanceDescriptor | None = None
        """The descriptor of the latest publication."""
        self.signal = Signal()
        original = instance.registry.publish

        async def publish(descriptor: InstanceDescriptor, ttl_ms: int) -> None:
            await original(descriptor, ttl_ms)
            self.count += 1
            self.last = descriptor
            self.signal.notify()

        original_if_queued = instance.registry.publish_if_queued

        async def publish_if_queued(
            descriptor: InstanceDescriptor, ttl_ms: int, queue_key: str
        ) -> tuple[bool, int]:
            answer = await original_if_queued(descriptor, ttl_ms, queue_key)
            if answer[0]:
                self.count += 1
                self.last = descriptor
                self.signal.notify()
            return answer

        instance.registry.publish = publish  # type: ignore[method-assign]
        instance.registry.publish_if_queued = publish_if_queued  # type: ignore[method-assign]

    async def rounds(self, n: int) -> None:
        """Wait for ``n`` more publications (n >= 2 spans one full heartbeat round)."""
        target = self.count + n
        await self.signal.wait_for(lambda: self.count >= target, f"{n} more publications")


TEST_HANDLERS = (*DEFAULT_ALLOWED_HANDLERS, "gate")
"""What the tests' tenants may use: the default allowlist and the ``gate`` handler."""
TEST_TOKEN = "runtime-token-for-tests"
"""The runtime token of the test hosts."""


def tenant_settings(tenant_id: str, **fields: Any) -> TenantSettings:
    """Settings of a test tenant that may use the ``gate`` handler."""
    return TenantSettings(tenant_id=tenant_id, **{"allowed_handlers": TEST_HANDLERS, **fields})


def snapshot(tenant: str = "tenant-a", group: str | None = None) -> ExecutionContextSnapshot:
    return ExecutionContextSnapshot(
        tenant_id=tenant, tenant_group_id=group, user_id="u1", project="p1", context_key="ck"
    )


def pipeline(
    n: int, *, uses: str = "gate", with_: dict[str, Any] | None = None, pid: str = "p"
) -> dict[str, Any]:
    """``n`` independent steps ``s0..s<n-1>`` (all ready at once)."""
    steps = []
    for i in range(n):
        step: dict[str, Any] = {"id": f"s{i}", "uses": uses}
        if with_:
            step["with"] = with_
        steps.append(step)
    return {"id": pid, "steps": steps}


def request(
    doc: dict[str, Any],
    *,
    tenant: str = "tenant-a",
    group: str | None = None,
    shared_run_id: str | None = None,
) -> RunRequest:
    return RunRequest(
        shared_run_id=shared_run_id or f"sr-{uuid.uuid4().hex[:12]}",
        pipeline=doc,
        snapshot=snapshot(tenant, group),
    )


def handlers_with(gate: Gate) -> HandlerRegistry:
    registry = HandlerRegistry(autoload=True)
    registry.register("gate", gate.handler)
    return registry


def completions(events: Iterable[LedgerEvent]) -> Counter[str]:
    return Counter(e.get("step") for e in events if e.type == "step_completed")


async def eventually(
    probe: Callable[[], Awaitable[bool]], what: str, timeout: float = DEADLINE_S
) -> None:
    """Wait for external state (another process, a TTL) with a deadline."""
    deadline = time.monotonic() + timeout
    while not await probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout} s: {what}")
        await asyncio.sleep(0.02)


async def crash(instance: RuntimeInstance) -> None:
    """Kill an instance's background loops without ``stop()`` (a crashed process)."""
    instance._stopping = True  # a crashed process runs no loop any more
    await instance.supervisor.stop()  # cancels until every loop has really ended


def subprocess_env(redis_url: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRUNTIME_")}
    if redis_url is not None:
        env["AIRUNTIME_REDIS_URL"] = redis_url
    env.update(extra)
    return env
