"""Tenant visibility of runtime instances (docs/architecture.md §8).

The rules, first as a table over :func:`airuntime.fleet.tenancy.is_visible`, then through
the real Redis registry (``list_visible``) and dispatch-time admission, which only
ever sees what the restored snapshot's tenant may see.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from airuntime.control_plane.admission import Admission, Assign, Decision
from airuntime.core.context import use_context
from airuntime.fleet.registry import Registry
from airuntime.fleet.tenancy import IsolationMode, TenantSettings, default_settings, is_visible
from runtime_pod.config import InstanceConfig
from tests.control_plane.support import TENANT_A, TENANT_B, descriptor, publish, snap

SHARED = IsolationMode.SHARED
DEDICATED = IsolationMode.DEDICATED
HYBRID = IsolationMode.HYBRID

DEFAULT = default_settings("default")
TEST_TENANT = default_settings("test-tenant")
HYBRID_NO_FALLBACK = TENANT_B.model_copy(update={"allow_shared_fallback": False})
DEDICATED_WITH_FALLBACK = TENANT_A.model_copy(update={"allow_shared_fallback": True})
A_IN_GROUP = TENANT_A.model_copy(update={"tenant_group_id": "group-1"})
C_IN_GROUP = TenantSettings(tenant_id="tenant-c", tenant_group_id="group-1", isolation_mode=HYBRID)
D_OTHER_GROUP = TenantSettings(
    tenant_id="tenant-d", tenant_group_id="group-2", isolation_mode=HYBRID
)


@pytest.mark.parametrize(
    ("tenant", "mode", "owner", "group", "visible"),
    [
        # Shared runtimes
        pytest.param(DEFAULT, SHARED, None, None, True, id="shared-to-default"),
        pytest.param(TEST_TENANT, SHARED, None, None, True, id="shared-to-shared-tenant"),
        pytest.param(TENANT_B, SHARED, None, None, True, id="shared-to-hybrid-with-fallback"),
        pytest.param(
            HYBRID_NO_FALLBACK, SHARED, None, None, False, id="shared-not-to-hybrid-no-fallback"
        ),
        pytest.param(TENANT_A, SHARED, None, None, False, id="shared-not-to-dedicated-no-fallback"),
        pytest.param(
            DEDICATED_WITH_FALLBACK, SHARED, None, None, True, id="shared-to-dedicated-if-allowed"
        ),
        # Dedicated runtimes: tenant or group match only
        pytest.param(TENANT_A, DEDICATED, "tenant-a", None, True, id="dedicated-to-owner"),
        pytest.param(TENANT_B, DEDICATED, "tenant-a", None, False, id="dedicated-not-to-other"),
        pytest.param(DEFAULT, DEDICATED, "tenant-a", None, False, id="dedicated-not-to-default"),
        pytest.param(C_IN_GROUP, DEDICATED, None, "group-1", True, id="dedicated-to-group"),
        pytest.param(
            D_OTHER_GROUP, DEDICATED, None, "group-1", False, id="dedicated-not-to-other-group"
        ),
        # Hybrid runtimes: tenant or group match only
        pytest.param(TENANT_B, HYBRID, "tenant-b", None, True, id="hybrid-to-owner"),
        pytest.param(TENANT_A, HYBRID, "tenant-b", None, False, id="hybrid-not-to-other"),
        pytest.param(DEFAULT, HYBRID, "tenant-b", None, False, id="hybrid-not-to-default"),
        pytest.param(A_IN_GROUP, HYBRID, "tenant-x", "group-1", True, id="hybrid-to-group"),
        pytest.param(D_OTHER_GROUP, HYBRID, None, "group-1", False, id="hybrid-not-to-other-group"),
        # Unowned Hybrid/Dedicated: nobody, whatever the fallback setting
        pytest.param(TENANT_B, HYBRID, None, None, False, id="unowned-hybrid-not-to-fallback"),
        pytest.param(DEFAULT, HYBRID, None, None, False, id="unowned-hybrid-not-to-default"),
        pytest.param(TEST_TENANT, HYBRID, None, None, False, id="unowned-hybrid-not-to-shared"),
        pytest.param(
            DEDICATED_WITH_FALLBACK, DEDICATED, None, None, False, id="unowned-dedicated-nobody"
        ),
    ],
)
def test_visibility_rules(
    tenant: TenantSettings,
    mode: IsolationMode,
    owner: str | None,
    group: str | None,
    visible: bool,
) -> None:
    assert (
        is_visible(
            tenant=tenant,
            instance_mode=mode,
            instance_tenant_id=owner,
            instance_tenant_group_id=group,
        )
        is visible
    )


POOL = {
    "runtime-instance-1": dict(isolation_mode=SHARED),
    "tenant-a-runtime-1": dict(
        isolation_mode=DEDICATED, tenant_id="tenant-a", runtime_prefix="tenant-a-runtime"
    ),
    "tenant-b-runtime-1": dict(
        isolation_mode=HYBRID, tenant_id="tenant-b", runtime_prefix="tenant-b-runtime"
    ),
    "group-1-runtime-1": dict(
        isolation_mode=HYBRID, tenant_group_id="group-1", runtime_prefix="group-1-runtime"
    ),
    "unowned-hybrid-1": dict(isolation_mode=HYBRID, runtime_prefix="unowned-hybrid"),
}


@pytest.mark.parametrize(
    ("tenant", "expected"),
    [
        pytest.param(DEFAULT, {"runtime-instance-1"}, id="default"),
        pytest.param(TENANT_A, {"tenant-a-runtime-1"}, id="tenant-a-dedicated"),
        pytest.param(
            TENANT_B, {"tenant-b-runtime-1", "runtime-instance-1"}, id="tenant-b-hybrid-fallback"
        ),
        pytest.param(HYBRID_NO_FALLBACK, {"tenant-b-runtime-1"}, id="tenant-b-no-fallback"),
        pytest.param(C_IN_GROUP, {"group-1-runtime-1"}, id="tenant-c-group-member"),
        pytest.param(D_OTHER_GROUP, set(), id="tenant-d-other-group"),
    ],
)
async def test_registry_lists_only_tenant_visible_instances(
    redis: Redis, tenant: TenantSettings, expected: set[str]
) -> None:
    for iid, fields in POOL.items():
        await publish(redis, descriptor(iid, **fields))  # type: ignore[arg-type]
    registry = Registry(redis)
    assert {d.instance_id for d in await registry.list_all()} == set(POOL)
    assert {d.instance_id for d in await registry.list_visible(tenant)} == expected
    assert "unowned-hybrid-1" not in expected


@pytest.mark.parametrize(
    ("tenant", "own", "fallback"),
    [
        pytest.param(TENANT_A, "tenant-a-runtime-1", None, id="tenant-a-never-falls-back"),
        pytest.param(
            TENANT_B, "tenant-b-runtime-1", "runtime-instance-1", id="tenant-b-falls-back"
        ),
    ],
)
async def test_admission_assigns_only_tenant_visible_capacity(
    redis: Redis, tenant: TenantSettings, own: str, fallback: str | None
) -> None:
    """Own capacity first; when it is full, shared fallback only if the tenant allows it
    (tenant-a: RequestScaleOut instead, never the visible-to-others shared runtime)."""
    registry = Registry(redis)
    await registry.put_tenant(tenant)
    for iid, fields in POOL.items():
        await publish(redis, descriptor(iid, max_concurrent_runs=2, **fields))  # type: ignore[arg-type]
    admission = Admission(redis)
    picks: list[str] = []
    decisions: list[Decision] = []
    with use_context(snap(tenant.tenant_id)):
        for _ in range(4):
            result = await admission.admit()
            decisions.append(result.decision)
            if isinstance(result, Assign):
                picks.append(result.instance.instance_id)
    assert picks[:2] == [own, own]  # preferred own capacity, two slots reserved
    if fallback is None:
        assert picks == [own, own]
        assert decisions[2:] == [Decision.SCALE_OUT, Decision.SCALE_OUT]
    else:
        assert picks == [own, own, fallback, fallback]


async def test_unowned_hybrid_runtime_cannot_even_be_configured() -> None:
    with pytest.raises(ValueError, match="visible to nobody"):
        InstanceConfig(isolation_mode=HYBRID)
