"""A tenants file's settings outlive a Redis that lost its data.

Tenant settings live in Redis; a tenant with none stored is a Shared one. The
control plane publishes its tenants file at start; a Valkey without persistence (the
chart's) restarts empty, and before this the Dedicated tenant-a (no shared fallback)
stayed a Shared tenant until the control plane restarted: its runs were placed on the
Shared runtime it may not use. Here a real Valkey is killed and started again, empty,
on the same port, under a running control plane and runtime: the file's settings come
back on their own, and tenant-a is still refused the Shared runtime that a Shared
tenant's run is placed on at the same moment.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest_asyncio
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from airuntime.control_plane.settings import SubmitMode
from airuntime.control_plane.shared_runs import SharedRun, SharedRunStatus
from airuntime.core import keys
from airuntime.devstack.child_process import free_port
from airuntime.devstack.embedded import EmbeddedServer
from airuntime.fleet.registry import InstanceStatus, Registry
from runtime_pod.host import RuntimeHost
from tests.control_plane.support import (
    SHARED_RUNTIME,
    TENANT_A,
    TINY_PIPELINE,
    manual_cp,
    serving,
    snap,
    wait_for,
)

T = TypeVar("T")


@pytest_asyncio.fixture
async def forgetful_valkey() -> AsyncIterator[EmbeddedServer]:
    """A Valkey that keeps nothing across a restart, on a port it keeps."""
    server = EmbeddedServer(fixed_port=free_port())
    await server.astart()
    try:
        yield server
    finally:
        await server.astop()


async def _when_up(call: Callable[[], Awaitable[T]]) -> T:
    """``call()`` once the client's pooled connections from before the restart are gone."""

    async def attempt() -> list[T] | None:
        try:
            return [await call()]
        except RedisConnectionError:
            return None

    return (await wait_for(attempt, what="a call on the restarted server"))[0]


async def test_the_tenants_file_is_published_again_when_redis_lost_it(
    forgetful_valkey: EmbeddedServer,
) -> None:
    redis = Redis.from_url(forgetful_valkey.url)
    registry = Registry(redis)
    cp = manual_cp(redis, submit_mode=SubmitMode.DIRECT_DISPATCH)
    await cp.seed_tenants([TENANT_A], "tenants.yaml")
    shared = RuntimeHost(
        Redis.from_url(forgetful_valkey.url), SHARED_RUNTIME, instance_ids=["runtime-instance-1"]
    )
    async with serving(cp, shared):
        refused = await cp.submit(TINY_PIPELINE, snap("tenant-a"))
        assert refused.status is SharedRunStatus.SCALE_OUT_REQUESTED  # no shared fallback

        os.kill(forgetful_valkey.pid or 0, signal.SIGKILL)
        await forgetful_valkey.astop()
        await forgetful_valkey.astart()  # same port, nothing in it
        gone = await _when_up(lambda: redis.exists(keys.shared_run(refused.shared_run_id)))
        assert gone == 0  # the restart kept nothing: the run submitted before is gone too

        async def seeded_and_shared_runtime_back() -> bool:
            stored = await _when_up(lambda: registry.tenant("tenant-a"))
            ready = [d for d in await registry.list_all() if d.status is InstanceStatus.READY]
            return stored == TENANT_A and [d.instance_id for d in ready] == ["runtime-instance-1"]

        await wait_for(
            seeded_and_shared_runtime_back,
            what="tenant-a's settings published again and the Shared runtime registered again",
        )

        async def submit(tenant: str) -> SharedRun:
            return await _when_up(lambda: cp.submit(TINY_PIPELINE, snap(tenant)))

        placed = await submit("default")
        assert placed.status is SharedRunStatus.DISPATCHED, placed
        assert placed.assigned_instance_id == "runtime-instance-1"
        still_refused = await submit("tenant-a")
        assert still_refused.status is SharedRunStatus.SCALE_OUT_REQUESTED, still_refused
        assert still_refused.assigned_instance_id is None and still_refused.run_id is None
    assert "tenant-seeds" in cp.supervisor.loops
    await redis.aclose()
