"""The end-to-end scenario on a kind cluster: the real image, pods and kubelet.

The same scenario as ``tests/e2e/test_cluster_e2e.py`` (one run per tenant mode, every
run needing a scale-out through a ScaleOutRequest), on kind: the image is built from the
repository's Dockerfile (``docker build``) and loaded into the cluster of
``kind-config.yaml``; the chart is installed with ``helm install`` (in-cluster Valkey,
the control plane on the NodePort that ``kind-config.yaml`` maps to the host); the
RuntimePools are applied with ``kubectl apply -f``; runs are submitted through the
mapped port.

The cluster comes from pytest-kind's :class:`pytest_kind.KindCluster`, pointed at the
``kind`` and ``kubectl`` that ``scripts/k8s-node-binaries.sh`` builds from the Go module
proxy (so it never downloads either): it creates the cluster from ``kind-config.yaml``
(or reuses one of that name, which is then kept) and loads the image. Only the last
step needs a container engine: without a reachable docker daemon the scenario is
skipped with the reason, after the fixture's wiring was checked
(``test_kind_fixture_uses_the_built_binaries``). A cluster this test creates is deleted
afterwards (unless ``AIRUNTIME_KIND_KEEP=1``).
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.cluster import (
    MAX_INSTANCES,
    TENANTS,
    check_placement,
    scenario_values,
    submit_and_wait,
)
from tests.e2e.test_chart import CHART, helm, run_helm  # noqa: F401 - helm is a fixture
from tests.polling import wait_until

pytestmark = [pytest.mark.timeout(1800), pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
KIND_CONFIG = REPO_ROOT / "kind-config.yaml"
IMAGE_REPOSITORY, IMAGE_TAG = "airuntime", "e2e"
RELEASE = NAMESPACE = "airuntime"
RUN_DEADLINE = 300.0


def docker_missing() -> str | None:
    """Why kind cannot create a cluster here (it runs its nodes as docker containers)."""
    if shutil.which("docker") is None:
        return "docker is not installed"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`docker info` failed: {exc}"
    if info.returncode != 0:
        return f"`docker info` failed (no reachable docker daemon): {info.stderr.strip()[-300:]}"
    return None


def sh(*argv: str, timeout: float = 900, input_text: str | None = None) -> str:
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, input=input_text, cwd=REPO_ROOT
    )
    assert proc.returncode == 0, f"{shlex.join(argv)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


class Kind:
    """pytest-kind's cluster plus helm, with the scenario's namespace."""

    def __init__(self, cluster: Any, tmp: Path, helm_path: str) -> None:
        self.cluster, self.tmp, self.helm = cluster, tmp, helm_path

    def kubectl(self, *args: str, input_text: str | None = None) -> str:
        return str(self.cluster.kubectl(*args, input=input_text))

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "--namespace", NAMESPACE, "-o", "json"))

    def run_helm(self, *args: str, values: dict[str, Any] | None = None) -> str:
        return run_helm(self.helm, *args, "--kubeconfig", str(self.cluster.kubeconfig_path),
                        values=values, tmp=self.tmp)  # fmt: skip


@pytest.fixture(scope="module")
def kind_cluster_object(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A :class:`pytest_kind.KindCluster` for ``kind-config.yaml``'s cluster, using the
    built ``kind`` and ``kubectl`` (not created yet)."""
    from pytest_kind import KindCluster

    from tests.k8s_node import NodeUnavailable, node_binaries

    try:
        bin_dir = node_binaries()
    except NodeUnavailable as exc:
        pytest.skip(f"kind and kubectl could not be built: {exc}")
    name = yaml.safe_load(KIND_CONFIG.read_text())["name"]
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
    return KindCluster(
        name, kubeconfig, kind_path=bin_dir / "kind", kubectl_path=bin_dir / "kubectl"
    )


def test_kind_fixture_uses_the_built_binaries(kind_cluster_object: Any) -> None:
    """The fixture's wiring, up to where a container engine is needed: pytest-kind is
    pointed at built binaries that run, so ``ensure_kind``/``ensure_kubectl`` have
    nothing to download."""
    cluster = kind_cluster_object
    assert cluster.name == yaml.safe_load(KIND_CONFIG.read_text())["name"]
    for path in (cluster.kind_path, cluster.kubectl_path):
        assert path.is_file() and os.access(path, os.X_OK), path
    cluster.ensure_kind()
    cluster.ensure_kubectl()
    assert sh(str(cluster.kind_path), "version").startswith("kind v")
    assert "v1.30" in sh(str(cluster.kubectl_path), "version", "--client")
    # kind reads kind-config.yaml (this validates it without creating anything).
    config = yaml.safe_load(KIND_CONFIG.read_text())
    assert (config["kind"], config["apiVersion"]) == ("Cluster", "kind.x-k8s.io/v1alpha4")


