"""Script calls of one loop turn share a round trip, and each caller still gets its own answer.

Many contenders released together by a barrier call through one
:class:`ScriptBatcher` on a real server: each gets its own reply, the server saw
fewer round trips than calls, an error reply reaches only its caller, a lost script
cache is refilled, a failed round trip reaches every caller of it, and a cancelled
caller leaves the others their answers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from airuntime.core.errors import ScriptError
from airuntime.core.script_batching import ScriptBatcher
from airuntime.core.scripts import ScriptCall, ScriptLibrary
from tests.task_counting import tasks_started

ECHO = """--[[ KEYS[1] a counter; ARGV[1] a value. Returns {value, counter after INCR}. ]]
return {ARGV[1], redis.call('INCR', KEYS[1])}
"""
REFUSE = """--[[ KEYS[1] unused; ARGV[1]. An error reply when ARGV[1] is 'bad'. ]]
if ARGV[1] == 'bad' then return redis.error_reply('refused ' .. ARGV[1]) end
return ARGV[1]
"""


@pytest.fixture
def scripts(tmp_path: Path) -> ScriptLibrary:
    (tmp_path / "echoValue-1.lua").write_text(ECHO)
    (tmp_path / "refuseBad-1.lua").write_text(REFUSE)
    return ScriptLibrary(tmp_path)


async def _released(n: int, call: object) -> list[object]:
    barrier = asyncio.Barrier(n)

    async def one(i: int) -> object:
        await barrier.wait()
        try:
            return await call(i)  # type: ignore[operator]
        except Exception as exc:
            return exc

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def test_contenders_get_their_own_replies_in_fewer_round_trips(
    redis: Redis, scripts: ScriptLibrary
) -> None:
    batcher = ScriptBatcher(redis, scripts)
    replies = await _released(64, lambda i: batcher.call("echoValue", ["air:{t}:count"], [f"v{i}"]))
    assert [r[0] for r in replies] == [f"v{i}".encode() for i in range(64)]  # type: ignore[index]
    assert sorted(r[1] for r in replies) == list(range(1, 65)), "each call ran once"  # type: ignore[index]
    assert 1 <= batcher.batches < 64, "calls of one turn shared round trips"
    alone = await batcher.call("echoValue", ["air:{t}:count"], ["last"])
    assert alone == [b"last", 65] and batcher.batches < 64


async def test_an_error_reply_reaches_only_its_caller(redis: Redis, scripts: ScriptLibrary) -> None:
    batcher = ScriptBatcher(redis, scripts)
    replies = await _released(
        10, lambda i: batcher.call("refuseBad", ["air:{t}:x"], ["bad" if i == 3 else f"ok{i}"])
    )
    assert isinstance(replies[3], ResponseError) and "refused bad" in str(replies[3])
    assert [r for i, r in enumerate(replies) if i != 3] == [
        f"ok{i}".encode() for i in range(10) if i != 3
    ]
    assert batcher.batches == 1
    with pytest.raises(ScriptError, match="takes 1 keys"):
        await batcher.call("refuseBad", ["a", "b"], ["x"])  # refused before it is queued


async def test_a_lost_script_cache_is_refilled(redis: Redis, scripts: ScriptLibrary) -> None:
    batcher = ScriptBatcher(redis, scripts)
    await batcher.call("echoValue", ["air:{t}:count"], ["warm"])
    await redis.script_flush()
    replies = await _released(
        8,
        lambda i: (
            batcher.call("echoValue", ["air:{t}:count"], [f"v{i}"])
            if i % 2
            else batcher.call("refuseBad", ["air:{t}:x"], [f"ok{i}"])
        ),
    )
    assert not [r for r in replies if isinstance(r, Exception)], replies
    assert int(await redis.get("air:{t}:count") or 0) == 1 + 4, "each ran exactly once"


async def test_a_failed_round_trip_reaches_every_caller(scripts: ScriptLibrary) -> None:
    dead = Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    batcher = ScriptBatcher(dead, scripts)
    try:
        replies = await _released(5, lambda i: batcher.call("refuseBad", ["k"], [f"{i}"]))
    finally:
        await dead.aclose()
    assert all(isinstance(r, RedisConnectionError | OSError) for r in replies), replies


async def test_a_cancelled_caller_leaves_the_others_their_answers(
    redis: Redis, scripts: ScriptLibrary
) -> None:
    batcher = ScriptBatcher(redis, scripts)
    calls = [
        asyncio.ensure_future(batcher.call("refuseBad", ["air:{t}:x"], [f"ok{i}"]))
        for i in range(6)
    ]
    await asyncio.sleep(0)  # every call is queued; the flush is the next callback
    calls[2].cancel()
    done = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(done[2], asyncio.CancelledError)
    assert [d for i, d in enumerate(done) if i != 2] == [
        f"ok{i}".encode() for i in range(6) if i != 2
    ]


async def test_a_cancelled_first_caller_still_has_the_others_sent(
    redis: Redis, scripts: ScriptLibrary
) -> None:
    # The first caller of a queue sends it; cancelled before it does, the others wait on.
    batcher = ScriptBatcher(redis, scripts)
    calls = [
        asyncio.ensure_future(batcher.call("refuseBad", ["air:{t}:x"], [f"ok{i}"]))
        for i in range(4)
    ]
    await asyncio.sleep(0)  # every call is queued; the first waits for its turn to send
    calls[0].cancel()
    done = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(done[0], asyncio.CancelledError)
    assert done[1:] == [b"ok1", b"ok2", b"ok3"]
    alone = asyncio.ensure_future(batcher.call("refuseBad", ["air:{t}:x"], ["alone"]))
    await asyncio.sleep(0)
    alone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await alone
    assert await batcher.call("refuseBad", ["air:{t}:x"], ["after"]) == b"after"


async def test_a_lone_call_is_sent_by_its_caller(redis: Redis, scripts: ScriptLibrary) -> None:
    # Nothing to share the round trip with: no sending task, no extra loop turn.
    batcher = ScriptBatcher(redis, scripts)
    await batcher.call("echoValue", ["air:{t}:count"], ["warm"])  # connect outside the count
    with tasks_started() as made:
        replies = [await batcher.call("echoValue", ["air:{t}:count"], [f"v{i}"]) for i in range(5)]
        together = await _released(3, lambda i: batcher.call("refuseBad", ["k"], [f"{i}"]))
    assert replies == [[f"v{i}".encode(), i + 2] for i in range(5)]
    assert together == [b"0", b"1", b"2"]
    assert made.count("ScriptBatcher._send_all") == 1, made


APPEND = """--[[ KEYS[1] a list; ARGV[1] a value. RPUSH, returns the new length. ]]
return redis.call('RPUSH', KEYS[1], ARGV[1])
"""


async def test_groups_keep_their_order_across_chunks_and_raise_their_first_error(
    redis: Redis, scripts: ScriptLibrary, tmp_path: Path
) -> None:
    (tmp_path / "appendValue-1.lua").write_text(APPEND)
    lib = ScriptLibrary(tmp_path)
    batcher = ScriptBatcher(redis, lib, max_batch=3)  # groups of 4 span chunks

    async def group(g: int) -> list[object]:
        calls = [ScriptCall("appendValue", [f"air:{{t}}:g{g}"], [f"{g}.{i}"]) for i in range(4)]
        return await batcher.call_in_order(calls)

    done = await _released(12, group)
    assert done == [[1, 2, 3, 4]] * 12
    for g in range(12):
        assert await redis.lrange(f"air:{{t}}:g{g}", 0, -1) == [
            f"{g}.{i}".encode() for i in range(4)
        ], "each group's calls ran in the order given"
    with pytest.raises(ResponseError, match="refused bad"):
        await batcher.call_in_order(
            [
                ScriptCall("refuseBad", ["air:{t}:x"], ["bad"]),
                ScriptCall("appendValue", ["air:{t}:after"], ["ran"]),
            ]
        )
    assert await redis.lrange("air:{t}:after", 0, -1) == [b"ran"], "every call runs"
