"""Read-modify-write of one JSON record in Redis, safe against concurrent writers.

Shared runs and scale-out requests are each one pydantic model stored as JSON under
one key; every change reads it, computes the new record and writes it under WATCH,
retrying when another writer changed the key in between. That makes each change a
compare-and-set: ``change`` sees the record as it is when the write lands, so a
transition that is no longer allowed (a cancel landed first) is refused, not written
over.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from pydantic import BaseModel
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from airuntime.core.parsed_records import ParsedRecords
from airuntime.core.redis_client import RedisClient
from airuntime.core.slots import ensure_transaction_slot

M = TypeVar("M", bound=BaseModel)

AlsoWrite = Callable[[Any, list[tuple[Any, Any]]], None]
"""``also(pipe, [(before, after), ...])``: more writes queued in the same MULTI (index
upkeep) for every record the transaction changes -- one for :func:`update_record`, a
batch's for :func:`update_records`, queued as a few multi-key commands rather than a
few commands per record."""


async def update_record(
    redis: RedisClient,
    key: str,
    model: type[M],
    change: Callable[[M], M | None],
    also: Callable[[Any, list[tuple[M, M]]], None] | None = None,
    records: ParsedRecords[M] | None = None,
) -> tuple[M, M] | None:
    """Replace the record at ``key`` by ``change(record)``; ``(before, after)``.

    None, and nothing written, when the key does not exist or ``change`` returns None.
    ``change`` may run more than once (once per conflicting write). ``also`` queues
    further writes into the same transaction (:data:`AlsoWrite`); ``records`` as for
    :func:`update_records`.
    """
    parse = records.parse if records is not None else model.model_validate_json
    while True:
        async with redis.pipeline(transaction=True) as pipe:
            try:
                [raw] = await watch_and_read(pipe, [key])
                if raw is None:
                    return None
                before = parse(raw)
                after = change(before)
                if after is None:
                    return None
                pipe.multi()  # type: ignore[no-untyped-call]
                text = after.model_dump_json()
                pipe.set(key, text)
                if also is not None:
                    also(pipe, [(before, after)])
                ensure_transaction_slot("update_record", pipe, key)
                await pipe.execute()
                if records is not None:
                    records.written(text, after)
                return before, after
            except WatchError:
                continue


async def update_records(
    redis: RedisClient,
    keys: list[str],
    model: type[M],
    change: Callable[[int, M], M | None],
    also: Callable[[Any, list[tuple[M, M]]], None] | None = None,
    records: ParsedRecords[M] | None = None,
    always: Callable[[Any], None] | None = None,
) -> list[tuple[M, M] | None]:
    """:func:`update_record` for many keys in one transaction (a pump's batch):
    ``change(i, record)`` for the record at ``keys[i]``; one ``(before, after)`` or None
    (missing, or ``change`` returned None: nothing written for it) per key. A conflict on
    any key retries the whole batch, so every change still sees the record as it is when
    the write lands. The changed records are written by one MSET and ``also`` queues the
    batch's upkeep (:data:`AlsoWrite`): the transaction holds a few commands, not a
    few per record (each queued command is a reply to read back). With ``records``
    (a frozen model's :class:`ParsedRecords`) a record read back as it was last stored
    is not parsed again, and the records written are kept there. ``always(pipe)``
    queues writes that go with the batch whatever changed (the outcome reader's XACK:
    the entries are acknowledged in the transaction that ended their runs); they must
    be in the records' slot."""
    parse = records.parse if records is not None else model.model_validate_json
    if not keys:
        return []
    while True:
        async with redis.pipeline(transaction=True) as pipe:
            try:
                raws = await watch_and_read(pipe, keys)
                out: list[tuple[M, M] | None] = []
                for i, raw in enumerate(raws):
                    before = parse(raw) if raw is not None else None
                    after = change(i, before) if before is not None else None
                    out.append(
                        (before, after) if before is not None and after is not None else None
                    )
                pipe.multi()  # type: ignore[no-untyped-call]
                changed = [(k, pair) for k, pair in zip(keys, out, strict=True) if pair]
                if changed:
                    # A key named twice gets its last change, as one SET after another
                    # would. A raw command, as MGET above: a cluster pipeline blocks mset().
                    latest = {k: (pair[1].model_dump_json(), pair[1]) for k, pair in changed}
                    flat = [x for key, (text, _) in latest.items() for x in (key, text)]
                    pipe.execute_command("MSET", *flat)
                    if also is not None:
                        also(pipe, [pair for _, pair in changed])
                if always is not None:
                    always(pipe)
                ensure_transaction_slot("update_records", pipe, *keys)
                await pipe.execute()
                if records is not None and changed:
                    for text, record in latest.values():
                        records.written(text, record)
                return out
            except WatchError:
                continue


async def watch_and_read(pipe: Any, keys: Sequence[str]) -> list[Any]:
    """WATCH ``keys`` on the transaction ``pipe`` and read them (MGET).

    On a standalone server both go in one round trip: one connection's commands run
    in order, so the read is under the watch. A connection lost on the way is retried
    as redis-py retries an immediate command -- on a new connection, from the WATCH,
    while nothing is watched yet; once the WATCH was answered the watch went with the
    connection, so :class:`WatchError` tells the caller to start again. On a cluster
    (redis-py's cluster transaction sends each immediate command by itself) they are
    two round trips, the MGET a raw command (a cluster pipeline blocks its mget(): it
    cannot know the keys share a slot; they do: one transaction)."""
    if not isinstance(pipe, Pipeline):
        await pipe.watch(*keys)
        return cast(list[Any], await pipe.execute_command("MGET", *keys))
    if pipe.connection is None:
        pipe.connection = await pipe.connection_pool.get_connection()  # type: ignore[no-untyped-call]
    conn = pipe.connection
    packed = conn.pack_commands([("WATCH", *keys), ("MGET", *keys)])

    async def send_and_read() -> list[Any]:
        await conn.send_packed_command(packed)
        await pipe.parse_response(conn, "WATCH")  # the pipeline is watching from here
        return cast(list[Any], await pipe.parse_response(conn, "MGET"))

    async def failed(error: Exception) -> None:
        await conn.disconnect()
        if pipe.watching:
            await pipe.reset()  # type: ignore[no-untyped-call]
            raise WatchError(f"A {type(error).__name__} occurred while watching {len(keys)} key(s)")

    return cast(list[Any], await conn.retry.call_with_retry(send_and_read, failed))


async def read_record(redis: RedisClient, key: str, model: type[M]) -> M | None:
    raw = await redis.get(key)
    return model.model_validate_json(raw) if raw else None
