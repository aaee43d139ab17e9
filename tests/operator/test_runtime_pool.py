"""RuntimePool: the operator turns a pool into a Deployment of ``airt runtime`` pods and
tenant settings in Redis, keeps both current, reports status, and cleans up.

Everything runs against a real API server (+ controller-manager) and a real Valkey;
the operator is the real kopf operator running in this process.
"""

from __future__ import annotations

from typing import Any

import pytest

from airuntime.fleet.registry import Registry
from airuntime.fleet.tenancy import IsolationMode
from airuntime.k8s.v1alpha1 import API_GROUP, API_VERSION, RUNTIME_POOL
from airuntime_operator import deployments
from tests.control_plane.support import wait_for
from tests.operator.k8s import Cluster, eventually, pool_spec, unique
from tests.operator.runtimes import RuntimeLauncher, RuntimeSpec

pytestmark = pytest.mark.usefixtures("operator")


def _selector(prefix: str) -> str:
    return f"app.kubernetes.io/name=airuntime-runtime,airuntime.io/prefix={prefix}"


def _condition(status: dict[str, Any], type_: str, value: str) -> dict[str, Any] | None:
    """The status's condition ``type_`` once its status is ``value``."""
    found = [c for c in status.get("conditions", []) if c["type"] == type_]
    return found[0] if found and found[0]["status"] == value else None


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


async def test_pool_becomes_a_deployment_with_its_service_account_and_nothing_else(
    cluster: Cluster, namespace: str, registry: Registry
) -> None:
    tenant, prefix = unique("tenant"), unique("rt")
    created = cluster.create_pool(namespace, "pool", pool_spec(tenant, prefix, replicas=2))

    pool = await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="reconcile")

    deployment = cluster.deployment(namespace, prefix)
    assert deployment is not None
    assert deployment["spec"]["replicas"] == 2
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    assert deployment["metadata"]["labels"]["airuntime.io/tenant"] == tenant
    assert deployment["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "airuntime-operator"
    container = _container(deployment)
    assert container["command"] == ["airt", "runtime"]
    env = {e["name"]: e for e in container["env"]}
    assert env["AIRUNTIME_TENANT_ID"]["value"] == tenant
    assert env["AIRUNTIME_RUNTIME_PREFIX"]["value"] == prefix
    assert env["AIRUNTIME_WORKERS"]["value"] == "8"
    assert env["AIRUNTIME_HTTP_PORT"]["value"] == "8080"
    assert env["AIRUNTIME_REDIS_URL"]["valueFrom"]["secretKeyRef"]["name"] == "redis-credentials"
    assert env["AIRUNTIME_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert env["AIRUNTIME_STEP_SLOTS_FROM_TENANT"]["value"] == "true"
    assert "AIRUNTIME_MAX_CONCURRENT_STEP_TASKS" not in env  # read from the tenant settings
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == prefix
    assert cluster.read("ServiceAccount", namespace, prefix) is not None
    # Two objects per pool: no live-settings ConfigMap, no headless Service.
    assert cluster.read("Service", namespace, prefix) is None
    assert cluster.read("ConfigMap", namespace, f"{prefix}-live-settings") is None

    status = pool["status"]
    assert status["desiredReplicas"] == 2
    assert status["selector"] == _selector(prefix)
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Reconciled": "True",
        "TenantSettingsPublished": "True",
        "Ready": "False",  # no kubelet runs the pods
    }
    (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert ready["reason"] == "ReplicasUnavailable"
    assert ready["message"] == f"0/2 replicas of Deployment {prefix} are available."
    assert cluster.pool_columns(namespace, "pool")["Status"] == "ReplicasUnavailable"
    settings = await registry.tenant(tenant)
    assert settings.runtime_prefix == prefix
    assert settings.isolation_mode is IsolationMode.DEDICATED
    assert settings.max_concurrent_step_tasks == 6
    assert "Reconciled" in await eventually(
        lambda: cluster.event_reasons(namespace, "pool"), what="a Reconciled event"
    )


async def test_spec_change_rolls_out_a_new_pod_template(cluster: Cluster, namespace: str) -> None:
    prefix = unique("rt")
    cluster.create_pool(namespace, "pool", pool_spec(unique("tenant"), prefix))
    await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="first reconcile")
    before = cluster.deployment(namespace, prefix)
    assert before is not None

    cluster.patch_pool(namespace, "pool", {"spec": {"workersPerInstance": 12, "image": "img:2"}})
    await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="second reconcile")

    after = cluster.deployment(namespace, prefix)
    assert after is not None
    assert after["spec"]["template"] != before["spec"]["template"]
    assert after["metadata"]["generation"] > before["metadata"]["generation"]
    assert _container(after)["image"] == "img:2"
    env = {e["name"]: e.get("value") for e in _container(after)["env"]}
    assert env["AIRUNTIME_WORKERS"] == "12"


