"""The worker pool end to end on a real server: outputs, retries, throttling,
policy -> lease -> claim, crashes and timeouts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airuntime.core.redis_client import RedisClient
from airuntime.engine.concurrency import ConcurrencyContext, ConcurrencyLeases
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import HandlerRegistry, StepContext
from airuntime.engine.worker_pool import KnownExecution, PoolSettings, WorkerPool
from tests.dags import fan, plan_of

THROTTLE = [{"match": {"provider": "openai"}, "limit": 2, "lease_ttl_s": 30}]
OPENAI = {"concurrency": {"provider": "openai", "model": "gpt-x", "operation": "chat"}}
SCOPE = "openai/gpt-x/chat"


@pytest.fixture
def store(engine_redis: RedisClient) -> ExecutionStore:
    """On the embedded Valkey, redis-server 7 and a 3-shard Valkey Cluster."""
    return ExecutionStore(engine_redis)


def registry(**handlers: Any) -> HandlerRegistry:
    reg = HandlerRegistry(autoload=True)
    for name, fn in handlers.items():
        reg.register(name, fn)
    return reg


async def test_outputs_flow_through_a_fan_out_fan_in(store: ExecutionStore) -> None:
    n = 12
    steps: dict[str, dict[str, Any]] = {
        "root": {"uses": "echo", "with": {"value": [f"doc{i}" for i in range(n)]}}
    }
    for i in range(n):
        steps[f"s{i}"] = {
            "uses": "template",
            "with": {"template": "sum($d)", "d": f"${{steps.root.output.{i}}}"},
        }
    steps["sink"] = {
        "uses": "echo",
        "with": {"value": [f"${{steps.s{i}.output}}" for i in range(n)]},
    }
    eid = await store.create(plan_of(fan(n), steps=steps))
    assert await WorkerPool(store, settings=PoolSettings(workers=5)).run(eid) == "Succeeded"
    snap = await store.snapshot(eid)
    assert snap is not None
    assert snap["steps"]["sink"]["output"] == [f"sum(doc{i})" for i in range(n)]


async def test_transient_failures_are_retried_until_success(store: ExecutionStore) -> None:
    plan = plan_of(
        {"flaky": []},
        steps={
            "flaky": {
                "uses": "fail",
                "with": {"fail_attempts": 2, "value": 42},
                "retry": {"max_attempts": 4, "backoff_initial_s": 0.001},
            }
        },
    )
    eid = await store.create(plan)
    pool = WorkerPool(store, settings=PoolSettings(workers=2))
    assert await pool.run(eid) == "Succeeded"
    snap = await store.snapshot(eid)
    assert snap is not None and snap["steps"]["flaky"] == {
        **snap["steps"]["flaky"],
        "attempts": 3,
        "output": 42,
    }
    assert pool.stats.retries_scheduled == 2


async def test_a_timed_out_attempt_counts_as_a_failure(store: ExecutionStore) -> None:
    plan = plan_of(
        {"slow": []},
        steps={
            "slow": {
                "uses": "sleep",
                "with": {"seconds": 30},
                "timeout_s": 0.05,
                "retry": {"max_attempts": 2, "backoff_initial_s": 0},
            }
        },
    )
    eid = await store.create(plan)
    assert await WorkerPool(store).run(eid) == "Failed"
    snap = await store.snapshot(eid)
    assert snap is not None
    assert snap["steps"]["slow"]["attempts"] == 2 and "timed out" in snap["steps"]["slow"]["error"]


async def test_an_output_over_the_limit_fails_without_retry(store: ExecutionStore) -> None:
    reg = registry(big=lambda ctx: "x" * 2000)
    plan = plan_of({"a": []}, uses="big", steps={"a": {"retry": {"max_attempts": 3}}}, registry=reg)
    eid = await store.create(plan)
    assert await WorkerPool(store, reg, PoolSettings(max_output_bytes=1000)).run(eid) == "Failed"
    snap = await store.snapshot(eid)
    assert snap is not None and snap["steps"]["a"]["attempts"] == 1
    assert "over the limit of 1000" in snap["steps"]["a"]["error"]


async def test_a_throttle_scope_never_runs_more_than_its_limit(store: ExecutionStore) -> None:
    active = 0
    peak = 0
    two_running = asyncio.Event()
    release = asyncio.Event()

    async def probe(ctx: StepContext) -> str:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        if active == 2:
            two_running.set()
        await release.wait()
        active -= 1
        return ctx.step_id

    reg = registry(probe=probe)
    plan = plan_of(
        {f"c{i}": [] for i in range(6)},
        uses="probe",
        steps={f"c{i}": OPENAI for i in range(6)},
        throttle=THROTTLE,
        registry=reg,
    )
    eid = await store.create(plan)
    pool = WorkerPool(store, reg, PoolSettings(workers=6))
    run = asyncio.create_task(pool.run(eid))
    await two_running.wait()
    leases = ConcurrencyLeases(store.redis)
    assert await leases.holders(SCOPE) == 2
    # The other four are ready and workers are free: they must be held back by the scope.
    for _ in range(50):
        await asyncio.sleep(0)
    assert pool.stats.lease_denied > 0 or pool.stats.claimed == 2
    release.set()
    assert await run == "Succeeded"
    assert peak == 2
    assert await leases.holders(SCOPE) == 0, "every lease is released after its step"


class _Gate:
    """A policy that denies until opened, and says when it was consulted."""

    def __init__(self) -> None:
        self.open = False
        self.consulted = asyncio.Event()

    def deny_reason(self, ctx: ConcurrencyContext) -> str | None:
        self.consulted.set()
        return None if self.open else "closed for the test"


async def test_policy_denial_acquires_no_lease(store: ExecutionStore) -> None:
    plan = plan_of({"a": []}, steps={"a": OPENAI}, throttle=THROTTLE)
    eid = await store.create(plan)
    gate = _Gate()
    pool = WorkerPool(store, policies=[gate])
    run = asyncio.create_task(pool.run(eid))
    await gate.consulted.wait()
    assert await ConcurrencyLeases(store.redis).holders(SCOPE) == 0
    assert not [e for e in await store.events(eid) if e.type == "step_claimed"]
    assert pool.stats.policy_denied >= 1
    gate.open = True
    assert await run == "Succeeded"


class _ObservedLeases(ConcurrencyLeases):
    """Real leases that signal denials and releases to the test."""

    def __init__(self, redis: RedisClient) -> None:
        super().__init__(redis)
        self.denied = asyncio.Event()
        self.released = asyncio.Event()

    async def acquire(self, scope: str, holder: str, limit: int, ttl_ms: int) -> Any:
        result = await super().acquire(scope, holder, limit, ttl_ms)
        if not result.acquired:
            self.denied.set()
        return result

    async def release(self, scope: str, holder: str) -> bool:
        released = await super().release(scope, holder)
        self.released.set()
        return released


async def test_lease_denial_attempts_no_claim(store: ExecutionStore) -> None:
    leases = _ObservedLeases(store.redis)
    throttle = [{"match": {"provider": "openai"}, "limit": 1}]
    assert (await leases.acquire(SCOPE, "someone-else", 1, 60_000)).acquired
    plan = plan_of({"a": []}, steps={"a": OPENAI}, throttle=throttle)
    eid = await store.create(plan)
    pool = WorkerPool(store, leases=leases)
    run = asyncio.create_task(pool.run(eid))
    await leases.denied.wait()
    assert (await store.step_states(eid))["a"] == "ready"
    assert not [e for e in await store.events(eid) if e.type == "step_claimed"]
    await leases.release(SCOPE, "someone-else")
    assert await run == "Succeeded"


class _RacingLeases(_ObservedLeases):
    """After the pool gets its lease, a competitor claims the step first."""

    def __init__(self, store: ExecutionStore, eid: str) -> None:
        super().__init__(store.redis)
        self.store, self.eid = store, eid
        self.competitor_token: str | None = None

    async def acquire(self, scope: str, holder: str, limit: int, ttl_ms: int) -> Any:
        result = await super().acquire(scope, holder, limit, ttl_ms)
        if self.competitor_token is None:
            claim = await self.store.claim_step(self.eid, "competitor", "a", 30_000)
            self.competitor_token = claim.token
        return result


async def test_a_lease_whose_claim_failed_is_released_at_once(store: ExecutionStore) -> None:
    plan = plan_of({"a": [], "b": ["a"]}, steps={"a": OPENAI}, throttle=THROTTLE)
    eid = await store.create(plan)
    leases = _RacingLeases(store, eid)
    pool = WorkerPool(store, leases=leases)
    run = asyncio.create_task(pool.run(eid))
    await leases.released.wait()
    assert pool.stats.claim_conflicts == 1
    assert await leases.holders(SCOPE) == 0, "the lease of the failed claim was released"
    assert leases.competitor_token is not None
    await store.complete(eid, "competitor", [("a", leases.competitor_token, "competitor", "1")])
    assert await run == "Succeeded"


async def test_a_crashed_lease_holders_capacity_returns_after_its_ttl(
    store: ExecutionStore,
) -> None:
    leases = ConcurrencyLeases(store.redis)
    assert (await leases.acquire(SCOPE, "crashed-worker", 1, 150)).acquired
    denied = await leases.acquire(SCOPE, "next-worker", 1, 30_000)
    assert not denied.acquired and 0 < denied.retry_after_ms <= 150
    # The crashed holder never releases; the scope frees itself when the TTL passes.
    await asyncio.sleep(denied.retry_after_ms / 1000)
    for _ in range(200):
        if (got := await leases.acquire(SCOPE, "next-worker", 1, 30_000)).acquired:
            break
        await asyncio.sleep(0.005)
    assert got.acquired and got.holders == 1


async def test_a_worker_killed_mid_step_is_recovered_without_using_retry_budget(
    store: ExecutionStore,
) -> None:
    calls: dict[str, int] = {}

    async def crash_once(ctx: StepContext) -> str:
        calls[ctx.step_id] = calls.get(ctx.step_id, 0) + 1
        if ctx.step_id == "victim" and calls["victim"] == 1:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # the worker dies mid-step: nothing is reported
            await asyncio.Event().wait()
        return ctx.step_id

    reg = registry(crashy=crash_once)
    plan = plan_of({"a": [], "victim": ["a"], "z": ["victim"]}, uses="crashy", registry=reg)
    eid = await store.create(plan)
    pool = WorkerPool(store, reg, PoolSettings(workers=2, lease_ms=150))
    assert await pool.run(eid) == "Succeeded"
    assert calls["victim"] == 2 and pool.stats.crashed_steps == 1
    snap = await store.snapshot(eid)
    assert snap is not None and snap["steps"]["victim"]["attempts"] == 1
    events = await store.events(eid)
    assert [e.get("step") for e in events if e.type == "step_recovered"] == ["victim"]
    assert [e.get("step") for e in events if e.type == "step_completed"].count("victim") == 1


async def test_steps_claimed_by_the_creating_call_run_without_a_claim_round_trip(
    store: ExecutionStore,
) -> None:
    """``create_and_claim`` claims the first ready steps (in plan order, at most the
    count asked) in the creating call; a pool given them runs them as its first claim
    round instead of calling claimSteps, and every step still completes once. A create
    that finds the execution claims nothing."""
    plan = plan_of({"a": [], "b": [], "c": ["a", "b"]})
    eid, batch = await store.create_and_claim(plan, claim=("pool-x", 2, 30_000))
    assert batch is not None and [c.step_id for c in batch.claims] == ["a", "b"]
    types = [e.type for e in await store.events(eid)]
    assert types == ["execution_created", "step_claimed", "step_claimed"]
    assert await store.create_and_claim(plan, execution_id=eid, claim=("pool-x", 5, 30_000)) == (
        eid,
        None,
    )
    pool = WorkerPool(store, settings=PoolSettings(workers=2), pool_id="pool-x")
    too_many = KnownExecution(plan, {}, "", claimed=batch)
    with pytest.raises(ValueError, match="2 steps were claimed for 1 workers"):
        await pool.run(eid, workers=1, known=too_many)
    sent = asyncio.get_running_loop().time()
    known = KnownExecution(plan, {}, "", claimed=batch, claimed_at=sent)
    assert await pool.run(eid, known=known) == "Succeeded"
    events = await store.events(eid)
    completed = [e.get("step") for e in events if e.type == "step_completed"]
    assert sorted(completed) == ["a", "b", "c"]
    claims = [e.get("step") for e in events if e.type == "step_claimed"]
    # a and b were claimed once, by the creating call: the pool ran them from the batch
    # (claimed again only after their 30 s leases, which would outlast the test).
    assert sorted(claims) == ["a", "b", "c"]


async def test_a_step_outliving_its_lease_keeps_its_claim_through_renewals(
    store: ExecutionStore,
) -> None:
    """The renewer starts a third of a lease after the participation (not with it) and
    renews every third of a lease from then on: a step running for many leases is never
    recovered, runs once, and a rival's recovery sweep finds nothing stale."""
    release = asyncio.Event()
    calls: list[str] = []

    async def long(ctx: StepContext) -> str:
        calls.append(ctx.step_id)
        await release.wait()
        return "done"

    reg = registry(long=long)
    eid = await store.create(plan_of({"a": []}, uses="long", registry=reg))
    lease_ms = 150
    renewed = asyncio.Event()  # set by the fourth real renewal: past the first lease's end
    rounds = 0
    real_renew = store.renew

    async def counted_renew(*args: Any, **kwargs: Any) -> Any:
        nonlocal rounds
        result = await real_renew(*args, **kwargs)
        rounds += 1
        if rounds == 4:
            renewed.set()
        return result

    store.renew = counted_renew  # type: ignore[method-assign]
    pool = WorkerPool(store, reg, PoolSettings(workers=1, lease_ms=lease_ms))
    running = asyncio.create_task(pool.run(eid))
    try:
        await asyncio.wait_for(renewed.wait(), 30)  # a bound for a broken renewer only
        # Four rounds a third of a lease apart: the claim's first lease has run out.
        expiry = await store.redis.zscore(store.keys_of(eid).running, "a")
        assert expiry is not None, "the claim was lost"
        assert (await store.recover(eid)).recovered == 0, "nothing is stale while renewed"
        assert not running.done(), "the pool ended while the step was held"
    finally:
        release.set()
    assert await running == "Succeeded"
    assert calls == ["a"]
    events = await store.events(eid)
    assert [e.type for e in events if e.type == "step_recovered"] == []


