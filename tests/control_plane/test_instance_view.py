"""Admission's reading of the fleet (:mod:`airuntime.control_plane.instance_view`).

The view must say exactly what the separate reads it replaces said -- the registry's
visible instances, the suspect marks, the descriptors' ages -- whatever changed since
the previous view (a new or departed instance, a new mark, a changed tenant setting),
and in one round trip when the membership did not change.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from airuntime.control_plane.instance_view import GUESS_UP_TO, InstanceViews
from airuntime.control_plane.suspects import SuspectMarks, SuspectPolicy
from airuntime.core import keys
from airuntime.core.redis_client import RedisClient
from airuntime.fleet.registry import InstanceStatus, Registry
from airuntime.fleet.tenancy import IsolationMode, TenantSettings, default_settings
from tests.control_plane.support import TENANT_A, TENANT_B, descriptor, publish
from tests.round_trips import RoundTripCounting
from tests.tenancy.test_visibility import C_IN_GROUP, HYBRID_NO_FALLBACK, POOL


async def _ages_read_apart(redis: Redis, ids: list[str]) -> dict[str, int]:
    """Descriptor ages as admission computed them before the view: ZSCORE and PTTL."""
    registry = Registry(redis)
    out: dict[str, int] = {}
    for iid in ids:
        desc = await registry.get(iid)
        score = await redis.zscore(keys.instances(), iid)
        left = await redis.pttl(keys.instance(iid))
        assert desc is not None and score is not None and left >= 0
        out[iid] = max(0, int(score) - desc.heartbeat_at_ms - left)
    return out


@pytest.mark.parametrize(
    "tenant",
    [
        pytest.param(default_settings("default"), id="default"),
        pytest.param(TENANT_A, id="tenant-a-dedicated"),
        pytest.param(TENANT_B, id="tenant-b-hybrid-fallback"),
        pytest.param(HYBRID_NO_FALLBACK, id="tenant-b-no-fallback"),
        pytest.param(C_IN_GROUP, id="tenant-c-group-member"),
    ],
)
async def test_a_view_says_what_the_separate_reads_say(
    redis: Redis, tenant: TenantSettings
) -> None:
    registry = Registry(redis)
    if tenant.tenant_id != "default":
        await registry.put_tenant(tenant)
    for iid, fields in POOL.items():
        await publish(redis, descriptor(iid, **fields), ttl_ms=60_000)  # type: ignore[arg-type]
    await publish(
        redis, descriptor("runtime-instance-2", status=InstanceStatus.DRAINING), ttl_ms=60_000
    )
    marks = SuspectMarks(redis, SuspectPolicy(failures_before_suspect=1))
    await marks.failed("runtime-instance-1", "refused")  # suspect (one failure suffices)
    counter = RoundTripCounting.sharing(redis)
    views = InstanceViews(counter)

    for attempt in range(2):  # the first reads the membership, the second guesses it
        view = await views.read(tenant.tenant_id)
        assert counter.taken() == (2 if attempt == 0 else 1)
        expected = [
            d for d in await registry.list_visible(tenant) if d.status is InstanceStatus.READY
        ]
        assert view.tenant == tenant
        assert view.visible == expected
        assert [d.instance_id for d in view.descriptors] == sorted([*POOL, "runtime-instance-2"])
        ids = [d.instance_id for d in expected]
        suspect, failing = await marks.state(ids)
        assert (set(view.suspect), set(view.failing)) == (suspect, failing)
        assert ("runtime-instance-1" in view.suspect) is ("runtime-instance-1" in ids)
        apart = await _ages_read_apart(redis, ids)
        assert view.ages_ms.keys() == apart.keys()
        for iid, age in view.ages_ms.items():
            # The separate reads came later: the key's TTL ran down a little more.
            assert 0 <= apart[iid] - age < 5_000, (iid, age, apart[iid])


async def test_every_change_between_views_is_seen(redis: Redis) -> None:
    registry = Registry(redis)
    await publish(redis, descriptor("runtime-instance-1"))
    counter = RoundTripCounting.sharing(redis)
    views = InstanceViews(counter)
    assert [d.instance_id for d in (await views.read("default")).visible] == ["runtime-instance-1"]
    counter.taken()

    # A new instance: the guess misses, the second round trip reads it (and its marks).
    await publish(redis, descriptor("runtime-instance-2"))
    await SuspectMarks(redis, SuspectPolicy(failures_before_suspect=1)).failed(
        "runtime-instance-2", "refused"
    )
    view = await views.read("default")
    assert [d.instance_id for d in view.visible] == ["runtime-instance-1", "runtime-instance-2"]
    assert view.suspect == {"runtime-instance-2"} and view.failing == {"runtime-instance-2"}
    assert counter.taken() == 2

    # Same members: one round trip, and a cleared mark, a changed descriptor and a
    # changed tenant setting are all read afresh in it.
    await SuspectMarks(redis).succeeded("runtime-instance-2")
    await publish(redis, descriptor("runtime-instance-1", status=InstanceStatus.DRAINING))
    await registry.put_tenant(TenantSettings(tenant_id="default", max_instances=7))
    view = await views.read("default")
    assert counter.taken() == 1
    assert [d.instance_id for d in view.visible] == ["runtime-instance-2"]
    assert view.suspect == frozenset() and view.failing == frozenset()
    assert view.tenant.max_instances == 7

    # A departed instance (unregistered) and an expired one (its descriptor gone, its
    # member not yet pruned) are not in the view.
    await registry.unregister("runtime-instance-1")
    await redis.delete(keys.instance("runtime-instance-2"))
    view = await views.read("default")
    assert view.visible == [] and view.descriptors == []
    assert view.ages_ms == {}


async def test_a_target_and_a_snapshot_group_narrow_and_widen_the_view(redis: Redis) -> None:
    for iid, fields in POOL.items():
        await publish(redis, descriptor(iid, **fields))  # type: ignore[arg-type]
    views = InstanceViews(redis)
    plain = await views.read("tenant-x")  # Shared defaults: the shared runtime only
    assert [d.instance_id for d in plain.visible] == ["runtime-instance-1"]
    grouped = await views.read("tenant-x", group_id="group-1")
    assert grouped.tenant.tenant_group_id == "group-1"
    assert [d.instance_id for d in grouped.visible] == ["group-1-runtime-1", "runtime-instance-1"]
    only = await views.read("tenant-x", target="runtime-instance-1", group_id="group-1")
    assert [d.instance_id for d in only.visible] == ["runtime-instance-1"]
    hidden = await views.read("tenant-x", target="tenant-a-runtime-1")
    assert hidden.visible == []


async def test_a_large_fleet_reads_the_marks_of_the_visible_instances_only(
    redis: Redis,
) -> None:
    """Above GUESS_UP_TO members nothing is guessed: the registry, then the descriptors,
    then the marks of what the tenant may use."""
    await Registry(redis).put_tenant(TENANT_A)
    for i in range(GUESS_UP_TO + 8):
        await publish(
            redis,
            descriptor(
                f"tenant-z-runtime-{i:02d}",
                isolation_mode=IsolationMode.DEDICATED,
                tenant_id="tenant-z",
                runtime_prefix="tenant-z-runtime",
            ),
        )
    own = descriptor(
        "tenant-a-runtime-1",
        isolation_mode=IsolationMode.DEDICATED,
        tenant_id="tenant-a",
        runtime_prefix="tenant-a-runtime",
    )
    await publish(redis, own)
    await SuspectMarks(redis, SuspectPolicy(failures_before_suspect=1)).failed(
        own.instance_id, "refused"
    )
    counter = RoundTripCounting.sharing(redis)
    views = InstanceViews(counter)
    for _ in range(2):
        view = await views.read("tenant-a")
        assert counter.taken() == 3
        assert [d.instance_id for d in view.visible] == [own.instance_id]
        assert view.suspect == {own.instance_id}
        assert len(view.descriptors) == GUESS_UP_TO + 9
        assert set(view.ages_ms) == {own.instance_id}


async def test_a_view_on_a_cluster_reads_the_same(cluster_redis: RedisClient) -> None:
    """Descriptors and tenant settings live in the control slot, the marks in slots of
    their own: one pipeline over the shards still reads it all."""
    for iid, fields in POOL.items():
        await publish(cluster_redis, descriptor(iid, **fields))  # type: ignore[arg-type]
    await SuspectMarks(cluster_redis, SuspectPolicy(failures_before_suspect=1)).failed(
        "tenant-b-runtime-1", "refused"
    )
    views = InstanceViews(cluster_redis)
    for _ in range(2):
        view = await views.read("tenant-b")
        expected = {"tenant-b-runtime-1", "runtime-instance-1"}
        assert {d.instance_id for d in view.visible} == expected
        assert view.suspect == {"tenant-b-runtime-1"}
        assert set(view.ages_ms) == expected
