"""Smoke test of the real Kubernetes test environment (tests/k8s_env.py).

Proves that the binaries built by scripts/k8s-test-binaries.sh come up as a
working control plane: the API server stores and serves objects, and the
controller-manager reconciles built-in resources (Deployment -> ReplicaSet). It uses
the session's cluster of the operator tests (``kube_cluster``, ``k8s`` in conftest.py).
"""

from __future__ import annotations

import contextlib
import uuid

import pytest
from kubernetes import client

from tests.k8s_env import KubeTestEnv
from tests.polling import wait_until

# A cold cache builds kube-apiserver and kube-controller-manager from source,
# which takes far longer than the default per-test timeout.
pytestmark = pytest.mark.timeout(3600)


def test_configmap_roundtrip(kube_cluster: KubeTestEnv, k8s: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s)
    ns = f"smoke-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    core.create_namespaced_config_map(
        ns,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="greeting"),
            data={"hello": "world"},
        ),
    )

    cm = core.read_namespaced_config_map("greeting", ns)

    assert cm.data == {"hello": "world"}
    assert cm.metadata is not None
    assert cm.metadata.namespace == ns
    assert kube_cluster.server.startswith("https://127.0.0.1:")


def test_controller_manager_creates_replicaset(
    kube_cluster: KubeTestEnv, k8s: client.ApiClient
) -> None:
    assert kube_cluster.with_controller_manager
    core = client.CoreV1Api(k8s)
    apps = client.AppsV1Api(k8s)
    ns = f"smoke-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    labels = {"app": "smoke"}
    deployment = apps.create_namespaced_deployment(
        ns,
        client.V1Deployment(
            metadata=client.V1ObjectMeta(name="smoke"),
            spec=client.V1DeploymentSpec(
                replicas=1,
                selector=client.V1LabelSelector(match_labels=labels),
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(labels=labels),
                    spec=client.V1PodSpec(
                        containers=[client.V1Container(name="app", image="example.invalid/app:1")]
                    ),
                ),
            ),
        ),
    )

    assert deployment.metadata is not None
    deployment_uid = deployment.metadata.uid

    # Waiting on an external controller (kube-controller-manager), so poll.
    def owned_replica_sets() -> list[client.V1ReplicaSet]:
        return [
            rs
            for rs in apps.list_namespaced_replica_set(ns).items
            if rs.metadata is not None
            and any(ref.uid == deployment_uid for ref in rs.metadata.owner_references or [])
        ]

    owned: list[client.V1ReplicaSet] = []
    with contextlib.suppress(AssertionError):  # the assertion below names the log
        owned = wait_until(
            owned_replica_sets, within=60, what="a ReplicaSet of the Deployment", interval=0.2
        )

    assert owned, (
        "no ReplicaSet created for the Deployment within 60s; controller-manager log: "
        f"{kube_cluster.log_tail('kube-controller-manager')}"
    )
    spec = owned[0].spec
    assert spec is not None
    assert spec.replicas == 1
