"""Cancel stops work: running async handlers are cancelled, sync handlers are told and
stop, steps waiting for a step slot never start, and the execution finalizes Cancelled
without waiting for the work it stopped. Evidence comes from the ledger and the terminal
snapshot (a step that had finished would be recorded completed), never from the clock."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
from redis.asyncio import RedisCluster

from airuntime.core.errors import ExecutionNotFound
from airuntime.core.redis_client import RedisClient
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import (
    HandlerRegistry,
    StepCancelled,
    StepContext,
    builtin,
    set_shared_executor,
)
from airuntime.engine.status import ExecutionStatus
from airuntime.engine.store_results import LedgerEvent
from airuntime.engine.worker_pool import PoolSettings, WorkerPool
from runtime_pod.step_slots import StepSlotController
from tests.dags import plan_of

CANCELLED = ExecutionStatus.CANCELLED


class Latch:
    """Counts arrivals (from the loop or from handler threads); ``wait(n)`` until n."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()

    def arrive(self) -> None:
        with self._lock:
            self.count += 1
        self._loop.call_soon_threadsafe(self._changed.set)

    async def wait(self, n: int) -> None:
        while self.count < n:
            self._changed.clear()
            if self.count >= n:
                return
            await self._changed.wait()


@pytest.fixture
def store(engine_redis: RedisClient) -> ExecutionStore:
    """On the embedded Valkey, redis-server 7 and a 3-shard Valkey Cluster (where the
    control notices are PUBLISHed by a script on the execution's primary and reach the
    pool's subscription on whichever node it is)."""
    return ExecutionStore(engine_redis)


def registry(**handlers: Callable[[StepContext], Any]) -> HandlerRegistry:
    reg = HandlerRegistry(autoload=True)
    for name, fn in handlers.items():
        reg.register(name, fn)
    return reg


def stopped_steps(events: list[LedgerEvent]) -> list[str]:
    return sorted(e.get("step") for e in events if e.type == "step_stopped")


def completed_steps(events: list[LedgerEvent]) -> list[str]:
    return sorted(e.get("step") for e in events if e.type == "step_completed")


async def _run_until(
    pool: WorkerPool, eid: str, latch: Latch, n: int
) -> asyncio.Task[ExecutionStatus]:
    run = asyncio.create_task(pool.run(eid))
    await latch.wait(n)
    return run


async def test_a_running_sleep_step_is_stopped(store: ExecutionStore) -> None:
    latch = Latch()
    interrupted: list[str] = []

    async def sleeping(ctx: StepContext) -> Any:
        latch.arrive()
        try:
            return await builtin.sleep(ctx)  # 3 s, returns "slept" if it ever finishes
        except (asyncio.CancelledError, StepCancelled):
            interrupted.append(ctx.step_id)
            raise

    reg = registry(sleeping=sleeping)
    plan = plan_of(
        {"nap": [], "after": ["nap"]},
        steps={"nap": {"uses": "sleeping", "with": {"seconds": 3, "value": "slept"}}},
        registry=reg,
    )
    eid = await store.create(plan)
    pool = WorkerPool(store, reg)
    run = await _run_until(pool, eid, latch, 1)
    assert await store.cancel(eid, actor="test") is ExecutionStatus.CANCELLING
    assert await run is CANCELLED
    assert interrupted == ["nap"], "the handler was interrupted, it did not finish"
    events = await store.events(eid)
    assert stopped_steps(events) == ["nap"] and completed_steps(events) == []
    snap = await store.snapshot(eid)
    assert snap is not None and snap["status"] == "Cancelled"
    assert snap["steps"]["nap"]["status"] == "cancelled" and "output" not in snap["steps"]["nap"]
    assert snap["steps"]["after"]["status"] == "cancelled"
    assert pool.stats.stopped_steps == 1 and pool.stats.crashed_steps == 0
    order = [e.type for e in events]
    assert order.index("cancel_requested") < order.index("step_stopped")
    assert order.index("step_stopped") < order.index("execution_finalized")


def busy_until_cancelled(latch: Latch, finished: list[str]) -> Callable[[StepContext], Any]:
    def busy(ctx: StepContext) -> Any:
        latch.arrive()
        give_up = time.monotonic() + 60  # only so that a broken cancel cannot hang the suite
        spins = 0
        while not ctx.is_cancelled():
            spins += 1
            # A CPU-bound chunk, then a moment off the GIL: four pure-Python spinners
            # starved the event loop so long on a loaded 2-core CI box that a new
            # Redis connection hit redis-py's 5 s connect timeout. Cancellation is
            # still noticed only by polling ``is_cancelled``.
            sum(range(2_000))
            time.sleep(0.0005)
            if time.monotonic() > give_up:
                finished.append(ctx.step_id)
                return spins
        raise StepCancelled(f"{ctx.step_id}: noticed the cancel after {spins} spins")

    return busy


