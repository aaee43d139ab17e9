"""The floor of Redis work for draining a DAG: what the engine is measured against.

Why this exists: steps/s alone depends on the machine; the engine's cost is judged by
the ratio to the least Redis work any Lua-based drain of the same DAG must do on the
same server, measured in the same run. The floor is one script
(``benchmarks/floor_lua/drainSteps-5.lua``): complete a batch of steps (dependency
counters, ready sorted set scored by topological order, exactly the engine's readiness
scheme) and claim up to N ready steps in the same call. No ledger, claim tokens,
leases, outputs, per-step status or control checks.

It is driven like the engine: ``WORKER_PROCESSES`` processes
(``python -m benchmarks.floor URL FLOOR_ID SLOTS``), started together once both
listen on a start channel (:func:`release`), each looping "complete what I
claimed, claim up to SLOTS more" with no handler, sleeping 1 ms doubling to 50 ms when
nothing was ready. The duration is read from server time (the first claim's and the
last completion's ``TIME``, stored in the floor's meta hash), like the engine's, which
reads it from its ledger's stream ids.

Keys are the engine's own (:func:`airuntime.core.keys.execution_keys` of a ``floor-``
id: meta, pending, children, order, ready), so key names and hash slot are alike too.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from airuntime.core import keys
from airuntime.core.redis_client import connect
from airuntime.core.scripts import ScriptLibrary

__all__ = ["drop", "setup", "start_workers", "window_ms"]

LUA_DIR = Path(__file__).resolve().parent / "floor_lua"
IDLE_MAX_S = 0.05
SETUP_CHUNK = 2000


def _keys(floor_id: str) -> list[str]:
    ek = keys.execution_keys(floor_id)
    return [ek.key(s) for s in ("meta", "pending", "children", "order", "ready")]


def setup(client: redis.Redis, deps: dict[str, list[str]]) -> str:
    """Write the DAG ``deps`` (step -> parents, topological order) as a floor drain."""
    floor_id = f"floor-{uuid.uuid4().hex}"
    meta, pending, children, order, ready = _keys(floor_id)
    kids: dict[str, list[str]] = {s: [] for s in deps}
    for step, parents in deps.items():
        for p in parents:
            kids[p].append(step)
    items = list(deps.items())
    for start in range(0, len(items), SETUP_CHUNK):
        pipe = client.pipeline(transaction=False)
        for i, (step, parents) in enumerate(items[start : start + SETUP_CHUNK], start):
            pipe.hset(order, step, i)
            if parents:
                pipe.hset(pending, step, len(parents))
            else:
                pipe.zadd(ready, {step: i})
            if kids[step]:
                pipe.hset(children, step, ",".join(kids[step]))
        pipe.execute()
    client.hset(meta, mapping={"total": len(deps), "done": 0})
    return floor_id


def drop(client: redis.Redis, floor_id: str) -> None:
    client.delete(*_keys(floor_id))


def window_ms(client: redis.Redis, floor_id: str) -> int:
    started, finished = client.hmget(_keys(floor_id)[0], ["started_ms", "finished_ms"])
    if started is None or finished is None:
        raise RuntimeError(f"floor {floor_id} did not finish")
    return max(int(finished) - int(started), 1)


async def _drain(url: str, floor_id: str, slots: int) -> int:
    """One worker process's loop; returns its round trips."""
    client = connect(url)
    library = ScriptLibrary(LUA_DIR)
    script_keys = _keys(floor_id)
    held: list[Any] = []
    idle = 0.001
    try:
        await _wait_for_start(client, floor_id)
        while True:
            reply = await library.call(client, "drainSteps", script_keys, [slots, *held])
            if int(reply[0]) == 1:
                return client.round_trips
            held = reply[1:]
            if held:
                idle = 0.001
            else:
                await asyncio.sleep(idle)
                idle = min(idle * 2, IDLE_MAX_S)
    finally:
        await client.aclose()


def start_channel(floor_id: str) -> str:
    """The pub/sub channel on which the driver starts the floor's workers at once."""
    return f"{keys.execution_keys(floor_id).tag}:start"


async def _wait_for_start(client: Any, floor_id: str) -> None:
    pubsub = client.pubsub()
    await pubsub.subscribe(start_channel(floor_id))
    while (await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)) is None:
        pass
    await pubsub.aclose()


def release(client: redis.Redis, floor_id: str, workers: int) -> None:
    """Once ``workers`` processes listen, start them (none has claimed anything before)."""
    channel = start_channel(floor_id)
    while _listeners(client, channel) < workers:
        time.sleep(0.005)
    client.publish(channel, "go")


def _listeners(client: redis.Redis, channel: str) -> int:
    return int(dict(client.pubsub_numsub(channel)).get(channel.encode(), 0))


def start_workers(url: str, floor_id: str, slots: int, n: int) -> list[subprocess.Popen[str]]:
    cmd = [sys.executable, "-m", "benchmarks.floor", url, floor_id, str(slots)]
    return [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(n)
    ]


def main(argv: list[str]) -> int:
    url, floor_id, slots = argv[0], argv[1], int(argv[2])
    print(asyncio.run(_drain(url, floor_id, slots)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