async def test_max_concurrent_step_tasks_changes_live_without_a_rollout(
    cluster: Cluster, namespace: str, registry: Registry
) -> None:
    tenant, prefix = unique("tenant"), unique("rt")
    cluster.create_pool(namespace, "pool", pool_spec(tenant, prefix, maxConcurrentStepTasks=6))
    await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="first reconcile")
    before = cluster.deployment(namespace, prefix)
    assert before is not None

    cluster.patch_pool(namespace, "pool", {"spec": {"maxConcurrentStepTasks": 40}})
    await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="second reconcile")

    after = cluster.deployment(namespace, prefix)
    assert after is not None
    assert after["spec"]["template"] == before["spec"]["template"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert (await registry.tenant(tenant)).max_concurrent_step_tasks == 40


@pytest.mark.parametrize(
    ("scale_to", "expected"),
    [
        pytest.param(3, 3, id="within-bounds"),
        pytest.param(7, 3, id="clamped-to-max-instances"),
    ],
)
async def test_scale_subresource_drives_the_deployment(
    cluster: Cluster, namespace: str, scale_to: int, expected: int
) -> None:
    prefix = unique("rt")
    cluster.create_pool(namespace, "pool", pool_spec(unique("tenant"), prefix, maxInstances=3))
    await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="first reconcile")

    scale = cluster.custom.patch_namespaced_custom_object_scale(
        API_GROUP, API_VERSION, namespace, RUNTIME_POOL.plural, "pool",
        {"spec": {"replicas": scale_to}}, _content_type="application/merge-patch+json",
    )  # fmt: skip

    assert isinstance(scale, dict)
    assert scale["spec"]["replicas"] == scale_to
    assert scale["status"]["selector"] == _selector(prefix)
    await eventually(
        lambda: cluster.deployment_replicas(namespace, prefix) == expected,
        what=f"Deployment scaled to {expected}",
    )
    pool = await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="reconcile")
    assert pool["status"]["desiredReplicas"] == expected


async def test_status_counts_visible_registry_instances(
    cluster: Cluster, namespace: str, runtimes: RuntimeLauncher
) -> None:
    tenant, prefix = unique("tenant"), unique("rt")
    cluster.create_pool(namespace, "pool", pool_spec(tenant, prefix))
    await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="reconcile")

    for n in range(2):
        await runtimes.start(RuntimeSpec(f"{prefix}-{n}", tenant, prefix))
    await runtimes.start(RuntimeSpec(f"{unique('other')}-0", tenant, unique("other")))

    await eventually(
        lambda: cluster.pool_status(namespace, "pool").get("visibleInstances") == 2,
        what="visibleInstances == 2",
    )
    await runtimes.stop(f"{prefix}-0")
    await eventually(
        lambda: cluster.pool_status(namespace, "pool").get("visibleInstances") == 1,
        what="visibleInstances == 1",
    )


async def test_ready_replicas_follow_the_deployment(cluster: Cluster, namespace: str) -> None:
    prefix = unique("rt")
    cluster.create_pool(namespace, "pool", pool_spec(unique("tenant"), prefix))
    await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="reconcile")
    selector = _selector(prefix)
    # No kubelet runs here: play its part and report the ReplicaSet's pod as ready.
    (pod,) = await eventually(lambda: cluster.pods(namespace, selector), what="the pool's pod")
    cluster.core.patch_namespaced_pod_status(
        pod["metadata"]["name"], namespace,
        {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "ContainersReady", "status": "True"},
        ]}},
        _content_type="application/merge-patch+json",
    )  # fmt: skip

    await eventually(
        lambda: cluster.pool_status(namespace, "pool").get("readyReplicas") == 1,
        what="readyReplicas == 1",
    )
    ready = await eventually(
        lambda: _condition(cluster.pool_status(namespace, "pool"), "Ready", "True"),
        what="the pool Ready",
    )
    assert ready["reason"] == "ReplicasAvailable"
    assert ready["message"].startswith(f"1/1 replicas of Deployment {prefix} are available")
    assert cluster.pool_columns(namespace, "pool")["Status"] == "ReplicasAvailable"


