"""``airt mcp`` against a remote control plane: relay stdio to its ``/mcp``.

Why this exists: a desktop agent starts MCP servers as stdio processes, while the tools
live in the control plane (one implementation). With ``AIRUNTIME_API_URL`` the stdio
process is a relay and nothing else: every JSON-RPC message from the agent goes to
``<api>/mcp`` over streamable HTTP with the bearer token, every answer comes back; the
roles, tenant scoping and validation are the server's. An HTTP failure (401, an
unreachable server) reaches the agent as the JSON-RPC error of the request it answered
(the SDK's client transport does that), so the agent's session never just hangs.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx2
from mcp.client.streamable_http import streamable_http_client
from mcp.server.stdio import stdio_server

TIMEOUT = httpx2.Timeout(30.0, read=300.0)
"""The SDK's own client timeouts: 30 s to connect and write, 300 s for an answer."""


async def _pipe(source: Any, sink: Any) -> None:
    async for message in source:
        if isinstance(message, Exception):
            continue  # a transport hiccup already answered as a JSON-RPC error
        await sink.send(message)


async def relay_stdio(url: str, token: str) -> None:
    """Relay this process's stdio MCP session to the streamable HTTP server at ``url``
    until the agent closes stdin."""
    client = httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=TIMEOUT)
    async with (
        client,
        streamable_http_client(url, http_client=client) as (remote_read, remote_write),
        stdio_server() as (local_read, local_write),
        anyio.create_task_group() as tasks,
    ):
        tasks.start_soon(_pipe, remote_read, local_write)
        await _pipe(local_read, remote_write)
        tasks.cancel_scope.cancel()
