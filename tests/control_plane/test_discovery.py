"""Control-plane discovery: runtime-only hosts resolve the control plane's identity once."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.fleet.discovery import read_control_plane, resolve_control_plane_id
from airuntime.fleet.registry import Registry
from runtime_pod.config import InstanceConfig
from runtime_pod.host import RuntimeHost
from tests.control_plane.support import manual_cp


async def test_a_runtime_host_stamps_the_resolved_control_plane_id_on_its_instances(
    redis: Redis,
) -> None:
    assert await resolve_control_plane_id(redis) is None
    cp = manual_cp(redis, control_plane_id="cp-east-1")
    await cp.start()
    try:
        record = await read_control_plane(redis)
        assert record is not None and record.control_plane_id == "cp-east-1"
        host = RuntimeHost(redis, InstanceConfig(heartbeat_s=0.5, assist=False), instances=2)
        await host.start()
        try:
            described = await Registry(redis).list_all()
            assert {d.control_plane_id for d in described} == {"cp-east-1"}
        finally:
            # Shutdown reuses the identity it resolved: it works with discovery gone.
            await redis.delete(keys.control_plane())
            await host.stop()
        assert await Registry(redis).list_all() == []
    finally:
        await cp.stop()


async def test_resolution_waits_for_a_control_plane_that_starts_later(redis: Redis) -> None:
    waiting = asyncio.create_task(resolve_control_plane_id(redis, wait_s=30, poll_s=0.01))
    await asyncio.sleep(0)
    assert not waiting.done()
    cp = manual_cp(redis, control_plane_id="cp-late")
    await cp.start()
    try:
        assert await waiting == "cp-late"
    finally:
        await cp.stop()
