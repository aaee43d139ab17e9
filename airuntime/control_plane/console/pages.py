"""The console's pages (``GET /ui/...``): runs, one run, the queue, the instances.

Why this exists: a person looks at runs in a browser. Every page is rendered from the
answers of the API's own route functions and services (``run_reads``, ``fleet``, the
shared queue, the scale-out store) called with the signed-in principal, so a page
shows exactly what the API would show that token: the caller's tenant only, another
tenant's run "not found". Live parts are small: the run page's state JSON (polled when
the run's SSE ledger stream says something happened) and the runs table fragment.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Any, Final

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from airuntime.control_plane.api import fleet, operations, run_reads
from airuntime.control_plane.api.runs import SharedRunId
from airuntime.control_plane.console.charts import gantt_rows
from airuntime.control_plane.console.layout import Dag, layout, plan_deps
from airuntime.control_plane.console.rendering import REFUSED, page, refused_page
from airuntime.control_plane.console.session import PREFIX, Session, SignedIn
from airuntime.control_plane.rbac import Capability
from airuntime.control_plane.run_views import RunDetails, run_details
from airuntime.control_plane.shared_runs import SharedRunStatus

router = APIRouter(prefix=PREFIX, include_in_schema=False)

STEPS_PER_PAGE: Final = 100
LEDGER_PAGE: Final = 100
RUNS_PAGE: Final = 50


def _ms(field: str, value: str | None) -> int | None:
    """A ``datetime-local`` value (UTC) as epoch ms; 422 naming the field otherwise."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise HTTPException(422, f"{field}: {value[:64]!r} is not a date and time") from None
    return int(parsed.replace(tzinfo=parsed.tzinfo or UTC).timestamp() * 1000)


def _statuses(values: list[str]) -> list[SharedRunStatus]:
    known = {s.value: s for s in SharedRunStatus}
    for v in values:
        if v not in known:
            raise HTTPException(422, f"status: {v[:64]!r} is not one of {', '.join(known)}")
    return [known[v] for v in values]


@router.get("", response_class=RedirectResponse)
async def home() -> RedirectResponse:
    return RedirectResponse(f"{PREFIX}/runs", status_code=303)


@router.get("/runs")
async def runs_page(
    request: Request,
    s: SignedIn,
    status: Annotated[list[str], Query()] = [],  # noqa: B006 (FastAPI copies defaults)
    pipeline: Annotated[str, Query(max_length=256)] = "",
    created_from: Annotated[str, Query(max_length=64)] = "",
    created_to: Annotated[str, Query(max_length=64)] = "",
    cursor: Annotated[str | None, Query(max_length=2048)] = None,
    fragment: bool = False,
) -> Response:
    """The tenant's runs, hot and archived, newest first, filtered, one page."""
    try:
        listed = await run_reads.list_runs(
            s.who,
            s.context,
            status=_statuses(status) or None,
            pipeline=pipeline or None,
            created_from_ms=_ms("created_from", created_from),
            created_to_ms=_ms("created_to", created_to),
            cursor=cursor,
            limit=RUNS_PAGE,
        )
    except REFUSED as exc:
        return refused_page(request, s, exc)
    values: dict[str, Any] = {
        "runs": listed.runs,
        "next_cursor": listed.next_cursor,
        "chosen": set(status),
        "statuses": [st.value for st in SharedRunStatus],
        "pipeline": pipeline,
        "created_from": created_from,
        "created_to": created_to,
        "first_page": cursor is None,
    }
    return page(request, "_runs_table.html" if fragment else "runs.html", s, **values)


async def _details(s: Session, shared_run_id: str) -> tuple[RunDetails, Dag | None]:
    found = await operations.material(s.context, shared_run_id, s.who.tenant_id)
    dag = layout(plan_deps(found.execution.plan)) if found.execution else None
    return run_details(found), dag


def _states(details: RunDetails) -> dict[str, str]:
    return {k: v.status for k, v in (details.steps or {}).items()}


