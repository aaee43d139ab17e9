"""``/v1/runs``: submit, read, list and cancel shared runs, scoped to the caller's tenant."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from airuntime.control_plane.api.deps import Canceller, Context, Reader, Submitter
from airuntime.control_plane.api.models import (
    CancelResponse,
    ErrorBody,
    SubmitRequest,
    SubmitResponse,
)
from airuntime.control_plane.run_details import SharedRunDetails, SharedRunView

router = APIRouter(prefix="/v1/runs", tags=["runs"])

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "No such run visible to the caller."}
}


def _not_found(shared_run_id: str) -> HTTPException:
    return HTTPException(404, f"shared run {shared_run_id!r} not found")


@router.post("", status_code=202, response_model=SubmitResponse)
async def submit(body: SubmitRequest, who: Submitter, context: Context) -> SubmitResponse:
    run = await context.control_plane.submit(
        body.document(),
        who.snapshot(body.project),
        inputs=body.inputs,
        metadata=body.metadata,
        mode=body.mode,
    )
    return SubmitResponse(
        shared_run_id=run.shared_run_id,
        status=run.status,
        assigned_instance_id=run.assigned_instance_id,
        run_id=run.run_id,
    )


@router.get(
    "/{shared_run_id}",
    response_model=SharedRunDetails,
    response_model_exclude_unset=True,
    responses=NOT_FOUND,
)
async def get_run(shared_run_id: str, who: Reader, context: Context) -> SharedRunDetails:
    details = await context.control_plane.get(shared_run_id, who.tenant_id)
    if details is None:
        raise _not_found(shared_run_id)
    return details


@router.get("", response_model=list[SharedRunView])
async def list_runs(
    who: Reader, context: Context, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[SharedRunView]:
    runs = await context.control_plane.list(who.tenant_id, limit)
    return [SharedRunView.of(r) for r in runs]


@router.post("/{shared_run_id}/cancel", response_model=CancelResponse, responses=NOT_FOUND)
async def cancel(shared_run_id: str, who: Canceller, context: Context) -> CancelResponse:
    run = await context.control_plane.cancel(shared_run_id, who.tenant_id)
    if run is None:
        raise _not_found(shared_run_id)
    return CancelResponse(shared_run_id=run.shared_run_id, status=run.status, reason=run.reason)
