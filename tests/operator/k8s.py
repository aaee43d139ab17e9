"""Helpers of the operator tests: the cluster seen through the official client, as dicts.

Waiting uses polling with a deadline, and only for what *other* processes do (the
operator, kube-controller-manager): the tests cannot be told when those are done.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from airuntime.k8s.v1alpha1 import (
    API_GROUP,
    API_VERSION,
    RUNTIME_POOL,
    SCALE_OUT_REQUEST,
    CrdNames,
)

T = TypeVar("T")

DEFAULT_TIMEOUT = 60.0
MERGE_PATCH = "application/merge-patch+json"


async def eventually(
    probe: Callable[[], T | None],
    *,
    within: float = DEFAULT_TIMEOUT,
    what: str,
    interval: float = 0.1,
) -> T:
    """Async :func:`wait_until`: ``probe`` (blocking client calls) runs in a thread, so the
    test's event loop stays free."""
    deadline = time.monotonic() + within
    last = await asyncio.to_thread(probe)
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g}s waiting for {what}; last: {last!r}")
        await asyncio.sleep(interval)
        last = await asyncio.to_thread(probe)
    return last


def _json(obj: object) -> dict[str, Any]:
    """The custom-objects API is typed ``object``; its answers are JSON objects."""
    assert isinstance(obj, dict), f"expected a JSON object, got {type(obj).__name__}"
    return obj


def api_error_message(exc: ApiException) -> str:
    """The API server's message of a failed request (the ``Status`` body)."""
    try:
        return str(json.loads(exc.body or "{}").get("message", exc.body))
    except ValueError:
        return str(exc.body)


class Cluster:
    """The objects the tests read and write, through the official ``kubernetes`` client."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)

    def as_dict(self, obj: Any) -> dict[str, Any]:
        """A generated model object as the API's JSON (camelCase keys)."""
        return _json(self.api.sanitize_for_serialization(obj))  # type: ignore[no-untyped-call]

    # -- RuntimePool ----------------------------------------------------------------------

    def _create(
        self, names: CrdNames, namespace: str, name: str, spec: dict[str, Any]
    ) -> dict[str, Any]:
        """Create a custom resource from a raw spec (which may well be invalid)."""
        body = {
            "apiVersion": names.api_version,
            "kind": names.kind,
            "metadata": {"name": name},
            "spec": spec,
        }
        return _json(
            self.custom.create_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, names.plural, body
            )
        )

    def _get(self, names: CrdNames, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found = self.custom.get_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, names.plural, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return _json(found)

    def create_pool(self, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self._create(RUNTIME_POOL, namespace, name, spec)

    def reconciled_pool(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pool once the operator reconciled its current generation."""
        pool = self.pool(namespace, name)
        if pool is None:
            return None
        if pool.get("status", {}).get("observedGeneration") != pool["metadata"]["generation"]:
            return None
        return pool

    def pool_status(self, namespace: str, name: str) -> dict[str, Any]:
        status: dict[str, Any] = (self.pool(namespace, name) or {}).get("status", {})
        return status

    def pool(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(RUNTIME_POOL, namespace, name)

    def pool_columns(self, namespace: str, name: str) -> dict[str, Any]:
        """The pool's printer columns as the API server renders them (``kubectl get rp``)."""
        path = (
            f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{namespace}/{RUNTIME_POOL.plural}/{name}"
        )
        method, url, headers, body, _ = self.api.param_serialize(
            method="GET", resource_path=path, auth_settings=["BearerToken"],
            header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        )  # fmt: skip
        response = self.api.call_api(method, url, header_params=headers, body=body)
        table = json.loads(response.read())  # type: ignore[no-untyped-call]
        (row,) = table["rows"]
        return {
            c["name"]: cell
            for c, cell in zip(table["columnDefinitions"], row["cells"], strict=True)
        }

    def patch_pool(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        patched = self.custom.patch_namespaced_custom_object(
            API_GROUP, API_VERSION, namespace, RUNTIME_POOL.plural, name, patch,
            _content_type=MERGE_PATCH,
        )  # fmt: skip
        return _json(patched)

    def delete_pool(self, namespace: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(
            API_GROUP, API_VERSION, namespace, RUNTIME_POOL.plural, name
        )

    # -- ScaleOutRequest ----------------------------------------------------------------------

    def create_request(self, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self._create(SCALE_OUT_REQUEST, namespace, name, spec)

    def request(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(SCALE_OUT_REQUEST, namespace, name)

    def request_in_phase(self, namespace: str, name: str, phase: str) -> dict[str, Any] | None:
        """The request once its ``status.phase`` is ``phase``."""
        found = self.request(namespace, name)
        return found if found and found.get("status", {}).get("phase") == phase else None

    def request_phase(self, namespace: str, name: str) -> str | None:
        found = self.request(namespace, name)
        return None if found is None else found.get("status", {}).get("phase")

    # -- built-in kinds -------------------------------------------------------------------------

    def deployment_replicas(self, namespace: str, name: str) -> int | None:
        found = self.deployment(namespace, name)
        return None if found is None else int(found["spec"]["replicas"])

    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.as_dict(self.apps.read_namespaced_deployment(name, namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        readers: dict[str, Callable[[str, str], Any]] = {
            "Deployment": self.apps.read_namespaced_deployment,
            "Service": self.core.read_namespaced_service,
            "ServiceAccount": self.core.read_namespaced_service_account,
            "ConfigMap": self.core.read_namespaced_config_map,
            "Pod": self.core.read_namespaced_pod,
        }
        try:
            return self.as_dict(readers[kind](name, namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        listed = self.core.list_namespaced_pod(namespace, label_selector=label_selector)
        return [self.as_dict(p) for p in listed.items]

    def event_reasons(self, namespace: str, name: str) -> list[str]:
        """Reasons of the events posted about the object ``name`` in ``namespace``."""
        events = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        )
        return [e.reason for e in events.items if e.reason]


def unique(prefix: str) -> str:
    """A DNS label unique to this test run (registry keys are global in Redis)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def pool_spec(tenant_id: str, runtime_prefix: str, **overrides: Any) -> dict[str, Any]:
    """A valid RuntimePool spec (camelCase, as sent to the API server)."""
    spec: dict[str, Any] = {
        "tenantId": tenant_id,
        "isolationMode": "Dedicated",
        "runtimePrefix": runtime_prefix,
        "minInstances": 1,
        "maxInstances": 3,
        "replicas": 1,
        "workersPerInstance": 8,
        "maxConcurrentRunsPerInstance": 4,
        "localQueueCapacity": 50,
        "maxLocalWorkersPerExecution": 2,
        "maxConcurrentStepTasks": 6,
        "redis": {"name": "redis-credentials", "key": "url"},
    }
    spec.update(overrides)
    return spec


def request_spec(
    tenant_id: str, runtime_prefix: str, *, requested: int = 1, **overrides: Any
) -> dict[str, Any]:
    """A valid ScaleOutRequest spec."""
    spec: dict[str, Any] = {
        "tenantId": tenant_id,
        "runtimePrefix": runtime_prefix,
        "sharedRunId": f"run-{uuid.uuid4().hex[:12]}",
        "requestedInstances": requested,
    }
    spec.update(overrides)
    return spec
