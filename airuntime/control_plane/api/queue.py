"""``/v1/queue``: the shared queue's depth, and manual drain."""

from __future__ import annotations

import time

from fastapi import APIRouter

from airuntime.control_plane.api.deps import (
    AUTHENTICATED,
    WITH_BODY,
    Context,
    Drainer,
    Reader,
    error,
)
from airuntime.control_plane.api.models import DrainRequest, DrainResponse, QueueResponse
from airuntime.control_plane.api.request_body import StrictJsonRoute
from airuntime.control_plane.rbac import Capability

router = APIRouter(
    prefix="/v1/queue", tags=["queue"], route_class=StrictJsonRoute, responses=AUTHENTICATED
)


@router.post(
    "/drain",
    response_model=DrainResponse,
    responses={**WITH_BODY, 409: error("The pump is disabled.")},
)
async def drain(who: Drainer, context: Context, body: DrainRequest | None = None) -> DrainResponse:
    request = body or DrainRequest()
    started = time.perf_counter()
    result = await context.control_plane.drain(
        request.max_count, stop_on_failure=request.stop_on_failure
    )
    return DrainResponse(
        dispatched=result.dispatched,
        failed=result.failed,
        cycles=result.cycles,
        stopped=result.stopped,
        seconds=round(time.perf_counter() - started, 4),
    )


@router.get("", response_model=QueueResponse)
async def queue(who: Reader, context: Context) -> QueueResponse:
    """Pending items per tenant: the caller's tenant only, unless the caller is an admin."""
    by_tenant = await context.control_plane.queue.pending_by_tenant()
    if not who.can(Capability.ADMIN):
        by_tenant = {t: n for t, n in by_tenant.items() if t == who.tenant_id}
    return QueueResponse(pending=sum(by_tenant.values()), pending_by_tenant=by_tenant)
