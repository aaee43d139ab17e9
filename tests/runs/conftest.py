"""Fixtures of the run read & steer suite: a real control plane, a real runtime host and
a real durable history (SQLite and PostgreSQL: every test runs on both).

``api`` is an httpx client over the ASGI app (``create_app(..., history=store)``) with
the control plane's background pump running, so submitted runs really execute; the
history fixtures are the durable-history suite's own (``tests/history/conftest.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import pytest_asyncio
from redis.asyncio import Redis

from airuntime.control_plane.api import create_app
from airuntime.control_plane.rbac import Authenticator, TokenEntry
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.history import HistoryStore
from runtime_pod.config import InstanceConfig
from runtime_pod.host import RuntimeHost
from tests.history.conftest import backend, history_dsn, pg_template, postgres, store

__all__ = ["Api", "backend", "history_dsn", "pg_template", "postgres", "store"]

TOKENS = {
    "alice-a": ("tenant-a", ["operator"]),
    "sub-a": ("tenant-a", ["submitter"]),
    "viewer-a": ("tenant-a", ["viewer"]),
    "bob-b": ("tenant-b", ["operator"]),
}


def auth(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer token-{name}"}


def authenticator() -> Authenticator:
    return Authenticator(
        [
            TokenEntry(token=f"token-{name}", user=name, tenant=tenant, roles=roles)
            for name, (tenant, roles) in TOKENS.items()
        ]
    )


@dataclass
class Api:
    client: httpx.AsyncClient
    cp: ControlPlane
    redis: Redis
    history: HistoryStore


@pytest_asyncio.fixture
async def hot(valkey_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(valkey_url, decode_responses=False)
    try:
        await client.flushall()
        yield client
    finally:
        await client.aclose()


@asynccontextmanager
async def serving_api(
    hot: Redis,
    store: HistoryStore,
    config: InstanceConfig | None = None,
    settings: ControlPlaneSettings | None = None,
    *,
    archive: bool = False,
) -> AsyncIterator[Api]:
    """A runtime host and a control plane on ``hot`` behind the API app reading ``store``;
    with ``archive`` the control plane's archivers also write to ``store``."""
    host = RuntimeHost(
        hot, config or InstanceConfig(workers=4, heartbeat_s=0.5, assist=False), instances=1
    )
    await host.start()
    cp = ControlPlane(
        hot,
        settings or ControlPlaneSettings(scale_out_enabled=False),
        history=store if archive else None,
    )
    if cp.archiver is not None:
        cp.archiver.idle_s = 0.05
    for inst in host.instances:
        cp.local.add(inst)
    await cp.start()
    await cp.wait_started()
    app = create_app(cp, authenticator(), history=store)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cp")
    try:
        yield Api(client, cp, hot, store)
    finally:
        await client.aclose()
        await cp.stop()
        await host.stop()


@pytest_asyncio.fixture
async def api(hot: Redis, store: HistoryStore) -> AsyncIterator[Api]:
    async with serving_api(hot, store) as served:
        yield served
