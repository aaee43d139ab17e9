"""ScaleOutRequest: rejected beyond the pool's maxInstances; otherwise the pool grows
(Observed) and the request is Fulfilled by the first *new* runtime instance of the
prefix that can accept a run.

Runtime instances come from the ``runtimes`` launcher (registry entries today, real
``airt runtime`` processes once they exist).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.operator.k8s import Cluster, eventually, pool_spec, request_spec, unique
from tests.operator.runtimes import RuntimeLauncher, RuntimeSpec

pytestmark = pytest.mark.usefixtures("operator")


async def _pool(cluster: Cluster, namespace: str, tenant: str, prefix: str, **spec: Any) -> None:
    cluster.create_pool(namespace, "pool", pool_spec(tenant, prefix, **spec))
    await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="pool reconciled")


async def _phase(cluster: Cluster, namespace: str, name: str, phase: str) -> dict[str, Any]:
    return await eventually(
        lambda: cluster.request_in_phase(namespace, name, phase), what=f"{name} {phase}"
    )


async def test_request_beyond_max_instances_is_rejected_with_the_numbers(
    cluster: Cluster, namespace: str
) -> None:
    tenant, prefix = unique("tenant"), unique("rt")
    await _pool(cluster, namespace, tenant, prefix, replicas=2, maxInstances=3)

    cluster.create_request(namespace, "sor", request_spec(tenant, prefix, requested=2))

    request = await _phase(cluster, namespace, "sor", "Rejected")
    reason = request["status"]["reason"]
    assert "2 replicas" in reason and "2 + 2 requested = 4" in reason
    assert "maxInstances 3" in reason
    assert request["status"]["rejectedAt"]
    assert (cluster.pool(namespace, "pool") or {})["spec"]["replicas"] == 2
    assert "Rejected" in await eventually(
        lambda: cluster.event_reasons(namespace, "sor"), what="a Rejected event"
    )


async def test_request_for_an_unknown_pool_is_rejected(cluster: Cluster, namespace: str) -> None:
    cluster.create_request(namespace, "sor", request_spec("nobody", unique("rt")))

    request = await _phase(cluster, namespace, "sor", "Rejected")

    assert "no RuntimePool with tenantId nobody" in request["status"]["reason"]


async def test_request_is_observed_then_fulfilled_by_a_new_ready_instance(
    cluster: Cluster, namespace: str, runtimes: RuntimeLauncher
) -> None:
    tenant, prefix = unique("tenant"), unique("rt")
    await _pool(cluster, namespace, tenant, prefix, replicas=1, maxInstances=3)
    await runtimes.start(RuntimeSpec(f"{prefix}-old", tenant, prefix))

    cluster.create_request(namespace, "sor", request_spec(tenant, prefix, requested=1))

    observed = await _phase(cluster, namespace, "sor", "Observed")
    status = observed["status"]
    assert status["baselineInstanceIds"] == [f"{prefix}-old"]
    assert (status["previousReplicas"], status["targetReplicas"]) == (1, 2)
    assert (cluster.pool(namespace, "pool") or {})["spec"]["replicas"] == 2
    await eventually(
        lambda: cluster.deployment_replicas(namespace, prefix) == 2, what="Deployment scaled to 2"
    )

    # Neither a baseline instance nor a new one that cannot accept a run fulfils it.
    await runtimes.start(RuntimeSpec(f"{prefix}-full", tenant, prefix, can_accept_run=False))
    await runtimes.start(RuntimeSpec(f"{prefix}-new", tenant, prefix))

    fulfilled = await _phase(cluster, namespace, "sor", "Fulfilled")
    assert fulfilled["status"]["fulfilledRuntimeInstanceId"] == f"{prefix}-new"
    assert fulfilled["status"]["fulfilledAt"]
    await eventually(
        lambda: {"Observed", "Fulfilled"} <= set(cluster.event_reasons(namespace, "sor")),
        what="Observed and Fulfilled events",
    )


async def test_concurrent_requests_never_lose_a_replica(cluster: Cluster, namespace: str) -> None:
    """Two requests racing for the same pool: the second write conflicts (optimistic
    locking on resourceVersion), kopf retries it, and both increments land."""
    tenant, prefix = unique("tenant"), unique("rt")
    await _pool(cluster, namespace, tenant, prefix, replicas=1, maxInstances=3)

    for name in ("sor-a", "sor-b", "sor-c"):
        cluster.create_request(namespace, name, request_spec(tenant, prefix, requested=1))

    def finished() -> list[str] | None:
        phases = [cluster.request_phase(namespace, n) or "" for n in ("sor-a", "sor-b", "sor-c")]
        decided = all(p in ("Observed", "Rejected") for p in phases)
        return sorted(phases) if decided else None

    assert await eventually(finished, what="three requests decided") == [
        "Observed", "Observed", "Rejected",
    ]  # fmt: skip
    assert (cluster.pool(namespace, "pool") or {})["spec"]["replicas"] == 3


async def test_request_naming_a_pool_of_another_tenant_is_rejected(
    cluster: Cluster, namespace: str
) -> None:
    tenant, prefix = unique("tenant"), unique("rt")
    await _pool(cluster, namespace, tenant, prefix)

    cluster.create_request(namespace, "sor", request_spec("intruder", prefix, poolName="pool"))

    request = await _phase(cluster, namespace, "sor", "Rejected")
    assert f"serves tenant {tenant}" in request["status"]["reason"]
    assert (cluster.pool(namespace, "pool") or {})["spec"]["replicas"] == 1


async def test_request_naming_its_pool_scales_it(cluster: Cluster, namespace: str) -> None:
    tenant, prefix = unique("tenant"), unique("rt")
    await _pool(cluster, namespace, tenant, prefix, replicas=1, maxInstances=3)

    cluster.create_request(
        namespace, "sor", request_spec(tenant, prefix, requested=2, poolName="pool")
    )

    request = await _phase(cluster, namespace, "sor", "Observed")
    assert request["status"]["poolName"] == "pool"
    assert (cluster.pool(namespace, "pool") or {})["spec"]["replicas"] == 3
