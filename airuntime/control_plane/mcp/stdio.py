"""``airt mcp`` on a Redis URL: the MCP server over stdio for one principal.

Why this exists: for local use (``airt up``'s Valkey, a developer's Redis) an agent can
drive the runtime without an API in between. The process serves the same tools over
the same operations, as one principal fixed at startup: the holder of a token from the
tokens file, or -- only when asked for explicitly -- a local admin. It runs none of the
control plane's background loops (pump, outcomes, scale-out watcher): those belong to
the control plane process on the same Redis; a ``drain_queue`` here runs one manual
pump pass from this process, delivering through the instances' ``redis``/``http``
providers.
"""

from __future__ import annotations

from airuntime.control_plane.api.deps import ApiContext
from airuntime.control_plane.mcp.access import McpAccess
from airuntime.control_plane.mcp.server import build_server
from airuntime.control_plane.rbac import Authenticator, Capability, Principal
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.core.redis_client import RedisClient
from airuntime.history import open_history_at_start


def local_admin(tenant_id: str) -> Principal:
    """Every capability, acting as ``tenant_id`` (``--local-admin``)."""
    return Principal(user="local-admin", tenant_id=tenant_id, capabilities=frozenset(Capability))


async def serve_stdio(
    redis: RedisClient,
    principal: Principal,
    settings: ControlPlaneSettings,
    auth: Authenticator | None = None,
) -> None:
    """Serve MCP on stdin/stdout until the client closes stdin."""
    history = await open_history_at_start()
    cp = ControlPlane(redis, settings)
    try:
        context = ApiContext(cp, auth or Authenticator([]), None, history)
        server = build_server(context, McpAccess(auth=auth, fixed=principal))
        await server.run_stdio_async()
    finally:
        await cp.deliveries.close()
        await history.close()
