"""``/v1/runs``: submit and cancel shared runs, scoped to the caller's tenant (reading
them is :mod:`~airuntime.control_plane.api.run_reads`, steering them
:mod:`~airuntime.control_plane.api.run_steer`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path
from pydantic import ValidationError

from airuntime.control_plane.api.deps import (
    AUTHENTICATED,
    WITH_BODY,
    Canceller,
    Context,
    Responses,
    Submitter,
    error,
)
from airuntime.control_plane.api.models import (
    CancelResponse,
    PipelineYamlError,
    SubmitRequest,
    SubmitResponse,
)
from airuntime.control_plane.api.request_body import StrictJsonRoute
from airuntime.control_plane.shared_runs import SHARED_RUN_ID_PATTERN

router = APIRouter(
    prefix="/v1/runs", tags=["runs"], route_class=StrictJsonRoute, responses=AUTHENTICATED
)

NOT_FOUND: Responses = {404: error("No such run visible to the caller.")}
SharedRunId = Annotated[
    str, Path(pattern=SHARED_RUN_ID_PATTERN, description="A SharedRunId (`sr-` + 32 hex).")
]


def _not_found(shared_run_id: str) -> HTTPException:
    return HTTPException(404, f"shared run {shared_run_id!r} not found")


def _invalid(field: str, message: str) -> HTTPException:
    return HTTPException(422, [{"type": "value_error", "loc": ["body", field], "msg": message}])


@router.post(
    "",
    status_code=202,
    response_model=SubmitResponse,
    responses={
        **WITH_BODY,
        403: error("The token lacks the submit capability, or does not allow a snapshot field."),
    },
)
async def submit(body: SubmitRequest, who: Submitter, context: Context) -> SubmitResponse:
    """Submit a run as the token's tenant; the snapshot's other fields only within what
    the token allows."""
    try:
        document = body.document()
    except PipelineYamlError as exc:
        raise _invalid("pipeline_yaml", str(exc)) from None
    try:
        snapshot = who.snapshot(
            body.project,
            current_namespace=body.current_namespace,
            namespaces=body.namespaces,
            context_key=body.context_key,
            tenant_group_id=body.tenant_group_id,
        )
    except ValidationError as exc:
        raise _invalid("snapshot", str(exc)) from None
    run = await context.control_plane.submit(
        document, snapshot, inputs=body.inputs, metadata=body.metadata, mode=body.mode
    )
    return SubmitResponse(
        shared_run_id=run.shared_run_id,
        status=run.status,
        assigned_instance_id=run.assigned_instance_id,
        run_id=run.run_id,
    )


@router.post("/{shared_run_id}/cancel", response_model=CancelResponse, responses=NOT_FOUND)
async def cancel(shared_run_id: SharedRunId, who: Canceller, context: Context) -> CancelResponse:
    """Cancel a run: Cancelled at once while it is queued; once dispatched its runtime
    run is cancelled and the run ends Cancelled when that one did. An archived run has
    ended: the answer is its status."""
    run = await context.control_plane.cancel(shared_run_id, who.tenant_id)
    if run is None:
        # Redis no longer has it: an archived run has ended, and cancelling changes nothing.
        archived = await context.material.shared_run(shared_run_id, who.tenant_id)
        if archived is None:
            raise _not_found(shared_run_id)
        run = archived[0]
    return CancelResponse(shared_run_id=run.shared_run_id, status=run.status, reason=run.reason)
