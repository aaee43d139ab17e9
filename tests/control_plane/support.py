"""Helpers shared by the control-plane and tenancy suites.

Everything here drives real objects: real Redis/Valkey, real ``RuntimeHost``
instances, the real control plane. The only stand-in is :class:`RecordingInstance`,
an in-process *instance object* behind the ``local`` provider boundary that records
what it was delivered (its descriptor is still published in the real registry, so
admission, reservations and the shared queue are the real ones).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, TypeVar

import httpx
from redis.asyncio import Redis

from airuntime.control_plane.api import create_app
from airuntime.control_plane.metrics import ControlPlaneMetrics
from airuntime.control_plane.rbac import Authenticator, TokenEntry
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.core.context import ExecutionContextSnapshot, current_context
from airuntime.engine.handlers import HandlerRegistry
from airuntime.fleet.providers import DeliveryError
from airuntime.fleet.registry import (
    CapacityDescriptor,
    InstanceDescriptor,
    InstanceStatus,
    Registry,
)
from airuntime.fleet.runs import RunRequest
from airuntime.fleet.tenancy import IsolationMode, TenantSettings
from runtime_pod.config import InstanceConfig
from runtime_pod.host import RuntimeHost

T = TypeVar("T")

TINY_PIPELINE: dict[str, Any] = {"id": "tiny", "steps": [{"id": "a", "uses": "noop"}]}


def fan_pipeline(steps: int, pipeline_id: str = "fan") -> dict[str, Any]:
    """root -> (steps - 2) parallel noops -> sink: exactly ``steps`` steps."""
    middle = [f"s{i}" for i in range(steps - 2)]
    specs: list[dict[str, Any]] = [{"id": "root", "uses": "noop"}]
    specs += [{"id": m, "uses": "noop", "depends_on": ["root"]} for m in middle]
    specs.append({"id": "sink", "uses": "noop", "depends_on": middle})
    return {"id": pipeline_id, "steps": specs}


def snap(tenant_id: str = "default", **extra: Any) -> ExecutionContextSnapshot:
    return ExecutionContextSnapshot(tenant_id=tenant_id, **extra)


async def wait_for(
    probe: Callable[[], Awaitable[T | None]],
    *,
    timeout_s: float = 30.0,
    interval_s: float = 0.02,
    what: str = "condition",
) -> T:
    """Poll ``probe`` until it returns something truthy (a deadline, not a sleep-for-order)."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last={last!r})")


async def run_body(
    cp: ControlPlane, shared_run_id: str, tenant_id: str | None
) -> dict[str, Any] | None:
    """The JSON ``GET /v1/runs/{id}`` returns to ``tenant_id`` (None: not visible)."""
    details = await cp.get(shared_run_id, tenant_id)
    return None if details is None else details.to_json()


async def drain_until_finished(
    cp: ControlPlane,
    runs: dict[str, str],
    *,
    timeout_s: float = 60.0,
    batch: int = 100,
) -> dict[str, dict[str, Any]]:
    """Manual drain until every shared run (id -> tenant) has a terminal runtime run."""
    bodies: dict[str, dict[str, Any]] = {}

    async def probe() -> bool:
        await cp.drain(batch)
        for srid, tenant in runs.items():
            if srid in bodies:
                continue
            body = await run_body(cp, srid, tenant)
            assert body is not None
            if body.get("run", {}).get("status") in ("completed", "failed", "cancelled"):
                bodies[srid] = body
        return len(bodies) == len(runs)

    await wait_for(probe, timeout_s=timeout_s, what=f"{len(runs)} runs to finish")
    return bodies


async def wait_ended(
    cp: ControlPlane, shared_run_id: str, tenant_id: str, status: str = "Succeeded"
) -> dict[str, Any]:
    """Wait for the shared run to end with ``status`` (the control plane reads the
    runtime's outcome after the run finished) and return its body."""

    async def probe() -> dict[str, Any] | None:
        body = await run_body(cp, shared_run_id, tenant_id)
        return body if body is not None and body["status"] == status else None

    return await wait_for(probe, timeout_s=30, what=f"{shared_run_id} to end {status}")


