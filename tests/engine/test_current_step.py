"""A ``python`` step's callable gets only its ``args``/``kwargs``, not the StepContext:
``current_step()`` is how it reaches the idempotency key to dedupe its effects.

Found by the chaos test (tests/chaos): before ``current_step()`` a ``python`` step had
no way to learn its idempotency key, so its side effects could not be deduped.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import HandlerRegistry, current_step
from airuntime.engine.status import ExecutionStatus
from airuntime.engine.worker_pool import PoolSettings, WorkerPool
from tests.dags import plan_of


@pytest.fixture(autouse=True)
def python_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRUNTIME_PYTHON_HANDLER_MODULES", "tests.engine.callables")


async def test_python_callables_read_their_steps_idempotency_key(redis: Redis) -> None:
    reg = HandlerRegistry(autoload=True)
    store = ExecutionStore(redis)
    steps = {
        "sync": {"with": {"callable": "tests.engine.callables:step_key"}},
        "async": {"with": {"callable": "tests.engine.callables:async_step_key"}},
    }
    plan = plan_of({"sync": [], "async": []}, uses="python", steps=steps, registry=reg)
    eid = await store.create(plan)
    pool = WorkerPool(store, reg, PoolSettings(workers=2))
    assert await pool.run(eid) is ExecutionStatus.SUCCEEDED
    snapshot = await store.snapshot(eid)
    assert snapshot is not None
    outputs = {sid: s["output"] for sid, s in snapshot["steps"].items()}
    assert outputs == {"sync": f"{eid}:sync:1", "async": f"{eid}:async:1"}
    assert current_step() is None, "reset once the handler returned"
