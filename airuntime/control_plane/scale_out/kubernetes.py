"""The ``kubernetes`` scale-out provider: capacity through ScaleOutRequest resources.

On Kubernetes the control plane does not start processes: for each scale-out request
it creates a ``ScaleOutRequest`` custom resource (``airuntime.io/v1alpha1``, named
after the request id, carrying the tenant settings of that moment) and waits for
the operator to scale the tenant's RuntimePool and mark the resource Fulfilled with
the new instance id (or Rejected with a reason). The requeue service then puts the
shared run back into the shared queue, exactly as with the local provider. When an
attempt fails (refused by the API server or the operator, not fulfilled in time) the
provider posts a ``ScaleOutFailed`` warning Event about the request, so ``kubectl
describe sor`` shows what the control plane saw; the prefix then backs off.

The resource is built from the contract's models (:mod:`airuntime.k8s.v1alpha1`), so
it is validated before it is sent, and it travels through the client the operator
uses too (:mod:`airuntime.k8s.client`). That client needs the optional ``kubernetes``
extra (``pip install 'airuntime[kubernetes]'``): importing this module without it
raises ImportError, which ``airt control-plane`` reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import ValidationError

from airuntime.control_plane.scale_out.requests import ScaleOutRejected, ScaleOutRequest
from airuntime.k8s.client import (
    EVENT,
    SCALE_OUT_REQUEST_KIND,
    ApiError,
    KubeApi,
    load_configuration,
)
from airuntime.k8s.conditions import EventReason
from airuntime.k8s.v1alpha1 import (
    LABEL_PREFIX,
    LABEL_TENANT,
    SCALE_OUT_REQUEST,
    ScaleOutPhase,
    ScaleOutRequestSpec,
    TenantSettingsSnapshot,
    scale_out_request_manifest,
)

FIELD_MANAGER: Final = "airuntime-control-plane"
"""User agent (and field manager) of the control plane's requests to the API server."""

log = logging.getLogger(__name__)


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
        kube: KubeApi | None = None,
    ) -> None:
        self.namespace = namespace or os.environ.get("AIRUNTIME_NAMESPACE") or "default"
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.kube = kube or KubeApi(
            load_configuration(kubeconfig, fall_back_to_kubeconfig=True),
            field_manager=FIELD_MANAGER,
            threads=4,
        )

    def manifest(self, req: ScaleOutRequest) -> dict[str, Any]:
        """The ScaleOutRequest resource of ``req`` (raises ValidationError when invalid)."""
        spec = ScaleOutRequestSpec(
            tenant_id=req.tenant_id,
            runtime_prefix=req.runtime_prefix,
            shared_run_id=req.shared_run_id,
            requested_instances=req.requested_instances,
            tenant_settings=TenantSettingsSnapshot.of(req.tenant_settings),
        )
        labels = {LABEL_TENANT: req.tenant_id, LABEL_PREFIX: req.runtime_prefix}
        return scale_out_request_manifest(req.request_id, self.namespace, spec, labels=labels)

    async def fulfil(self, request: ScaleOutRequest) -> str:
        try:
            return await self._fulfil(request)
        except Exception as exc:
            await self._failure_event(request, exc)
            raise

    async def _fulfil(self, request: ScaleOutRequest) -> str:
        await self._create(request)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            obj = await self.kube.get(SCALE_OUT_REQUEST_KIND, self.namespace, request.request_id)
            if obj is None:
                raise ScaleOutRejected(
                    f"ScaleOutRequest {request.request_id} was deleted before a verdict"
                )
            status = obj.get("status") or {}
            phase = status.get("phase")
            if phase == ScaleOutPhase.FULFILLED and status.get("fulfilledRuntimeInstanceId"):
                return str(status["fulfilledRuntimeInstanceId"])
            if phase == ScaleOutPhase.REJECTED:
                raise ScaleOutRejected(status.get("reason") or "rejected by the operator")
            await asyncio.sleep(self.poll_s)
        raise ScaleOutRejected(
            f"ScaleOutRequest {request.request_id} not fulfilled within {self.timeout_s} s"
        )

    async def _create(self, request: ScaleOutRequest) -> None:
        """File the resource; one created by an earlier attempt is simply waited for."""
        try:
            body = self.manifest(request)
        except ValidationError as exc:
            raise ScaleOutRejected(
                f"ScaleOutRequest {request.request_id} would be invalid: {exc}"
            ) from None
        try:
            await self.kube.create(SCALE_OUT_REQUEST_KIND, self.namespace, body)
        except ApiError as exc:
            if exc.status != 409:  # 409: created by an earlier attempt; just wait for it
                raise ScaleOutRejected(
                    f"the API server refused ScaleOutRequest {request.request_id}: "
                    f"{exc.status} {exc.reason}"
                ) from None

    async def _failure_event(self, request: ScaleOutRequest, exc: Exception) -> None:
        """A ``ScaleOutFailed`` warning about the request (best effort: an Event that
        cannot be posted is logged, the failure itself is recorded in Redis anyway)."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        message = (
            f"Scale-out attempt {request.attempts} for {request.runtime_prefix} (shared run "
            f"{request.shared_run_id}) failed: {exc}; the control plane backs off before "
            "the next attempt."
        )[:1024]
        involved: dict[str, str] = {
            "apiVersion": SCALE_OUT_REQUEST.api_version,
            "kind": SCALE_OUT_REQUEST.kind,
            "name": request.request_id,
            "namespace": self.namespace,
        }
        with contextlib.suppress(Exception):
            found = await self.kube.get(SCALE_OUT_REQUEST_KIND, self.namespace, request.request_id)
            if found is not None:
                involved["uid"] = str(found["metadata"]["uid"])
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{request.request_id}.", "namespace": self.namespace},
            "involvedObject": involved,
            "reason": EventReason.SCALE_OUT_FAILED.value,
            "message": message,
            "type": "Warning",
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": os.environ.get("HOSTNAME", FIELD_MANAGER),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.kube.create(EVENT, self.namespace, body)
        except Exception as event_exc:
            log.warning(
                "cannot post the ScaleOutFailed event of %s: %s", request.request_id, event_exc
            )

    async def close(self) -> None:
        self.kube.close()
