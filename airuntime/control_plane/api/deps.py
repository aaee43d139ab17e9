"""What the routes depend on: the wired control plane, the authenticated caller, and
the error responses every authenticated route documents.

:func:`~airuntime.control_plane.api.app.create_app` stores an :class:`ApiContext` on
the app; routes take it, and the caller's :class:`~airuntime.control_plane.rbac.Principal`,
through the ``Annotated`` dependencies below (``Reader``, ``Submitter``, ...), each
of which also checks one capability (401 without a known token, 403 without the
capability).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Header, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from airuntime.control_plane.api.models import ErrorBody
from airuntime.control_plane.metrics import ControlPlaneMetrics
from airuntime.control_plane.rbac import Authenticator, Capability, Principal
from airuntime.control_plane.run_ledger import LedgerReader
from airuntime.control_plane.run_listing import RunListing
from airuntime.control_plane.run_material import MaterialLoader
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.submit_idempotency import IDEMPOTENCY_KEY_PATTERN
from airuntime.history.store import HistoryStore

Responses = dict[int | str, dict[str, Any]]


def error(description: str, **headers: str) -> dict[str, Any]:
    """An error response of the OpenAPI document: an :class:`ErrorBody`."""
    doc: dict[str, Any] = {"model": ErrorBody, "description": description}
    if headers:
        doc["headers"] = {
            name: {"description": text, "schema": {"type": "string"}}
            for name, text in headers.items()
        }
    return doc


UNAVAILABLE: Responses = {
    503: error(
        "Redis does not answer; retry after the given seconds.",
        **{"Retry-After": "Seconds to wait before retrying."},
    )
}
AUTHENTICATED: Responses = {
    401: error("No bearer token, or an unknown one."),
    403: error("The token's roles lack the capability this operation needs."),
    **UNAVAILABLE,
}
WITH_BODY: Responses = {
    400: error("The body is not JSON."),
    413: error("The body is larger than max_request_bytes (AIRUNTIME_MAX_REQUEST_BYTES)."),
}


@dataclass(frozen=True)
class ApiContext:
    control_plane: ControlPlane
    auth: Authenticator
    metrics: ControlPlaneMetrics | None
    history: HistoryStore | None = None
    """The durable history the run reads fall back to once Redis no longer has a run."""
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the server begins to stop (:func:`~airuntime.control_plane.api.app.
    begin_closing`): streams that would run until a run ends end now instead, so the
    server's shutdown does not wait on them (a client follows again from its cursor)."""

    @property
    def material(self) -> MaterialLoader:
        return MaterialLoader(self.control_plane.redis, self.history)

    @property
    def ledger(self) -> LedgerReader:
        return LedgerReader(self.control_plane.redis, self.history)

    @property
    def listing(self) -> RunListing:
        return RunListing(self.control_plane.redis, self.history)


def api_context(request: Request) -> ApiContext:
    context: ApiContext = request.app.state.airuntime
    return context


Context = Annotated[ApiContext, Depends(api_context)]

_bearer = HTTPBearer(auto_error=False)


async def principal(
    context: Context,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if creds is None:
        raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
    who = context.auth.authenticate(creds.credentials)
    if who is None:
        raise HTTPException(401, "unknown bearer token", headers={"WWW-Authenticate": "Bearer"})
    return who


def _need(capability: Capability) -> Callable[[Principal], Awaitable[Principal]]:
    async def check(who: Annotated[Principal, Depends(principal)]) -> Principal:
        if not who.can(capability):
            raise HTTPException(403, f"user {who.user!r} lacks the {capability.value!r} capability")
        return who

    return check


Reader = Annotated[Principal, Depends(_need(Capability.READ))]
Submitter = Annotated[Principal, Depends(_need(Capability.SUBMIT))]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description="Makes the submit safe to send again (a timeout, a lost connection, a "
        "503): the same key with the same request within the idempotency TTL (24 h) answers "
        "with the run it created and creates nothing; with another request, 409. 1-255 "
        "visible ASCII characters; the tenant's own.",
    ),
]
"""The ``Idempotency-Key`` header of a request that creates a run (submit, replay)."""
Canceller = Annotated[Principal, Depends(_need(Capability.CANCEL))]
Drainer = Annotated[Principal, Depends(_need(Capability.DRAIN))]
Admin = Annotated[Principal, Depends(_need(Capability.ADMIN))]
