"""Redis connections for airuntime, with a round-trip counter.

Every process talks to Redis through :func:`connect`, so connection options are
set in one place and benchmarks can report *client round trips per step*: each
command sent (an EVALSHA counts once, whatever the script runs inside) and each
pipeline sent count as one round trip.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from airuntime.core.resp_packing import use_hiredis_packing


class CountingRedis(Redis):
    """``redis.asyncio.Redis`` that counts client round trips in ``round_trips``."""

    round_trips: int = 0

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.round_trips += 1
        return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        self.round_trips += 1
        return super().pipeline(transaction=transaction, shard_hint=shard_hint)


def connect(url: str, **options: Any) -> CountingRedis:
    """A client for ``url`` (``redis://``, ``rediss://`` or ``unix://``); bytes replies;
    commands packed by hiredis (:mod:`airuntime.core.resp_packing`)."""
    options.setdefault("health_check_interval", 30)
    options.setdefault("socket_keepalive", True)
    client = CountingRedis.from_url(url, **options)
    assert isinstance(client, CountingRedis)
    use_hiredis_packing(client)
    return client
