"""Smoke test of the real Kubernetes test environment (tests/k8s_env.py).

Proves that the binaries built by scripts/k8s-test-binaries.sh come up as a
working control plane: the API server stores and serves objects, and the
controller-manager reconciles built-in resources (Deployment -> ReplicaSet).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client, config

from tests.k8s_env import KubeBinariesUnavailable, KubeTestEnv

# A cold cache builds kube-apiserver and kube-controller-manager from source,
# which takes far longer than the default per-test timeout.
pytestmark = pytest.mark.timeout(3600)


@pytest.fixture(scope="module")
def kube_env() -> Iterator[KubeTestEnv]:
    env = KubeTestEnv(with_controller_manager=True)
    try:
        env.bin_dir  # noqa: B018 - resolves (and if needed builds) the binaries
    except KubeBinariesUnavailable as exc:
        pytest.skip(f"Kubernetes test binaries unavailable: {exc}")
    with env:
        yield env


@pytest.fixture(scope="module")
def api_client(kube_env: KubeTestEnv) -> Iterator[client.ApiClient]:
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kube_env.kubeconfig_path)
    )
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]


def test_configmap_roundtrip(kube_env: KubeTestEnv, api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(api_client)
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
    assert kube_env.server.startswith("https://127.0.0.1:")


def test_controller_manager_creates_replicaset(
    kube_env: KubeTestEnv, api_client: client.ApiClient
) -> None:
    assert kube_env.with_controller_manager
    core = client.CoreV1Api(api_client)
    apps = client.AppsV1Api(api_client)
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
    deadline = time.monotonic() + 60
    owned: list[client.V1ReplicaSet] = []
    while time.monotonic() < deadline:
        replica_sets = apps.list_namespaced_replica_set(ns).items
        owned = [
            rs
            for rs in replica_sets
            if rs.metadata is not None
            and any(ref.uid == deployment_uid for ref in rs.metadata.owner_references or [])
        ]
        if owned:
            break
        time.sleep(0.2)

    assert owned, (
        "no ReplicaSet created for the Deployment within 60s; controller-manager log: "
        f"{kube_env.log_tail('kube-controller-manager')}"
    )
    spec = owned[0].spec
    assert spec is not None
    assert spec.replicas == 1
