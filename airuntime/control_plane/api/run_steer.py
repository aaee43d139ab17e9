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

from fastapi import APIRouter, HTTPException

from airuntime.control_plane.api.deps import (
    AUTHENTICATED,
    WITH_BODY,
    Canceller,
    Context,
    Responses,
    Submitter,
    error,
)
from airuntime.control_plane.api.request_body import StrictJsonRoute
from airuntime.control_plane.api.run_models import InputRequest, ReplayResponse, SteerResponse
from airuntime.control_plane.api.run_reads import NO_EXECUTION, material
from airuntime.control_plane.api.runs import NOT_FOUND, SharedRunId
from airuntime.core.errors import (
    ControlBlocked,
    EngineError,
    ExecutionNotFound,
    ExecutionTerminal,
    InvalidTransition,
    StepNotFound,
)
from airuntime.engine.execution_store import ExecutionStore

router = APIRouter(
    prefix="/v1/runs", tags=["runs"], route_class=StrictJsonRoute, responses=AUTHENTICATED
)

REFUSED: Responses = {
    **NOT_FOUND,
    409: error("The run, its execution or the step is not in a state that allows this."),
}


def _conflict(message: str) -> HTTPException:
    return HTTPException(409, message)


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
    found = await material(context, shared_run_id, who.tenant_id)
    ex = found.execution
    if ex is None:
        raise _conflict(f"step {body.step!r}: the run has no execution yet")
    if body.step not in ex.steps:
        raise HTTPException(
            422,
            [{"type": "value_error", "loc": ["body", "step"], "msg": f"no step {body.step!r}"}],
        )
    state = ex.steps[body.step].get("status")
    if ex.terminal:
        raise _conflict(f"step {body.step!r} is {state}, not waiting for input (run ended)")
    store = ExecutionStore(context.control_plane.redis)
    try:
        status = await store.provide_input(ex.execution_id, body.step, body.value, who.user)
    except InvalidTransition:
        now = await store.step_states(ex.execution_id)
        current = now.get(body.step, state)
        raise _conflict(f"step {body.step!r} is {current}, not waiting for input") from None
    except StepNotFound:
        raise _conflict(f"step {body.step!r} is not in the execution") from None
    except (ExecutionTerminal, ControlBlocked, ExecutionNotFound) as exc:
        raise _conflict(f"step {body.step!r}: {exc}") from None
    return SteerResponse(
        shared_run_id=shared_run_id, execution_id=ex.execution_id, status=status.value
    )


async def _control(
    shared_run_id: str, action: str, tenant_id: str, user: str, context: Context
) -> SteerResponse:
    found = await material(context, shared_run_id, tenant_id)
    ex = found.execution
    if ex is None:
        raise _conflict(f"cannot {action} run {shared_run_id}: it has no execution yet")
    if ex.terminal:
        raise _conflict(f"cannot {action} execution {ex.execution_id}: it ended {ex.status}")
    store = ExecutionStore(context.control_plane.redis)
    try:
        if action == "pause":
            status = await store.pause(ex.execution_id, actor=user)
        else:
            status = await store.resume(ex.execution_id, actor=user)
    except EngineError as exc:
        raise _conflict(f"cannot {action} execution {ex.execution_id}: {exc}") from None
    return SteerResponse(
        shared_run_id=shared_run_id, execution_id=ex.execution_id, status=status.value
    )


@router.post(
    "/{shared_run_id}/pause", response_model=SteerResponse, responses={**REFUSED, **NO_EXECUTION}
)
async def pause(shared_run_id: SharedRunId, who: Canceller, context: Context) -> SteerResponse:
    """Block new claims; running steps finish (Pausing, then Paused)."""
    return await _control(shared_run_id, "pause", who.tenant_id, who.user, context)


@router.post(
    "/{shared_run_id}/resume", response_model=SteerResponse, responses={**REFUSED, **NO_EXECUTION}
)
async def resume(shared_run_id: SharedRunId, who: Canceller, context: Context) -> SteerResponse:
    """Let a paused execution claim steps again."""
    return await _control(shared_run_id, "resume", who.tenant_id, who.user, context)


@router.post(
    "/{shared_run_id}/replay", status_code=202, response_model=ReplayResponse, responses=NOT_FOUND
)
async def replay(shared_run_id: SharedRunId, who: Submitter, context: Context) -> ReplayResponse:
    """Submit the run's pipeline, inputs and context again as a new linked run."""
    found = await material(context, shared_run_id, who.tenant_id)
    original = found.run
    run = await context.control_plane.submit(
        original.pipeline,
        original.snapshot,
        inputs=original.inputs,
        metadata=original.metadata,
        replay_of=original.shared_run_id,
    )
    return ReplayResponse(
        shared_run_id=run.shared_run_id, replay_of=original.shared_run_id, status=run.status
    )
