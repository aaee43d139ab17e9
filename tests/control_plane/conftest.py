"""Fixtures of the control-plane suite.

``redis`` (from ``tests/conftest.py``) runs a test once per server (Valkey and Redis
7). The heavy scenarios (1,000 runs, pooled HTTP runtimes, ``airt runtime``
subprocesses) use ``valkey`` instead: one real embedded Valkey, flushed per test,
which keeps the suite inside its time budget.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from redis.asyncio import Redis


@pytest_asyncio.fixture
async def valkey(valkey_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(valkey_url, decode_responses=False)
    try:
        await client.flushall()
        yield client
    finally:
        await client.aclose()
