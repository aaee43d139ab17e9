"""Fixtures of the MCP suite: a real control plane serving its API and ``/mcp`` on a TCP
port (uvicorn, as ``airt control-plane`` does), a real runtime host on real Valkey, a
SQLite durable history, and the official SDK's client over streamable HTTP.

``stack(...)`` builds one (background pump on or off, scale-out provider); ``mcp_session``
opens a ``ClientSession`` with a bearer token. Tokens (user -> tenant, roles) are in
:data:`TOKENS`; every role is there, for tenant-a, plus an operator of tenant-b.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import pytest
import pytest_asyncio
import uvicorn
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult
from redis.asyncio import Redis

from airuntime.control_plane.api import close_app, create_app
from airuntime.control_plane.rbac import Authenticator, TokenEntry
from airuntime.control_plane.scale_out import ScaleOutProvider
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.history import HistoryStore, open_history_store
from runtime_pod.config import InstanceConfig
from runtime_pod.host import RuntimeHost
from tests.history.conftest import settings as history_settings

T = TypeVar("T")

TOKENS: dict[str, tuple[str, list[str]]] = {
    "viewer-a": ("tenant-a", ["viewer"]),
    "submitter-a": ("tenant-a", ["submitter"]),
    "operator-a": ("tenant-a", ["operator"]),
    "admin-a": ("tenant-a", ["admin"]),
    "operator-b": ("tenant-b", ["operator"]),
    "operator-default": ("default", ["operator"]),
}


def token(user: str) -> str:
    return f"token-of-{user}"


def token_entries() -> list[TokenEntry]:
    return [
        TokenEntry(token=token(user), user=user, tenant=tenant, roles=roles)
        for user, (tenant, roles) in TOKENS.items()
    ]


def tokens_yaml(path: Path) -> Path:
    lines = ["tokens:"]
    for e in token_entries():
        lines += [f"  - token: {e.token}", f"    user: {e.user}", f"    tenant: {e.tenant}"]
        lines.append(f"    roles: [{', '.join(e.roles)}]")
    path.write_text("\n".join(lines) + "\n")
    return path


TINY: dict[str, Any] = {
    "id": "tiny",
    "steps": [
        {"id": "a", "uses": "noop"},
        {"id": "b", "uses": "echo", "with": {"value": "${inputs.word}"}, "depends_on": ["a"]},
    ],
}
WAITING: dict[str, Any] = {
    "id": "asks",
    "steps": [
        {"id": "approve", "uses": "input"},
        {"id": "after", "uses": "echo", "with": {"value": "${steps.approve.output}"}},
    ],
}


@dataclass
class Stack:
    url: str
    cp: ControlPlane
    redis: Redis
    history: HistoryStore
    hosts: list[RuntimeHost]


@pytest_asyncio.fixture
async def valkey(valkey_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(valkey_url, decode_responses=False)
    try:
        await client.flushall()
        yield client
    finally:
        await client.aclose()


@pytest_asyncio.fixture
async def history(tmp_path: Path) -> AsyncIterator[HistoryStore]:
    store = await open_history_store(
        f"sqlite:///{tmp_path / 'history.db'}", settings=history_settings()
    )
    try:
        yield store
    finally:
        await store.close()


async def _listen(app: Any) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            serving.result()
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, serving, f"http://127.0.0.1:{port}"


@asynccontextmanager
async def stack(
    redis: Redis,
    history: HistoryStore,
    settings: ControlPlaneSettings,
    *,
    runtimes: list[InstanceConfig] | None = None,
    scale_out_provider: ScaleOutProvider | None = None,
) -> AsyncIterator[Stack]:
    """Runtime hosts (one per config; default one shared runtime), a started control
    plane, and its app served on a free port."""
    async with AsyncExitStack() as exits:
        hosts = []
        configs = [InstanceConfig(workers=4, heartbeat_s=0.5)] if runtimes is None else runtimes
        for config in configs:
            host = RuntimeHost(redis, config, instances=1)
            await host.start()
            exits.push_async_callback(host.stop, drain_timeout_s=5)
            hosts.append(host)
        cp = ControlPlane(redis, settings, scale_out_provider=scale_out_provider)
        await cp.start()
        exits.push_async_callback(cp.stop)
        await cp.wait_started()
        app = create_app(cp, Authenticator(token_entries()), history=history)
        server, serving, url = await _listen(app)

        async def shutdown() -> None:
            server.should_exit = True
            await serving
            await close_app(app)

        exits.push_async_callback(shutdown)
        yield Stack(url, cp, redis, history, hosts)


@asynccontextmanager
async def serve_app_only(redis: Redis, history: HistoryStore) -> AsyncIterator[str]:
    """The API app (and /mcp) of a control plane whose loops never start: for a Redis
    that does not answer."""
    app = create_app(ControlPlane(redis, ControlPlaneSettings()), Authenticator(token_entries()))
    server, serving, url = await _listen(app)
    try:
        yield url
    finally:
        server.should_exit = True
        await serving
        await close_app(app)


@asynccontextmanager
async def mcp_session(url: str, user: str | None) -> AsyncIterator[ClientSession]:
    """The SDK's client session on ``<url>/mcp`` with ``user``'s bearer token."""
    headers = {"authorization": f"Bearer {token(user)}"} if user else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=60.0))
    async with (
        http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> CallToolResult:
    result = await session.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult)
    return result


async def ok(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result; fails the test with the tool's error text."""
    result = await call(session, tool, **arguments)
    assert not result.is_error, f"{tool} failed: {error_text(result)}"
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def error_text(result: CallToolResult) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


async def refused(session: ClientSession, tool: str, **arguments: Any) -> str:
    """A tool's error text (the call must fail as a tool error, the session lives on)."""
    result = await call(session, tool, **arguments)
    assert result.is_error, f"{tool} should have been refused: {result.structured_content}"
    return error_text(result)


async def until(
    probe: Callable[[], Awaitable[T | None]], *, timeout_s: float = 60.0, what: str = "condition"
) -> T:
    """Poll ``probe`` until it returns something truthy (a deadline, not ordering)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: T | None = None
    while loop.time() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last={last!r})")


@pytest.fixture
def manual() -> ControlPlaneSettings:
    """Queue-first, background pump off: only a drain dispatches (the seed's controlled drain)."""
    return ControlPlaneSettings(background_pump=False, scale_out_enabled=False)