async def wait_finished(
    cp: ControlPlane, shared_run_id: str, tenant_id: str, *, timeout_s: float = 60.0
) -> dict[str, Any]:
    """Wait (no draining here: a background pump or the test does it) for a terminal run."""

    async def probe() -> dict[str, Any] | None:
        body = await run_body(cp, shared_run_id, tenant_id)
        if body is not None and body.get("run", {}).get("status") in (
            "completed",
            "failed",
            "cancelled",
        ):
            return body
        return None

    return await wait_for(probe, timeout_s=timeout_s, what=f"run of {shared_run_id} to finish")


@asynccontextmanager
async def running_host(host: RuntimeHost, cp: ControlPlane | None = None) -> AsyncIterator[None]:
    """Start a RuntimeHost (and hand its instances to ``cp``'s local provider)."""
    await host.start()
    try:
        if cp is not None:
            for inst in host.instances:
                cp.local.add(inst)
        yield
    finally:
        await host.stop(drain_timeout_s=5)


@asynccontextmanager
async def running_cp(cp: ControlPlane) -> AsyncIterator[ControlPlane]:
    await cp.start()
    await cp.wait_started()
    try:
        yield cp
    finally:
        await cp.stop()


def manual_cp(
    redis: Redis, *, handlers: HandlerRegistry | None = None, **settings: Any
) -> ControlPlane:
    """A control plane without a background pump: only the test drains its queue."""
    return ControlPlane(
        redis, ControlPlaneSettings(background_pump=False, **settings), handlers=handlers
    )


@asynccontextmanager
async def serving(cp: ControlPlane, *hosts: RuntimeHost) -> AsyncIterator[ControlPlane]:
    """Start ``hosts`` (their instances handed to ``cp``'s local provider), then ``cp``;
    stop them all afterwards."""
    async with AsyncExitStack() as stack:
        for host in hosts:
            await stack.enter_async_context(running_host(host, cp))
        yield await stack.enter_async_context(running_cp(cp))


# Runtime instance settings the suites share (in-process instances, fast heartbeats).
LOCAL_RUNTIME = InstanceConfig(provider="local", heartbeat_s=0.5)
SHARED_RUNTIME = InstanceConfig(provider="local", max_concurrent_runs=5, heartbeat_s=0.5)
TENANT_A_RUNTIME = InstanceConfig(
    provider="local",
    tenant_id="tenant-a",
    isolation_mode=IsolationMode.DEDICATED,
    allow_shared_fallback=False,
    runtime_prefix="tenant-a-runtime",
    max_concurrent_runs=5,
    heartbeat_s=0.5,
)


class RecordingInstance:
    """An in-process dispatch target that records every delivery (and its context).

    ``fail`` makes ``accept`` raise that exception instead of accepting.
    """

    def __init__(self, instance_id: str, *, fail: BaseException | None = None) -> None:
        self.instance_id = instance_id
        self.fail = fail
        self.deliveries: list[RunRequest] = []
        self.contexts: list[ExecutionContextSnapshot | None] = []
        self.run_ids: dict[str, str] = {}

    async def accept(self, request: RunRequest) -> str:
        self.contexts.append(current_context())
        await asyncio.sleep(0)  # let concurrent pumps interleave here
        if self.fail is not None:
            raise self.fail
        self.deliveries.append(request)
        return self.run_ids.setdefault(request.shared_run_id, f"run-{uuid.uuid4().hex}")


