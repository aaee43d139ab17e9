"""``GET /v1/runs[/{id}[/events|/trace|/report]]``: a run read from hot Redis or the archive.

Why this exists: a caller reads a run the same way while it runs, after it ended, and
after retention moved it to the durable history. Every answer here is computed from
the run's material (:mod:`~airuntime.control_plane.run_material`) and its ledger
(:mod:`~airuntime.control_plane.run_ledger`), so it is the same JSON from either source.
Scoped to the caller's tenant: another tenant's run is 404, like an unknown one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Final

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from airuntime.control_plane.api import operations
from airuntime.control_plane.api.deps import (
    AUTHENTICATED,
    ApiContext,
    Context,
    Reader,
    Responses,
    error,
)
from airuntime.control_plane.api.run_models import EventsPage, ReportBody, RunsPageBody, TraceBody
from airuntime.control_plane.api.runs import NOT_FOUND, SharedRunId
from airuntime.control_plane.run_ledger import (
    MAX_LIMIT,
    encode_cursor,
)
from airuntime.control_plane.run_listing import RunFilter
from airuntime.control_plane.run_material import RunMaterial
from airuntime.control_plane.run_views import RunDetails
from airuntime.control_plane.shared_runs import SharedRunStatus

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=AUTHENTICATED)

FOLLOW_POLL_S: Final = 0.2
"""How often a followed event stream looks for new ledger entries."""
NO_EXECUTION: Final[Responses] = {
    409: error("The run has no execution yet (still queued or refused).")
}
BAD_CURSOR: Final[Responses] = {
    400: error("The cursor is not one this API made for this run and filter.")
}


@router.get("", response_model=RunsPageBody, responses=BAD_CURSOR)
async def list_runs(
    who: Reader,
    context: Context,
    status: Annotated[list[SharedRunStatus] | None, Query(description="Any of these.")] = None,
    pipeline: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
    created_from_ms: Annotated[int | None, Query(ge=0, description="Inclusive.")] = None,
    created_to_ms: Annotated[int | None, Query(ge=0, description="Exclusive.")] = None,
    cursor: Annotated[str | None, Query(max_length=2048)] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="How many, newest first.")] = 100,
) -> RunsPageBody:
    """The caller tenant's runs, hot and archived, newest first, each once."""
    query = RunFilter(
        who.tenant_id,
        tuple(s.value for s in status or ()),
        pipeline,
        created_from_ms,
        created_to_ms,
    )
    return await operations.list_runs(context, who, query, cursor, limit)


@router.get(
    "/{shared_run_id}",
    response_model=RunDetails,
    response_model_exclude_unset=True,
    responses=NOT_FOUND,
)
async def get_run(shared_run_id: SharedRunId, who: Reader, context: Context) -> RunDetails:
    """Identities, status, every step's record (status, attempts, output or its payload
    reference, error, worker and instance, timings) and the terminal snapshot."""
    return await operations.get_run(context, who, shared_run_id)


@router.get(
    "/{shared_run_id}/events",
    response_model=EventsPage,
    responses={
        **NOT_FOUND,
        **BAD_CURSOR,
        200: {
            "description": "A page of the ledger, or with `Accept: text/event-stream` / "
            "`follow=true` a Server-Sent Events stream (one `event: <type>` per entry, "
            "`id:` its cursor, then `event: end`) that closes once the run ended.",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
    },
)
async def events(
    shared_run_id: SharedRunId,
    who: Reader,
    context: Context,
    request: Request,
    cursor: Annotated[str | None, Query(max_length=2048)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
    follow: bool = False,
) -> Any:
    """The execution's ledger from ``cursor`` on."""
    found = await operations.material(context, shared_run_id, who.tenant_id)
    if follow or "text/event-stream" in request.headers.get("accept", ""):
        eid = found.execution.execution_id if found.execution else None
        after = operations.ledger_after(eid, cursor)
        stream = _follow(context, request, found, after, limit)
        return StreamingResponse(stream, media_type="text/event-stream")
    return await operations.events_page(context, found, cursor, limit)


def _sse(event: str, data: dict[str, Any], event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def _follow(
    context: ApiContext,
    request: Request,
    found: RunMaterial,
    after: tuple[int, str] | None,
    limit: int,
) -> AsyncIterator[str]:
    """Every ledger entry from ``after`` on, as it is written, until the shared run
    ended and its ledger is read to the end; then ``event: end``. A stream the server
    ends before (it stops) has no ``end``: its client follows again from the last
    ``id`` it got (``cursor``)."""
    run, tenant = found.run, found.tenant_id
    eid = found.execution.execution_id if found.execution else None
    closing = context.closing
    while not closing.is_set() and not await request.is_disconnected():
        ended = run.status.terminal
        if eid is not None:
            page = await context.ledger.page(eid, tenant, after, limit)
            for entry in page.entries:
                yield _sse(
                    entry.type, entry.to_json(), encode_cursor(eid, entry.seq, entry.entry_id)
                )
            after = page.last
            if page.next_cursor is not None:
                continue
        if ended:
            yield _sse("end", {"status": run.status.value, "execution_id": eid})
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(closing.wait(), FOLLOW_POLL_S)
        if closing.is_set():
            return  # the server stops: the client follows again from its last id
        reloaded = await context.material.load(run.shared_run_id, tenant)
        if reloaded is None:
            return
        run = reloaded.run
        eid = reloaded.execution.execution_id if reloaded.execution else eid


@router.get(
    "/{shared_run_id}/trace",
    response_model=TraceBody,
    responses={**NOT_FOUND, **NO_EXECUTION},
)
async def trace(shared_run_id: SharedRunId, who: Reader, context: Context) -> TraceBody:
    """Per-step timeline (claims, retries, recoveries, ends; worker and instance; input
    waits) and each instance's step-slot waits -- fit for a Gantt view."""
    return await operations.trace(context, who, shared_run_id)


@router.get(
    "/{shared_run_id}/report",
    response_model=ReportBody,
    responses={**NOT_FOUND, **NO_EXECUTION},
)
async def report(shared_run_id: SharedRunId, who: Reader, context: Context) -> ReportBody:
    """Durations, the critical path through the DAG by durations, retries, recoveries,
    slot waits and the step-slot evidence."""
    return await operations.report(context, who, shared_run_id)
