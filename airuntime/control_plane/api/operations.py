"""What a caller may do to the control plane: one function per operation, shared by the
HTTP routes and the MCP tools.

Why this exists: the control plane has two front doors (the ``/v1`` HTTP API and the MCP
server, :mod:`airuntime.control_plane.mcp`), and a rule written twice drifts. Each
function here takes the wired :class:`~airuntime.control_plane.api.deps.ApiContext`,
the authenticated :class:`~airuntime.control_plane.rbac.Principal` and validated
arguments (the API's own request models), scopes everything to the caller's tenant
(another tenant's run is "not found", exactly like a missing one) and answers with the
API's response models. A refusal is a :class:`~airuntime.control_plane.service.ControlPlaneError`
with its HTTP status: :class:`RunNotFound` (404), :class:`Conflict` (409),
:class:`InvalidField` (422, naming the field), :class:`BadRequest` (400). The front
doors translate these; capabilities are checked by the front doors before calling.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from pydantic import ValidationError

from airuntime.control_plane.api.deps import ApiContext
from airuntime.control_plane.api.models import (
    CancelResponse,
    DrainRequest,
    DrainResponse,
    InstanceView,
    ModelProviderView,
    ModelUsageView,
    PipelineYamlError,
    QueueResponse,
    SecretView,
    SubmitRequest,
    SubmitResponse,
)
from airuntime.control_plane.api.run_models import (
    EventsPage,
    InputRequest,
    ReplayResponse,
    ReportBody,
    RunsPageBody,
    SteerResponse,
    TraceBody,
)
from airuntime.control_plane.rbac import Capability, Principal
from airuntime.control_plane.run_details import SharedRunView
from airuntime.control_plane.run_ledger import BadCursor, decode_cursor
from airuntime.control_plane.run_listing import RunFilter
from airuntime.control_plane.run_material import ExecutionMaterial, RunMaterial
from airuntime.control_plane.run_trace import build_report, build_trace
from airuntime.control_plane.run_views import RunDetails, run_details
from airuntime.control_plane.service import ControlPlaneError
from airuntime.control_plane.shared_runs import SharedRun
from airuntime.control_plane.submit_idempotency import Submission
from airuntime.core.errors import (
    ControlBlocked,
    EngineError,
    ExecutionNotFound,
    ExecutionTerminal,
    InvalidTransition,
    StepNotFound,
)
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers.model_call import MODEL_HANDLER
from airuntime.engine.handlers.settings import handler_settings
from airuntime.engine.pipeline.spec import INPUT_HANDLER
from airuntime.engine.status import StepStatus
from airuntime.engine.tenant_secrets import SecretInfo, TooManySecrets, value_problem
from airuntime.fleet.tenancy import TenantSettings


class RunNotFound(ControlPlaneError):
    """No such run (or tenant) visible to the caller (404)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=404)


class Conflict(ControlPlaneError):
    """The run, its execution or a step is not in a state that allows this (409)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=409)


class BadRequest(ControlPlaneError):
    """An argument the models cannot check, such as a forged cursor (400)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=400)


