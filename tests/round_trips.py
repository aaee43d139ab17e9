"""A real client that counts its round trips to the server.

Tests that a read was merged into fewer round trips count what the code under test
sends: each pipeline execution is one round trip, and so is each lone command of the
kinds the code sends outside pipelines (MGET, ZRANGE). It shares the connection pool of
the client it is made from, so it talks to the same real server.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis


class RoundTripCounting(Redis):
    """:class:`Redis` counting pipeline executions and lone MGET / ZRANGE commands."""

    round_trips = 0

    @classmethod
    def sharing(cls, client: Redis) -> RoundTripCounting:
        """A counting client on ``client``'s connection pool."""
        return cls(connection_pool=client.connection_pool)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.round_trips += 1
            return await execute(*args, **kwargs)

        pipe.execute = counted  # type: ignore[method-assign]
        return pipe

    async def mget(self, *args: Any, **kwargs: Any) -> Any:
        self.round_trips += 1
        return await super().mget(*args, **kwargs)

    async def zrange(self, *args: Any, **kwargs: Any) -> Any:
        self.round_trips += 1
        return await super().zrange(*args, **kwargs)

    def taken(self) -> int:
        """The round trips since the last call (and start counting again)."""
        count, self.round_trips = self.round_trips, 0
        return count