@router.get("/runs/{shared_run_id}")
async def run_page(
    request: Request, shared_run_id: SharedRunId, s: SignedIn, steps: int = 0
) -> Response:
    """One run: its DAG, steps, Gantt and ledger (the last two loaded after the page)."""
    try:
        details, dag = await _details(s, shared_run_id)
    except REFUSED as exc:
        return refused_page(request, s, exc)
    states = _states(details)
    all_steps = list(details.steps or {})  # plan order (run_details)
    pages = max(1, -(-len(all_steps) // STEPS_PER_PAGE))
    current = min(max(steps, 0), pages - 1)
    shown = all_steps[current * STEPS_PER_PAGE : (current + 1) * STEPS_PER_PAGE]
    page_of = {step: i // STEPS_PER_PAGE for i, step in enumerate(all_steps)}
    return page(
        request,
        "run.html",
        s,
        run=details,
        dag=dag,
        states=states,
        groups=dag.counts(states) if dag else {},
        shown=shown,
        page_of=page_of,
        steps_page=current,
        steps_pages=pages,
        waiting=[k for k, v in states.items() if v == "input_wait"],
        live=not details.status.terminal,
    )


@router.get("/runs/{shared_run_id}/state")
async def run_state(shared_run_id: SharedRunId, s: SignedIn) -> JSONResponse:
    """What the live run page repaints: the run's status, each drawn step's state and
    each summary node's counts."""
    details, dag = await _details(s, shared_run_id)
    states = _states(details)
    ex = details.execution
    drawn = {sid: st for sid, st in states.items() if dag is None or dag.node_of.get(sid) == sid}
    return JSONResponse(
        {
            "status": details.status.value,
            "terminal": details.status.terminal,
            "execution_status": ex.status if ex else None,
            "done": ex.done if ex else 0,
            "total": ex.total if ex else 0,
            "steps": drawn,
            "groups": dag.counts(states) if dag else {},
            "waiting": sorted(k for k, v in states.items() if v == "input_wait"),
        },
        headers={"Cache-Control": "no-store"},
    )


@router.get("/runs/{shared_run_id}/events")
async def run_events(request: Request, shared_run_id: SharedRunId, s: SignedIn) -> Any:
    """The run's ledger as Server-Sent Events, the API's own stream."""
    return await run_reads.events(
        shared_run_id, s.who, s.context, request, cursor=None, limit=100, follow=True
    )


@router.get("/runs/{shared_run_id}/gantt")
async def gantt(request: Request, shared_run_id: SharedRunId, s: SignedIn) -> Response:
    """The trace as a Gantt chart (an HTML fragment)."""
    try:
        trace = await run_reads.trace(shared_run_id, s.who, s.context)
    except REFUSED as exc:
        return refused_page(request, s, exc)
    chart = gantt_rows(trace.model_dump(mode="json"), int(time.time() * 1000))
    return page(request, "_gantt.html", s, chart=chart, shared_run_id=shared_run_id)


@router.get("/runs/{shared_run_id}/ledger")
async def ledger(
    request: Request,
    shared_run_id: SharedRunId,
    s: SignedIn,
    cursor: Annotated[str | None, Query(max_length=2048)] = None,
) -> Response:
    """One page of the run's ledger (an HTML fragment)."""
    try:
        found = await run_reads.events(
            shared_run_id, s.who, s.context, request, cursor=cursor, limit=LEDGER_PAGE
        )
    except REFUSED as exc:
        return refused_page(request, s, exc)
    body = found.model_dump(mode="json")
    return page(request, "_ledger.html", s, ledger=body, shared_run_id=shared_run_id)


@router.get("/queue")
async def queue_page(request: Request, s: SignedIn) -> Response:
    """Depth and oldest age per tenant, the pending items (the caller's tenant; every
    tenant for an admin), and drain for operators."""
    cp = s.context.control_plane
    tenant = None if s.who.can(Capability.ADMIN) else s.who.tenant_id
    items = await cp.queue.pending_items(tenant)
    by_tenant: dict[str, dict[str, Any]] = {}
    for item in items:
        row = by_tenant.setdefault(item.tenant_id, {"depth": 0, "oldest_ms": item.enqueued_at_ms})
        row["depth"] += 1
        row["oldest_ms"] = min(row["oldest_ms"], item.enqueued_at_ms)
    return page(request, "queue.html", s, items=items[:500], by_tenant=by_tenant)


@router.get("/instances")
async def instances_page(request: Request, s: SignedIn) -> Response:
    """Every instance the tenant may run on with its capacity and heartbeat age, the
    tenant's step-slot limit and model token budget, and the scale-out requests with
    their phases."""
    visible = await fleet.instances(s.who, s.context)
    settings = await fleet.tenant_settings(s.who.tenant_id, s.who, s.context)
    usage = await fleet.model_usage(s.who.tenant_id, s.who, s.context)
    requests = await s.context.control_plane.scale_outs.list()
    if not s.who.can(Capability.ADMIN):
        requests = [r for r in requests if r.tenant_id == s.who.tenant_id]
    return page(
        request,
        "instances.html",
        s,
        instances=visible,
        settings=settings,
        usage=usage,
        scale_outs=requests,
    )
