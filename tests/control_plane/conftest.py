"""Fixtures of the control-plane suite.

``redis`` (from ``tests/conftest.py``) runs a test once per server (Valkey and Redis
7). The heavy scenarios (1,000 runs, pooled HTTP runtimes, ``airt runtime``
subprocesses) use ``valkey`` instead: one real embedded Valkey, flushed per test,
which keeps the suite inside its time budget. ``cp`` is the control plane most tests
drain by hand.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from airuntime.control_plane.service import ControlPlane
from tests.control_plane.support import manual_cp


@pytest_asyncio.fixture
async def valkey(valkey_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(valkey_url, decode_responses=False)
    try:
        await client.flushall()
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def cp(redis: Redis) -> ControlPlane:
    """A control plane on ``redis`` without a background pump (not started)."""
    return manual_cp(redis)
