"""connect(): cluster URLs and the settings that select the cluster client, and a
fresh cluster client used by many coroutines at once."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import CrossSlotTransactionError

from airuntime.core.redis_client import (
    CountingRedis,
    CountingRedisCluster,
    clone,
    connect,
    connection_options,
    is_cluster_url,
)
from airuntime.devstack.cluster import LocalCluster


def test_cluster_urls_and_the_environment_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRUNTIME_REDIS_CLUSTER", raising=False)
    assert is_cluster_url("redis+cluster://h:1,h:2")
    assert not is_cluster_url("redis://h:1/0")
    monkeypatch.setenv("AIRUNTIME_REDIS_CLUSTER", "1")
    assert is_cluster_url("redis://h:1/0")


@pytest.mark.parametrize("seed", ["h", "h:port", ":1", "h:1,"])
def test_a_bad_seed_is_named(seed: str) -> None:
    with pytest.raises(ValueError, match="is not host:port"):
        connect(f"redis+cluster://{seed}")


async def test_a_fresh_cluster_client_serves_many_first_commands_at_once(
    valkey_cluster: LocalCluster,
) -> None:
    """Hundreds of coroutines issue their first commands on a new client together (a
    worker pool starting its participations): every one gets its answer."""
    client = connect(valkey_cluster.url)
    assert isinstance(client, CountingRedisCluster)
    try:
        replies = await asyncio.gather(*(client.get(f"k{i}") for i in range(300)))
        assert replies == [None] * 300
        assert client.round_trips == 300
    finally:
        await client.aclose()


async def test_a_clone_reaches_the_same_cluster_with_its_own_options(
    valkey_cluster: LocalCluster, redis: Redis
) -> None:
    client = connect(valkey_cluster.url)
    try:
        blocking = clone(client, socket_timeout=42.0)
        assert isinstance(blocking, RedisCluster)
        assert connection_options(blocking)["socket_timeout"] == 42.0
        await blocking.set("cloned", "yes")
        assert await client.get("cloned") == b"yes"
        await blocking.aclose()
        plain = connect(f"redis://127.0.0.1:{redis.connection_pool.connection_kwargs['port']}")
        assert isinstance(plain, CountingRedis)
        assert connection_options(clone(plain, socket_timeout=7.0))["socket_timeout"] == 7.0
        await plain.aclose()
    finally:
        await client.delete("cloned")
        await client.aclose()


async def test_a_fresh_cluster_clients_first_command_may_be_a_transaction(
    valkey_cluster: LocalCluster,
) -> None:
    """A control plane publishing its tenants at start opens with WATCH/MULTI/EXEC;
    redis-py would queue those commands through a thread with its own event loop."""
    client = connect(valkey_cluster.url)
    try:
        async with client.pipeline(transaction=True) as pipe:
            await pipe.watch("air:{tx}:a")
            assert await pipe.get("air:{tx}:a") is None  # immediate, after WATCH
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.set("air:{tx}:a", "1").incr("air:{tx}:b")
            assert await pipe.execute() == [True, 1]
        fresh = connect(valkey_cluster.url)
        pipe = fresh.pipeline(transaction=True)
        pipe.hset("air:{tx}:h", "f", "v").expire("air:{tx}:h", 60)
        assert await pipe.execute() == [1, True]
        await fresh.aclose()
        cross = client.pipeline(transaction=True)
        with pytest.raises(CrossSlotTransactionError):
            cross.execute_command("MGET", "air:{tx}:a", "air:{other}:a")
        assert await client.mget("air:{tx}:a", "air:{tx}:b") == [b"1", b"1"]
    finally:
        await client.delete("air:{tx}:a", "air:{tx}:b", "air:{tx}:h")
        await client.aclose()
