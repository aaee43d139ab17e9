"""Cancel reaches running steps: controlExecution announces every change on the control
channel, and stopSteps records the steps workers stopped so the execution finalizes
Cancelled without waiting for running work to drain."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.core.errors import ExecutionTerminal, InvalidTransition
from airuntime.engine.execution_store import ExecutionStore
from tests.dags import plan_of


@pytest.fixture
def store(redis: Redis) -> ExecutionStore:
    return ExecutionStore(redis)


async def test_every_control_action_publishes_the_execution_id(store: ExecutionStore) -> None:
    eid = await store.create(plan_of({"a": []}))
    await store.claim(eid, "w", 1, 30_000)
    pubsub = store.redis.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(keys.control_channel())
    try:
        await store.pause(eid)
        await store.resume(eid)
        await store.cancel(eid)
        received: list[str] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while len(received) < 3 and loop.time() < deadline:
            # None also stands for a subscribe confirmation that was skipped
            message = await pubsub.get_message(timeout=1)
            if message is not None:
                received.append(message["data"].decode())
        assert received == [eid, eid, eid]
    finally:
        await pubsub.aclose()


async def test_stopping_every_running_step_finalizes_cancelled(store: ExecutionStore) -> None:
    eid = await store.create(plan_of({"a": [], "b": [], "c": ["a"]}))
    a, b = (await store.claim(eid, "w", 2, 30_000)).claims
    assert await store.cancel(eid, "user") == "Cancelling"
    first = await store.stop(eid, [(a.step_id, a.token, "w/w0")])
    assert (first.status, first.codes) == ("Cancelling", [1])
    last = await store.stop(eid, [(b.step_id, b.token, "w/w1")])
    assert (last.status, last.codes) == ("Cancelled", [1])
    assert await store.step_states(eid) == {"a": "cancelled", "b": "cancelled", "c": "cancelled"}
    info = await store.info(eid)
    assert (info.cancelled, info.done, info.running) == (3, 3, 0)
    stopped = [e for e in await store.events(eid) if e.type == "step_stopped"]
    assert [(e.get("step"), e.get("token"), e.get("reason")) for e in stopped] == [
        ("a", a.token, "cancel"),
        ("b", b.token, "cancel"),
    ]
    snap = await store.snapshot(eid)
    assert snap is not None and snap["steps"]["a"]["status"] == "cancelled"


async def test_a_completion_after_the_stop_is_rejected_as_stale(store: ExecutionStore) -> None:
    eid = await store.create(plan_of({"a": [], "b": []}))
    a, b = (await store.claim(eid, "w", 2, 30_000)).claims
    await store.cancel(eid)
    assert (await store.stop(eid, [(a.step_id, a.token, "w")])).codes == [1]
    late = await store.complete(eid, "w", [(a.step_id, a.token, "w", '"late"')])
    assert late.codes == [-3] and late.status == "Cancelling"
    assert (await store.step_states(eid))["a"] == "cancelled"
    assert (await store.stop(eid, [(a.step_id, a.token, "w")])).codes == [-3], "stopped once"
    await store.stop(eid, [(b.step_id, b.token, "w")])
    assert [e.type for e in await store.events(eid)].count("step_completed") == 0


async def test_a_stale_worker_cannot_stop_the_step(store: ExecutionStore) -> None:
    eid = await store.create(plan_of({"a": []}))
    (a,) = (await store.claim(eid, "w", 1, 30_000)).claims
    await store.cancel(eid)
    result = await store.stop(eid, [("a", a.token + "x", "w"), ("nope", "t", "w")])
    assert result.codes == [-3, -2] and result.status == "Cancelling"
    assert (await store.step_states(eid))["a"] == "running"


async def test_pause_never_stops_steps(store: ExecutionStore) -> None:
    eid = await store.create(plan_of({"a": []}))
    (a,) = (await store.claim(eid, "w", 1, 30_000)).claims
    assert await store.pause(eid) == "Pausing"
    with pytest.raises(InvalidTransition):
        await store.stop(eid, [("a", a.token, "w")])
    assert (await store.step_states(eid))["a"] == "running"


async def test_stopping_after_finalization_is_refused(store: ExecutionStore) -> None:
    eid = await store.create(plan_of({"a": []}))
    assert await store.cancel(eid) == "Cancelled"
    with pytest.raises(ExecutionTerminal, match="Cancelled"):
        await store.stop(eid, [("a", "w#1", "w")])


async def test_many_workers_stopping_at_once_finalize_once(store: ExecutionStore) -> None:
    eid = await store.create(plan_of({f"s{i}": [] for i in range(40)}))
    claims = (await store.claim(eid, "w", 40, 30_000)).claims
    await store.cancel(eid)
    gate = asyncio.Event()

    async def stop(i: int) -> str:
        await gate.wait()
        c = claims[i]
        return (await store.stop(eid, [(c.step_id, c.token, f"w{i}")])).status

    tasks = [asyncio.create_task(stop(i)) for i in range(40)]
    await asyncio.sleep(0)
    gate.set()
    statuses = await asyncio.gather(*tasks)
    assert statuses.count("Cancelled") == 1 and statuses.count("Cancelling") == 39
    events = [e.type for e in await store.events(eid)]
    assert events.count("step_stopped") == 40 and events.count("execution_finalized") == 1
