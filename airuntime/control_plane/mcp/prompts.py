"""MCP prompts a person would actually pick: "why is my run waiting?" and "drain
tenant X safely".

Why this exists: the questions operators ask most need several tools in a known order
and the meaning of the runtime's states. Each prompt embeds what the caller may see
right now (the run, the queue, the instance table) and tells the model which tools to
use next and what the states mean, so the answer rests on facts, not guesses.
"""

from __future__ import annotations

import json
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage

from airuntime.control_plane.api import operations
from airuntime.control_plane.api.deps import ApiContext
from airuntime.control_plane.mcp.access import McpAccess
from airuntime.control_plane.mcp.refusals import guarded
from airuntime.control_plane.mcp.views import InstanceRow
from airuntime.control_plane.rbac import Capability, Principal

Ctx = Context[Any, Any]

STATES = """States of a run: Submitted -> QueuedGlobally (in the shared queue, waiting for a
pump: the background pump, or a manual drain_queue when it is off) -> Dispatched (a
runtime accepted it; its execution may still wait for a run slot or a worker there) ->
Succeeded / Failed / Cancelled; RequestScaleOut: admission found no instance with
capacity and asked for one (the run is requeued when the instance exists); Rejected:
no instance may ever take it. A step WaitingForInput needs answer_input; a Paused
execution needs resume_run. An instance takes a run only when can_accept_run is true
(queue not paused, queue room, a free run slot, a free worker)."""


class AirPrompts:
    def __init__(self, context: ApiContext, access: McpAccess) -> None:
        self.context, self.access = context, access

    def register(self, server: MCPServer[Any]) -> None:
        server.prompt(name="why_is_my_run_waiting", title="Why is my run waiting?")(
            self.why_is_my_run_waiting
        )
        server.prompt(name="drain_tenant_safely", title="Drain a tenant's queue safely")(
            self.drain_tenant_safely
        )

    async def _facts(self, who: Principal) -> dict[str, Any]:
        queue = await operations.queue_status(self.context, who)
        views = await operations.instances(self.context, who)
        return {
            "queue": queue.model_dump(mode="json"),
            "instances": [InstanceRow.of(v).model_dump(mode="json") for v in views],
        }

    async def why_is_my_run_waiting(self, shared_run_id: str, ctx: Ctx) -> list[UserMessage]:
        """Explain why a run has not finished, from its state, the queue and the instances."""

        async def facts() -> dict[str, Any]:
            who = self.access.require(ctx, Capability.READ, "why_is_my_run_waiting")
            run = await operations.get_run(self.context, who, shared_run_id)
            return {"run": run.model_dump(mode="json"), **(await self._facts(who))}

        data = await guarded(facts)
        text = (
            f"Run {shared_run_id} has not finished. Explain why, and what would unblock it, "
            "from the facts below. Use get_run, run_ledger and list_instances for more, "
            "queue_status for the queue.\n\n"
            f"{STATES}\n\nFacts (JSON):\n{json.dumps(data, indent=1)}"
        )
        return [UserMessage(text)]

    async def drain_tenant_safely(self, tenant_id: str, ctx: Ctx) -> list[UserMessage]:
        """A careful manual drain: check capacity first, drain in small batches, stop at
        the first failed dispatch, verify after each batch."""

        async def facts() -> dict[str, Any]:
            who = self.access.require(ctx, Capability.DRAIN, "drain_tenant_safely")
            if tenant_id != who.tenant_id and not who.can(Capability.ADMIN):
                raise operations.RunNotFound(f"tenant {tenant_id!r} not found")
            return await self._facts(who)

        data = await guarded(facts)
        text = (
            f"Drain the queued runs of tenant {tenant_id} safely. drain_queue runs the shared "
            "pump for every tenant (each run goes only to an instance its own tenant may use), "
            "so: 1) check that tenant's instances have can_accept_run and free run slots; "
            "2) call drain_queue with a small max_count (about the free run slots) and "
            "stop_on_failure=true; 3) call queue_status and list_instances again; repeat "
            "while runs are queued and capacity is free; stop and report if a dispatch "
            "failed or nothing was dispatched.\n\n"
            f"{STATES}\n\nCurrent facts (JSON):\n{json.dumps(data, indent=1)}"
        )
        return [UserMessage(text)]