class InvalidField(ControlPlaneError):
    """An argument that passed its model but is still invalid (422, naming the field)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}", status=422)
        self.field = field
        self.detail = message


def not_found(shared_run_id: str) -> RunNotFound:
    return RunNotFound(f"shared run {shared_run_id!r} not found")


async def material(context: ApiContext, shared_run_id: str, tenant_id: str) -> RunMaterial:
    found = await context.material.load(shared_run_id, tenant_id)
    if found is None:
        raise not_found(shared_run_id)
    return found


def execution_of(found: RunMaterial) -> ExecutionMaterial:
    if found.execution is None:
        raise Conflict(
            f"shared run {found.run.shared_run_id!r} has no execution yet "
            f"(status {found.run.status.value})"
        )
    return found.execution


# -- submit / cancel / replay -----------------------------------------------------------


async def submit(
    context: ApiContext,
    who: Principal,
    body: SubmitRequest,
    idempotency_key: str | None = None,
) -> SubmitResponse:
    """Submit a run as the caller's tenant; the snapshot's other fields only within what
    the token allows (:class:`~airuntime.control_plane.rbac.NotAllowed` otherwise). With
    ``idempotency_key``, a request sent again is the run it created
    (:mod:`~airuntime.control_plane.submit_idempotency`)."""
    try:
        document = body.document()
    except PipelineYamlError as exc:
        raise InvalidField("pipeline_yaml", str(exc)) from None
    try:
        snapshot = who.snapshot(
            body.project,
            current_namespace=body.current_namespace,
            namespaces=body.namespaces,
            context_key=body.context_key,
            tenant_group_id=body.tenant_group_id,
        )
    except ValidationError as exc:
        raise InvalidField("snapshot", str(exc)) from None
    made = await context.control_plane.submission(
        document,
        snapshot,
        inputs=body.inputs,
        metadata=body.metadata,
        mode=body.mode,
        idempotency_key=idempotency_key,
    )
    run = await _made_run(context, who, made, idempotency_key)
    return SubmitResponse(
        shared_run_id=run.shared_run_id,
        status=run.status,
        assigned_instance_id=run.assigned_instance_id,
        run_id=run.run_id,
        replayed=made.replayed,
    )


async def cancel(context: ApiContext, who: Principal, shared_run_id: str) -> CancelResponse:
    """Cancel a run; an archived run has ended and the answer is its status."""
    run = await context.control_plane.cancel(shared_run_id, who.tenant_id)
    if run is None:
        archived = await context.material.shared_run(shared_run_id, who.tenant_id)
        if archived is None:
            raise not_found(shared_run_id)
        run = archived[0]
    return CancelResponse(shared_run_id=run.shared_run_id, status=run.status, reason=run.reason)


async def replay(
    context: ApiContext, who: Principal, shared_run_id: str, idempotency_key: str | None = None
) -> ReplayResponse:
    """Submit the run's pipeline, inputs and context snapshot again as a new linked run
    (with ``idempotency_key``: once, however often it is asked)."""
    original = (await material(context, shared_run_id, who.tenant_id)).run
    made = await context.control_plane.submission(
        original.pipeline,
        original.snapshot,
        inputs=original.inputs,
        metadata=original.metadata,
        replay_of=original.shared_run_id,
        idempotency_key=idempotency_key,
    )
    run = await _made_run(context, who, made, idempotency_key)
    return ReplayResponse(
        shared_run_id=run.shared_run_id,
        replay_of=original.shared_run_id,
        status=run.status,
        replayed=made.replayed,
    )


async def _made_run(
    context: ApiContext, who: Principal, made: Submission, idempotency_key: str | None
) -> SharedRun:
    """The run a submission made, read from the archive when a replayed key's run has
    left Redis; 409 when it is kept nowhere any more."""
    if made.run is not None:
        return made.run
    archived = await context.material.shared_run(made.shared_run_id, who.tenant_id)
    if archived is None:
        raise ControlPlaneError(
            f"idempotency key {idempotency_key!r} created {made.shared_run_id}, which is "
            "no longer kept: use a new key",
            status=409,
        )
    return archived[0]


# -- steer ------------------------------------------------------------------------------


async def provide_input(
    context: ApiContext, who: Principal, shared_run_id: str, body: InputRequest
) -> SteerResponse:
    """Answer an ``input`` step: its output becomes ``value`` and the run goes on. The
    same answer again (its answer lost, a client sent it again) is that answer, not a
    409: an input step that completed with this very value answers ``replayed``."""
    found = await material(context, shared_run_id, who.tenant_id)
    ex = found.execution
    if ex is None:
        raise Conflict(f"step {body.step!r}: the run has no execution yet")
    if body.step not in ex.steps:
        raise InvalidField("step", f"no step {body.step!r}")
    if _answered_with(ex, body):
        return SteerResponse(
            shared_run_id=shared_run_id,
            execution_id=ex.execution_id,
            status=ex.status,
            replayed=True,
        )
    state = ex.steps[body.step].get("status")
    if ex.terminal:
        raise Conflict(f"step {body.step!r} is {state}, not waiting for input (run ended)")
    store = ExecutionStore(context.control_plane.redis)
    try:
        status = await store.provide_input(ex.execution_id, body.step, body.value, who.user)
    except InvalidTransition:
        again = (await material(context, shared_run_id, who.tenant_id)).execution
        if again is not None and _answered_with(again, body):  # answered in between
            return SteerResponse(
                shared_run_id=shared_run_id,
                execution_id=again.execution_id,
                status=again.status,
                replayed=True,
            )
        current = (await store.step_states(ex.execution_id)).get(body.step, state)
        raise Conflict(f"step {body.step!r} is {current}, not waiting for input") from None
    except StepNotFound:
        raise Conflict(f"step {body.step!r} is not in the execution") from None
    except (ExecutionTerminal, ControlBlocked, ExecutionNotFound) as exc:
        raise Conflict(f"step {body.step!r}: {exc}") from None
    return SteerResponse(
        shared_run_id=shared_run_id, execution_id=ex.execution_id, status=status.value
    )


def _answered_with(ex: ExecutionMaterial, body: InputRequest) -> bool:
    """Whether ``body.step`` is an ``input`` step that completed with ``body.value``."""
    record = ex.steps.get(body.step) or {}
    specs = ex.plan.get("steps")
    spec = next(
        (s for s in specs if isinstance(s, dict) and s.get("id") == body.step), None
    ) if isinstance(specs, list) else None  # fmt: skip
    return (
        spec is not None
        and spec.get("handler") == INPUT_HANDLER
        and record.get("status") == StepStatus.COMPLETED
        and "output" in record
        and record["output"] == body.value
    )


async def control(
    context: ApiContext, who: Principal, shared_run_id: str, action: str
) -> SteerResponse:
    """``pause`` (block new claims; running steps finish) or ``resume`` an execution."""
    if action not in ("pause", "resume"):
        raise InvalidField("action", f"{action!r} is not pause or resume")
    found = await material(context, shared_run_id, who.tenant_id)
    ex = found.execution
    if ex is None:
        raise Conflict(f"cannot {action} run {shared_run_id}: it has no execution yet")
    if ex.terminal:
        raise Conflict(f"cannot {action} execution {ex.execution_id}: it ended {ex.status}")
    store = ExecutionStore(context.control_plane.redis)
    try:
        if action == "pause":
            status = await store.pause(ex.execution_id, actor=who.user)
        else:
            status = await store.resume(ex.execution_id, actor=who.user)
    except EngineError as exc:
        raise Conflict(f"cannot {action} execution {ex.execution_id}: {exc}") from None
    return SteerResponse(
        shared_run_id=shared_run_id, execution_id=ex.execution_id, status=status.value
    )


# -- read -------------------------------------------------------------------------------


async def get_run(context: ApiContext, who: Principal, shared_run_id: str) -> RunDetails:
    return run_details(await material(context, shared_run_id, who.tenant_id))


async def list_runs(
    context: ApiContext,
    who: Principal,
    query: RunFilter,
    cursor: str | None = None,
    limit: int = 100,
) -> RunsPageBody:
    """The caller tenant's runs, hot and archived, newest first (``query.tenant_id`` is
    replaced by the caller's)."""
    scoped = dataclasses.replace(query, tenant_id=who.tenant_id)
    try:
        page = await context.listing.page(scoped, cursor, limit)
    except BadCursor as exc:
        raise BadRequest(f"cursor: {exc}") from None
    return RunsPageBody(runs=[SharedRunView.of(r) for r in page.runs], next_cursor=page.next_cursor)


