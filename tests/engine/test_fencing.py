"""Handlers get what they need to make side effects idempotent: the same idempotency key
for every run of one attempt (also on the worker that recovered a frozen worker's claim)
and a fencing sequence that only grows, while the state transition stays exactly-once."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import HandlerRegistry, StepContext, TransientError
from airuntime.engine.store_results import CompletionResult, RenewResult
from airuntime.engine.worker_pool import PoolSettings, WorkerPool
from tests.dags import plan_of


@dataclass(frozen=True)
class Effect:
    pool: str
    key: str
    token: str
    seq: int


class FrozenRenewals(ExecutionStore):
    """A worker that cannot renew its leases (frozen, or cut off): renewals never return.
    ``answered`` is set once a completion it sent has its answer."""

    def __init__(self, redis: Redis) -> None:
        super().__init__(redis)
        self.answered = asyncio.Event()

    async def complete(self, *args: Any, **kwargs: Any) -> CompletionResult:
        result = await super().complete(*args, **kwargs)
        self.answered.set()
        return result

    async def renew(
        self, execution_id: str, lease_ms: int, items: Any
    ) -> RenewResult:  # pragma: no cover - never returns
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@dataclass
class FrozenAndSuccessor:
    """One single-step execution and two pools on it, each holding the step inside its
    handler until released: ``frozen`` cannot renew its lease (it runs first), the
    ``successor`` recovers the step once that lease expired."""

    store: ExecutionStore
    eid: str
    frozen: WorkerPool
    frozen_store: FrozenRenewals
    frozen_run: asyncio.Task[str]
    successor_run: asyncio.Task[str]
    release: dict[str, asyncio.Event]


async def frozen_and_successor(redis: Redis, effects: list[Effect]) -> FrozenAndSuccessor:
    """Both pools started, each one's handler entered (the successor's after recovery)."""
    entered = {"frozen": asyncio.Event(), "successor": asyncio.Event()}
    release = {"frozen": asyncio.Event(), "successor": asyncio.Event()}

    async def effect(ctx: StepContext) -> str:
        pool = ctx.fencing_token.rsplit("#", 1)[0]
        effects.append(Effect(pool, ctx.idempotency_key, ctx.fencing_token, ctx.fencing_seq))
        entered[pool].set()
        await release[pool].wait()
        return pool

    reg = HandlerRegistry(autoload=True)
    reg.register("effect", effect)
    store = ExecutionStore(redis)
    eid = await store.create(plan_of({"a": []}, uses="effect", registry=reg))
    frozen_store = FrozenRenewals(redis)
    frozen = WorkerPool(frozen_store, reg, PoolSettings(workers=1, lease_ms=300), pool_id="frozen")
    successor = WorkerPool(store, reg, PoolSettings(workers=1), pool_id="successor")
    frozen_run = asyncio.create_task(frozen.run(eid))
    await entered["frozen"].wait()
    successor_run = asyncio.create_task(successor.run(eid))  # recovers once the lease expires
    await entered["successor"].wait()
    return FrozenAndSuccessor(store, eid, frozen, frozen_store, frozen_run, successor_run, release)


async def test_a_frozen_worker_and_its_successor_share_the_key_and_only_one_completes(
    redis: Redis,
) -> None:
    effects: list[Effect] = []
    pair = await frozen_and_successor(redis, effects)
    store, eid, frozen, release = pair.store, pair.eid, pair.frozen, pair.release
    release["frozen"].set()  # the frozen worker wakes up and finishes: too late
    await asyncio.wait_for(pair.frozen_store.answered.wait(), 10)
    release["successor"].set()
    assert await pair.successor_run == "Succeeded" and await pair.frozen_run == "Succeeded"

    first, second = effects
    assert (first.pool, second.pool) == ("frozen", "successor")
    assert first.key == second.key == f"{eid}:a:1", "one logical attempt, one key"
    assert first.seq < second.seq and first.token != second.token
    events = await store.events(eid)
    completed = [e for e in events if e.type == "step_completed"]
    assert [(e.get("step"), e.get("token")) for e in completed] == [("a", second.token)]
    rejected = [e for e in events if e.type == "completion_rejected"]
    assert [(e.get("token"), e.get("code")) for e in rejected] == [(first.token, "-3")]
    assert [e.get("step") for e in events if e.type == "step_recovered"] == ["a"]
    snap = await store.snapshot(eid)
    assert snap is not None and snap["steps"]["a"] == {
        **snap["steps"]["a"],
        "output": "successor",
        "attempts": 1,
    }
    assert frozen.stats.stale_rejections == 1 and frozen.stats.completed == 0


async def test_a_frozen_workers_completion_after_the_end_is_late_and_writes_nothing(
    redis: Redis,
) -> None:
    """The successor completes the recovered step and the execution finalizes (its
    working hashes deleted); the frozen worker then wakes and reports: the answer is
    "already finalized", counted as a late report (not a completion, not a stale token),
    and the ledger and snapshot stay as the successor left them."""
    pair = await frozen_and_successor(redis, [])
    store, eid, frozen = pair.store, pair.eid, pair.frozen
    pair.release["successor"].set()
    assert await pair.successor_run == "Succeeded"
    ledger = [e.type for e in await store.events(eid)]
    snapshot = await store.snapshot(eid)
    pair.release["frozen"].set()
    assert await pair.frozen_run == "Succeeded"
    assert frozen.stats.late_reports == 1, frozen.stats
    assert frozen.stats.completed == 0 and frozen.stats.stale_rejections == 0
    assert [e.type for e in await store.events(eid)] == ledger
    assert await store.snapshot(eid) == snapshot
    assert snapshot is not None and snapshot["steps"]["a"]["output"] == "successor"


async def test_a_retry_is_a_new_attempt_with_a_new_key_and_a_higher_sequence(
    redis: Redis,
) -> None:
    seen: list[tuple[str, int, int]] = []

    async def flaky(ctx: StepContext) -> int:
        seen.append((ctx.idempotency_key, ctx.fencing_seq, ctx.attempt))
        if ctx.attempt < 3:
            raise TransientError("not yet")
        return ctx.attempt

    reg = HandlerRegistry(autoload=True)
    reg.register("flaky", flaky)
    store = ExecutionStore(redis)
    plan = plan_of(
        {"a": [], "b": []},
        uses="flaky",
        steps={s: {"retry": {"max_attempts": 3, "backoff_initial_s": 0}} for s in "ab"},
        registry=reg,
    )
    eid = await store.create(plan)
    assert await WorkerPool(store, reg).run(eid) == "Succeeded"
    keys = [key for key, _, _ in seen]
    assert Counter(keys) == Counter({f"{eid}:{s}:{n}": 1 for s in "ab" for n in (1, 2, 3)})
    seqs = [seq for _, seq, _ in seen]
    assert len(set(seqs)) == len(seqs), "every claim of the execution has its own number"
    for step in "ab":
        mine = [seq for key, seq, _ in seen if key.split(":")[1] == step]
        assert mine == sorted(mine), "a later claim of a step carries a higher number"