def descriptor(
    instance_id: str,
    *,
    isolation_mode: IsolationMode = IsolationMode.SHARED,
    tenant_id: str | None = None,
    tenant_group_id: str | None = None,
    runtime_prefix: str = "runtime-instance",
    provider: str = "local",
    endpoint: str = "",
    status: InstanceStatus = InstanceStatus.READY,
    max_concurrent_runs: int = 10_000,
    paused: bool = False,
) -> InstanceDescriptor:
    return InstanceDescriptor(
        instance_id=instance_id,
        status=status,
        heartbeat_at_ms=int(time.time() * 1000),
        provider=provider,
        endpoint=endpoint,
        tenant_id=tenant_id,
        tenant_group_id=tenant_group_id,
        isolation_mode=isolation_mode,
        runtime_prefix=runtime_prefix,
        capacity=CapacityDescriptor.compute(
            # Static descriptors never reflect a dispatch: workers (like run slots) are
            # plentiful, so reservations (10 s TTL) do not throttle these tests.
            worker_count=100_000,
            active_worker_count=0,
            max_local_workers_per_execution=4,
            queued_run_count=0,
            running_run_count=0,
            queue_capacity=100_000,
            max_concurrent_runs=max_concurrent_runs,
            is_queue_paused=paused,
        ),
    )


async def publish(redis: Redis, desc: InstanceDescriptor, ttl_ms: int = 120_000) -> None:
    await Registry(redis).publish(desc, ttl_ms)


async def refusing_tenant_a_runtime(redis: Redis, cp: ControlPlane) -> RecordingInstance:
    """tenant-a (TENANT_A: Dedicated, no shared fallback) gets one registered runtime,
    ``tenant-a-runtime-1``, whose every delivery is refused with a DeliveryError."""
    await Registry(redis).put_tenant(TENANT_A)
    broken = RecordingInstance("tenant-a-runtime-1", fail=DeliveryError("refused", reason="paused"))
    cp.local.add(broken)
    tenant_a = {"tenant_id": "tenant-a", "runtime_prefix": "tenant-a-runtime"}
    await publish(
        redis, descriptor(broken.instance_id, isolation_mode=IsolationMode.DEDICATED, **tenant_a)
    )
    return broken


# Tenant settings of the reference's validated examples (000_*, "tenant runtime settings").
TENANT_A = TenantSettings(
    tenant_id="tenant-a",
    isolation_mode=IsolationMode.DEDICATED,
    prefer_dedicated=True,
    allow_shared_fallback=False,
    max_instances=3,
    runtime_prefix="tenant-a-runtime",
    workers_per_instance=10,
    max_concurrent_runs=5,
    queue_capacity=500,
)
TENANT_B = TenantSettings(
    tenant_id="tenant-b",
    isolation_mode=IsolationMode.HYBRID,
    prefer_dedicated=True,
    allow_shared_fallback=True,
    max_instances=2,
    runtime_prefix="tenant-b-runtime",
    workers_per_instance=5,
    max_concurrent_runs=3,
    queue_capacity=250,
)


@asynccontextmanager
async def api_over(
    redis: Redis, tokens: Mapping[str, tuple[str, Sequence[str]]]
) -> AsyncIterator[tuple[httpx.AsyncClient, ControlPlane]]:
    """The control plane's app (httpx over ASGI) with one runtime host of 4 workers and
    no background pump (the test drains); ``tokens``: name -> (tenant, roles), each the
    bearer token ``token-<name>`` of user ``<name>``."""
    host = RuntimeHost(redis, InstanceConfig(workers=4, heartbeat_s=0.5, assist=False), instances=1)
    await host.start()
    cp = manual_cp(redis, scale_out_enabled=False)
    for inst in host.instances:
        cp.local.add(inst)
    await cp.start()
    await cp.wait_started()
    auth = Authenticator(
        [
            TokenEntry(token=f"token-{name}", user=name, tenant=tenant, roles=list(roles))
            for name, (tenant, roles) in tokens.items()
        ]
    )
    app = create_app(cp, auth, ControlPlaneMetrics(cp))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cp")
    try:
        yield client, cp
    finally:
        await client.aclose()
        await cp.stop()
        await host.stop()
