"""Many workers in several processes on one execution: every step exactly once.

The worker processes are real ``airt worker`` processes on a shared server; the
ledger (the execution's event stream) is the witness.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter

from redis.asyncio import Redis

from airuntime.engine.execution_store import ExecutionStore
from tests.conftest import RedisServerInfo
from tests.dags import plan_of, random_dag


async def _spawn_workers(
    url: str, eid: str, processes: int, workers: int, lease_ms: int
) -> list[asyncio.subprocess.Process]:
    env = {**os.environ, "AIRUNTIME_REDIS_URL": url}
    return [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "airuntime.cli",
            "worker",
            eid,
            "--workers",
            str(workers),
            "--lease-ms",
            str(lease_ms),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(processes)
    ]


async def _connected_workers(redis: Redis) -> int:
    """Worker processes connected (a process may hold several connections: commands and
    its control-channel subscription share the process's client name)."""
    clients = await redis.client_list()
    names = {str(c.get("name", "")) for c in clients}
    return sum(1 for name in names if name.startswith("airt-worker:"))


def _completions(events: list) -> Counter[str]:  # type: ignore[type-arg]
    return Counter(e.get("step") for e in events if e.type == "step_completed")


async def test_32_workers_in_4_processes_complete_2000_steps_exactly_once(
    redis: Redis, redis_server: RedisServerInfo
) -> None:
    store = ExecutionStore(redis)
    plan = plan_of(random_dag(2000, seed=7))
    eid = await store.create(plan)
    # Hold the execution until all four processes are connected, so they contend.
    await store.pause(eid)
    procs = await _spawn_workers(redis_server.url, eid, processes=4, workers=8, lease_ms=30_000)
    while await _connected_workers(redis) < 4:
        await asyncio.sleep(0.01)
    await store.resume(eid)
    outputs = await asyncio.gather(*(p.communicate() for p in procs))
    for p, (_out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err.decode()[-2000:]
    info = await store.info(eid)
    assert (info.status, info.completed) == ("Succeeded", 2000)
    events = await store.events(eid)
    done = _completions(events)
    assert len(done) == 2000 and set(done.values()) == {1}, "every step completed exactly once"
    owners = {e.get("worker").split("/")[0] for e in events if e.type == "step_completed"}
    assert len(owners) >= 2, "the work was shared between processes"
    assert not [e for e in events if e.type == "completion_rejected"]


async def test_killing_a_worker_process_mid_execution_loses_no_step(
    redis: Redis, redis_server: RedisServerInfo
) -> None:
    store = ExecutionStore(redis)
    n = 400
    dag = {f"n{i}": [] for i in range(n)}
    steps = {s: {"uses": "sleep", "with": {"seconds": 0.01}} for s in dag}
    eid = await store.create(plan_of(dag, steps=steps))
    # Hold the execution until all three processes are connected: a victim that started
    # late could otherwise find the work done before it claimed any.
    await store.pause(eid)
    procs = await _spawn_workers(redis_server.url, eid, processes=3, workers=4, lease_ms=300)
    while await _connected_workers(redis) < 3:
        await asyncio.sleep(0.01)
    await store.resume(eid)
    # Wait until the victim has claimed work, then kill -9 it.
    victim = procs[0]
    while True:
        events = await store.events(eid)
        if any(e.type == "step_claimed" and f":{victim.pid}:" in e.get("worker") for e in events):
            break
        await asyncio.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    await victim.wait()
    survivors = procs[1:]
    outputs = await asyncio.gather(*(p.communicate() for p in survivors))
    for p, (_, err) in zip(survivors, outputs, strict=True):
        assert p.returncode == 0, err.decode()[-2000:]
    info = await store.info(eid)
    assert (info.status, info.completed) == ("Succeeded", n)
    events = await store.events(eid)
    done = _completions(events)
    assert len(done) == n and set(done.values()) == {1}
    assert [e for e in events if e.type == "step_recovered"], "the victim's claims were recovered"
