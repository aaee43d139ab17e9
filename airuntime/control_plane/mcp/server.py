"""The MCP server over one wired control plane, and ``/mcp`` on the API's app.

Why this exists: :func:`build_server` assembles the tools, resources and prompts on the
official SDK's :class:`~mcp.server.mcpserver.MCPServer`; :class:`McpEndpoint` serves it
as streamable HTTP on the control plane's own port with the API's bearer tokens.

The endpoint is *stateless* with JSON answers: every POST is a complete exchange and
no session lives in one process, so any replica of the control plane answers any call
(no sticky sessions behind the Service). A request without a known bearer token is
refused with 401 before the SDK sees it; the tools authenticate the same token again
for its roles and tenant. DNS-rebinding protection (Host/Origin allowlists) is off:
it protects unauthenticated local servers, and every call here needs a token a browser
page cannot add. The SDK's session manager needs a running task group: the endpoint
starts it on its first request (the API runs without an ASGI lifespan) and
:meth:`McpEndpoint.close` stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from airuntime.control_plane.api.deps import ApiContext
from airuntime.control_plane.mcp.access import McpAccess, bearer
from airuntime.control_plane.mcp.prompts import AirPrompts
from airuntime.control_plane.mcp.resources import AirResources
from airuntime.control_plane.mcp.tools import AirTools
from airuntime.control_plane.rbac import Authenticator
from airuntime.core.version import installed_version

INSTRUCTIONS = """Drive the airuntime control plane: submit runs (submit_run), read them
(get_run, list_runs, run_report, run_trace, run_ledger), steer them (answer_input,
pause_run, resume_run, cancel_run, replay_run), operate the shared queue (queue_status,
drain_queue), inspect runtime capacity (list_instances) and tenant settings. Every call
acts as the caller's tenant; another tenant's runs are "not found"."""


def build_server(context: ApiContext, access: McpAccess) -> MCPServer[Any]:
    """The MCP server: every tool, resource and prompt over ``context``."""
    # WARNING: the SDK configures the root logger (basicConfig) with this level; INFO
    # would make every control plane log each MCP request.
    server: MCPServer[Any] = MCPServer(
        "airuntime", instructions=INSTRUCTIONS, version=installed_version(), log_level="WARNING"
    )
    AirTools(context, access).register(server)
    AirResources(context, access).register(server)
    AirPrompts(context, access).register(server)
    return server


class McpEndpoint:
    """The ASGI app of ``/mcp``: bearer check, then the SDK's streamable HTTP transport."""

    def __init__(self, context: ApiContext, auth: Authenticator) -> None:
        self.auth = auth
        server = build_server(context, McpAccess(auth=auth))
        server.streamable_http_app(
            stateless_http=True,
            json_response=True,
            max_request_body_size=context.control_plane.settings.max_request_bytes,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self._manager = server.session_manager
        self._runner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._starting: asyncio.Lock | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        token = bearer(Headers(scope=scope))
        if token is None or self.auth.authenticate(token) is None:
            detail = "missing bearer token" if token is None else "unknown bearer token"
            refusal = JSONResponse(
                {"detail": detail}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
            )
            await refusal(scope, receive, send)
            return
        await self._running()
        await self._manager.handle_request(scope, receive, send)

    async def _running(self) -> None:
        """Start the session manager's task group once, on this event loop."""
        if self._runner is not None and not self._runner.done():
            return
        self._starting = self._starting or asyncio.Lock()
        async with self._starting:
            if self._runner is not None and not self._runner.done():
                return
            ready = asyncio.Event()
            self._runner = runner = asyncio.create_task(self._serve(ready), name="mcp-sessions")
            waiting = asyncio.create_task(ready.wait())
            await asyncio.wait({runner, waiting}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            if runner.done():
                runner.result()  # raises what stopped it

    async def _serve(self, ready: asyncio.Event) -> None:
        async with self._manager.run():
            ready.set()
            await self._stop.wait()

    async def close(self) -> None:
        """Stop the session manager (in-flight calls are cancelled)."""
        self._stop.set()
        if self._runner is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