async def test_delete_removes_objects_tenant_settings_and_registry_entries(
    cluster: Cluster, namespace: str, registry: Registry, runtimes: RuntimeLauncher
) -> None:
    tenant, prefix = unique("tenant"), unique("rt")
    created = cluster.create_pool(namespace, "pool", pool_spec(tenant, prefix))
    await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="reconcile")
    await runtimes.start(RuntimeSpec(f"{prefix}-a", tenant, prefix))
    assert tenant in await registry.tenant_ids()
    # What an operator before 0.2 also made for the pool: its deletion removes them too
    # (this API server runs no garbage collector to do it for the owner reference).
    owner = deployments.PoolRef("pool", namespace, created["metadata"]["uid"]).owner_reference()
    meta = {"namespace": namespace, "ownerReferences": [owner]}
    cluster.core.create_namespaced_config_map(
        namespace, {"metadata": {**meta, "name": f"{prefix}-live-settings"}, "data": {"k": "1"}}
    )
    cluster.core.create_namespaced_service(
        namespace,
        {
            "metadata": {**meta, "name": prefix},
            "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 8080}]},
        },
    )

    cluster.delete_pool(namespace, "pool")

    await eventually(lambda: cluster.pool(namespace, "pool") is None, what="pool deleted")
    for kind, name in (
        ("Deployment", prefix),
        ("Service", prefix),
        ("ServiceAccount", prefix),
        ("ConfigMap", f"{prefix}-live-settings"),
    ):
        assert cluster.read(kind, namespace, name) is None, f"{kind} {name} still exists"
    assert tenant not in await registry.tenant_ids()
    assert await registry.list_by_prefix(prefix) == []


async def test_ready_turns_false_when_the_deployment_is_gone(
    cluster: Cluster, namespace: str
) -> None:
    prefix = unique("rt")
    cluster.create_pool(namespace, "pool", pool_spec(unique("tenant"), prefix))
    await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="reconcile")

    cluster.apps.delete_namespaced_deployment(prefix, namespace)

    def not_found() -> dict[str, Any] | None:
        ready = _condition(cluster.pool_status(namespace, "pool"), "Ready", "False")
        return ready if ready and ready["reason"] == "DeploymentNotFound" else None

    ready = await eventually(not_found, what="Ready False: DeploymentNotFound")
    assert ready["message"] == f"Deployment {prefix} does not exist."
    assert cluster.pool_columns(namespace, "pool")["Status"] == "DeploymentNotFound"


async def test_tenant_settings_redis_lost_are_published_again_and_others_kept(
    cluster: Cluster, namespace: str, registry: Registry
) -> None:
    # A Redis that lost its data (the chart's Valkey keeps none across a restart) has
    # no settings for a pool's tenant: it would be a Shared tenant with the default
    # handlers until the spec changed or the operator restarted.
    tenant, other = unique("tenant"), unique("tenant")
    cluster.create_pool(namespace, "pool", pool_spec(tenant, unique("rt")))
    cluster.create_pool(namespace, "other", pool_spec(other, unique("rt")))
    for name in ("pool", "other"):
        await eventually(lambda n=name: cluster.reconciled_pool(namespace, n), what="reconcile")
    published = await registry.tenant(tenant)
    assert published.isolation_mode is IsolationMode.DEDICATED

    async def lost_and_restored(tenant_id: str) -> None:
        expected = await registry.tenant(tenant_id)
        await registry.delete_tenant(tenant_id)

        async def back() -> bool:
            ids = await registry.tenant_ids()
            return tenant_id in ids and await registry.tenant(tenant_id) == expected

        await wait_for(back, what=f"{tenant_id}'s settings published again")

    await lost_and_restored(tenant)
    await eventually(
        lambda: "TenantSettingsRestored" in cluster.event_reasons(namespace, "pool"),
        what="a TenantSettingsRestored event on the pool",
    )
    # Settings that are there (changed through the API since) are never overwritten:
    # three restores of the other pool span more than one refresh of this one.
    changed = published.model_copy(update={"max_concurrent_runs": 7})
    await registry.put_tenant(changed)
    for _ in range(3):
        await lost_and_restored(other)
    assert await registry.tenant(tenant) == changed
