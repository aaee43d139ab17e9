"""``python -m airuntime_operator`` -- settings from the environment, kopf peering (HA).

The real entry point runs as a subprocess: with peering (its default) it creates its
ClusterKopfPeering object when missing, announces itself there with its priority,
handles resources, and stops cleanly on SIGTERM. The peering CRDs ship in ``crds/``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.k8s_env import REPO_ROOT, KubeTestEnv
from tests.operator.k8s import Cluster, eventually, pool_spec, unique


@pytest.fixture
def operator_process(kube_cluster: KubeTestEnv, valkey_url: str) -> Iterator[tuple[str, Any]]:
    peering = unique("airuntime")
    env = {
        **os.environ,
        "KUBECONFIG": str(kube_cluster.kubeconfig_path),
        "AIRUNTIME_REDIS_URL": valkey_url,
        "AIRUNTIME_OPERATOR_PEERING": peering,
        "AIRUNTIME_OPERATOR_PRIORITY": "100",
        "AIRUNTIME_OPERATOR_STATUS_INTERVAL": "0.5",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "airuntime_operator"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield peering, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def test_main_module_peers_reconciles_and_stops_on_sigterm(
    operator_process: tuple[str, subprocess.Popen[str]], cluster: Cluster, namespace: str
) -> None:
    peering, process = operator_process
    custom = client.CustomObjectsApi(cluster.api)

    def announced() -> bool:
        try:
            found = custom.get_cluster_custom_object(
                "kopf.dev", "v1", "clusterkopfpeerings", peering
            )
        except client.exceptions.ApiException:
            return process.poll() is not None  # stop waiting if the operator died
        assert isinstance(found, dict)
        peers: dict[str, Any] = found.get("status") or {}
        return any(p.get("priority") == 100 for p in peers.values())

    await eventually(announced, what=f"ClusterKopfPeering {peering} with this operator")
    assert process.poll() is None, process.stdout.read() if process.stdout else ""

    prefix = unique("rt")
    cluster.create_pool(namespace, "pool", pool_spec(unique("tenant"), prefix))
    await eventually(lambda: cluster.deployment(namespace, prefix), what="the pool's Deployment")
    cluster.delete_pool(namespace, "pool")
    await eventually(lambda: cluster.pool(namespace, "pool") is None, what="pool finalized")

    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
