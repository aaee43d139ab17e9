"""``airt mcp``: the MCP server over stdio, for agents that start their servers as
processes (a desktop agent's config, an IDE).

Two ways, chosen by what is configured:

* ``--api``/``AIRUNTIME_API_URL`` with ``--token``/``AIRUNTIME_API_TOKEN`` (or the stack
  ``airt up`` runs, with ``--tenant``'s development token): a relay to the control
  plane's ``/mcp`` (:mod:`airuntime.control_plane.mcp.bridge`), so the tools, roles and
  tenant scoping are the server's;
* ``--redis-url``/``AIRUNTIME_REDIS_URL`` (and no API): the server in this process
  (:mod:`airuntime.control_plane.mcp.stdio`) as the principal of
  ``--token`` in ``--tokens-file``/``AIRUNTIME_TOKENS_FILE``, or as a local admin of
  ``--tenant`` with the explicit ``--local-admin``.

Exit 2 for what cannot work (no way to connect, an unknown token, a control plane that
serves no MCP), before any message is read.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import httpx
import typer

from airuntime.cli.client import _client
from airuntime.cli.common import (
    configure_logs_or_exit,
    handler_policy_or_exit,
    invalid,
    tune_collector_or_exit,
)
from airuntime.control_plane.rbac import Authenticator, Principal
from airuntime.control_plane.settings import ControlPlaneServerSettings, ControlPlaneSettings
from airuntime.core.errors import ConfigError
from airuntime.core.redis_client import connect
from airuntime.core.settings import env_name

_Api = Annotated[str | None, typer.Option(envvar=env_name("api_url"), help="Control plane URL.")]
_Token = Annotated[str | None, typer.Option(envvar=env_name("api_token"), help="Bearer token.")]


def mcp(
    api: _Api = None,
    token: _Token = None,
    tenant: Annotated[
        str | None, typer.Option(help="The tenant (airt up's token; --local-admin's tenant).")
    ] = None,
    redis_url: Annotated[
        str | None,
        typer.Option(envvar=env_name("redis_url"), help="Serve from this Redis (no API)."),
    ] = None,
    tokens_file: Annotated[
        Path | None,
        typer.Option(envvar=env_name("tokens_file"), help="Resolve --token here (Redis mode)."),
    ] = None,
    local_admin: Annotated[
        bool, typer.Option("--local-admin", help="Redis mode: act as an admin of --tenant.")
    ] = False,
) -> None:
    """Serve MCP over stdio: relay to a control plane's /mcp, or serve from Redis."""
    if api or not redis_url:
        url, bearer = _client(api, token, tenant)
        endpoint = f"{url.rstrip('/')}/mcp"
        _check_remote(endpoint, bearer)
        from airuntime.control_plane.mcp.bridge import relay_stdio

        asyncio.run(relay_stdio(endpoint, bearer))
        return
    principal = _principal(token, tokens_file, tenant, local_admin)
    try:
        settings = ControlPlaneServerSettings().control_plane_settings()
    except Exception as exc:  # pydantic's error names the variable and the value
        raise invalid(f"control-plane settings: {exc}") from None
    configure_logs_or_exit()  # on stderr: stdout is the MCP stream
    handler_policy_or_exit()
    tune_collector_or_exit()
    try:
        asyncio.run(_serve(redis_url, principal, settings, tokens_file))
    except ConfigError as exc:  # the history's file cannot be opened, above all
        raise invalid(str(exc)) from None


def _check_remote(endpoint: str, bearer: str) -> None:
    """Exit 2 now for a server that is unreachable, refuses the token or serves no MCP:
    relayed, these would reach the agent only as an opaque error of its first request."""
    ping = {"jsonrpc": "2.0", "id": 0, "method": "ping"}
    headers = {"authorization": f"Bearer {bearer}", "accept": "application/json, text/event-stream"}
    try:
        resp = httpx.post(endpoint, json=ping, headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        raise invalid(f"cannot reach the MCP server at {endpoint}: {exc}") from None
    if resp.status_code == 401:
        raise invalid(f"{endpoint}: 401, the token is refused (--token, AIRUNTIME_API_TOKEN)")
    if resp.status_code == 404:
        raise invalid(f"{endpoint}: 404, the control plane serves no MCP (AIRUNTIME_MCP_ENABLED)")


def _principal(
    token: str | None, tokens_file: Path | None, tenant: str | None, local_admin: bool
) -> Principal:
    from airuntime.control_plane.mcp.stdio import local_admin as admin

    if local_admin:
        return admin(tenant or "default")
    if not token or tokens_file is None:
        raise invalid(
            "Redis mode needs --token with --tokens-file (AIRUNTIME_API_TOKEN, "
            "AIRUNTIME_TOKENS_FILE), or --local-admin"
        )
    try:
        who = Authenticator.from_file(tokens_file).authenticate(token)
    except ConfigError as exc:
        raise invalid(str(exc)) from None
    if who is None:
        raise invalid(f"--token: not a token of {tokens_file}")
    return who


async def _serve(
    redis_url: str, principal: Principal, settings: object, tokens: Path | None
) -> None:
    from airuntime.control_plane.mcp.stdio import serve_stdio

    assert isinstance(settings, ControlPlaneSettings)
    auth = Authenticator.from_file(tokens) if tokens else None
    redis = connect(redis_url, client_name="airt-mcp")
    try:
        await serve_stdio(redis, principal, settings, auth)
    finally:
        await redis.aclose()


def register(app: typer.Typer) -> None:
    app.command("mcp")(mcp)