async def test_a_busy_sync_handler_is_told_and_stops(store: ExecutionStore) -> None:
    latch = Latch()
    finished: list[str] = []
    reg = registry(busy=busy_until_cancelled(latch, finished))
    plan = plan_of(
        {"spin": [], "nap": []},
        steps={"spin": {"uses": "busy"}, "nap": {"uses": "sleep", "with": {"seconds": 30}}},
        registry=reg,
    )
    eid = await store.create(plan)
    pool = WorkerPool(store, reg, PoolSettings(workers=2))
    run = await _run_until(pool, eid, latch, 1)
    await store.cancel(eid)
    assert await run is CANCELLED
    assert finished == [], "the sync handler stopped when told, it never ran to its end"
    events = await store.events(eid)
    assert stopped_steps(events) == ["nap", "spin"] and completed_steps(events) == []


class SignallingSlots:
    """The runtime's step-slot controller, telling the test when a step asks for a slot."""

    def __init__(self, controller: StepSlotController) -> None:
        self.controller = controller
        self.asked = Latch()

    def slot(self, execution_id: str) -> AbstractAsyncContextManager[Any]:
        slot = self.controller.slot(execution_id)
        self.asked.arrive()  # the caller enters (and queues) before anything else runs
        return slot


async def test_a_step_waiting_for_a_step_slot_never_runs_after_the_cancel(
    store: ExecutionStore,
) -> None:
    started: list[str] = []
    holding = Latch()

    async def hold(ctx: StepContext) -> Any:
        started.append(ctx.step_id)
        holding.arrive()
        await asyncio.Event().wait()

    reg = registry(hold=hold)
    plan = plan_of({"first": [], "second": []}, uses="hold", registry=reg)
    eid = await store.create(plan)
    slots = SignallingSlots(StepSlotController(limit=1))
    pool = WorkerPool(store, reg, PoolSettings(workers=2), slots=slots)
    run = asyncio.create_task(pool.run(eid))
    await holding.wait(1)
    await slots.asked.wait(2)
    assert slots.controller.queued == 1, "the second step waits for the only slot"
    await store.cancel(eid)
    assert await run is CANCELLED
    assert started == ["first"], "the queued step's handler never started"
    evidence = slots.controller.pop_evidence(eid)
    assert (evidence.admitted, evidence.cancelled) == (1, 2)
    assert slots.controller.active == 0 and slots.controller.queued == 0
    assert stopped_steps(await store.events(eid)) == ["first", "second"]


async def test_a_sync_handler_queued_for_a_thread_never_starts(store: ExecutionStore) -> None:
    """More sync steps than handler threads: the ones still queued are withdrawn."""
    latch = Latch()
    finished: list[str] = []
    started: list[str] = []
    busy = busy_until_cancelled(latch, finished)

    def tracked(ctx: StepContext) -> Any:
        started.append(ctx.step_id)
        return busy(ctx)

    reg = registry(busy=tracked)
    plan = plan_of({f"s{i}": [] for i in range(4)}, uses="busy", registry=reg)
    eid = await store.create(plan)
    one_thread = ThreadPoolExecutor(max_workers=1)
    original = set_shared_executor(one_thread)
    try:
        pool = WorkerPool(store, reg, PoolSettings(workers=4))
        run = await _run_until(pool, eid, latch, 1)
        await store.cancel(eid)
        assert await run is CANCELLED
    finally:
        set_shared_executor(original)
        one_thread.shutdown(wait=True)
    assert len(started) == 1 and finished == []
    assert len(stopped_steps(await store.events(eid))) == 4


