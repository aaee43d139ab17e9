"""The control plane's HTTP API (FastAPI; OpenAPI at ``/openapi.json``).

Every ``/v1`` endpoint needs a bearer token (:mod:`airuntime.control_plane.rbac`); the
caller's tenant becomes the run's snapshot and scopes every read, so no endpoint
returns another tenant's data (an invisible run answers 404, exactly like a missing
one). Bad requests get a 4xx naming the field, never a 500.

:func:`~airuntime.control_plane.api.app.create_app` wires the routers: ``runs``,
``queue``, ``fleet`` (instances and tenant settings) and ``health`` (healthz, readyz,
metrics), and mounts the MCP server at ``/mcp``
(:mod:`airuntime.control_plane.mcp`); request and response bodies are in
:mod:`~airuntime.control_plane.api.models`.
"""

from airuntime.control_plane.api.app import begin_closing, close_app, create_app

__all__ = ["begin_closing", "close_app", "create_app"]
