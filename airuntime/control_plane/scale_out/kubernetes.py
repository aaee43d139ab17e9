"""The ``kubernetes`` scale-out provider: capacity through ScaleOutRequest resources.

On Kubernetes the control plane does not start processes: for each scale-out request
it creates a ``ScaleOutRequest`` custom resource (``airuntime.io/v1alpha1``, named
after the request id, carrying the tenant settings of that moment) and waits for
the operator to scale the tenant's RuntimePool and mark the resource Fulfilled with
the new instance id (or Rejected with a reason). The requeue service then puts the
shared run back into the shared queue, exactly as with the local provider.

The ``kubernetes`` client is an optional dependency (``pip install airuntime[kubernetes]``)
and is imported lazily; its blocking calls run in a thread.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from airuntime.control_plane.scale_out import ScaleOutRejected, ScaleOutRequest

GROUP, VERSION, PLURAL = "airuntime.io", "v1alpha1", "scaleoutrequests"


def _load_client(kubeconfig: str | None) -> Any:
    from kubernetes import client, config

    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig)
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
    return client.CustomObjectsApi()


class KubernetesScaleOutProvider:
    """Creates ScaleOutRequest resources and waits for the operator's verdict."""

    name = "kubernetes"

    def __init__(
        self,
        namespace: str | None = None,
        *,
        kubeconfig: str | None = None,
        timeout_s: float = 300.0,
        poll_s: float = 0.5,
        api: Any = None,
    ) -> None:
        self.namespace = namespace or os.environ.get("AIRUNTIME_NAMESPACE") or "default"
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.api = api or _load_client(kubeconfig)

    def manifest(self, req: ScaleOutRequest) -> dict[str, Any]:
        t = req.tenant_settings
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ScaleOutRequest",
            "metadata": {
                "name": req.request_id,
                "labels": {
                    "airuntime.io/tenant": req.tenant_id,
                    "airuntime.io/prefix": req.runtime_prefix,
                },
            },
            "spec": {
                "tenantId": req.tenant_id,
                "runtimePrefix": req.runtime_prefix,
                "sharedRunId": req.shared_run_id,
                "requestedInstances": req.requested_instances,
                "tenantSettings": {
                    "tenantId": t.tenant_id,
                    **({"tenantGroupId": t.tenant_group_id} if t.tenant_group_id else {}),
                    "isolationMode": t.isolation_mode.value,
                    "preferDedicated": t.prefer_dedicated,
                    "allowSharedFallback": t.allow_shared_fallback,
                    "maxInstances": t.max_instances,
                    "runtimePrefix": t.runtime_prefix,
                    "workersPerInstance": t.workers_per_instance,
                    "maxConcurrentRuns": t.max_concurrent_runs,
                    "queueCapacity": t.queue_capacity,
                    "maxLocalWorkersPerExecution": t.max_local_workers_per_execution,
                    "maxConcurrentStepTasks": t.max_concurrent_step_tasks,
                },
            },
        }

    async def fulfil(self, request: ScaleOutRequest) -> str:
        from kubernetes.client.exceptions import ApiException

        body = self.manifest(request)
        try:
            await asyncio.to_thread(
                self.api.create_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                body,
            )
        except ApiException as exc:
            if exc.status != 409:  # 409: created by an earlier attempt; just wait for it
                raise ScaleOutRejected(
                    f"the API server refused ScaleOutRequest {request.request_id}: "
                    f"{exc.status} {exc.reason}"
                ) from None
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            obj = await asyncio.to_thread(
                self.api.get_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                request.request_id,
            )
            status = obj.get("status") or {}
            phase = status.get("phase")
            if phase == "Fulfilled" and status.get("fulfilledRuntimeInstanceId"):
                return str(status["fulfilledRuntimeInstanceId"])
            if phase == "Rejected":
                raise ScaleOutRejected(status.get("reason") or "rejected by the operator")
            await asyncio.sleep(self.poll_s)
        raise ScaleOutRejected(
            f"ScaleOutRequest {request.request_id} not fulfilled within {self.timeout_s} s"
        )

    async def close(self) -> None:
        return None
