"""Read-modify-write of JSON records (:mod:`airuntime.control_plane.json_records`).

A change is a compare-and-set: it sees the record as it is when its write lands. On a
standalone server the WATCH and the read go in one round trip; a writer that slips in
before the write makes the change run again on what that writer left, and a
connection lost before the WATCH is answered is retried on a new one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import redis as sync_redis
from pydantic import BaseModel, ConfigDict
from redis.asyncio import Connection, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from airuntime.control_plane.json_records import update_record, update_records


class Counter(BaseModel):
    model_config = ConfigDict(frozen=True)

    n: int
    by: tuple[str, ...] = ()


class CountingConnection(Connection):
    """Counts what is written to the server: one send per round trip."""

    sends = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sends += 1
        await super().send_packed_command(command, check_health)


@pytest_asyncio.fixture
async def counted(valkey: Redis, valkey_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(valkey_url, connection_class=CountingConnection)
    await client.ping()
    CountingConnection.sends = 0
    try:
        yield client
    finally:
        await client.aclose()


def _keys(n: int) -> list[str]:
    return [f"air:{{air}}:test-record:{i}" for i in range(n)]


async def test_a_batch_change_is_two_round_trips(counted: Redis, valkey: Redis) -> None:
    keys = _keys(3)
    for key in keys:
        await valkey.set(key, Counter(n=1).model_dump_json())
    out = await update_records(counted, keys, Counter, lambda i, c: Counter(n=c.n + i + 1))
    assert CountingConnection.sends == 2, "WATCH + read, then MULTI ... EXEC"
    assert [after.n for _, after in (pair for pair in out if pair)] == [2, 3, 4]
    assert [Counter.model_validate_json(await valkey.get(k) or b"").n for k in keys] == [2, 3, 4]
    CountingConnection.sends = 0
    assert await update_record(counted, keys[0], Counter, lambda c: Counter(n=c.n * 10))
    assert CountingConnection.sends == 2
    assert Counter.model_validate_json(await valkey.get(keys[0]) or b"").n == 20


async def test_a_writer_between_read_and_write_makes_the_change_see_its_record(
    counted: Redis, valkey: Redis, valkey_url: str
) -> None:
    [key] = _keys(1)
    await valkey.set(key, Counter(n=0).model_dump_json())
    other = sync_redis.Redis.from_url(valkey_url)
    seen: list[Counter] = []

    def change(i: int, record: Counter) -> Counter:
        seen.append(record)
        if len(seen) == 1:  # another writer lands after our read, before our write
            other.set(key, Counter(n=100, by=("other",)).model_dump_json())
        return Counter(n=record.n + 1, by=(*record.by, "us"))

    try:
        [pair] = await update_records(counted, [key], Counter, change)
    finally:
        other.close()
    assert [r.n for r in seen] == [0, 100], "ran again on what the other writer left"
    assert pair is not None and pair[1] == Counter(n=101, by=("other", "us"))
    assert Counter.model_validate_json(await valkey.get(key) or b"") == pair[1]


class DroppedOnce(Connection):
    """A real connection whose next send, once armed, finds the link gone: the socket
    is closed under it (as a dropped network would) and the send fails."""

    armed = False

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if DroppedOnce.armed:
            DroppedOnce.armed = False
            await self.disconnect()
            raise RedisConnectionError("link dropped (test)")
        await super().send_packed_command(command, check_health)


@pytest.mark.parametrize("retries", [0, 1])
async def test_a_link_dropped_before_the_watch_writes_nothing_and_is_retried_if_allowed(
    valkey: Redis, valkey_url: str, retries: int
) -> None:
    """With the clients' setting (no command retries) the change fails and writes
    nothing, the next one works; a client that allows a retry resends on a new
    connection, WATCH first, and the change lands once."""
    [key] = _keys(1)
    await valkey.set(key, Counter(n=5).model_dump_json())
    client = Redis.from_url(
        valkey_url, connection_class=DroppedOnce, retry=Retry(NoBackoff(), retries)
    )
    calls: list[int] = []

    def change(record: Counter) -> Counter:
        calls.append(record.n)
        return Counter(n=record.n + 1)

    try:
        DroppedOnce.armed = True
        if retries:
            assert await update_record(client, key, Counter, change)
            assert calls == [5]
            assert Counter.model_validate_json(await valkey.get(key) or b"").n == 6
        else:
            with pytest.raises(RedisConnectionError):
                await update_record(client, key, Counter, change)
            assert calls == [] and await valkey.get(key) == Counter(n=5).model_dump_json().encode()
            assert await update_record(client, key, Counter, change)
            assert Counter.model_validate_json(await valkey.get(key) or b"").n == 6
        assert not client.connection_pool._in_use_connections  # the connection went back
    finally:
        await client.aclose()
