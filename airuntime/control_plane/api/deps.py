"""What the routes depend on: the wired control plane, and the authenticated caller.

:func:`~airuntime.control_plane.api.app.create_app` stores an :class:`ApiContext` on
the app; routes take it, and the caller's :class:`~airuntime.control_plane.rbac.Principal`,
through the ``Annotated`` dependencies below (``Reader``, ``Submitter``, ...), each
of which also checks one capability (401 without a known token, 403 without the
capability).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from airuntime.control_plane.metrics import ControlPlaneMetrics
from airuntime.control_plane.rbac import Authenticator, Capability, Principal
from airuntime.control_plane.service import ControlPlane


@dataclass(frozen=True)
class ApiContext:
    control_plane: ControlPlane
    auth: Authenticator
    metrics: ControlPlaneMetrics | None


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
Canceller = Annotated[Principal, Depends(_need(Capability.CANCEL))]
Drainer = Annotated[Principal, Depends(_need(Capability.DRAIN))]
