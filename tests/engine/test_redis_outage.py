"""A Redis outage in the middle of a run loses nothing: the server (with its append-only
file) is stopped while steps run, their handlers finish during the outage, the server
comes back on the same port, and the execution finishes with every step completed
exactly once in the ledger. The client does no retries of its own: the engine's do."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from airuntime.devstack import embedded
from airuntime.devstack.embedded import EmbeddedServer
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import HandlerRegistry, StepContext
from airuntime.engine.worker_pool import PoolSettings, WorkerPool
from tests.conftest import REDIS7_EXECUTABLE, REDIS7_MISSING
from tests.dags import fan, plan_of


@pytest.fixture(
    params=[
        pytest.param(None, id="valkey"),
        pytest.param(
            REDIS7_EXECUTABLE,
            id="redis7",
            marks=pytest.mark.skipif(
                not os.access(REDIS7_EXECUTABLE, os.X_OK), reason=REDIS7_MISSING
            ),
        ),
    ]
)
def server(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[EmbeddedServer]:
    """A server with an append-only file that restarts on the same port."""
    port = embedded.free_port()
    monkeypatch.setattr(embedded, "free_port", lambda: port)
    srv = EmbeddedServer(data_dir=tmp_path / "data", executable=request.param)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


class Gate:
    """Handlers of the middle steps report in and wait until the test opens the gate."""

    def __init__(self) -> None:
        self.arrived = 0
        self.changed = asyncio.Event()
        self.open = asyncio.Event()
        self.finished = 0

    async def middle(self, ctx: StepContext) -> str:
        self.arrived += 1
        self.changed.set()
        await self.open.wait()
        self.finished += 1
        self.changed.set()
        return ctx.step_id

    async def wait_for(self, what: str, n: int) -> None:
        while getattr(self, what) < n:
            self.changed.clear()
            await self.changed.wait()


async def _wait_until(condition: Any, what: str) -> None:
    for _ in range(3000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_restarted_server_mid_run_loses_no_completion(server: EmbeddedServer) -> None:
    gate = Gate()
    reg = HandlerRegistry(autoload=True)
    reg.register("middle", gate.middle)
    n = 8
    plan = plan_of(fan(n), steps={f"s{i}": {"uses": "middle"} for i in range(n)}, registry=reg)
    redis = Redis.from_url(server.url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=1)
    try:
        store = ExecutionStore(redis)
        eid = await store.create(plan)
        pool = WorkerPool(store, reg, PoolSettings(workers=4, lease_ms=20_000))
        run = asyncio.create_task(pool.run(eid))
        await gate.wait_for("arrived", 4)

        await asyncio.to_thread(server.stop)  # four steps running, their handlers waiting
        gate.open.set()
        await gate.wait_for("finished", 4)  # finished during the outage: unflushed
        await _wait_until(lambda: pool.stats.redis_errors >= 3, "the pool to meet the outage")
        assert not run.done(), "the participation survives the outage"
        await asyncio.to_thread(server.start)  # same port, same append-only file

        assert await run == "Succeeded"
        events = await store.events(eid)
    finally:
        await redis.aclose()
    completed = Counter(e.get("step") for e in events if e.type == "step_completed")
    assert completed == Counter({s.id: 1 for s in plan.steps}), "every step exactly once"
    assert gate.finished == n, "no handler had to run twice"
    assert pool.stats.dropped_reports == 0 and pool.stats.crashed_steps == 0
