"""The status enums stay what the Lua scripts write, and the scripts only make the
step-status changes the transition table allows (checked on the ledger of real runs)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from redis.asyncio import Redis

from airuntime.core.scripts import library
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import HandlerRegistry, StepContext
from airuntime.engine.pipeline import Plan
from airuntime.engine.status import (
    ALLOWED_EXECUTION_TRANSITIONS,
    ALLOWED_STEP_TRANSITIONS,
    TERMINAL_EXECUTION_STATUSES,
    TERMINAL_STEP_STATUSES,
    ExecutionStatus,
    StepStatus,
)
from airuntime.engine.store_results import LedgerEvent
from airuntime.engine.worker_pool import PoolSettings, WorkerPool
from tests.dags import plan_of


def _execution_lua() -> str:
    """The scripts that write execution state (21 keys, +1 or +2 indexes), includes expanded."""
    return "\n".join(s.source for s in library().scripts.values() if 21 <= s.num_keys <= 23)


def _step_status_literals(lua: str) -> set[str]:
    """Values written to the step status hash or compared with a step's status."""
    written = re.findall(r"'HSET',\s*ek\.status,\s*[^,()]+,\s*'([a-z_]+)'", lua)
    leftovers = re.findall(r"\bleftover\s*=\s*'([a-z_]+)'", lua)
    compared = re.findall(r"\b(?:st|\w+\))\s*[=~]=\s*'([a-z_]+)'", lua)
    return {*written, *leftovers, *compared}


def test_every_status_the_lua_scripts_write_is_an_enum_member() -> None:
    lua = _execution_lua()
    # CamelCase literals in the execution scripts are execution statuses, nothing else
    # (Redis commands are upper case, field names and step statuses lower case).
    execution = set(re.findall(r"'([A-Z][a-z]+(?:[A-Z][a-z]+)*)'", lua))
    assert execution == {s.value for s in ExecutionStatus}
    steps = _step_status_literals(lua)
    assert steps == {s.value for s in StepStatus}


def test_the_transition_tables_cover_every_status_and_end_in_terminal_ones() -> None:
    for table, terminal in (
        (ALLOWED_EXECUTION_TRANSITIONS, TERMINAL_EXECUTION_STATUSES),
        (ALLOWED_STEP_TRANSITIONS, TERMINAL_STEP_STATUSES),
    ):
        assert set(table) == set(type(next(iter(table))))
        for status, targets in table.items():
            assert status not in targets
            assert (not targets) == (status in terminal), status
            assert status.terminal == (status in terminal)


# -- the ledger of real runs ---------------------------------------------------------------

#: The status each ledger entry records for its ``step``.
_RECORDED = {
    "step_claimed": StepStatus.RUNNING,
    "step_completed": StepStatus.COMPLETED,
    "step_retry_scheduled": StepStatus.RETRY_WAIT,
    "step_failed": StepStatus.FAILED,
    "step_skipped": StepStatus.SKIPPED,
    "step_recovered": StepStatus.READY,
    "step_stopped": StepStatus.CANCELLED,
    "input_requested": StepStatus.INPUT_WAIT,
    "input_provided": StepStatus.COMPLETED,
}


def _check(before: StepStatus, after: StepStatus, step: str, seen: list[tuple[str, str]]) -> None:
    assert after in ALLOWED_STEP_TRANSITIONS[before], f"{step}: {before} -> {after} after {seen}"
    seen.append((before.value, after.value))


def _replay(plan: Plan, events: list[LedgerEvent], final: dict[str, Any]) -> set[tuple[str, str]]:
    """Every step-status change of the ledger (and of finalization, from the snapshot),
    each checked against the table; returns the changes seen."""
    assert events[0].type == "execution_created"
    state = {s.id: StepStatus.PENDING for s in plan.steps}
    seen: list[tuple[str, str]] = []
    for event in events:
        target = _RECORDED.get(event.type)
        if target is None:
            continue
        step = event.get("step")
        if event.type == "step_claimed" and state[step] is not StepStatus.READY:
            # becoming ready is not a ledger entry of its own; the claim proves it happened
            _check(state[step], StepStatus.READY, step, seen)
            state[step] = StepStatus.READY
        _check(state[step], target, step, seen)
        state[step] = target
    finalized = [e for e in events if e.type == "execution_finalized"]
    assert len(finalized) == 1 and ExecutionStatus(finalized[0].get("status")).terminal
    for step, entry in final["steps"].items():
        if StepStatus(entry["status"]) is not state[step]:  # settled by finalization
            _check(state[step], StepStatus(entry["status"]), step, seen)
    return set(seen)


