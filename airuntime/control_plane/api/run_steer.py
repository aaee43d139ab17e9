"""``POST /v1/runs/{id}/input|pause|resume|replay``: steering a run through the API.

Why this exists: a person answers an ``input`` step, pauses or resumes an execution,
or replays a finished run, without Redis access. Answer and pause/resume are the
engine's own Lua transitions (``provideInput``, ``controlExecution``); a refusal is a
409 naming the step or execution and the state it is in. Replay submits the original
run's pipeline, inputs and context snapshot (read from hot Redis or the archive, the
same material) as a new shared run with ``replay_of`` = the original's SharedRunId.

Roles: answering and replaying need ``submit`` (submitter, operator); pause and resume
need ``cancel`` (operator). Another tenant's run is 404.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

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
from airuntime.control_plane.api.request_body import StrictJsonRoute
from airuntime.control_plane.api.run_models import InputRequest, ReplayResponse, SteerResponse
from airuntime.control_plane.api.run_reads import NO_EXECUTION
from airuntime.control_plane.api.runs import NOT_FOUND, SharedRunId

router = APIRouter(
    prefix="/v1/runs", tags=["runs"], route_class=StrictJsonRoute, responses=AUTHENTICATED
)

REFUSED: Responses = {
    **NOT_FOUND,
    409: error("The run, its execution or the step is not in a state that allows this."),
}


@router.post(
    "/{shared_run_id}/input",
    response_model=SteerResponse,
    responses={
        **WITH_BODY,
        **REFUSED,
        # 422 (FastAPI's validation shape): the body is invalid, or no such step.
    },
)
async def provide_input(
    shared_run_id: SharedRunId, body: InputRequest, who: Submitter, context: Context
) -> SteerResponse:
    """Answer an ``input`` step: its output becomes ``value`` and the run goes on."""
    return await operations.provide_input(context, who, shared_run_id, body)


@router.post(
    "/{shared_run_id}/pause", response_model=SteerResponse, responses={**REFUSED, **NO_EXECUTION}
)
async def pause(shared_run_id: SharedRunId, who: Canceller, context: Context) -> SteerResponse:
    """Block new claims; running steps finish (Pausing, then Paused)."""
    return await operations.control(context, who, shared_run_id, "pause")


@router.post(
    "/{shared_run_id}/resume", response_model=SteerResponse, responses={**REFUSED, **NO_EXECUTION}
)
async def resume(shared_run_id: SharedRunId, who: Canceller, context: Context) -> SteerResponse:
    """Let a paused execution claim steps again."""
    return await operations.control(context, who, shared_run_id, "resume")


@router.post(
    "/{shared_run_id}/replay", status_code=202, response_model=ReplayResponse, responses=NOT_FOUND
)
async def replay(
    shared_run_id: SharedRunId,
    who: Submitter,
    context: Context,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> ReplayResponse:
    """Submit the run's pipeline, inputs and context again as a new linked run. With an
    ``Idempotency-Key``, sending it again is safe."""
    answer = await operations.replay(context, who, shared_run_id, idempotency_key)
    if answer.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return answer
