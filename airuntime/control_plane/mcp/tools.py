"""The MCP tools: each control-plane operation with a typed input schema, a structured
result, and the capability it needs.

Why this exists: an agent drives the runtime through these tools exactly as a client
drives the HTTP API: every tool builds the API's request model from its arguments (the
same validation, the same messages), calls the same function in
:mod:`airuntime.control_plane.api.operations` and answers with the API's response
model. :data:`TOOL_CAPABILITIES` is the single table of what each tool needs; the
caller's tenant scopes every call (another tenant's run is "not found"), and the
tenant a queued run is dispatched for comes from its stored snapshot, never from an
argument.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Final, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field

from airuntime.control_plane.api import operations
from airuntime.control_plane.api.deps import ApiContext
from airuntime.control_plane.api.models import (
    CancelResponse,
    DrainRequest,
    DrainResponse,
    ModelUsageView,
    QueueResponse,
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
from airuntime.control_plane.mcp.access import McpAccess, role_for
from airuntime.control_plane.mcp.refusals import guarded
from airuntime.control_plane.mcp.views import (
    InstanceRow,
    InstanceTable,
    ModelProviderTable,
    SecretTable,
)
from airuntime.control_plane.rbac import TENANT_ID_PATTERN, Capability, Principal
from airuntime.control_plane.run_ledger import MAX_LIMIT
from airuntime.control_plane.run_listing import RunFilter
from airuntime.control_plane.run_views import RunDetails
from airuntime.control_plane.settings import SubmitMode
from airuntime.control_plane.shared_runs import SHARED_RUN_ID_PATTERN, SharedRunStatus
from airuntime.control_plane.submit_idempotency import IDEMPOTENCY_KEY_PATTERN
from airuntime.fleet.tenancy import TenantSettings

T = TypeVar("T")
MODE_HELP: Final = (
    "QueueFirst (the pump dispatches it) or DirectDispatch (admission at once); "
    "default: the control plane's."
)
Ctx = Context[Any, Any]

RunId = Annotated[
    str, Field(pattern=SHARED_RUN_ID_PATTERN, description="A SharedRunId (`sr-` + 32 hex).")
]
TenantId = Annotated[str, Field(pattern=TENANT_ID_PATTERN, description="A tenant id.")]
Cursor = Annotated[str | None, Field(max_length=2048, description="From `next_cursor`.")]

TOOL_CAPABILITIES: Final[dict[str, Capability]] = {
    "submit_run": Capability.SUBMIT,
    "get_run": Capability.READ,
    "list_runs": Capability.READ,
    "cancel_run": Capability.CANCEL,
    "answer_input": Capability.SUBMIT,
    "pause_run": Capability.CANCEL,
    "resume_run": Capability.CANCEL,
    "replay_run": Capability.SUBMIT,
    "run_report": Capability.READ,
    "run_ledger": Capability.READ,
    "run_trace": Capability.READ,
    "drain_queue": Capability.DRAIN,
    "queue_status": Capability.READ,
    "list_instances": Capability.READ,
    "list_model_providers": Capability.READ,
    "list_secrets": Capability.READ,
    "model_usage": Capability.READ,
    "get_tenant_settings": Capability.READ,
    "set_tenant_settings": Capability.ADMIN,
    "set_step_slots": Capability.CANCEL,
}
"""Every tool and the capability it needs (viewer: read; submitter: + submit; operator:
+ cancel, drain; admin: everything, every tenant)."""


class AirTools:
    """The tools over one wired control plane; register with :meth:`register`."""

    def __init__(self, context: ApiContext, access: McpAccess) -> None:
        self.context, self.access = context, access

    def register(self, server: MCPServer[Any]) -> None:
        for name, capability in TOOL_CAPABILITIES.items():
            fn = getattr(self, name)
            role = role_for(capability)
            server.add_tool(
                fn,
                name=name,
                description=f"{(fn.__doc__ or '').strip()}\n\nNeeds the {role} role.",
                annotations=ToolAnnotations(read_only_hint=capability is Capability.READ),
            )

    async def _call(self, ctx: Ctx, tool: str, act: Callable[[Principal], Awaitable[T]]) -> T:
        async def call() -> T:
            who = self.access.require(ctx, TOOL_CAPABILITIES[tool], tool)
            return await act(who)

        return await guarded(call)

    # -- runs ---------------------------------------------------------------------------

    async def submit_run(
        self,
        ctx: Ctx,
        pipeline: Annotated[
            dict[str, Any] | None, Field(description="The pipeline document (or pipeline_yaml).")
        ] = None,
        pipeline_yaml: Annotated[str | None, Field(description="The pipeline as YAML.")] = None,
        inputs: Annotated[dict[str, Any] | None, Field(description="Run inputs.")] = None,
        metadata: dict[str, str] | None = None,
        mode: Annotated[
            SubmitMode | None,
            Field(description=MODE_HELP),
        ] = None,
        project: str | None = None,
        current_namespace: str | None = None,
        namespaces: list[str] | None = None,
        context_key: str | None = None,
        tenant_group_id: str | None = None,
        idempotency_key: Annotated[
            str | None,
            Field(
                pattern=IDEMPOTENCY_KEY_PATTERN,
                description="Makes calling again safe (a lost answer, a timeout): the same "
                "key with the same request answers with the run it created (replayed: "
                "true) and creates nothing; with another request it is refused.",
            ),
        ] = None,
    ) -> SubmitResponse:
        """Submit a run as the caller's tenant: exactly one of pipeline / pipeline_yaml;
        the other snapshot fields only within what the token allows."""
        given = {
            k: v
            for k, v in locals().items()
            if k not in ("self", "ctx", "idempotency_key") and v is not None
        }

        async def act(who: Principal) -> SubmitResponse:
            request = SubmitRequest.model_validate(given)
            return await operations.submit(self.context, who, request, idempotency_key)

        return await self._call(ctx, "submit_run", act)

    async def get_run(self, ctx: Ctx, shared_run_id: RunId) -> RunDetails:
        """A run: identities, status, every step (status, attempts, output, error, worker
        and instance, timings) and the terminal snapshot; hot or archived."""
        return await self._call(
            ctx, "get_run", lambda who: operations.get_run(self.context, who, shared_run_id)
        )

    async def list_runs(
        self,
        ctx: Ctx,
        status: list[SharedRunStatus] | None = None,
        pipeline: Annotated[str | None, Field(min_length=1, max_length=256)] = None,
        created_from_ms: Annotated[int | None, Field(ge=0, description="Inclusive.")] = None,
        created_to_ms: Annotated[int | None, Field(ge=0, description="Exclusive.")] = None,
        cursor: Cursor = None,
        limit: Annotated[int, Field(ge=1, le=1000)] = 100,
    ) -> RunsPageBody:
        """The caller tenant's runs, hot and archived, newest first."""
        statuses = tuple(s.value for s in status or ())

        async def act(who: Principal) -> RunsPageBody:
            query = RunFilter(who.tenant_id, statuses, pipeline, created_from_ms, created_to_ms)
            return await operations.list_runs(self.context, who, query, cursor, limit)

        return await self._call(ctx, "list_runs", act)

    async def cancel_run(self, ctx: Ctx, shared_run_id: RunId) -> CancelResponse:
        """Cancel a run: at once while queued; a dispatched run ends Cancelled once its
        runtime stopped it."""
        return await self._call(
            ctx, "cancel_run", lambda who: operations.cancel(self.context, who, shared_run_id)
        )

    async def answer_input(
        self, ctx: Ctx, shared_run_id: RunId, step: str, value: Any = None
    ) -> SteerResponse:
        """Answer a run's waiting ``input`` step: its output becomes ``value``."""

        async def act(who: Principal) -> SteerResponse:
            body = InputRequest(step=step, value=value)
            return await operations.provide_input(self.context, who, shared_run_id, body)

        return await self._call(ctx, "answer_input", act)

    async def pause_run(self, ctx: Ctx, shared_run_id: RunId) -> SteerResponse:
        """Pause a run's execution: no new step starts; running steps finish."""
        return await self._call(
            ctx,
            "pause_run",
            lambda who: operations.control(self.context, who, shared_run_id, "pause"),
        )

    async def resume_run(self, ctx: Ctx, shared_run_id: RunId) -> SteerResponse:
        """Resume a paused run's execution."""
        return await self._call(
            ctx,
            "resume_run",
            lambda who: operations.control(self.context, who, shared_run_id, "resume"),
        )

    async def replay_run(
        self,
        ctx: Ctx,
        shared_run_id: RunId,
        idempotency_key: Annotated[
            str | None,
            Field(
                pattern=IDEMPOTENCY_KEY_PATTERN,
                description="Makes calling again safe: the same key answers with the replay "
                "it created (replayed: true) instead of making another.",
            ),
        ] = None,
    ) -> ReplayResponse:
        """Run a run again (same pipeline, inputs and context) as a new linked run."""
        return await self._call(
            ctx,
            "replay_run",
            lambda who: operations.replay(self.context, who, shared_run_id, idempotency_key),
        )

    # -- observability --------------------------------------------------------------------

    async def run_report(self, ctx: Ctx, shared_run_id: RunId) -> ReportBody:
        """Durations, the critical path, retries, recoveries, slot waits of a run."""
        return await self._call(
            ctx, "run_report", lambda who: operations.report(self.context, who, shared_run_id)
        )

    async def run_trace(self, ctx: Ctx, shared_run_id: RunId) -> TraceBody:
        """Per-step timeline of a run (claims, retries, recoveries; worker and instance)."""
        return await self._call(
            ctx, "run_trace", lambda who: operations.trace(self.context, who, shared_run_id)
        )

    async def run_ledger(
        self,
        ctx: Ctx,
        shared_run_id: RunId,
        cursor: Cursor = None,
        limit: Annotated[int, Field(ge=1, le=MAX_LIMIT)] = 100,
    ) -> EventsPage:
        """A page of the run's ledger (every claim, completion, retry, control action)."""

        async def act(who: Principal) -> EventsPage:
            found = await operations.material(self.context, shared_run_id, who.tenant_id)
            return await operations.events_page(self.context, found, cursor, limit)

        return await self._call(ctx, "run_ledger", act)

    # -- queue, fleet, tenants ------------------------------------------------------------

    async def drain_queue(
        self,
        ctx: Ctx,
        max_count: Annotated[int, Field(ge=1, le=100_000)] = 100,
        stop_on_failure: bool = False,
    ) -> DrainResponse:
        """Manual pump: dispatch up to max_count queued runs of every tenant (each onto
        an instance its stored snapshot's tenant may use); counts only."""
        body = {"max_count": max_count, "stop_on_failure": stop_on_failure}
        return await self._call(
            ctx,
            "drain_queue",
            lambda who: operations.drain(self.context, DrainRequest.model_validate(body)),
        )

    async def queue_status(self, ctx: Ctx) -> QueueResponse:
        """Queued runs per tenant (the caller's tenant; every tenant for an admin)."""
        return await self._call(
            ctx, "queue_status", lambda who: operations.queue_status(self.context, who)
        )

    async def list_instances(self, ctx: Ctx) -> InstanceTable:
        """The runtime instances the caller's tenant may run on, with their capacity
        (workers, run slots, queue, can-accept-run), ownership and provider."""

        async def act(who: Principal) -> InstanceTable:
            views = await operations.instances(self.context, who)
            return InstanceTable(
                tenant_id=who.tenant_id, instances=[InstanceRow.of(v) for v in views]
            )

        return await self._call(ctx, "list_instances", act)

    async def list_model_providers(self, ctx: Ctx) -> ModelProviderTable:
        """The model providers the caller's tenant may name in `model` steps (name, API,
        models it offers, the most max_tokens): the platform's, within the tenant's
        allowed_model_providers; never where they are or the keys they use."""

        async def act(who: Principal) -> ModelProviderTable:
            providers = await operations.model_providers(self.context, who)
            return ModelProviderTable(tenant_id=who.tenant_id, providers=providers)

        return await self._call(ctx, "list_model_providers", act)

    async def list_secrets(
        self, ctx: Ctx, tenant_id: Annotated[str | None, Field(pattern=TENANT_ID_PATTERN)] = None
    ) -> SecretTable:
        """The names of a tenant's secrets (default: the caller's tenant), when and by
        whom each was set: what an http step's header may name as ${secrets.<name>}.
        Never a value; setting one is not a tool (a value would pass through the agent's
        context): use the API or `airt secrets set`."""

        async def act(who: Principal) -> SecretTable:
            tenant = tenant_id or who.tenant_id
            views = await operations.secrets(self.context, who, tenant)
            return SecretTable(tenant_id=tenant, secrets=views)

        return await self._call(ctx, "list_secrets", act)

    async def model_usage(
        self, ctx: Ctx, tenant_id: Annotated[str | None, Field(pattern=TENANT_ID_PATTERN)] = None
    ) -> ModelUsageView:
        """A tenant's model token budget (default: the caller's tenant) and its current
        window: tokens used, held by calls going on, remaining, and when it renews. A
        model step that could pass the budget fails, naming it; budget null: not limited."""
        return await self._call(
            ctx,
            "model_usage",
            lambda who: operations.model_usage(self.context, who, tenant_id or who.tenant_id),
        )

    async def get_tenant_settings(
        self, ctx: Ctx, tenant_id: Annotated[str | None, Field(pattern=TENANT_ID_PATTERN)] = None
    ) -> TenantSettings:
        """A tenant's placement settings (default: the caller's tenant)."""
        return await self._call(
            ctx,
            "get_tenant_settings",
            lambda who: operations.tenant_settings(self.context, who, tenant_id or who.tenant_id),
        )

    async def set_tenant_settings(self, ctx: Ctx, settings: TenantSettings) -> TenantSettings:
        """Replace a tenant's settings (isolation, capacity, allowed handlers...)."""
        return await self._call(
            ctx,
            "set_tenant_settings",
            lambda who: operations.put_tenant_settings(self.context, who, settings),
        )

    async def set_step_slots(
        self,
        ctx: Ctx,
        limit: Annotated[int, Field(ge=0, description="Concurrent step handlers; 0: no limit.")],
        tenant_id: Annotated[str | None, Field(pattern=TENANT_ID_PATTERN)] = None,
    ) -> TenantSettings:
        """Bound the step handlers running at once on each runtime the tenant owns
        (max_concurrent_step_tasks, applied live; default: the caller's tenant)."""
        return await self._call(
            ctx,
            "set_step_slots",
            lambda who: operations.set_step_slots(
                self.context, who, tenant_id or who.tenant_id, limit
            ),
        )
