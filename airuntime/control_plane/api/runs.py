"""``/v1/runs``: submit and cancel shared runs, scoped to the caller's tenant (reading
them is :mod:`~airuntime.control_plane.api.run_reads`, steering them
:mod:`~airuntime.control_plane.api.run_steer`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from airuntime.control_plane.api import operations
from airuntime.control_plane.api.deps import (
    AUTHENTICATED,
    WITH_BODY,
    Canceller,
    Context,
    IdempotencyKey,
    Responses,
    Submitter,
    error,
)
from airuntime.control_plane.api.models import CancelResponse, SubmitRequest, SubmitResponse
from airuntime.control_plane.api.request_body import StrictJsonRoute
from airuntime.control_plane.shared_runs import SHARED_RUN_ID_PATTERN

router = APIRouter(
    prefix="/v1/runs", tags=["runs"], route_class=StrictJsonRoute, responses=AUTHENTICATED
)

NOT_FOUND: Responses = {404: error("No such run visible to the caller.")}
SharedRunId = Annotated[
    str, Path(pattern=SHARED_RUN_ID_PATTERN, description="A SharedRunId (`sr-` + 32 hex).")
]


@router.post(
    "",
    status_code=202,
    response_model=SubmitResponse,
    responses={
        **WITH_BODY,
        403: error("The token lacks the submit capability, or does not allow a snapshot field."),
        409: error("The Idempotency-Key was used for another request."),
    },
)
async def submit(
    body: SubmitRequest,
    who: Submitter,
    context: Context,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> SubmitResponse:
    """Submit a run as the token's tenant; the snapshot's other fields only within what
    the token allows. With an ``Idempotency-Key``, sending it again is safe."""
    answer = await operations.submit(context, who, body, idempotency_key)
    if answer.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return answer


@router.post("/{shared_run_id}/cancel", response_model=CancelResponse, responses=NOT_FOUND)
async def cancel(shared_run_id: SharedRunId, who: Canceller, context: Context) -> CancelResponse:
    """Cancel a run: Cancelled at once while it is queued; once dispatched its runtime
    run is cancelled and the run ends Cancelled when that one did. An archived run has
    ended: the answer is its status."""
    return await operations.cancel(context, who, shared_run_id)