class _Recording(HandlerRegistry):
    """A registry that notes each lookup in a shared log."""

    def __init__(self, log: list[str]) -> None:
        super().__init__(autoload=True)
        self.log = log

    def get(self, name: str) -> Any:
        self.log.append(f"get {name}")
        return super().get(name)


async def test_a_pool_resolves_its_handlers_before_it_claims_and_an_unknown_one_fails_its_step(
    store: ExecutionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first lookup of a handler may import its module: done before the first claim,
    so no claimed step's lease runs meanwhile. A name this worker cannot resolve (the
    plan was compiled where a plugin provides it) still fails only its own step, when
    it runs, naming the handler."""
    log: list[str] = []
    claim = store.claim

    async def noting_claim(*args: Any, **kwargs: Any) -> Any:
        log.append("claim")
        return await claim(*args, **kwargs)

    monkeypatch.setattr(store, "claim", noting_claim)
    plan = plan_of(
        {"a": [], "b": [], "c": ["a"]},
        steps={"a": {"uses": "noop"}, "b": {"uses": "plugin_only"}, "c": {"uses": "echo"}},
        failure_policy="continue",
        registry=registry(plugin_only=lambda ctx: "from the plugin"),
    )
    eid = await store.create(plan)
    pool = WorkerPool(store, _Recording(log), PoolSettings(workers=2))
    assert await pool.run(eid) == "Failed"
    first_claim = log.index("claim")
    assert {"get noop", "get plugin_only", "get echo"} <= set(log[:first_claim]), log
    snap = await store.snapshot(eid)
    assert snap is not None
    assert snap["steps"]["a"]["status"] == snap["steps"]["c"]["status"] == "completed"
    assert snap["steps"]["b"]["status"] == "failed"
    assert "plugin_only" in snap["steps"]["b"]["error"]
