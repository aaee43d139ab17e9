"""The control-plane API against its own OpenAPI document, by schemathesis.

Schemathesis generates requests from ``/openapi.json`` (valid and, in its negative
mode, invalid bodies, path and query values, for every operation) and sends each one
to the real app -- a uvicorn server on a loopback port with a real ControlPlane on the
suite's Valkey -- as an admin, as a tenant's submitter, with no token and with an
unknown token. Every answer must
be documented: no 5xx, a status code the operation lists, the content type it lists,
and a body that matches the listed schema. A defect found here is fixed in the app or
in the document, never by excluding the check.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any, Final

import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings
from redis.asyncio import Redis
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from airuntime.control_plane.api import create_app
from airuntime.control_plane.metrics import ControlPlaneMetrics
from airuntime.control_plane.rbac import Authenticator, TokenEntry
from tests.control_plane.support import manual_cp

ADMIN: Final = {"authorization": "Bearer token-admin"}
TENANT: Final = {"authorization": "Bearer token-tenant-a"}
CALLERS: Final = (ADMIN, TENANT, {}, {"authorization": "Bearer not-a-token"})
"""An admin, a tenant's submitter, no token and an unknown token."""
CHECKS: Final = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
MAX_EXAMPLES: Final = 10
"""Per operation and mode: 11 operations x 2 modes x 10 examples x 4 callers stay well
under a minute on two cores."""


class ServedControlPlane:
    """The control plane's app under uvicorn in a thread of its own (its own loop, its
    own Redis client), on a socket bound before the thread starts."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server: uvicorn.Server | None = None
        self.started = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="served-cp", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to the test by start()
            self.failure = exc
            self.started.set()

    async def _serve(self) -> None:
        redis = Redis.from_url(self.redis_url)
        await redis.flushall()
        cp = manual_cp(redis, scale_out_enabled=False)
        await cp.start()
        await cp.wait_started()
        auth = Authenticator(
            [
                TokenEntry(token="token-admin", user="root", tenant="default", roles=["admin"]),
                TokenEntry(
                    token="token-tenant-a", user="alice", tenant="tenant-a", roles=["submitter"]
                ),
            ]
        )
        app = create_app(cp, auth, ControlPlaneMetrics(cp))
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.started.set()
        try:
            await self.server.serve(sockets=[self.sock])
        finally:
            await cp.stop()
            await redis.aclose()

    def start(self) -> None:
        self.thread.start()
        assert self.started.wait(30), "the control plane did not start"
        if self.failure is not None:
            raise self.failure

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive(), "the control plane did not stop"


@pytest.fixture(scope="module")
def served(valkey_url: str) -> Iterator[ServedControlPlane]:
    server = ServedControlPlane(valkey_url)
    server.start()
    try:
        yield server
    finally:
        server.stop()


OPERATIONS: Final = [
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("POST", "/v1/runs"),
    ("GET", "/v1/runs"),
    ("GET", "/v1/runs/{shared_run_id}"),
    ("POST", "/v1/runs/{shared_run_id}/cancel"),
    ("GET", "/v1/runs/{shared_run_id}/events"),
    ("GET", "/v1/runs/{shared_run_id}/trace"),
    ("GET", "/v1/runs/{shared_run_id}/report"),
    ("POST", "/v1/runs/{shared_run_id}/input"),
    ("POST", "/v1/runs/{shared_run_id}/pause"),
    ("POST", "/v1/runs/{shared_run_id}/resume"),
    ("POST", "/v1/runs/{shared_run_id}/replay"),
    ("GET", "/v1/queue"),
    ("POST", "/v1/queue/drain"),
    ("GET", "/v1/instances"),
    ("GET", "/v1/model-providers"),
    ("GET", "/v1/tenants/{tenant_id}/settings"),
    ("PUT", "/v1/tenants/{tenant_id}/settings"),
    ("PUT", "/v1/tenants/{tenant_id}/step-slots"),
    ("GET", "/v1/tenants/{tenant_id}/model-usage"),
    ("GET", "/v1/tenants/{tenant_id}/secrets"),
    ("PUT", "/v1/tenants/{tenant_id}/secrets/{name}"),
    ("DELETE", "/v1/tenants/{tenant_id}/secrets/{name}"),
]

WITHOUT_INPUT: Final = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics")}


@pytest.fixture(scope="module")
def api_schema(served: ServedControlPlane) -> Any:
    return schemathesis.openapi.from_url(f"{served.url}/openapi.json", wait_for_schema=30)


def _operations(api_schema: Any) -> dict[tuple[str, str], Any]:
    ops = (result.ok() for result in api_schema.get_all_operations())
    return {(op.method.upper(), op.path): op for op in ops}


def test_the_document_lists_exactly_the_tested_operations(api_schema: Any) -> None:
    """A new route must join OPERATIONS (and so get generated requests below)."""
    assert sorted(_operations(api_schema)) == sorted(OPERATIONS)


@pytest.mark.parametrize(
    ("method", "path", "mode"),
    [
        pytest.param(method, path, mode, id=f"{method} {path} {mode}")
        for method, path in OPERATIONS
        for mode in GenerationMode
        # An operation without parameters or body has no invalid request to generate.
        if mode is GenerationMode.POSITIVE or (method, path) not in WITHOUT_INPUT
    ],
)
def test_every_answer_is_documented(
    method: str, path: str, mode: GenerationMode, api_schema: Any, served: ServedControlPlane
) -> None:
    operation = _operations(api_schema)[(method, path)]
    sent: list[int] = []

    @given(case=operation.as_strategy(mode))
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def generated(case: Any) -> None:
        for headers in CALLERS:
            response = case.call_and_validate(base_url=served.url, headers=headers, checks=CHECKS)
            sent.append(response.status_code)

    generated()
    assert sent, f"schemathesis sent no request to {method} {path}"
