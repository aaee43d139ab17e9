"""Read-only MCP resources: a run, a run's ledger, a tenant's instance table.

Why this exists: an MCP client can attach a resource to a conversation (a run's state,
its ledger) without a tool call. Each is a URI template, so the read has a request and
a caller: the same tenant scoping as the tools (another tenant's run or instance table
is "not found") and the viewer role at least. The bodies are the tools' JSON.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from pydantic import BaseModel

from airuntime.control_plane.api import operations
from airuntime.control_plane.api.deps import ApiContext
from airuntime.control_plane.mcp.access import McpAccess
from airuntime.control_plane.mcp.refusals import guarded
from airuntime.control_plane.mcp.views import InstanceRow, InstanceTable
from airuntime.control_plane.rbac import Capability, Principal
from airuntime.control_plane.run_ledger import MAX_LIMIT

Ctx = Context[Any, Any]
JSON: Final = "application/json"

RUN_URI: Final = "airuntime://runs/{shared_run_id}"
LEDGER_URI: Final = "airuntime://runs/{shared_run_id}/ledger"
INSTANCES_URI: Final = "airuntime://tenants/{tenant_id}/instances"


class AirResources:
    def __init__(self, context: ApiContext, access: McpAccess) -> None:
        self.context, self.access = context, access

    def register(self, server: MCPServer[Any]) -> None:
        add = server.resource
        add(RUN_URI, name="run", description="A run's details (JSON).", mime_type=JSON)(self.run)
        add(
            LEDGER_URI,
            name="run-ledger",
            description=f"The first {MAX_LIMIT} entries of a run's ledger (JSON).",
            mime_type=JSON,
        )(self.ledger)
        add(
            INSTANCES_URI,
            name="instances",
            description="The runtime instances a tenant may run on, with capacity (JSON).",
            mime_type=JSON,
        )(self.instances)

    async def _read(
        self, ctx: Ctx, what: str, act: Callable[[Principal], Awaitable[BaseModel]]
    ) -> str:
        async def call() -> BaseModel:
            return await act(self.access.require(ctx, Capability.READ, what))

        try:
            body = await guarded(call)
        except ToolError as exc:
            text = str(exc)
            if text.startswith("not found"):
                raise ResourceNotFoundError(text) from None
            raise ResourceError(text) from None
        return body.model_dump_json(exclude_unset=False)

    async def run(self, shared_run_id: str, ctx: Ctx) -> str:
        return await self._read(
            ctx, "the run resource", lambda w: operations.get_run(self.context, w, shared_run_id)
        )

    async def ledger(self, shared_run_id: str, ctx: Ctx) -> str:
        async def act(who: Principal) -> BaseModel:
            found = await operations.material(self.context, shared_run_id, who.tenant_id)
            return await operations.events_page(self.context, found, None, MAX_LIMIT)

        return await self._read(ctx, "the ledger resource", act)

    async def instances(self, tenant_id: str, ctx: Ctx) -> str:
        async def act(who: Principal) -> BaseModel:
            if tenant_id != who.tenant_id:
                raise operations.RunNotFound(f"tenant {tenant_id!r} not found")
            views = await operations.instances(self.context, who)
            return InstanceTable(tenant_id=tenant_id, instances=[InstanceRow.of(v) for v in views])

        return await self._read(ctx, "the instances resource", act)
