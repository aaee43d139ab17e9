"""Every engine rule of docs/architecture.md §6, exercised on the Lua transitions of a real server.

Each test runs on the embedded Valkey, on Debian's redis-server 7 and on a 3-shard
Valkey Cluster (``engine_redis``).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from redis.asyncio import RedisCluster

from airuntime.control_plane.run_material import MaterialLoader
from airuntime.core import keys
from airuntime.core.errors import (
    ExecutionExists,
    ExecutionNotFound,
    ExecutionTerminal,
    InvalidTransition,
    StepNotFound,
)
from airuntime.core.redis_client import RedisClient, server_ms
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.pipeline.plan import COMPRESSED_PREFIX
from airuntime.engine.status import ExecutionStatus
from tests.control_plane.support import wait_for
from tests.dags import chain, fan, plan_of


@pytest.fixture
def store(engine_redis: RedisClient) -> ExecutionStore:
    return ExecutionStore(engine_redis)


async def _expire_and_recover(store: ExecutionStore, eid: str, expected: int = 1) -> int:
    """Wait (on the server's clock) until ``expected`` 1 ms leases have expired and recover them."""
    recovered = 0
    for _ in range(2000):
        recovered += (await store.recover(eid)).recovered
        if recovered >= expected:
            return recovered
        await asyncio.sleep(0.002)
    raise AssertionError(f"only {recovered} of {expected} leases were recovered")


async def test_create_is_idempotent_for_the_same_plan(store: ExecutionStore) -> None:
    plan = plan_of({"a": [], "b": ["a"]})
    eid = await store.create(plan, execution_id="e1")
    assert await store.create(plan, execution_id="e1") == eid
    assert (await store.info(eid)).total == 2
    other = plan_of({"a": [], "c": ["a"]})
    with pytest.raises(ExecutionExists, match="e1"):
        await store.create(other, execution_id="e1")


async def test_only_roots_are_ready_and_claims_follow_topological_order(
    store: ExecutionStore,
) -> None:
    eid = await store.create(plan_of({"a": [], "b": ["a"], "c": [], "d": ["b", "c"]}))
    batch = await store.claim(eid, "w", 10, 30_000)
    assert [c.step_id for c in batch.claims] == ["a", "c"]
    states = await store.step_states(eid)
    assert states == {"a": "running", "b": "pending", "c": "running", "d": "pending"}
    assert (await store.claim(eid, "w", 10, 30_000)).claims == []


async def test_a_large_plan_is_stored_compressed_and_read_back_by_workers_and_views(
    store: ExecutionStore,
) -> None:
    plan = plan_of(fan(600))  # ~150 KB of plan JSON
    eid = await store.create(plan, execution_id="big-plan")
    raw = await store.redis.get(store.keys_of(eid).plan)
    assert isinstance(raw, bytes) and raw.startswith(COMPRESSED_PREFIX)
    assert len(raw) < len(plan.to_json()) / 10
    assert (await store.load_plan(eid)).digest == plan.digest
    # The digest is the JSON's: creating the same execution again is recognised.
    assert await store.create(plan, execution_id="big-plan") == eid
    material = await MaterialLoader(store.redis, None).execution(eid, "")
    assert material is not None and material.plan == json.loads(plan.to_json())


async def test_claim_errors_name_the_execution_and_step(store: ExecutionStore) -> None:
    with pytest.raises(ExecutionNotFound, match="nope"):
        await store.claim("nope", "w", 1, 1000)
    eid = await store.create(plan_of({"a": [], "b": ["a"]}))
    with pytest.raises(StepNotFound, match="'zz'"):
        await store.claim_step(eid, "w", "zz", 1000)
    with pytest.raises(InvalidTransition, match="'b'"):
        await store.claim_step(eid, "w", "b", 1000)


async def test_many_contenders_claim_every_step_exactly_once(store: ExecutionStore) -> None:
    n_steps, contenders = 300, 50
    eid = await store.create(plan_of({f"s{i}": [] for i in range(n_steps)}))
    gate = asyncio.Event()

    async def contender(i: int) -> list[str]:
        await gate.wait()
        got: list[str] = []
        while True:
            batch = await store.claim(eid, f"w{i}", 3, 30_000)
            if not batch.claims:
                return got
            got += [c.step_id for c in batch.claims]

    tasks = [asyncio.create_task(contender(i)) for i in range(contenders)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*tasks)
    claimed = Counter(s for r in results for s in r)
    assert len(claimed) == n_steps
    assert set(claimed.values()) == {1}
    assert sum(1 for r in results if r) > 1, "expected several contenders to win steps"
    tokens = await store.redis.hvals(store.keys_of(eid).token)
    assert len(set(tokens)) == n_steps


async def test_completion_requires_the_current_claim_token(store: ExecutionStore) -> None:
    eid = await store.create(plan_of({"a": [], "b": ["a"]}))
    (claim,) = (await store.claim(eid, "w", 1, 30_000)).claims
    wrong = await store.complete(eid, "w", [("a", claim.token + "x", "w", "1")])
    assert wrong.codes == [-3]
    assert (await store.step_states(eid))["a"] == "running"
    ok = await store.complete(eid, "w", [("a", claim.token, "w", "1")])
    assert ok.codes == [1] and ok.readied == 1
    # The same claim completing again (a retried call whose reply was lost) is known as
    # a duplicate (code 2) and changes nothing: no second output, no second release.
    again = await store.complete(eid, "w", [("a", claim.token, "w", "2")])
    assert again.codes == [2] and again.readied == 0
    assert json.loads(await store.redis.hget(store.keys_of(eid).out, "a")) == 1
    assert [e.type for e in await store.events(eid)].count("step_completed") == 1


async def test_stale_workers_late_completion_is_rejected(store: ExecutionStore) -> None:
    eid = await store.create(plan_of({"a": []}))
    (stale,) = (await store.claim(eid, "worker-a", 1, 1)).claims
    await _expire_and_recover(store, eid)
    (fresh,) = (await store.claim(eid, "worker-b", 1, 30_000)).claims
    assert fresh.token != stale.token
    late = await store.complete(eid, "worker-a", [("a", stale.token, "worker-a", '"stale"')])
    assert late.codes == [-3]
    with pytest.raises(Exception, match="no longer owned"):
        await store.fail(eid, "worker-a", "a", stale.token, "boom")
    done = await store.complete(eid, "worker-b", [("a", fresh.token, "worker-b", '"fresh"')])
    assert done.codes == [1] and done.status == "Succeeded"
    snap = await store.snapshot(eid)
    assert snap is not None and snap["steps"]["a"]["output"] == "fresh"
    rejected = [e for e in await store.events(eid) if e.type == "completion_rejected"]
    assert [e.get("token") for e in rejected] == [stale.token]


async def test_a_finalized_execution_is_its_snapshot_and_refuses_late_reports(
    store: ExecutionStore, engine_redis: RedisClient
) -> None:
    """Finalization deletes the per-step working hashes (the snapshot holds every step):
    the retry of the call that finalized (its reply lost) and a report for a step that
    was skipped are answered "already finalized" (-6) and change nothing -- no ledger
    entry, the snapshot as it was; the step states are still read, from the snapshot."""
    eid = await store.create(plan_of({"a": [], "b": []}), retention_s=300)
    a, b = (await store.claim(eid, "w", 2, 30_000)).claims
    assert (await store.complete(eid, "w", [("a", a.token, "w", '"A"')])).codes == [1]
    live = await store.step_states(eid)
    assert live == {"a": "completed", "b": "running"}
    done = await store.complete(eid, "w", [("b", b.token, "w", '"B"')])
    assert done.codes == [1] and done.status is ExecutionStatus.SUCCEEDED
    ek = store.keys_of(eid)
    left = [k for k in ek.all() if await engine_redis.exists(k)]
    assert left == [ek.key(s) for s in keys.EXECUTION_RECORD_SUFFIXES]
    snapshot_before = await engine_redis.get(ek.snapshot)
    ledger_before = len(await store.events(eid))

    again = await store.complete(eid, "w", [("b", b.token, "w", '"B2"'), ("a", a.token, "w", "0")])
    assert again.codes == [-6, -6] and again.status is ExecutionStatus.SUCCEEDED
    assert again.readied == 0 and again.claims == []
    with pytest.raises(ExecutionTerminal):
        await store.fail(eid, "w", "b", b.token, "late failure")
    assert await engine_redis.get(ek.snapshot) == snapshot_before
    assert len(await store.events(eid)) == ledger_before, "a late report writes no entry"
    assert [k for k in ek.all() if await engine_redis.exists(k)] == left, "nothing recreated"
    assert await store.step_states(eid) == {"a": "completed", "b": "completed"}


async def test_recovered_step_keeps_its_attempt_count(store: ExecutionStore) -> None:
    plan = plan_of({"a": []}, steps={"a": {"retry": {"max_attempts": 3}}})
    eid = await store.create(plan)
    (c1,) = (await store.claim(eid, "w", 1, 30_000)).claims
    assert c1.attempt == 1
    r = await store.fail(eid, "w", "a", c1.token, "transient", delay_ms=0)
    assert (r.outcome, r.attempt) == ("retry", 2)
    (c2,) = (await store.claim(eid, "w", 1, 1)).claims
    assert c2.attempt == 2
    await _expire_and_recover(store, eid)
    (c3,) = (await store.claim(eid, "w", 1, 30_000)).claims
    assert c3.attempt == 2, "recovery must not consume retry budget"
    r = await store.fail(eid, "w", "a", c3.token, "transient", delay_ms=0)
    assert (r.outcome, r.attempt) == ("retry", 3)
    recovered = [e for e in await store.events(eid) if e.type == "step_recovered"]
    assert len(recovered) == 1 and recovered[0].get("attempt") == "2"


async def test_a_step_waiting_for_retry_is_not_claimable_before_next_retry_at(
    store: ExecutionStore,
) -> None:
    plan = plan_of(
        {"slow": [], "fast": []},
        steps={s: {"retry": {"max_attempts": 2}} for s in ("slow", "fast")},
    )
    eid = await store.create(plan)
    claims = {c.step_id: c for c in (await store.claim(eid, "w", 2, 30_000)).claims}
    far = await store.fail(eid, "w", "slow", claims["slow"].token, "x", delay_ms=3_600_000)
    now = await store.fail(eid, "w", "fast", claims["fast"].token, "x", delay_ms=0)
    assert far.outcome == now.outcome == "retry"
    assert (await store.step_states(eid))["slow"] == "retry_wait"
    batch = await store.claim(eid, "w", 5, 30_000)
    assert [c.step_id for c in batch.claims] == ["fast"], "only the due retry is claimable"
    (fast,) = batch.claims
    assert fast.attempt == 2
    await store.complete(eid, "w", [("fast", fast.token, "w", "1")])
    batch = await store.claim(eid, "w", 5, 30_000)
    assert batch.claims == []
    assert 3_500_000 < batch.wake_ms <= 3_600_000, "idle workers learn when the retry opens"
    ledger = [e for e in await store.events(eid) if e.type == "step_retry_scheduled"]
    assert {e.get("step") for e in ledger} == {"slow", "fast"}


async def test_retry_budget_exhausted_fails_the_step(store: ExecutionStore) -> None:
    plan = plan_of({"a": []}, steps={"a": {"retry": {"max_attempts": 2}}})
    eid = await store.create(plan)
    (c,) = (await store.claim(eid, "w", 1, 30_000)).claims
    assert (await store.fail(eid, "w", "a", c.token, "e1")).outcome == "retry"
    (c,) = (await store.claim(eid, "w", 1, 30_000)).claims
    r = await store.fail(eid, "w", "a", c.token, "e2")
    assert (r.outcome, r.attempt, r.status) == ("failed", 2, "Failed")
    snap = await store.snapshot(eid)
    assert snap is not None
    assert snap["steps"]["a"] == {
        **snap["steps"]["a"],
        "status": "failed",
        "attempts": 2,
        "error": "e2",
    }


async def test_non_retryable_failure_fails_at_once(store: ExecutionStore) -> None:
    plan = plan_of({"a": []}, steps={"a": {"retry": {"max_attempts": 5}}})
    eid = await store.create(plan)
    (c,) = (await store.claim(eid, "w", 1, 30_000)).claims
    r = await store.fail(eid, "w", "a", c.token, "bad input", retryable=False)
    assert (r.outcome, r.attempt) == ("failed", 1)


async def test_fail_fast_blocks_claims_and_finalizes_after_running_steps_drain(
    store: ExecutionStore,
) -> None:
    eid = await store.create(plan_of({"a": [], "b": [], "c": [], "d": ["a"]}))
    claims = {c.step_id: c for c in (await store.claim(eid, "w", 2, 30_000)).claims}
    assert set(claims) == {"a", "b"}
    r = await store.fail(eid, "w", "a", claims["a"].token, "boom", retryable=False)
    assert r.status == "Failing"
    assert (await store.claim(eid, "w", 5, 30_000)).claims == [], "no claim while failing"
    done = await store.complete(eid, "w", [("b", claims["b"].token, "w", "null")])
    assert done.codes == [1] and done.status == "Failed"
    states = await store.step_states(eid)
    assert states == {"a": "failed", "b": "completed", "c": "skipped", "d": "skipped"}


async def test_continue_policy_skips_only_descendants(store: ExecutionStore) -> None:
    dag = {"a": [], "a1": ["a"], "a2": ["a1"], "b": [], "b1": ["b"], "j": ["a2", "b1"]}
    eid = await store.create(plan_of(dag, failure_policy="continue"))
    claims = {c.step_id: c for c in (await store.claim(eid, "w", 5, 30_000)).claims}
    await store.fail(eid, "w", "a", claims["a"].token, "boom", retryable=False)
    r = await store.complete(eid, "w", [("b", claims["b"].token, "w", "1")], claim_next=5)
    assert [c.step_id for c in r.claims] == ["b1"], "the independent branch keeps running"
    r = await store.complete(eid, "w", [("b1", r.claims[0].token, "w", "2")], claim_next=5)
    assert r.status == "Failed"
    states = await store.step_states(eid)
    assert states == {
        "a": "failed",
        "a1": "skipped",
        "a2": "skipped",
        "b": "completed",
        "b1": "completed",
        "j": "skipped",
    }


async def test_pause_blocks_new_claims_while_running_steps_drain(store: ExecutionStore) -> None:
    eid = await store.create(plan_of({f"s{i}": [] for i in range(4)}))
    running = (await store.claim(eid, "w", 2, 30_000)).claims
    assert await store.pause(eid, "op") == "Pausing"
    blocked = await store.claim(eid, "w", 5, 30_000)
    assert (blocked.status, blocked.claims) == ("Pausing", [])
    first = await store.complete(
        eid, "w", [(running[0].step_id, running[0].token, "w", "0")], claim_next=5
    )
    assert first.codes == [1] and first.claims == [] and first.status == "Pausing"
    last = await store.complete(eid, "w", [(running[1].step_id, running[1].token, "w", "0")])
    assert last.status == "Paused"
    assert (await store.claim(eid, "w", 5, 30_000)).claims == []
    assert await store.resume(eid, "op") == "Running"
    assert len((await store.claim(eid, "w", 5, 30_000)).claims) == 2


async def test_a_completion_hands_what_it_releases_to_its_slots_in_plan_order(
    store: ExecutionStore,
) -> None:
    # Nothing else ready: the released steps go from pending straight to running, in
    # the order the ready set would have given them, numbered after the claims before.
    plan = plan_of({"r": [], "c": ["r"], "a": ["r"], "b": ["r"]})
    children = [s.id for s in plan.steps if s.id != "r"]
    eid = await store.create(plan)
    (r,) = (await store.claim(eid, "w", 1, 30_000)).claims
    two = await store.complete(eid, "w", [("r", r.token, "w", "1")], claim_next=2)
    assert (two.readied, [c.step_id for c in two.claims]) == (3, children[:2])
    assert [c.sequence for c in two.claims] == [r.sequence + 1, r.sequence + 2]
    states = await store.step_states(eid)
    assert [states[s] for s in children] == ["running", "running", "ready"]
    assert (await store.info(eid)).running == 2

    eid = await store.create(plan)
    (r,) = (await store.claim(eid, "w", 1, 30_000)).claims
    three = await store.complete(eid, "w", [("r", r.token, "w", "1")], claim_next=3)
    assert [c.step_id for c in three.claims] == children
    assert set((await store.step_states(eid)).values()) == {"completed", "running"}
    info = await store.info(eid)
    assert (info.running, info.completed, info.done) == (3, 1, 1)
    items = [(c.step_id, c.token, "w", "1") for c in three.claims]
    assert (await store.complete(eid, "w", items)).status == "Succeeded"

    # Released by two completions of one batch, in the batch's order (k2's parent
    # first): claimed in plan order all the same.
    plan = plan_of({"p1": [], "p2": [], "k1": ["p2"], "k2": ["p1"]})
    eid = await store.create(plan)
    roots = {c.step_id: c for c in (await store.claim(eid, "w", 2, 30_000)).claims}
    items = [(s, roots[s].token, "w", "1") for s in ("p1", "p2")]
    both = await store.complete(eid, "w", items, claim_next=2)
    assert [c.step_id for c in both.claims] == ["k1", "k2"]


async def test_a_completion_claims_steps_ready_before_the_ones_it_releases(
    store: ExecutionStore,
) -> None:
    # r releases x and y; x releases z. One slot each time: y, ready since r completed,
    # is claimed before z, which x's completion released, as plan order says.
    plan = plan_of({"r": [], "x": ["r"], "y": ["r"], "z": ["x"]})
    order = [s.id for s in plan.steps]
    assert order.index("x") < order.index("y") < order.index("z")
    eid = await store.create(plan)
    (r,) = (await store.claim(eid, "w", 1, 30_000)).claims
    (x,) = (await store.complete(eid, "w", [("r", r.token, "w", "1")], claim_next=1)).claims
    assert x.step_id == "x" and (await store.step_states(eid))["y"] == "ready"
    after_x = await store.complete(eid, "w", [("x", x.token, "w", "1")], claim_next=1)
    assert (after_x.readied, [c.step_id for c in after_x.claims]) == (1, ["y"])
    assert (await store.step_states(eid))["z"] == "ready"
    (y,) = after_x.claims
    after_y = await store.complete(eid, "w", [("y", y.token, "w", "1")], claim_next=1)
    assert [c.step_id for c in after_y.claims] == ["z"]


async def test_steps_released_while_pausing_wait_ready_until_resumed(
    store: ExecutionStore,
) -> None:
    eid = await store.create(plan_of({"a": [], "b": [], "c": ["a"]}))
    claims = {c.step_id: c for c in (await store.claim(eid, "w", 2, 30_000)).claims}
    assert await store.pause(eid, "op") == "Pausing"
    r = await store.complete(eid, "w", [("a", claims["a"].token, "w", "1")], claim_next=5)
    assert (r.status, r.claims, r.readied) == ("Pausing", [], 1)
    assert (await store.step_states(eid))["c"] == "ready"
    last = await store.complete(eid, "w", [("b", claims["b"].token, "w", "1")], claim_next=5)
    assert (last.status, last.claims) == ("Paused", [])
    assert (await store.info(eid)).running == 0
    assert await store.resume(eid, "op") == "Running"
    assert [c.step_id for c in (await store.claim(eid, "w", 5, 30_000)).claims] == ["c"]


async def test_cancel_blocks_claims_drains_and_ends_cancelled(store: ExecutionStore) -> None:
    eid = await store.create(plan_of({"a": [], "b": [], "c": ["a"]}))
    (a,) = (await store.claim(eid, "w", 1, 30_000)).claims
    assert await store.cancel(eid, "user") == "Cancelling"
    assert (await store.claim(eid, "w", 5, 30_000)).claims == []
    with pytest.raises(InvalidTransition):
        await store.pause(eid)
    r = await store.complete(eid, "w", [("a", a.token, "w", "1")])
    assert r.status == "Cancelled"
    assert await store.step_states(eid) == {"a": "completed", "b": "cancelled", "c": "cancelled"}
    with pytest.raises(ExecutionTerminal, match="Cancelled"):
        await store.cancel(eid)


async def test_cancel_with_nothing_running_finalizes_at_once(store: ExecutionStore) -> None:
    eid = await store.create(plan_of({"a": [], "b": ["a"]}))
    assert await store.cancel(eid) == "Cancelled"
    assert (await store.snapshot(eid) or {})["status"] == "Cancelled"


async def _complete_last(store: ExecutionStore, gate: asyncio.Event, eid: str, token: str) -> str:
    await gate.wait()
    return (await store.complete(eid, "w", [("last", token, "w", "2")])).status


async def _cancel(store: ExecutionStore, gate: asyncio.Event, eid: str) -> str:
    await gate.wait()
    try:
        return await store.cancel(eid, "racer")
    except ExecutionTerminal:
        return "refused"


async def test_cancel_wins_over_a_racing_natural_completion(store: ExecutionStore) -> None:
    """The last step's completion and a cancel race, released by one gate, 40 times.

    Whenever the cancel was accepted before finalization the execution ends Cancelled
    (even though every step completed); it ends Succeeded only when the cancel was
    refused as too late. Both are consistent with the ledger order, and there is never
    a second terminal event.
    """
    outcomes: Counter[str] = Counter()
    for round_ in range(40):
        eid = await store.create(plan_of({"a": [], "last": ["a"]}), execution_id=f"race-{round_}")
        (a,) = (await store.claim(eid, "w", 1, 30_000)).claims
        (last,) = (await store.complete(eid, "w", [("a", a.token, "w", "1")], claim_next=1)).claims
        gate = asyncio.Event()
        racers = [
            _complete_last(store, gate, eid, last.token),
            _cancel(store, gate, eid),
        ]
        if round_ % 2 == 0:
            racers.reverse()
        tasks = [asyncio.create_task(r) for r in racers]
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(*tasks)
        final = (await store.info(eid)).status
        events = [e.type for e in await store.events(eid)]
        assert events.count("execution_finalized") == 1
        if "cancel_requested" in events:
            assert events.index("cancel_requested") < events.index("execution_finalized")
            assert final == "Cancelled"
        else:
            assert final == "Succeeded"
        outcomes[final] += 1
        assert (await store.step_states(eid))["last"] == "completed"
    assert outcomes["Cancelled"] > 0 and outcomes["Succeeded"] > 0, outcomes


async def test_finalization_is_idempotent_under_contention(store: ExecutionStore) -> None:
    eid = await store.create(plan_of({"a": []}))
    (a,) = (await store.claim(eid, "w", 1, 30_000)).claims
    assert await store.finalize(eid) is None, "not terminal while a step runs"
    await store.complete(eid, "w", [("a", a.token, "w", "1")])
    gate = asyncio.Event()

    async def finalize() -> str | None:
        await gate.wait()
        return await store.finalize(eid)

    tasks = [asyncio.create_task(finalize()) for _ in range(30)]
    await asyncio.sleep(0)
    gate.set()
    assert set(await asyncio.gather(*tasks)) == {"Succeeded"}
    events = [e.type for e in await store.events(eid)]
    assert events.count("execution_finalized") == 1
    assert await store.redis.ttl(store.keys_of(eid).meta) > 0, "retention TTL applied"


async def test_creation_writes_each_kind_of_root_where_it_belongs(store: ExecutionStore) -> None:
    """A plain root is Ready in the ready set, a throttled one in the throttled set (and
    counted in the reply), an ``input`` root waits for input from the start (status
    WaitingForInput, its request in the ledger right after the creation entry, nothing
    claimed), and a dependent step is Pending with its counter."""
    plan = plan_of(
        {"plain": [], "limited": [], "ask": [], "after": ["plain", "limited", "ask"]},
        steps={"limited": {"concurrency": {"key": "k"}}, "ask": {"uses": "input"}},
        throttle=[{"match": {}, "limit": 1}],
    )
    eid, batch = await store.create_and_claim(plan, ("w", 5, 30_000))
    assert batch is not None
    assert batch.status == "WaitingForInput" and batch.claims == [] and batch.throttled_ready == 1
    ek, redis = store.keys_of(eid), store.redis
    assert await redis.hgetall(ek.key("status")) == {
        b"plain": b"ready",
        b"limited": b"ready",
        b"ask": b"input_wait",
        b"after": b"pending",
    }
    assert await redis.zrange(ek.key("ready"), 0, -1) == [b"plain"]
    assert await redis.zrange(ek.key("ready_throttled"), 0, -1) == [b"limited"]
    assert await redis.hgetall(ek.key("pending")) == {b"after": b"3"}
    assert await redis.hmget(ek.meta, "status", "waiting_input") == [b"WaitingForInput", b"1"]
    types = [e.type for e in await store.events(eid)]
    assert types[:2] == ["execution_created", "input_requested"]
    assert await store.provide_input(eid, "ask", True) == "Running"


async def test_a_plan_larger_than_one_bulk_command_and_one_snapshot_chunk(
    store: ExecutionStore,
) -> None:
    """3,002 steps: creation writes every step's record (a bulk command takes 500
    fields) with the root alone ready; the plan drains to Succeeded; the snapshot,
    written in several chunks (one per 20,000 pieces, ~2,000 steps), is one JSON
    document holding every step with its worker and times, in the status hash's order."""
    eid = await store.create(plan_of(fan(3_000)))
    ek, redis = store.keys_of(eid), store.redis
    assert await redis.hlen(ek.key("status")) == await redis.hlen(ek.key("order")) == 3_002
    assert await redis.hlen(ek.key("pending")) == 3_001
    assert await redis.hlen(ek.key("children")) == 3_001
    assert await redis.zrange(ek.key("ready"), 0, -1) == [b"root"]
    assert await redis.hget(ek.key("pending"), "sink") == b"3000"
    order = [s.decode() for s in await redis.hkeys(ek.key("status"))]
    held = [(c.step_id, c.token) for c in (await store.claim(eid, "w", 64, 30_000)).claims]
    status = None
    while held:
        items = [(s, t, "w/0", "null") for s, t in held[:64]]
        r = await store.complete(eid, "w", items, claim_next=64)
        status = r.status
        held = held[64:] + [(c.step_id, c.token) for c in r.claims]
    assert status == "Succeeded"
    snap = await store.snapshot(eid)
    assert snap is not None and snap["counts"]["completed"] == 3_002
    assert list(snap["steps"]) == order
    for step in snap["steps"].values():
        assert step["status"] == "completed" and step["worker"] == "w/0"
        assert step["finished_at_ms"] >= step["claimed_at_ms"] > 0


async def _drain(store: ExecutionStore, eid: str, batch: int = 64) -> str | None:
    """Claim and complete until nothing is claimed; the last status seen."""
    held = [(c.step_id, c.token) for c in (await store.claim(eid, "w", batch, 30_000)).claims]
    status = None
    while held:
        items = [(s, t, "w/0", "null") for s, t in held[:batch]]
        r = await store.complete(eid, "w", items, claim_next=batch)
        status = r.status
        held = held[batch:] + [(c.step_id, c.token) for c in r.claims]
    return status


async def _claims_per_step(store: ExecutionStore, eid: str) -> Counter[str]:
    return Counter(e.get("step") for e in await store.events(eid) if e.type == "step_claimed")


async def test_a_release_longer_than_the_budget_goes_on_in_the_calls_that_claim(
    store: ExecutionStore,
) -> None:
    """A root with 10,000 dependents: its completion makes RELEASE_BUDGET of them ready
    and records where it stopped; each call that claims next releases up to as many
    more, before claiming; once all are out the record is gone. Every step is claimed
    exactly once and the execution succeeds."""
    eid = await store.create(plan_of(fan(10_000)))
    ek, redis = store.keys_of(eid), store.redis
    (root,) = (await store.claim(eid, "w", 1, 30_000)).claims
    r = await store.complete(eid, "w", [("root", root.token, "w", "null")])
    assert r.readied == RELEASE_BUDGET
    assert await redis.zcard(ek.key("ready")) == RELEASE_BUDGET
    assert (await redis.hget(ek.meta, "releasing") or b"").startswith(b"root=")
    batch = await store.claim(eid, "w", 64, 30_000)
    assert len(batch.claims) == 64
    assert await redis.zcard(ek.key("ready")) == 2 * RELEASE_BUDGET - 64
    await store.claim(eid, "w", 0, 30_000)
    assert await redis.zcard(ek.key("ready")) == 10_000 - 64
    assert not await redis.hexists(ek.meta, "releasing")
    items = [(c.step_id, c.token, "w/0", "null") for c in batch.claims]
    await store.complete(eid, "w", items)
    assert await _drain(store, eid) == "Succeeded"
    claims = await _claims_per_step(store, eid)
    assert len(claims) == 10_002 and set(claims.values()) == {1}


async def test_two_long_releases_and_a_dependent_of_both(store: ExecutionStore) -> None:
    """Two roots completed in one call, 5,000 dependents each, and one step that
    depends on both: the releases go on one after the other across calls, the shared
    dependent becomes ready once (when its second parent's list reaches it), and every
    step runs once."""
    deps: dict[str, list[str]] = {"r1": [], "r2": []}
    deps.update({f"a{i}": ["r1"] for i in range(5_000)})
    deps.update({f"b{i}": ["r2"] for i in range(5_000)})
    deps["both"] = ["r1", "r2"]
    deps["sink"] = [s for s in deps if s not in ("r1", "r2")]
    eid = await store.create(plan_of(deps))
    roots = (await store.claim(eid, "w", 2, 30_000)).claims
    r = await store.complete(eid, "w", [(c.step_id, c.token, "w", "null") for c in roots])
    assert r.readied == RELEASE_BUDGET
    assert await store.redis.hget(store.keys_of(eid).key("status"), "both") == b"pending"
    assert await _drain(store, eid) == "Succeeded"
    claims = await _claims_per_step(store, eid)
    assert len(claims) == len(deps) and set(claims.values()) == {1}


async def test_a_cancel_during_a_long_release_ends_it(store: ExecutionStore) -> None:
    """Cancelled while a release is still going on: the execution finalizes Cancelled
    with every dependent not released yet cancelled, the record of the release is
    gone, and a later claim finds the execution terminal."""
    eid = await store.create(plan_of(fan(10_000)))
    (root,) = (await store.claim(eid, "w", 1, 30_000)).claims
    await store.complete(eid, "w", [("root", root.token, "w", "null")])
    assert await store.redis.hexists(store.keys_of(eid).meta, "releasing")
    assert await store.cancel(eid, "user") == "Cancelled"
    assert not await store.redis.hexists(store.keys_of(eid).meta, "releasing")
    snap = await store.snapshot(eid)
    assert snap is not None
    assert snap["counts"] == {
        "total": 10_002,
        "completed": 1,
        "failed": 0,
        "skipped": 0,
        "cancelled": 10_001,
    }
    batch = await store.claim(eid, "w", 64, 30_000)
    assert batch.status == "Cancelled" and batch.claims == []


async def test_an_input_steps_dependents_are_released_like_a_completions(
    store: ExecutionStore,
) -> None:
    """Input provided to a step with 5,000 dependents: RELEASE_BUDGET of them become
    ready in that call, the rest in the calls that claim next; all run once."""
    deps: dict[str, list[str]] = {"ask": []}
    deps.update({f"s{i}": ["ask"] for i in range(5_000)})
    eid = await store.create(plan_of(deps, steps={"ask": {"uses": "input"}}))
    assert await store.provide_input(eid, "ask", {"ok": True}) == "Running"
    ek = store.keys_of(eid)
    assert await store.redis.zcard(ek.key("ready")) == RELEASE_BUDGET
    assert await store.redis.hexists(ek.meta, "releasing")
    assert await _drain(store, eid) == "Succeeded"
    claims = await _claims_per_step(store, eid)
    assert len(claims) == 5_000 and set(claims.values()) == {1}


async def test_input_step_blocks_claims_until_input_is_provided(store: ExecutionStore) -> None:
    plan = plan_of(
        {"draft": [], "approve": ["draft"], "other": ["draft"], "publish": ["approve"]},
        steps={"approve": {"uses": "input"}},
    )
    eid = await store.create(plan)
    (d,) = (await store.claim(eid, "w", 5, 30_000)).claims
    r = await store.complete(eid, "w", [("draft", d.token, "w", '"text"')], claim_next=5)
    assert r.status == "WaitingForInput" and r.claims == []
    assert (await store.claim(eid, "w", 5, 30_000)).claims == [], "WaitingForInput blocks claims"
    with pytest.raises(InvalidTransition):
        await store.provide_input(eid, "publish", True)
    assert await store.provide_input(eid, "approve", {"ok": True}, actor="alice") == "Running"
    batch = await store.claim(eid, "w", 5, 30_000)
    assert sorted(c.step_id for c in batch.claims) == ["other", "publish"]
    publish = next(c for c in batch.claims if c.step_id == "publish")
    assert publish.ref_outputs == {}


async def test_claim_returns_outputs_of_referenced_steps(store: ExecutionStore) -> None:
    plan = plan_of(
        {"a": [], "b": []}, steps={"b": {"uses": "echo", "with": {"value": "${steps.a.output.n}"}}}
    )
    eid = await store.create(plan)
    (a,) = (await store.claim(eid, "w", 5, 30_000)).claims
    r = await store.complete(eid, "w", [("a", a.token, "w", '{"n": 7}')], claim_next=5)
    (b,) = r.claims
    assert b.ref_outputs == {"a": {"n": 7}}


async def test_renewal_extends_live_claims_and_reports_lost_ones(store: ExecutionStore) -> None:
    eid = await store.create(plan_of({"a": [], "b": []}))
    a, b = (await store.claim(eid, "w", 2, 30_000)).claims
    assert (await store.renew(eid, 60_000, [(a.step_id, a.token), (b.step_id, "bogus")])).alive == [
        True,
        False,
    ]
    score = await store.redis.zscore(store.keys_of(eid).running, a.step_id)
    assert score is not None


RELEASE_BUDGET = 4096
"""Dependents one call releases at most (includes/releaseMany.lua, releaseBudget)."""


async def test_claim_work_does_not_grow_with_the_size_of_the_dag(store: ExecutionStore) -> None:
    """Ready steps are found without scanning: claiming and completing a step of a
    20,000-step execution runs as many Redis commands as in a 20-step one."""

    async def commands_for_one_step(n: int) -> int:
        eid = await store.create(plan_of(fan(n)))
        (root,) = (await store.claim(eid, "w", 1, 30_000)).claims
        r = await store.complete(eid, "w", [("root", root.token, "w", "null")])
        assert r.readied == min(n, RELEASE_BUDGET)
        while await store.redis.hexists(store.keys_of(eid).meta, "releasing"):
            await store.claim(eid, "w", 0, 30_000)  # the rest of the release, nothing claimed
        assert await store.redis.zcard(store.keys_of(eid).key("ready")) == n
        before = await _commands_run(store, eid)
        (step,) = (await store.claim(eid, "w", 1, 30_000)).claims
        await store.complete(eid, "w", [(step.step_id, step.token, "w", "null")])
        return await _commands_run(store, eid) - before

    small, large = await commands_for_one_step(20), await commands_for_one_step(20_000)
    assert small == large


_BACKGROUND = ("info", "replconf", "ping", "cluster")
"""Commands the test's own reads, replication and the cluster bus send meanwhile."""


async def _commands_run(store: ExecutionStore, eid: str) -> int:
    """Commands run so far by the server (on a cluster: the primary) holding ``eid``."""
    redis = store.redis
    if isinstance(redis, RedisCluster):
        node = redis.get_node_from_key(store.keys_of(eid).meta)
        stats = await redis.info("commandstats", target_nodes=node)
    else:
        stats = await redis.info("commandstats")
    return sum(
        int(v["calls"])
        for k, v in stats.items()
        if k.removeprefix("cmdstat_").split("|")[0] not in _BACKGROUND
    )


async def test_terminal_snapshot_records_statuses_attempts_outputs_and_timings(
    store: ExecutionStore,
) -> None:
    eid = await store.create(plan_of(chain(3)))
    owner = "w"
    r = await store.claim(eid, owner, 1, 30_000)
    claims = r.claims
    while claims:
        c = claims[0]
        res = await store.complete(
            eid, owner, [(c.step_id, c.token, "w1", json.dumps({"s": c.step_id}))], claim_next=1
        )
        claims = res.claims
    snap = await store.snapshot(eid)
    assert snap is not None
    assert snap["status"] == "Succeeded" and snap["counts"]["completed"] == 3
    for sid in ("c0", "c1", "c2"):
        st = snap["steps"][sid]
        assert st["output"] == {"s": sid} and st["attempts"] == 1 and st["worker"] == "w1"
        assert st["finished_at_ms"] >= st["claimed_at_ms"] > 0


async def test_terminal_snapshot_is_what_the_execution_hashes_say_for_every_kind_of_step(
    store: ExecutionStore, engine_redis: RedisClient
) -> None:
    """The snapshot (built in Lua, in one pass, at finalization) against one built here
    from the hashes themselves: a completed step with its output, a step that failed
    after a retry (its attempts and error), the steps skipped under `continue` because
    their dependency failed (no worker, no timings) and an independent branch that
    completed -- every field of every step, and the counts. Finalization deletes the
    hashes, so they are read just before the last call (the completion of `last`, held
    back until then), and `last` is checked against that completion."""
    plan = plan_of(
        {"ok": [], "flaky": [], "after": ["flaky"], "later": ["after"], "side": ["ok"], "last": []},
        failure_policy="continue",
        steps={"flaky": {"retry": {"max_attempts": 2}}},
    )
    eid = await store.create(plan)
    pending = (await store.claim(eid, "w", 10, 30_000)).claims
    held = [c for c in pending if c.step_id == "last"]
    pending = [c for c in pending if c.step_id != "last"]
    assert len(held) == 1
    attempts_left = {"flaky": 2}
    while pending:
        c = pending.pop(0)
        if c.step_id == "flaky":
            attempts_left["flaky"] -= 1
            await store.fail(eid, "w-f", c.step_id, c.token, 'boom "quoted"\n', delay_ms=0)
        else:
            done = await store.complete(
                eid, "w", [(c.step_id, c.token, "w-1", json.dumps({"from": c.step_id}))]
            )
            assert done.codes == [1]
        if not pending and attempts_left["flaky"] >= 0:
            pending = (await store.claim(eid, "w", 10, 30_000)).claims
    assert await store.snapshot(eid) is None, "`last` still runs"

    keys = store.keys_of(eid)

    async def table(key: str) -> dict[str, str]:
        raw = await engine_redis.hgetall(key)
        return {k.decode(): v.decode() for k, v in raw.items()}

    hashes = ("status", "attempt", "out", "err", "owner", "times")
    status, attempt, out, err, owner, times = [await table(keys.key(h)) for h in hashes]
    last = held[0]
    done = await store.complete(eid, "w", [(last.step_id, last.token, "w-9", '{"end":1}')])
    assert done.codes == [1] and done.status is ExecutionStatus.FAILED
    snap = await store.snapshot(eid)
    assert snap is not None and snap["status"] == "Failed"
    for h in hashes:
        assert await engine_redis.exists(keys.key(h)) == 0, f"{h} kept after finalization"

    expected: dict[str, dict[str, object]] = {}
    for step, st in status.items():
        entry: dict[str, object] = {"status": st, "attempts": int(attempt.get(step, "1"))}
        if step in out:
            entry["output"] = json.loads(out[step])
        if step in err:
            entry["error"] = err[step]
        if step in owner:  # the finish record: "<finished ms>|<worker>"
            finished, _, worker = owner[step].partition("|")
            entry["worker"] = worker
        if f"c:{step}" in times:
            entry["claimed_at_ms"] = int(times[f"c:{step}"])
        if step in owner:
            entry["finished_at_ms"] = int(finished)
        expected[step] = entry
    # `last` was running when the hashes were read; its completion is the one made above.
    assert expected["last"] == {
        "status": "running",
        "attempts": 1,
        "claimed_at_ms": expected["last"]["claimed_at_ms"],
    }
    finished_last = snap["steps"]["last"]["finished_at_ms"]
    assert finished_last >= int(str(expected["last"]["claimed_at_ms"]))
    expected["last"].update(
        status="completed", output={"end": 1}, worker="w-9", finished_at_ms=finished_last
    )
    assert snap["steps"] == expected
    assert list(snap["steps"]) == list(status), "in the status hash's order"
    assert {s: e["status"] for s, e in expected.items()} == {
        "ok": "completed",
        "side": "completed",
        "flaky": "failed",
        "after": "skipped",
        "later": "skipped",
        "last": "completed",
    }
    assert expected["flaky"]["attempts"] == 2 and expected["flaky"]["error"] == 'boom "quoted"\n'
    assert snap["counts"] == {"total": 6, "completed": 3, "failed": 1, "skipped": 2, "cancelled": 0}


async def test_snapshot_names_the_owner_of_a_claim_that_never_finished(
    store: ExecutionStore,
) -> None:
    """A claim writes no finish record (its token names its owner): a step whose claim
    expired and was recovered (the token is dropped then), then cancelled before anyone
    ran it again, still names that claim's owner in the snapshot, with its claim time
    and no finish time; a step that ran names the worker that completed it, and when."""
    eid = await store.create(plan_of({"a": [], "b": []}))
    lost = {c.step_id: c for c in (await store.claim(eid, "pool-lost", 2, 1)).claims}
    assert set(lost) == {"a", "b"}
    await _expire_and_recover(store, eid, expected=2)
    (a,) = (await store.claim(eid, "pool-2", 1, 30_000)).claims
    assert a.step_id == "a", "claims follow topological order"
    assert (await store.complete(eid, "pool-2", [("a", a.token, "pool-2/w0", "1")])).codes == [1]
    assert await store.cancel(eid, "user") == "Cancelled"
    snap = await store.snapshot(eid)
    assert snap is not None
    ran, never = snap["steps"]["a"], snap["steps"]["b"]
    assert never["status"] == "cancelled" and never["worker"] == "pool-lost"
    assert never["claimed_at_ms"] > 0 and "finished_at_ms" not in never
    assert ran["worker"] == "pool-2/w0" and ran["finished_at_ms"] >= ran["claimed_at_ms"] > 0


async def test_snapshot_reads_worker_and_finish_time_written_before_finish_records(
    store: ExecutionStore, engine_redis: RedisClient
) -> None:
    """An execution that ran partly under scripts that wrote the worker alone to
    ``owner`` and the finish time to ``times`` (``f:<step>``) finalizes with both read."""
    eid = await store.create(plan_of({"a": [], "b": ["a"]}))
    (a,) = (await store.claim(eid, "w", 1, 30_000)).claims
    (b,) = (await store.complete(eid, "w", [("a", a.token, "w/0", "1")], claim_next=1)).claims
    k = store.keys_of(eid)
    await engine_redis.hset(k.key("owner"), "a", "old-worker")
    await engine_redis.hset(k.key("times"), "f:a", "1234")
    assert (await store.complete(eid, "w", [("b", b.token, "w/1", "2")])).status == "Succeeded"
    snap = await store.snapshot(eid)
    assert snap is not None
    assert snap["steps"]["a"]["worker"] == "old-worker"
    assert snap["steps"]["a"]["finished_at_ms"] == 1234
    assert snap["steps"]["b"]["worker"] == "w/1"


async def test_the_first_claim_stamps_started_at_and_later_claims_keep_it(
    store: ExecutionStore,
) -> None:
    eid = await store.create(plan_of({"a": [], "b": ["a"], "c": ["b"], "d": ["c"]}))
    meta = store.keys_of(eid).meta
    assert await store.redis.hget(meta, "started_at") is None
    first = await store.claim(eid, "w", 10, 30_000)
    started = int(await store.redis.hget(meta, "started_at") or 0)
    assert started > 0
    assert started <= await server_ms(store.redis)

    async def clock_passed() -> bool:  # a clock, not an order: a re-stamp would differ
        return await server_ms(store.redis) > started

    await wait_for(clock_passed, timeout_s=5, interval_s=0.001, what="the server clock")
    # a completion that claims the next step, a batch claim and a single (claimStep) claim
    done = await store.complete(
        eid, "w", [("a", first.claims[0].token, "w", "null")], claim_next=10, lease_ms=30_000
    )
    assert [c.step_id for c in done.claims] == ["b"]
    await store.complete(eid, "w", [("b", done.claims[0].token, "w", "null")])
    assert [c.step_id for c in (await store.claim(eid, "w", 10, 30_000)).claims] == ["c"]
    assert int(await store.redis.hget(meta, "started_at") or 0) == started


async def test_completion_counters_follow_each_batch_and_a_missing_execution_is_refused(
    store: ExecutionStore,
) -> None:
    eid = await store.create(plan_of({f"s{i}": [] for i in range(5)} | {"z": ["s0", "s1"]}))
    claims = (await store.claim(eid, "w", 5, 30_000)).claims
    items = [(c.step_id, c.token, "w", "1") for c in claims]
    first = await store.complete(eid, "w", items[:2])
    assert first.codes == [1, 1] and first.readied == 1
    info = await store.info(eid)
    assert (info.completed, info.done, info.running, info.status) == (2, 2, 3, "Running")
    again = await store.complete(eid, "w", items[:3])  # two retried, one new
    assert again.codes == [2, 2, 1]
    info = await store.info(eid)
    assert (info.completed, info.done, info.running) == (3, 3, 2)
    with pytest.raises(ExecutionNotFound, match="nope"):
        await store.complete("nope", "w", items[:1])