async def test_many_executions_cancelled_at_once(store: ExecutionStore) -> None:
    latch = Latch()
    finished: list[str] = []
    reg = registry(busy=busy_until_cancelled(latch, finished))
    plan = plan_of(
        {"a": [], "b": [], "c": [], "d": ["a"]},
        steps={
            "a": {"uses": "sleep", "with": {"seconds": 30}},
            "b": {"uses": "sleep", "with": {"seconds": 30}},
            "c": {"uses": "busy"},
        },
        registry=reg,
    )
    n = 12
    eids = [await store.create(plan) for _ in range(n)]
    pool = WorkerPool(store, reg, PoolSettings(workers=3))
    runs = [asyncio.create_task(pool.run(eid)) for eid in eids]
    await latch.wait(min(n, 4))  # the sync steps that got a handler thread are busy
    gate = asyncio.Event()

    async def cancel(eid: str) -> ExecutionStatus:
        await gate.wait()
        return await store.cancel(eid, actor="bulk")

    cancels = [asyncio.create_task(cancel(eid)) for eid in eids]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*cancels)
    assert await asyncio.gather(*runs) == [CANCELLED] * n
    assert finished == []
    for eid in eids:
        events = await store.events(eid)
        assert completed_steps(events) == []
        assert stopped_steps(events) == ["a", "b", "c"]
        assert [e.type for e in events].count("execution_finalized") == 1
    assert pool.control_feed is None, "the subscription ends with the last participation"


async def test_pause_lets_running_steps_finish(store: ExecutionStore) -> None:
    release = asyncio.Event()
    latch = Latch()

    async def hold(ctx: StepContext) -> str:
        latch.arrive()
        await release.wait()
        return ctx.step_id

    reg = registry(hold=hold)
    plan = plan_of({"a": [], "b": ["a"]}, uses="hold", registry=reg)
    eid = await store.create(plan)
    pool = WorkerPool(store, reg)
    run = await _run_until(pool, eid, latch, 1)
    assert await store.pause(eid) is ExecutionStatus.PAUSING
    release.set()
    for _ in range(200):
        if (await store.info(eid)).status is ExecutionStatus.PAUSED:
            break
        await asyncio.sleep(0.01)
    assert (await store.step_states(eid))["a"] == "completed", "the running step drained"
    assert await store.resume(eid) is ExecutionStatus.RUNNING
    assert await run is ExecutionStatus.SUCCEEDED
    assert stopped_steps(await store.events(eid)) == []


async def _cancel_with(
    store: ExecutionStore, settings: PoolSettings, between: Callable[[WorkerPool], Awaitable[None]]
) -> tuple[WorkerPool, str]:
    latch = Latch()

    async def hold(ctx: StepContext) -> Any:
        latch.arrive()
        await asyncio.Event().wait()

    reg = registry(hold=hold)
    eid = await store.create(plan_of({"a": [], "b": []}, uses="hold", registry=reg))
    pool = WorkerPool(store, reg, settings)
    run = await _run_until(pool, eid, latch, 2)
    await between(pool)
    await store.cancel(eid)
    assert await run is CANCELLED
    return pool, eid


async def test_without_notices_the_periodic_check_stops_the_steps(store: ExecutionStore) -> None:
    async def nothing(pool: WorkerPool) -> None:
        assert pool.control_feed is None

    _, eid = await _cancel_with(store, PoolSettings(control_feed=False), nothing)
    assert stopped_steps(await store.events(eid)) == ["a", "b"]


async def test_the_feed_survives_a_dropped_subscription(store: ExecutionStore) -> None:
    """The subscription's connection is killed; the feed subscribes again and the cancel
    arrives through it (the periodic check is slowed down to a minute)."""

    async def drop_subscription(pool: WorkerPool) -> None:
        feed = pool.control_feed
        assert feed is not None
        await feed.wait_subscriptions(1)
        assert await _kill_pubsub_connections(store.redis) >= 1
        await feed.wait_subscriptions(2)

    settings = PoolSettings(control_poll_ms=60_000)
    _, eid = await _cancel_with(store, settings, drop_subscription)
    assert stopped_steps(await store.events(eid)) == ["a", "b"]


async def _kill_pubsub_connections(redis: RedisClient) -> int:
    if isinstance(redis, RedisCluster):
        replies = await redis.execute_command(
            "CLIENT KILL", "TYPE", "pubsub", target_nodes=RedisCluster.ALL_NODES
        )
        return sum(int(n) for n in replies.values())
    return int(await redis.execute_command("CLIENT", "KILL", "TYPE", "pubsub"))


async def test_two_pools_each_stop_their_own_steps(store: ExecutionStore) -> None:
    latch = Latch()
    ran_on: Counter[str] = Counter()

    async def hold(ctx: StepContext) -> Any:
        ran_on[ctx.fencing_token.rsplit("#", 1)[0]] += 1
        latch.arrive()
        await asyncio.Event().wait()

    reg = registry(hold=hold)
    eid = await store.create(plan_of({f"s{i}": [] for i in range(4)}, uses="hold", registry=reg))
    pools = [WorkerPool(store, reg, PoolSettings(workers=2), pool_id=f"p{i}") for i in range(2)]
    runs = [asyncio.create_task(p.run(eid)) for p in pools]
    await latch.wait(4)
    await store.cancel(eid)
    assert await asyncio.gather(*runs) == [CANCELLED, CANCELLED]
    assert ran_on == {"p0": 2, "p1": 2}
    assert [p.stats.stopped_steps for p in pools] == [2, 2]


