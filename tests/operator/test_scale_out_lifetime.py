"""ScaleOutRequest lifetime: an Observed request that no new instance fulfils in time is
Rejected, and finished requests are deleted once older than the retention period.

This module runs its own operator with a short fulfilment timeout and retention.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kopf.testing import KopfRunner

from tests.k8s_env import KubeTestEnv
from tests.operator.conftest import operator_settings, running_operator
from tests.operator.k8s import Cluster, eventually, pool_spec, request_spec, unique
from tests.operator.runtimes import RuntimeLauncher, RuntimeSpec

FULFILMENT_TIMEOUT = 4.0
RETENTION = 2.0


@pytest.fixture(scope="module")
def operator(kube_cluster: KubeTestEnv, valkey_url: str) -> Iterator[KopfRunner]:
    settings = operator_settings(
        kube_cluster,
        valkey_url,
        fulfilment_timeout_seconds=FULFILMENT_TIMEOUT,
        retention_seconds=RETENTION,
        gc_interval_seconds=0.3,
    )
    with running_operator(settings) as runner:
        yield runner


pytestmark = pytest.mark.usefixtures("operator")


async def _pool(cluster: Cluster, namespace: str, tenant: str, prefix: str) -> None:
    cluster.create_pool(namespace, "pool", pool_spec(tenant, prefix, maxInstances=3))
    await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="pool reconciled")


async def _seen_phase(cluster: Cluster, namespace: str, name: str, phase: str) -> dict[str, Any]:
    return await eventually(
        lambda: cluster.request_in_phase(namespace, name, phase),
        what=f"{name} {phase}",
        interval=0.05,
    )


async def test_unfulfilled_request_times_out_and_is_collected(
    cluster: Cluster, namespace: str
) -> None:
    tenant, prefix = unique("tenant"), unique("rt")
    await _pool(cluster, namespace, tenant, prefix)

    cluster.create_request(namespace, "sor", request_spec(tenant, prefix))

    rejected = await _seen_phase(cluster, namespace, "sor", "Rejected")
    assert rejected["status"]["observedAt"]
    assert f"No new ready runtime instance of {prefix} within 4s" in rejected["status"]["reason"]
    await eventually(
        lambda: cluster.request(namespace, "sor") is None,
        what="the rejected request garbage-collected",
        within=RETENTION + 30,
    )


async def test_fulfilled_request_is_collected_after_the_retention(
    cluster: Cluster, namespace: str, runtimes: RuntimeLauncher
) -> None:
    tenant, prefix = unique("tenant"), unique("rt")
    await _pool(cluster, namespace, tenant, prefix)
    cluster.create_request(namespace, "sor", request_spec(tenant, prefix))
    await _seen_phase(cluster, namespace, "sor", "Observed")

    await runtimes.start(RuntimeSpec(f"{prefix}-new", tenant, prefix))

    fulfilled = await _seen_phase(cluster, namespace, "sor", "Fulfilled")
    assert fulfilled["status"]["fulfilledRuntimeInstanceId"] == f"{prefix}-new"
    await eventually(
        lambda: cluster.request(namespace, "sor") is None,
        what="the fulfilled request garbage-collected",
        within=RETENTION + 30,
    )
