"""Read-modify-write of one JSON record in Redis, safe against concurrent writers.

Shared runs and scale-out requests are each one pydantic model stored as JSON under
one key; every change reads it, computes the new record and writes it under WATCH,
retrying when another writer changed the key in between.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel
from redis.asyncio import Redis
from redis.exceptions import WatchError

M = TypeVar("M", bound=BaseModel)


async def update_record(
    redis: Redis, key: str, model: type[M], change: Callable[[M], M | None]
) -> tuple[M, M] | None:
    """Replace the record at ``key`` by ``change(record)``; ``(before, after)``.

    None, and nothing written, when the key does not exist or ``change`` returns None.
    ``change`` may run more than once (once per conflicting write).
    """
    while True:
        async with redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(key)
                raw = await pipe.get(key)
                if raw is None:
                    return None
                before = model.model_validate_json(raw)
                after = change(before)
                if after is None:
                    return None
                pipe.multi()  # type: ignore[no-untyped-call]
                pipe.set(key, after.model_dump_json())
                await pipe.execute()
                return before, after
            except WatchError:
                continue
