"""ScaleOutRequest fulfilled by a real ``airt runtime`` process.

No kubelet runs next to this API server, so the test plays it for the one pod the
operator's scale-out asks for: it starts the pool Deployment's own container -- its
``command`` and its ``env`` resolved like the kubelet does (the Redis URL from the
Secret, the pod name for ``metadata.name``, ``127.0.0.1`` for ``status.podIP``) -- as a
local process (:class:`tests.e2e.cluster.LocalContainer`). The process registers
itself in Redis, and the operator must fulfil the request with it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from airuntime.fleet.registry import Registry
from tests.e2e.cluster import POD_IP, LocalContainer, PodIdentity, pod_name
from tests.operator.k8s import Cluster, eventually, pool_spec, request_spec, unique

pytestmark = pytest.mark.usefixtures("operator")

REDIS_SECRET = "redis-credentials"
HEARTBEAT_S = "0.5"


def _redis_secret(cluster: Cluster, namespace: str, url: str) -> None:
    cluster.core.create_namespaced_secret(
        namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name=REDIS_SECRET), string_data={"url": url}),
    )


def _start_pod(
    cluster: Cluster, namespace: str, deployment: dict[str, Any], root: Path
) -> LocalContainer:
    """One pod of ``deployment`` as a local process: the template's first container, its
    command run by this interpreter (the image's ``airt`` is ``python -m airuntime.cli``)."""
    spec = deployment["spec"]["template"]["spec"]
    container = dict(spec["containers"][0])
    command = list(container["command"])
    assert command[:2] == ["airt", "runtime"], command
    container["command"] = [sys.executable, "-m", "airuntime.cli", *command[1:]]
    declared = {e["name"] for e in container.get("env") or []}
    overrides = {"AIRUNTIME_HTTP_PORT": "0", "AIRUNTIME_HTTP_HOST": POD_IP}
    if "AIRUNTIME_HEARTBEAT_S" not in declared:
        overrides["AIRUNTIME_HEARTBEAT_S"] = HEARTBEAT_S
    pod = PodIdentity(
        pod_name(deployment["metadata"]["name"]),
        namespace,
        spec.get("serviceAccountName") or "default",
    )
    return LocalContainer(
        pod, spec, container, api=cluster.api, root=root / pod.name, overrides=overrides
    )


def _exit_code(popen: subprocess.Popen[bytes], timeout: float) -> int | None:
    try:
        return popen.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


async def test_request_is_fulfilled_by_a_real_runtime_process(
    cluster: Cluster, namespace: str, registry: Registry, valkey_url: str, tmp_path: Path
) -> None:
    tenant, prefix = unique("tenant"), unique("real-runtime")
    _redis_secret(cluster, namespace, valkey_url)
    cluster.create_pool(
        namespace,
        "pool",
        pool_spec(
            tenant, prefix, minInstances=0, replicas=0, maxInstances=2,
            redis={"name": REDIS_SECRET, "key": "url"},
        ),
    )  # fmt: skip
    await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="pool reconciled")
    await eventually(lambda: cluster.deployment(namespace, prefix), what="the pool's Deployment")
    assert cluster.deployment_replicas(namespace, prefix) == 0

    cluster.create_request(namespace, "sor", request_spec(tenant, prefix, requested=1))

    observed = await eventually(
        lambda: cluster.request_in_phase(namespace, "sor", "Observed"), what="sor Observed"
    )
    assert (observed["status"]["previousReplicas"], observed["status"]["targetReplicas"]) == (0, 1)
    assert observed["status"]["baselineInstanceIds"] == []
    deployment = await eventually(
        lambda: (d := cluster.deployment(namespace, prefix)) and d["spec"]["replicas"] == 1 and d,
        what="Deployment scaled to 1",
    )

    # The kubelet's part: start the one pod the Deployment now asks for.
    pod = _start_pod(cluster, namespace, deployment, tmp_path)
    try:

        def fulfilled() -> dict[str, Any] | None:
            if not pod.alive():
                raise AssertionError(f"airt runtime exited {pod.popen.returncode}:\n{pod.log()}")
            return cluster.request_in_phase(namespace, "sor", "Fulfilled")

        request = await eventually(fulfilled, within=30, what="sor Fulfilled")
        assert request["status"]["fulfilledRuntimeInstanceId"] == pod.name, pod.log()
        assert request["status"]["fulfilledAt"]

        descriptor = await registry.get(pod.name)
        assert descriptor is not None
        assert (descriptor.tenant_id, descriptor.runtime_prefix) == (tenant, prefix)
        assert descriptor.capacity.can_accept_run
        await eventually(
            lambda: cluster.pool_status(namespace, "pool").get("visibleInstances") == 1,
            what="pool visibleInstances 1",
        )
    finally:
        pod.terminate()  # SIGTERM to the process group, as the kubelet would
        exit_code = await asyncio.to_thread(_exit_code, pod.popen, 30)
        pod.stop(grace=0)  # SIGKILL whatever is left (nothing, after a clean exit)

    assert exit_code == 0, pod.log()
    assert await registry.get(pod.name) is None, "the stopped runtime left the registry"
