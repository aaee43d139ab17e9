"""The control plane's ``kubernetes`` scale-out provider against the real operator: it
files a ScaleOutRequest built from the contract's models (labels, tenant settings) through
the shared client, and returns the operator's verdict -- the new instance, or the reason
of a rejection."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from airuntime.control_plane.scale_out import ScaleOutRejected, ScaleOutRequest
from airuntime.control_plane.scale_out.kubernetes import KubernetesScaleOutProvider
from airuntime.control_plane.scale_out.requests import now_ms
from airuntime.fleet.tenancy import IsolationMode, TenantSettings
from airuntime.k8s.v1alpha1 import LABEL_PREFIX, LABEL_TENANT, TenantSettingsSnapshot
from tests.k8s_env import KubeTestEnv
from tests.operator.k8s import Cluster, eventually, pool_spec, unique
from tests.operator.runtimes import RuntimeLauncher, RuntimeSpec

pytestmark = pytest.mark.usefixtures("operator")


@pytest_asyncio.fixture
async def provider(
    kube_cluster: KubeTestEnv, namespace: str
) -> AsyncIterator[KubernetesScaleOutProvider]:
    provider = KubernetesScaleOutProvider(
        namespace, kubeconfig=str(kube_cluster.kubeconfig_path), timeout_s=60, poll_s=0.1
    )
    try:
        yield provider
    finally:
        await provider.close()


def _request(tenant: str, prefix: str) -> ScaleOutRequest:
    settings = TenantSettings(
        tenant_id=tenant, isolation_mode=IsolationMode.DEDICATED, runtime_prefix=prefix,
        max_instances=3,
    )  # fmt: skip
    return ScaleOutRequest(
        request_id=f"so-{uuid.uuid4().hex[:16]}",
        tenant_id=tenant,
        runtime_prefix=prefix,
        shared_run_id=f"run-{uuid.uuid4().hex[:8]}",
        tenant_settings=settings,
        requested_at_ms=now_ms(),
    )


async def _pool(cluster: Cluster, namespace: str, tenant: str, prefix: str, replicas: int) -> None:
    cluster.create_pool(namespace, "pool", pool_spec(tenant, prefix, replicas=replicas))
    await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="pool reconciled")


async def test_provider_returns_the_instance_the_operator_found(
    cluster: Cluster,
    namespace: str,
    runtimes: RuntimeLauncher,
    provider: KubernetesScaleOutProvider,
) -> None:
    tenant, prefix = unique("tenant"), unique("rt")
    await _pool(cluster, namespace, tenant, prefix, replicas=1)
    request = _request(tenant, prefix)

    fulfilling = asyncio.create_task(provider.fulfil(request))
    observed = await eventually(
        lambda: cluster.request_in_phase(namespace, request.request_id, "Observed"),
        what="the provider's request Observed",
    )
    assert observed["metadata"]["labels"] == {LABEL_TENANT: tenant, LABEL_PREFIX: prefix}
    assert observed["spec"]["sharedRunId"] == request.shared_run_id
    snapshot = TenantSettingsSnapshot.model_validate(observed["spec"]["tenantSettings"])
    assert snapshot.to_settings() == request.tenant_settings
    await runtimes.start(RuntimeSpec(f"{prefix}-new", tenant, prefix))

    assert await asyncio.wait_for(fulfilling, 60) == f"{prefix}-new"
    # A retried request finds its resource (409 on create) and the same verdict.
    assert await provider.fulfil(request) == f"{prefix}-new"


async def test_provider_raises_the_operator_s_rejection(
    cluster: Cluster, namespace: str, provider: KubernetesScaleOutProvider
) -> None:
    tenant, prefix = unique("tenant"), unique("rt")
    await _pool(cluster, namespace, tenant, prefix, replicas=3)

    request = _request(tenant, prefix)
    with pytest.raises(ScaleOutRejected, match="exceeds maxInstances 3"):
        await provider.fulfil(request)
    # The control plane's own warning about the failed attempt, beside the operator's.
    reasons = await eventually(
        lambda: (
            {"ScaleOutFailed", "Rejected"}
            <= set(cluster.event_reasons(namespace, request.request_id))
        ),
        what="ScaleOutFailed and Rejected events",
    )
    assert reasons
