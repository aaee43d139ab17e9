"""``/v1/queue``: the shared queue's depth, and manual drain."""

from __future__ import annotations

from fastapi import APIRouter

from airuntime.control_plane.api import operations
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

router = APIRouter(
    prefix="/v1/queue", tags=["queue"], route_class=StrictJsonRoute, responses=AUTHENTICATED
)


@router.post(
    "/drain",
    response_model=DrainResponse,
    responses={**WITH_BODY, 409: error("The pump is disabled.")},
)
async def drain(who: Drainer, context: Context, body: DrainRequest | None = None) -> DrainResponse:
    return await operations.drain(context, body or DrainRequest())


@router.get("", response_model=QueueResponse)
async def queue(who: Reader, context: Context) -> QueueResponse:
    """Pending items per tenant: the caller's tenant only, unless the caller is an admin."""
    return await operations.queue_status(context, who)
