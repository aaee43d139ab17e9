"""A submit compiles against the tenant's settings as they are when the run is created.

A control plane keeps the settings it last read per tenant instead of reading them for
every submit; the script that creates the shared run checks them byte for byte. So:

* a change made elsewhere (another control plane, another process) holds from the very
  next submit here, in both directions (a handler taken away is refused, one allowed is
  accepted), and a refused submit leaves no record and no queued item behind;
* the creating script itself refuses, writing nothing, when the settings it is given
  are not the stored ones;
* many submits of one tenant read its settings once and cost one round trip each;
* the kept settings are bounded (least recently used out).
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from airuntime.control_plane.service import ControlPlane, PipelineRefused
from airuntime.control_plane.shared_runs import (
    SETTINGS_CHANGED,
    SharedRun,
    SharedRunStatus,
    SharedRunStore,
)
from airuntime.control_plane.tenant_settings_cache import TenantSettingsCache
from airuntime.core import keys
from airuntime.core.redis_client import CountingRedis, connect
from airuntime.core.scripts import library
from airuntime.fleet.registry import Registry
from airuntime.fleet.tenancy import TenantSettings
from tests.conftest import RedisServerInfo
from tests.control_plane.support import manual_cp, snap

ECHO: dict[str, Any] = {"id": "echoing", "steps": [{"id": "say", "uses": "echo"}]}


async def _elsewhere(url: str, settings: TenantSettings) -> None:
    """Store ``settings`` through a client of its own: another process's write."""
    other = Redis.from_url(url)
    try:
        await Registry(other).put_tenant(settings)
    finally:
        await other.aclose()


async def _pending_ids(cp: ControlPlane, tenant_id: str) -> set[str]:
    return {i.shared_run_id for i in await cp.queue.pending_items(tenant_id)}


async def test_a_settings_change_made_elsewhere_holds_from_the_next_submit(
    redis: Redis, redis_server: RedisServerInfo
) -> None:
    cp = manual_cp(redis)
    tenant = "tenant-a"
    await Registry(redis).put_tenant(
        TenantSettings(tenant_id=tenant, allowed_handlers=("echo", "noop"))
    )
    first = await cp.submit(ECHO, snap(tenant))
    assert cp.tenant_settings.reads == 1

    await _elsewhere(redis_server.url, TenantSettings(tenant_id=tenant, allowed_handlers=("noop",)))
    with pytest.raises(PipelineRefused) as refused:
        await cp.submit(ECHO, snap(tenant))
    assert "'echo' is not allowed" in str(refused.value.problems), refused.value.problems
    assert cp.tenant_settings.reads == 2, "read again once the creating script refused"
    # Nothing of the refused submit is left: one record, one pending item (the first's).
    assert [r.shared_run_id for r in await cp.runs.list(tenant)] == [first.shared_run_id]
    assert await _pending_ids(cp, tenant) == {first.shared_run_id}
    assert await cp.queue.pending_count() == 1

    await _elsewhere(redis_server.url, TenantSettings(tenant_id=tenant, allowed_handlers=("echo",)))
    again = await cp.submit(ECHO, snap(tenant))
    assert again.status is SharedRunStatus.QUEUED_GLOBALLY
    assert await _pending_ids(cp, tenant) == {first.shared_run_id, again.shared_run_id}
    assert cp.tenant_settings.reads == 3


async def test_the_creating_script_writes_nothing_against_changed_settings(
    redis: Redis,
) -> None:
    tenant = "tenant-c"
    now = 1_700_000_000_000
    run = SharedRun(
        shared_run_id=SharedRunStore.new_id(),
        status=SharedRunStatus.QUEUED_GLOBALLY,
        pipeline_id="p",
        pipeline=ECHO,
        snapshot=snap(tenant),
        created_at_ms=now,
        updated_at_ms=now,
    )
    await Registry(redis).put_tenant(TenantSettings(tenant_id=tenant))
    stored = await redis.get(keys.tenant_settings(tenant))
    assert stored

    # Compiled against no stored settings (b""), or against other ones: refused.
    for stale in (b"", stored + b" "):
        call = SharedRunStore.create_call(run, stale)
        reply = await library().call(redis, call.name, call.keys, call.args)
        assert int(reply) == SETTINGS_CHANGED
    assert await redis.exists(keys.shared_run(run.shared_run_id)) == 0
    for index in (
        keys.shared_runs(),
        keys.shared_runs_by_tenant(tenant),
        keys.shared_runs_open(),
    ):
        assert await redis.zscore(index, run.shared_run_id) is None
    assert await redis.hget(keys.shared_runs_open_tenants(), run.shared_run_id) is None

    # Against the stored text: created (and a resend of the same call is this call's own).
    call = SharedRunStore.create_call(run, stored)
    assert int(await library().call(redis, call.name, call.keys, call.args)) == 1
    assert int(await library().call(redis, call.name, call.keys, call.args)) == 0
    # A tenant with nothing stored is checked the same way (b"" then).
    other = run.model_copy(
        update={"shared_run_id": SharedRunStore.new_id(), "snapshot": snap("tenant-none")}
    )
    call = SharedRunStore.create_call(other, b"")
    assert int(await library().call(redis, call.name, call.keys, call.args)) == 1


async def test_many_submits_of_a_tenant_read_its_settings_once_and_cost_one_round_trip(
    redis_server: RedisServerInfo,
) -> None:
    client = connect(redis_server.url)
    assert isinstance(client, CountingRedis)
    try:
        await client.flushall()
        cp = manual_cp(client)
        await cp.submit(ECHO, snap("tenant-d"))
        costs = []
        for _ in range(5):
            before = client.round_trips
            await cp.submit(ECHO, snap("tenant-d"))
            costs.append(client.round_trips - before)
        assert costs == [1] * 5, costs
        assert cp.tenant_settings.reads == 1
        assert await cp.queue.pending_count() == 6
    finally:
        await client.aclose()


async def test_the_kept_settings_are_bounded_least_recently_used_out(redis: Redis) -> None:
    cache = TenantSettingsCache(Registry(redis), capacity=2)
    kept = [(await cache.get(tenant))[1] for tenant in ("t1", "t2", "t1", "t3")]
    assert kept == [False, False, True, False]  # t1 used again before t3 arrives
    assert cache.reads == 3
    assert (await cache.get("t1"))[1], "kept"
    assert not (await cache.get("t2"))[1], "the least recently used went out"
    assert cache.reads == 4
    with pytest.raises(ValueError, match="capacity"):
        TenantSettingsCache(Registry(redis), capacity=0)