@pytest.fixture
def store(redis: Redis) -> ExecutionStore:
    return ExecutionStore(redis)


def _registry(**handlers: Any) -> HandlerRegistry:
    reg = HandlerRegistry(autoload=True)
    for name, fn in handlers.items():
        reg.register(name, fn)
    return reg


async def _run(
    store: ExecutionStore, plan: Plan, registry: HandlerRegistry | None = None
) -> tuple[ExecutionStatus, set[tuple[str, str]]]:
    eid = await store.create(plan)
    status = await WorkerPool(store, registry, PoolSettings(workers=3)).run(eid)
    snap = await store.snapshot(eid)
    assert snap is not None
    return status, _replay(plan, await store.events(eid), snap)


async def test_success_makes_only_allowed_step_changes(store: ExecutionStore) -> None:
    status, seen = await _run(store, plan_of({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}))
    assert status is ExecutionStatus.SUCCEEDED
    assert seen == {("pending", "ready"), ("ready", "running"), ("running", "completed")}


async def test_retry_then_success_makes_only_allowed_step_changes(store: ExecutionStore) -> None:
    retry = {"max_attempts": 3, "backoff_initial_s": 0.001}
    plan = plan_of(
        {"a": [], "b": ["a"]},
        steps={"a": {"uses": "fail", "with": {"fail_attempts": 2, "value": 1}, "retry": retry}},
    )
    status, seen = await _run(store, plan)
    assert status is ExecutionStatus.SUCCEEDED
    assert {("running", "retry_wait"), ("retry_wait", "ready")} <= seen


@pytest.mark.parametrize("policy", ["fail_fast", "continue"])
async def test_failure_makes_only_allowed_step_changes(store: ExecutionStore, policy: str) -> None:
    plan = plan_of(
        {"bad": [], "after_bad": ["bad"], "other": [], "after_other": ["other"]},
        failure_policy=policy,
        steps={"bad": {"uses": "fail", "with": {"fail_attempts": 5}}},
    )
    status, seen = await _run(store, plan)
    assert status is ExecutionStatus.FAILED
    assert ("running", "failed") in seen
    assert ("pending", "skipped") in seen


async def test_cancel_makes_only_allowed_step_changes(store: ExecutionStore) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def hold(ctx: StepContext) -> str:
        started.set()
        await release.wait()
        return "late"

    registry = _registry(hold=hold)
    plan = plan_of({"a": [], "b": ["a"], "c": []}, steps={"a": {"uses": "hold"}}, registry=registry)
    eid = await store.create(plan)
    pool = WorkerPool(store, registry, PoolSettings(workers=3))
    run = asyncio.create_task(pool.run(eid))
    await started.wait()
    assert await store.cancel(eid, actor="test") is ExecutionStatus.CANCELLING
    release.set()
    assert await run is ExecutionStatus.CANCELLED
    snap = await store.snapshot(eid)
    assert snap is not None
    seen = _replay(plan, await store.events(eid), snap)
    assert ("pending", "cancelled") in seen


async def test_input_step_makes_only_allowed_step_changes(store: ExecutionStore) -> None:
    plan = plan_of(
        {"draft": [], "approve": ["draft"], "publish": ["approve"]},
        steps={"approve": {"uses": "input"}},
    )
    eid = await store.create(plan)
    run = asyncio.create_task(WorkerPool(store, settings=PoolSettings(workers=2)).run(eid))
    for _ in range(2000):
        if (await store.info(eid)).status is ExecutionStatus.WAITING_FOR_INPUT:
            break
        await asyncio.sleep(0.005)
    assert await store.provide_input(eid, "approve", True, actor="t") is ExecutionStatus.RUNNING
    assert await run is ExecutionStatus.SUCCEEDED
    snap = await store.snapshot(eid)
    assert snap is not None
    seen = _replay(plan, await store.events(eid), snap)
    assert {("pending", "input_wait"), ("input_wait", "completed")} <= seen