@pytest.fixture(scope="module")
def kind(
    kind_cluster_object: Any,
    helm: str,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Kind]:
    missing = docker_missing()
    if missing:
        pytest.skip(f"kind e2e needs a docker engine: {missing}")
    cluster = kind_cluster_object
    created = cluster.name not in sh(str(cluster.kind_path), "get", "clusters").split()
    cluster.create(config_file=KIND_CONFIG)
    kind = Kind(cluster, tmp_path_factory.mktemp("kind-helm"), helm)
    try:
        image = f"{IMAGE_REPOSITORY}:{IMAGE_TAG}"
        sh("docker", "build", "-t", image, ".", timeout=1800)
        cluster.load_docker_image(image)
        yield kind
    finally:
        subprocess.run([str(cluster.kubectl_path), "--kubeconfig", str(cluster.kubeconfig_path),
                        "delete", "runtimepools,scaleoutrequests", "--all",
                        "--namespace", NAMESPACE, "--timeout=60s"],
                       capture_output=True, timeout=120)  # fmt: skip
        subprocess.run([helm, "uninstall", RELEASE, "--namespace", NAMESPACE,
                        "--kubeconfig", str(cluster.kubeconfig_path)],
                       capture_output=True, timeout=300)  # fmt: skip
        if created and os.environ.get("AIRUNTIME_KIND_KEEP") != "1":
            cluster.delete()


def test_scenario_on_kind(kind: Kind) -> None:
    node = yaml.safe_load(KIND_CONFIG.read_text())["nodes"][0]
    (mapping,) = [m for m in node["extraPortMappings"] if m["containerPort"] == 30780]
    values = {
        **scenario_values(with_pools=False),
        "image": {"repository": IMAGE_REPOSITORY, "tag": IMAGE_TAG, "pullPolicy": "Never"},
        "redis": {"valkey": {"enabled": True}},
    }
    values["controlPlane"] = {
        **values["controlPlane"],
        "service": {"type": "NodePort", "nodePort": mapping["containerPort"]},
    }
    kind.run_helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
                  "--wait", "--timeout", "10m", values=values)  # fmt: skip

    # The RuntimePools, applied by hand like a user would (Redis: the chart's Valkey).
    pools = [
        {
            "apiVersion": "airuntime.io/v1alpha1",
            "kind": "RuntimePool",
            "metadata": {"name": pool, "namespace": NAMESPACE},
            "spec": {"tenantId": tenant, "runtimePrefix": prefix, "isolationMode": mode,
                     "minInstances": 0, "maxInstances": MAX_INSTANCES, "replicas": 0,
                     "redis": {"name": f"{RELEASE}-redis", "key": "url"}},
        }
        for tenant, (mode, pool, prefix) in TENANTS.items()
    ]  # fmt: skip
    kind.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(pools))

    def reconciled() -> bool:
        items = kind.get("runtimepools")["items"]
        return len(items) == 3 and all("desiredReplicas" in (p.get("status") or {}) for p in items)

    wait_until(
        reconciled, within=120, what="the operator to reconcile the RuntimePools", interval=1
    )

    secret = kind.get("secret", f"{RELEASE}-tokens")
    entries = yaml.safe_load(base64.b64decode(secret["data"]["tokens.yaml"]))["tokens"]
    tokens = {e["tenant"]: e["token"] for e in entries}
    api_url = f"http://{mapping.get('listenAddress', '127.0.0.1')}:{mapping['hostPort']}"
    assert httpx.get(f"{api_url}/readyz", timeout=10).status_code == 200

    submitted, finished = submit_and_wait(api_url, tokens, deadline_s=RUN_DEADLINE)
    assert set(finished) == set(TENANTS), (
        f"unfinished: {sorted(set(TENANTS) - set(finished))}; "
        f"scale-out requests: {kind.get('scaleoutrequests')['items']}"
    )
    check_placement(submitted, finished)

    requests = {r["spec"]["tenantId"]: r for r in kind.get("scaleoutrequests")["items"]}
    pods = {p["metadata"]["name"] for p in kind.get("pods")["items"]}
    for tenant in TENANTS:
        status = requests[tenant]["status"]
        instance = finished[tenant]["assigned_instance_id"]
        assert status["phase"] == "Fulfilled", status
        assert status["fulfilledRuntimeInstanceId"] == instance
        assert instance in pods, f"{instance} is not a pod of the cluster: {sorted(pods)}"