def ledger_after(execution_id: str | None, cursor: str | None) -> tuple[int, str] | None:
    """The ledger position a cursor names (:class:`BadRequest` for a foreign one)."""
    if cursor is None:
        return None
    try:
        return decode_cursor(execution_id or "", cursor)
    except BadCursor as exc:
        raise BadRequest(f"cursor: {exc}") from None


async def events_page(
    context: ApiContext, found: RunMaterial, cursor: str | None, limit: int
) -> EventsPage:
    """One page of the run's ledger from ``cursor`` on."""
    eid = found.execution.execution_id if found.execution else None
    after = ledger_after(eid, cursor)
    if eid is None:
        return EventsPage(execution_id=None, events=[], next_cursor=None)
    page = await context.ledger.page(eid, found.tenant_id, after, limit)
    return EventsPage.model_validate(
        {
            "execution_id": eid,
            "events": [e.to_json() for e in page.entries],
            "next_cursor": page.next_cursor,
        }
    )


async def trace(context: ApiContext, who: Principal, shared_run_id: str) -> TraceBody:
    found = await material(context, shared_run_id, who.tenant_id)
    ex = execution_of(found)
    ledger = await context.ledger.all(ex.execution_id, found.tenant_id)
    return TraceBody.model_validate(build_trace(ex, ledger))


