"""The MCP server: the control plane's operations as Model Context Protocol tools,
resources and prompts, for operators and AI agents.

Why this exists: an agent (or a person in an MCP client) drives the runtime through the
same operations as the HTTP API -- submit, inspect, steer, drain, the instance table,
tenant settings, report/ledger/trace/replay -- with typed arguments and structured
results. One implementation, two front doors: every tool calls
:mod:`airuntime.control_plane.api.operations`, as the routes do.

* :mod:`.access` -- who is calling (bearer token on HTTP, the process's principal on
  stdio) and the role each tool needs;
* :mod:`.refusals` -- every refusal as a tool error naming the field, the run or the role;
* :mod:`.views` -- the instance table (the reference's dashboard columns);
* :mod:`.tools`, :mod:`.resources`, :mod:`.prompts` -- what the server offers;
* :mod:`.server` -- the server, and ``/mcp`` (streamable HTTP) on the API's app;
* :mod:`.bridge` -- ``airt mcp`` over stdio relaying to a remote ``/mcp``.
"""

from airuntime.control_plane.mcp.access import McpAccess
from airuntime.control_plane.mcp.server import McpEndpoint, build_server

__all__ = ["McpAccess", "McpEndpoint", "build_server"]
