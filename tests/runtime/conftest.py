"""Fixtures of the runtime instance tests: in-process instances on a real server."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest_asyncio
from redis.asyncio import Redis

from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import HandlerRegistry
from airuntime.fleet.instance_settings import InstanceConfig
from airuntime.fleet.registry import Registry
from airuntime.fleet.run_index import RunIndex
from runtime_pod.host import RuntimeHost
from runtime_pod.instance import InstanceHooks, RuntimeInstance
from runtime_pod.settings_store import SettingsStore
from runtime_pod.step_slots import StepSlotController
from tests.runtime.support import (
    TEST_TOKEN,
    Gate,
    RunWatcher,
    StepCounter,
    handlers_with,
    tenant_settings,
)

TEST_TENANTS = ("tenant-a", "tenant-b")
"""Tenants whose (Shared) settings every runtime test starts with: they may use ``gate``."""


class Runtime:
    """Instances of one test, sharing a gate handler and a run-state watcher."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self.gate = Gate()
        self.watcher = RunWatcher()
        self.steps = StepCounter()
        self.handlers = handlers_with(self.gate)
        self.store = ExecutionStore(redis)
        self.index = RunIndex(redis)
        self.registry = Registry(redis)
        self.instances: list[RuntimeInstance] = []

    def instance(
        self,
        instance_id: str,
        *,
        slots: StepSlotController | None = None,
        handlers: HandlerRegistry | None = None,
        **config: Any,
    ) -> RuntimeInstance:
        cfg = InstanceConfig(**{"heartbeat_s": 0.5, "lease_ms": 3000, **config})
        inst = RuntimeInstance(
            self.redis,
            cfg,
            instance_id,
            handlers=handlers or self.handlers,
            slots=slots,
            hooks=InstanceHooks(on_run_state=self.watcher, on_step=self.steps),
        )
        self.instances.append(inst)
        return inst

    async def start(self, instance_id: str, **kwargs: Any) -> RuntimeInstance:
        inst = self.instance(instance_id, **kwargs)
        await inst.start()
        return inst

    async def close(self) -> None:
        self.gate.open()
        await asyncio.gather(*(i.stop(drain_timeout_s=5) for i in self.instances))


@contextlib.asynccontextmanager
async def runtime_with_tenants(redis: Any) -> AsyncIterator[Runtime]:
    """A :class:`Runtime` on ``redis`` (any client: standalone or cluster) with the test
    tenants' settings stored; its instances are stopped on the way out."""
    rt = Runtime(redis)
    for tenant in TEST_TENANTS:
        await rt.registry.put_tenant(tenant_settings(tenant))
    try:
        yield rt
    finally:
        await _stopped(rt.close(), "instances")


@pytest_asyncio.fixture
async def runtime(redis: Redis) -> AsyncIterator[Runtime]:
    async with runtime_with_tenants(redis) as rt:
        yield rt


async def _stopped(closing: Awaitable[Any], what: str) -> None:
    """Await a shutdown; if it hangs, show where every task is stuck."""
    task = asyncio.ensure_future(closing)
    done, _ = await asyncio.wait([task], timeout=20)
    if not done:
        for t in asyncio.all_tasks():
            print(f"task {t.get_name()} (cancelling={t.cancelling()})", file=sys.stderr)
            t.print_stack(limit=6, file=sys.stderr)
        raise AssertionError(f"{what} did not stop within 20 s")
    task.result()


MakeHost = Callable[..., Awaitable[RuntimeHost]]


@pytest_asyncio.fixture
async def hosts(runtime: Runtime) -> AsyncIterator[MakeHost]:
    """Start ``RuntimeHost``s with an HTTP API on a free port, sharing the test's gate
    handler; run-state changes of their instances reach ``runtime.watcher`` too."""
    started: list[RuntimeHost] = []

    async def make(
        instances: int = 1, settings_store: SettingsStore | None = None, **config: Any
    ) -> RuntimeHost:
        cfg = InstanceConfig(**{"heartbeat_s": 0.5, "lease_ms": 3000, **config})
        host = RuntimeHost(
            runtime.redis,
            cfg,
            instances=instances,
            http_port=0,
            settings_store=settings_store,
            handlers=runtime.handlers,
            token=TEST_TOKEN,
        )
        started.append(host)
        await host.start()
        for inst in host.instances:
            metrics_hook = inst.hooks.on_run_state

            def both(run_id: str, state: str, metrics_hook: Any = metrics_hook) -> None:
                if metrics_hook is not None:
                    metrics_hook(run_id, state)
                runtime.watcher(run_id, state)

            inst.hooks.on_run_state = both
        return host

    try:
        yield make
    finally:
        runtime.gate.open()
        await _stopped(asyncio.gather(*(h.stop(drain_timeout_s=5) for h in started)), "hosts")