async def report(context: ApiContext, who: Principal, shared_run_id: str) -> ReportBody:
    found = await material(context, shared_run_id, who.tenant_id)
    ex = execution_of(found)
    ledger = await context.ledger.all(ex.execution_id, found.tenant_id)
    return ReportBody.model_validate(build_report(ex, ledger))


# -- queue / fleet / tenants --------------------------------------------------------------


async def drain(context: ApiContext, body: DrainRequest) -> DrainResponse:
    """One manual pump pass over every tenant's queue (the dispatch-time tenant boundary
    comes from each run's stored snapshot); the answer holds counts only."""
    started = time.perf_counter()
    result = await context.control_plane.drain(body.max_count, stop_on_failure=body.stop_on_failure)
    return DrainResponse(
        dispatched=result.dispatched,
        failed=result.failed,
        cycles=result.cycles,
        stopped=result.stopped,
        seconds=round(time.perf_counter() - started, 4),
    )


async def queue_status(context: ApiContext, who: Principal) -> QueueResponse:
    """Pending items per tenant: the caller's tenant only, unless the caller is an admin."""
    by_tenant = await context.control_plane.queue.pending_by_tenant()
    if not who.can(Capability.ADMIN):
        by_tenant = {t: n for t, n in by_tenant.items() if t == who.tenant_id}
    return QueueResponse(pending=sum(by_tenant.values()), pending_by_tenant=by_tenant)


async def instances(context: ApiContext, who: Principal) -> list[InstanceView]:
    """The instances the caller's tenant may run on, each with its suspect mark."""
    cp = context.control_plane
    visible = await cp.registry.list_visible(await cp.registry.tenant(who.tenant_id))
    marks = await cp.suspects.marks(d.instance_id for d in visible)
    return [
        InstanceView.model_validate({**d.model_dump(), "suspect": marks.get(d.instance_id)})
        for d in visible
    ]


async def model_providers(context: ApiContext, who: Principal) -> list[ModelProviderView]:
    """The platform's model providers the caller's tenant may call (none when it may not
    use ``model`` steps), by name: names, APIs and models, never URLs or keys."""
    tenant = await context.control_plane.registry.tenant(who.tenant_id)
    if MODEL_HANDLER not in tenant.allowed_handlers:
        return []
    allowed = tenant.allowed_model_providers
    return [
        ModelProviderView(
            name=name,
            api=provider.api.value,
            models=list(provider.models),
            max_output_tokens=provider.max_output_tokens,
        )
        for name, provider in sorted(handler_settings().model_providers.items())
        if allowed is None or name in allowed
    ]


