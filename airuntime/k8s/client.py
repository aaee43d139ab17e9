"""The one Kubernetes API client of airuntime: an asyncio facade, plain dicts in and out.

Why this exists: two parts of airuntime talk to the API server -- the operator
(which creates and patches Deployments, Services and the pools a scale-out request
scales, besides what kopf handles) and the control plane's ``kubernetes`` scale-out
provider (which files ScaleOutRequests and waits for their verdict). Both use this
module. The official ``kubernetes`` client is synchronous and converts everything
to generated model classes; here it is used only for what it does well -- loading
kubeconfig / in-cluster credentials, refreshing tokens, TLS -- while requests and
answers stay JSON dicts (built from :mod:`airuntime.k8s.v1alpha1`'s models), and
the blocking calls run on a bounded thread pool so the event loop never waits.

Objects are written with server-side apply (one request creates or updates, and
an unchanged object is not even touched), or with JSON merge patches carrying
``metadata.resourceVersion`` where a read-modify-write must not lose a concurrent
update (the API server answers 409 Conflict, surfaced as :class:`ApiError` with
``conflict`` true; the operator turns it into a kopf retry with backoff).

This is the only module of airuntime that imports the ``kubernetes`` package (the
optional ``kubernetes`` extra); nothing that ``airt`` imports at start-up imports
this module, and it knows nothing of kopf.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from airuntime.k8s.v1alpha1 import RUNTIME_POOL, SCALE_OUT_REQUEST, CrdNames

__all__ = [
    "CONFIG_MAP",
    "DEPLOYMENT",
    "EVENT",
    "POD",
    "RUNTIME_POOL_KIND",
    "SCALE_OUT_REQUEST_KIND",
    "SERVICE",
    "SERVICE_ACCOUNT",
    "ApiError",
    "Kind",
    "KubeApi",
    "load_configuration",
]


@dataclass(frozen=True)
class Kind:
    """Where objects of one kind live in the REST API."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    @classmethod
    def of(cls, names: CrdNames) -> Kind:
        """The kind of one of airuntime's custom resources (all namespaced)."""
        return cls(names.api_version, names.kind, names.plural)

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        group_version = self.api_version
        base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
        if self.namespaced:
            if namespace is None:
                raise ValueError(f"{self.kind} is namespaced: a namespace is needed.")
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name, safe='')}"
            if subresource is not None:
                base += f"/{subresource}"
        return base


DEPLOYMENT: Final = Kind("apps/v1", "Deployment", "deployments")
SERVICE: Final = Kind("v1", "Service", "services")
SERVICE_ACCOUNT: Final = Kind("v1", "ServiceAccount", "serviceaccounts")
CONFIG_MAP: Final = Kind("v1", "ConfigMap", "configmaps")
POD: Final = Kind("v1", "Pod", "pods")
EVENT: Final = Kind("v1", "Event", "events")
RUNTIME_POOL_KIND: Final = Kind.of(RUNTIME_POOL)
SCALE_OUT_REQUEST_KIND: Final = Kind.of(SCALE_OUT_REQUEST)
_BY_KIND: Final = {k.kind: k for k in (DEPLOYMENT, SERVICE, SERVICE_ACCOUNT, CONFIG_MAP, POD)}


class ApiError(Exception):
    """The API server answered a request with an error status."""

    def __init__(self, status: int, method: str, path: str, body: Mapping[str, Any]) -> None:
        self.status = status
        self.reason = str(body.get("reason", ""))
        self.api_message = str(body.get("message", ""))
        super().__init__(f"{method} {path} failed with HTTP {status}: {self.api_message or body}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        """Another writer changed the object since it was read (optimistic locking)."""
        return self.status == 409 and self.reason == "Conflict"

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def permanent(self) -> bool:
        """Retrying the same request cannot succeed (the request itself is wrong)."""
        return self.status in (400, 422)


def load_configuration(
    kubeconfig: str | None, *, fall_back_to_kubeconfig: bool = False
) -> k8s_client.Configuration:
    """Credentials from ``kubeconfig``, or the in-cluster service account when ``None``.

    With ``fall_back_to_kubeconfig``, a process that runs outside a cluster (no service
    account) uses the default kubeconfig instead (``$KUBECONFIG``, ``~/.kube/config``):
    the control plane runs anywhere, the operator only ever in a pod or with an
    explicit kubeconfig.
    """
    configuration = k8s_client.Configuration()
    if kubeconfig:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
        return configuration
    try:
        k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    except k8s_config.ConfigException:
        if not fall_back_to_kubeconfig:
            raise
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    return configuration


class KubeApi:
    """Asynchronous JSON requests to the API server, run on a private thread pool."""

    def __init__(
        self,
        configuration: k8s_client.Configuration,
        *,
        field_manager: str,
        threads: int = 8,
        request_timeout: float = 30.0,
    ) -> None:
        configuration.connection_pool_maxsize = max(threads, 4)
        self.configuration = configuration
        self.field_manager = field_manager
        self._client = k8s_client.ApiClient(configuration)
        self._client.user_agent = field_manager
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube-api")
        self._timeout = request_timeout

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._client.close()  # type: ignore[no-untyped-call]

    # -- generic verbs -------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, self._request_sync, method, path, query, body, content_type
        )

    def _request_sync(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str,
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        serialized = self._client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query.items()) if query else None,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        http_method, url, header_params, payload, _ = serialized
        response = self._client.call_api(
            http_method, url, header_params=header_params, body=payload,
            _request_timeout=self._timeout,
        )  # fmt: skip
        raw: bytes = response.read()  # type: ignore[no-untyped-call]
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {"message": raw.decode("utf-8", "replace")[:500]}
        if not 200 <= response.status < 300:
            raise ApiError(response.status, method, path, data if isinstance(data, dict) else {})
        return data if isinstance(data, dict) else {}

    async def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or ``None`` when it does not exist."""
        try:
            return await self.request("GET", kind.path(namespace, name))
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    async def list(
        self, kind: Kind, namespace: str | None, *, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else None
        answer = await self.request("GET", kind.path(namespace), query=query)
        items: list[dict[str, Any]] = answer.get("items", [])
        return items

    async def create(
        self, kind: Kind, namespace: str | None, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        return await self.request("POST", kind.path(namespace), body=dict(body))

    async def apply(self, body: Mapping[str, Any], kind: Kind | None = None) -> dict[str, Any]:
        """Server-side apply of ``body`` (create or update; no-op when unchanged)."""
        kind = kind or _BY_KIND[str(body["kind"])]
        metadata = body["metadata"]
        return await self.request(
            "PATCH",
            kind.path(metadata.get("namespace"), metadata["name"]),
            query={"fieldManager": self.field_manager, "force": "true"},
            body=dict(body),
            content_type="application/apply-patch+yaml",
        )

    async def merge_patch(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """JSON merge patch; put ``metadata.resourceVersion`` in it for optimistic locking."""
        return await self.request(
            "PATCH",
            kind.path(namespace, name, subresource),
            query={"fieldManager": self.field_manager},
            body=dict(patch),
            content_type="application/merge-patch+json",
        )

    async def delete(self, kind: Kind, namespace: str | None, name: str) -> bool:
        """Delete in the background; ``False`` when it was already gone."""
        try:
            await self.request(
                "DELETE",
                kind.path(namespace, name),
                body={"propagationPolicy": "Background"},
            )
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return True