async def test_one_periodic_read_serves_every_running_execution_of_the_pool(
    store: ExecutionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without notices, cancels reach running steps through the pool's periodic read:
    one pipelined read of every execution the pool runs steps of (not one per
    execution), stopped once the pool participates in nothing."""
    latch = Latch()

    async def hold(ctx: StepContext) -> Any:
        latch.arrive()
        await asyncio.Event().wait()

    reg = registry(hold=hold)
    plan = plan_of({"a": [], "b": []}, uses="hold", registry=reg)
    eids = [await store.create(plan) for _ in range(6)]
    pool = WorkerPool(store, reg, PoolSettings(workers=2, control_feed=False, control_poll_ms=20))
    runs = [asyncio.create_task(pool.run(eid)) for eid in eids]
    await latch.wait(12)
    reads: list[list[str]] = []
    two_reads = asyncio.Event()
    real = store.control_states

    async def spy(execution_ids: list[str]) -> Any:
        reads.append(list(execution_ids))
        if len(reads) >= 2:
            two_reads.set()
        return await real(execution_ids)

    monkeypatch.setattr(store, "control_states", spy)
    await asyncio.wait_for(two_reads.wait(), 30)
    assert reads[-1] == sorted(eids), "one read covers every running execution"
    for eid in eids:
        await store.cancel(eid)
    assert await asyncio.gather(*runs) == [CANCELLED] * 6
    assert pool.control_feed is None and pool.control_poll is None


async def test_a_held_pool_keeps_one_subscription_across_its_runs(store: ExecutionStore) -> None:
    """A runtime instance holds its pool: executions come and go under one control
    subscription (not a new one per burst, each announcing "check everything"), and the
    feed and the poll stop only when the hold is released."""
    pool = WorkerPool(store, settings=PoolSettings(workers=2))
    pool.hold()
    feed = pool.control_feed
    assert feed is not None and pool.control_poll is not None
    await feed.wait_subscriptions(1)
    for _ in range(3):
        eid = await store.create(plan_of({"a": []}))
        assert await pool.run(eid) == "Succeeded"
        assert pool.control_feed is feed
    assert feed.subscriptions == 1
    await pool.release()
    assert pool.control_feed is None and pool.control_poll is None


async def test_a_cancel_before_the_execution_exists_is_kept_for_its_creation(
    store: ExecutionStore,
) -> None:
    """A run record names its ExecutionId a moment before its runtime creates the
    execution: a cancel in that window must not be lost (it once was: the run ran on)."""
    ran: list[str] = []

    def never(ctx: StepContext) -> Any:
        ran.append(ctx.step_id)
        return "ran"

    reg = registry(never=never)
    plan = plan_of({"a": [], "b": ["a"]}, steps={"a": {"uses": "never"}}, registry=reg)
    with pytest.raises(ExecutionNotFound):
        await store.cancel("ex-early", actor="test")  # a plain cancel still needs the execution
    kept = await store.cancel_announced("ex-early", actor="tenant t")
    assert kept is ExecutionStatus.CANCELLING
    assert await store.cancel_announced("ex-early", actor="tenant t") is kept, "idempotent"
    _, batch = await store.create_and_claim(plan, ("pool-1", 4, 30_000), execution_id="ex-early")
    assert batch is not None and batch.status is CANCELLED and batch.claims == []
    pool = WorkerPool(store, reg)
    assert await pool.run("ex-early") is CANCELLED
    assert ran == []
    events = await store.events("ex-early")
    types = [e.type for e in events]
    assert types.count("cancel_requested") == 1 and "step_claimed" not in types
    assert types.index("execution_created") < types.index("cancel_requested")
    snap = await store.snapshot("ex-early")
    assert snap is not None and snap["status"] == "Cancelled"
    assert {s["status"] for s in snap["steps"].values()} == {"cancelled"}
    early = store.keys_of("ex-early").bucket.early_cancels
    assert await store.redis.zcard(early) == 0, "the kept cancel was taken"
    # An execution created without an early cancel is not touched by the set.
    eid = await store.create(plan)
    assert (await store.info(eid)).status is ExecutionStatus.RUNNING