def _own_tenant(who: Principal, tenant_id: str) -> None:
    if tenant_id != who.tenant_id and not who.can(Capability.ADMIN):
        raise RunNotFound(f"tenant {tenant_id!r} not found")


async def tenant_settings(context: ApiContext, who: Principal, tenant_id: str) -> TenantSettings:
    _own_tenant(who, tenant_id)
    return await context.control_plane.registry.tenant(tenant_id)


async def put_tenant_settings(
    context: ApiContext, who: Principal, settings: TenantSettings
) -> TenantSettings:
    """Store a tenant's settings (admission reads them at the next dispatch; runtimes
    owned by the tenant apply ``max_concurrent_step_tasks`` live). Front doors require
    the admin capability."""
    cp = context.control_plane
    await cp.registry.put_tenant(settings)
    # This control plane's next submit reads them (any other's finds them changed).
    cp.tenant_settings.forget(settings.tenant_id)
    return await cp.registry.tenant(settings.tenant_id)


async def set_step_slots(
    context: ApiContext, who: Principal, tenant_id: str, limit: int
) -> TenantSettings:
    """Change one setting of a tenant: ``max_concurrent_step_tasks`` (0 = unlimited),
    which the runtimes the tenant owns apply live (its own tenant, or any as admin)."""
    _own_tenant(who, tenant_id)
    current = await context.control_plane.registry.tenant(tenant_id)
    data: dict[str, Any] = {**current.model_dump(), "max_concurrent_step_tasks": limit}
    try:
        updated = TenantSettings.model_validate(data)
    except ValidationError as exc:
        raise InvalidField("limit", str(exc)) from None
    return await put_tenant_settings(context, who, updated)


async def model_usage(context: ApiContext, who: Principal, tenant_id: str) -> ModelUsageView:
    """The tenant's model token budget and its current window (its own tenant, or any as
    admin): read from Redis by the script that enforces it, so both judge one window."""
    _own_tenant(who, tenant_id)
    usage = await context.control_plane.model_budgets.usage(tenant_id)
    if usage is None:
        return ModelUsageView(tenant_id=tenant_id)
    return ModelUsageView(
        tenant_id=tenant_id,
        budget=usage.budget,
        window=usage.window,
        window_started_at_ms=usage.started_at_ms,
        resets_at_ms=usage.resets_at_ms,
        used=usage.used,
        reserved=usage.reserved,
        remaining=usage.remaining,
    )


# -- secrets ------------------------------------------------------------------------------


def _secret_view(info: SecretInfo) -> SecretView:
    return SecretView(
        name=info.name,
        updated_at_ms=info.updated_at_ms,
        updated_by=info.updated_by,
        sealed_with=info.sealed_with,
    )


async def secrets(context: ApiContext, who: Principal, tenant_id: str) -> list[SecretView]:
    """The tenant's secrets by name (its own tenant, or any as admin): never values."""
    _own_tenant(who, tenant_id)
    return [_secret_view(i) for i in await context.control_plane.secrets.listing(tenant_id)]


async def put_secret(
    context: ApiContext, who: Principal, tenant_id: str, name: str, value: str
) -> SecretView:
    """Store one secret of the tenant (its own, or any as admin; front doors require the
    cancel capability: operators and admins). The value is checked, never quoted."""
    _own_tenant(who, tenant_id)
    problem = value_problem(value)
    if problem is not None:
        raise InvalidField("value", problem)
    try:
        info = await context.control_plane.secrets.put(tenant_id, name, value, who.user)
    except TooManySecrets as exc:
        raise Conflict(str(exc)) from None
    return _secret_view(info)


async def delete_secret(context: ApiContext, who: Principal, tenant_id: str, name: str) -> None:
    """Forget one secret of the tenant (404 when there is none of that name): runs that
    name it fail their step, naming it, from then on."""
    _own_tenant(who, tenant_id)
    if not await context.control_plane.secrets.delete(tenant_id, name):
        raise RunNotFound(f"secret {name!r} of tenant {tenant_id!r} not found")
