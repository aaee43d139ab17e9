"""ScaleOutRequests do not outlive their RuntimePool (found by the image work: they
survived ``helm uninstall``). The operator makes the pool a request's owner when it
first observes the request, so deleting the pool lets the garbage collector
(kube-controller-manager, real here) delete its requests -- fulfilled, rejected for
maxInstances, or still waiting alike. A request for no pool has no owner. And a pool's
``allowedHandlers`` reach the tenant settings it publishes, also when changed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from redis.asyncio import Redis

from airuntime.fleet.registry import Registry
from airuntime.fleet.tenancy import DEFAULT_ALLOWED_HANDLERS
from tests.operator.k8s import Cluster, eventually, pool_spec, request_spec, unique
from tests.operator.runtimes import RuntimeLauncher, RuntimeSpec

pytestmark = pytest.mark.usefixtures("operator")


async def _phase(cluster: Cluster, namespace: str, name: str, phase: str) -> dict[str, Any]:
    return await eventually(
        lambda: cluster.request_in_phase(namespace, name, phase), what=f"{name} {phase}"
    )


async def test_requests_are_owned_by_their_pool_and_deleted_with_it(
    cluster: Cluster, namespace: str, runtimes: RuntimeLauncher
) -> None:
    tenant, prefix = unique("tenant"), unique("rt")
    cluster.create_pool(namespace, "pool", pool_spec(tenant, prefix, replicas=1, maxInstances=2))
    pool = await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="pool")
    owner = {
        "apiVersion": "airuntime.io/v1alpha1",
        "kind": "RuntimePool",
        "name": "pool",
        "uid": pool["metadata"]["uid"],
    }

    cluster.create_request(namespace, "grows", request_spec(tenant, prefix))
    await _phase(cluster, namespace, "grows", "Observed")
    await runtimes.start(RuntimeSpec(f"{prefix}-new", tenant, prefix))
    await _phase(cluster, namespace, "grows", "Fulfilled")
    cluster.create_request(namespace, "too-many", request_spec(tenant, prefix, requested=5))
    await _phase(cluster, namespace, "too-many", "Rejected")
    cluster.create_request(namespace, "orphan", request_spec("nobody", unique("rt")))
    await _phase(cluster, namespace, "orphan", "Rejected")

    for name in ("grows", "too-many"):
        found = cluster.request(namespace, name) or {}
        assert found["metadata"]["ownerReferences"] == [owner], name
    assert "ownerReferences" not in (cluster.request(namespace, "orphan") or {})["metadata"]

    cluster.delete_pool(namespace, "pool")
    await eventually(
        lambda: (
            cluster.pool(namespace, "pool") is None
            and cluster.request(namespace, "grows") is None
            and cluster.request(namespace, "too-many") is None
        ),
        what="the pool and, by garbage collection, its requests gone",
    )
    assert cluster.request(namespace, "orphan") is not None  # nobody owns it


async def test_allowed_handlers_are_published_with_the_tenant_settings(
    cluster: Cluster, namespace: str, valkey: Redis
) -> None:
    registry = Registry(valkey)
    tenant, prefix = unique("tenant"), unique("rt")
    cluster.create_pool(
        namespace, "pool", pool_spec(tenant, prefix, allowedHandlers=["echo", "python"])
    )

    async def published() -> tuple[str, ...] | None:
        if tenant not in await registry.tenant_ids():
            return None
        return (await registry.tenant(tenant)).allowed_handlers

    assert await eventually_async(published, what="settings published") == ("echo", "python")
    cluster.patch_pool(namespace, "pool", {"spec": {"allowedHandlers": ["noop"]}})

    async def changed() -> bool:
        return await published() == ("noop",)

    await eventually_async(changed, what="the changed allowlist published")
    cluster.patch_pool(namespace, "pool", {"spec": {"allowedHandlers": None}})

    async def defaulted() -> bool:
        return await published() == DEFAULT_ALLOWED_HANDLERS

    await eventually_async(defaulted, what="the default allowlist back")


async def eventually_async(probe: Any, *, what: str, within: float = 60.0) -> Any:
    """Poll an async probe with a deadline (the operator is another task)."""
    deadline = time.monotonic() + within
    while True:
        found = await probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g}s waiting for {what}")
        await asyncio.sleep(0.1)


async def test_allowed_model_providers_are_published_and_checked_by_the_api_server(
    cluster: Cluster, namespace: str, valkey: Redis
) -> None:
    registry = Registry(valkey)
    tenant, prefix = unique("tenant"), unique("rt")
    cluster.create_pool(
        namespace, "pool", pool_spec(tenant, prefix, allowedModelProviders=["local"])
    )

    async def published() -> tuple[str, ...] | bool | None:
        if tenant not in await registry.tenant_ids():
            return False
        return (await registry.tenant(tenant)).allowed_model_providers

    async def local_only() -> bool:
        return await published() == ("local",)

    await eventually_async(local_only, what="the providers published")
    cluster.patch_pool(namespace, "pool", {"spec": {"allowedModelProviders": None}})

    async def all_of_them() -> bool:
        return await published() is None

    await eventually_async(all_of_them, what="no restriction once the field is gone")
    with pytest.raises(ApiException) as info:  # the CRD's pattern, at the API server
        cluster.patch_pool(namespace, "pool", {"spec": {"allowedModelProviders": ["Open AI"]}})
    assert info.value.status == 422 and "allowedModelProviders" in str(info.value.body)


async def test_a_pools_model_token_budget_is_published_and_changed_live(
    cluster: Cluster, namespace: str, valkey: Redis
) -> None:
    """``modelTokenBudget`` reaches the tenant settings the runtimes' budget script reads
    (so every runtime of the tenant draws from it at its next model call), follows a
    change, and is gone when the field is."""
    from airuntime.engine.model_budget import ModelBudgets

    registry, budgets = Registry(valkey), ModelBudgets(valkey)
    tenant, prefix = unique("tenant"), unique("rt")
    cluster.create_pool(
        namespace, "pool", pool_spec(tenant, prefix, modelTokenBudget={"tokens": 5000})
    )

    async def limit() -> int | None:
        usage = await budgets.usage(tenant)
        return None if usage is None else usage.budget

    async def day_of_5000() -> bool:
        usage = await budgets.usage(tenant)
        return usage is not None and (usage.budget, usage.window.value) == (5000, "day")

    await eventually_async(day_of_5000, what="the budget published")
    patch = {"spec": {"modelTokenBudget": {"tokens": 90, "window": "hour"}}}
    cluster.patch_pool(namespace, "pool", patch)

    async def hour_of_90() -> bool:
        usage = await budgets.usage(tenant)
        return usage is not None and (usage.budget, usage.window.value) == (90, "hour")

    await eventually_async(hour_of_90, what="the changed budget")
    cluster.patch_pool(namespace, "pool", {"spec": {"modelTokenBudget": None}})

    async def unlimited() -> bool:
        return tenant in await registry.tenant_ids() and await limit() is None

    await eventually_async(unlimited, what="no budget once the field is gone")
