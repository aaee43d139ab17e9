"""A tenant's model token budget on a real server: the calendar windows the script judges,
reservations under contention, settling, and ``model`` steps that stop, naming the budget,
when it has no room (:mod:`airuntime.engine.model_budget`)."""

from __future__ import annotations

import asyncio
import calendar
import json
import os
import random
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.core.context import ExecutionContextSnapshot
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers.model_usage import totals
from airuntime.engine.model_budget import (
    BudgetSpent,
    BudgetWindow,
    ModelBudgets,
    ModelTokenBudget,
)
from airuntime.engine.pipeline import compile_pipeline, parse_pipeline
from airuntime.engine.pool_settings import PoolSettings
from airuntime.engine.worker_pool import WorkerPool
from airuntime.fleet.registry import Registry
from airuntime.fleet.tenancy import TenantSettings
from airuntime.k8s.v1alpha1 import RuntimePoolSpec
from tests.engine.model_server import ModelServer, model_server


def _tenant() -> str:
    return f"t-{os.urandom(4).hex()}"


async def _budget(redis: Redis, tenant: str, tokens: int, window: str = "day") -> None:
    budget = ModelTokenBudget(tokens=tokens, window=BudgetWindow(window))
    settings = TenantSettings(tenant_id=tenant, model_token_budget=budget)
    await Registry(redis).put_tenant(settings)


def _expected_window(at: int, window: BudgetWindow) -> tuple[int, int]:
    """The window containing ``at`` (seconds), by Python's calendar: start and end."""
    t = datetime.fromtimestamp(at, UTC)
    if window is BudgetWindow.HOUR:
        start = t.replace(minute=0, second=0, microsecond=0)
        return int(start.timestamp()), int(start.timestamp()) + 3600
    if window is BudgetWindow.DAY:
        start = t.replace(hour=0, minute=0, second=0, microsecond=0)
        return int(start.timestamp()), int(start.timestamp()) + 86400
    first = calendar.timegm((t.year, t.month, 1, 0, 0, 0))
    year, month = (t.year + 1, 1) if t.month == 12 else (t.year, t.month + 1)
    return first, calendar.timegm((year, month, 1, 0, 0, 0))


def _instants() -> list[int]:
    """Edges where calendars go wrong (month and year ends, 29 February of leap and
    non-leap centuries, the epoch) and 300 instants at random up to the year 2400."""
    edges = []
    for y, m, d in ((1970, 1, 1), (2000, 2, 29), (2024, 2, 29), (2100, 2, 28), (2100, 3, 1),
                    (2026, 12, 31), (2027, 1, 1), (2400, 2, 29), (2026, 4, 30)):  # fmt: skip
        day = calendar.timegm((y, m, d, 0, 0, 0))
        edges += [day, day + 86399, max(0, day - 1)]
    rng = random.Random(13)
    return edges + [rng.randrange(0, calendar.timegm((2400, 12, 31, 0, 0, 0))) for _ in range(300)]


@pytest.mark.parametrize("window", list(BudgetWindow))
async def test_windows_are_the_utc_calendars_hours_days_and_months(
    redis: Redis, window: BudgetWindow
) -> None:
    tenant = _tenant()
    await _budget(redis, tenant, 1000, window.value)
    budgets = ModelBudgets(redis)
    for at in _instants():
        usage = await budgets.usage(tenant, at_s=at)
        assert usage is not None and usage.window is window
        start, end = _expected_window(at, window)
        assert (usage.started_at_ms, usage.resets_at_ms) == (start * 1000, end * 1000), (
            window,
            datetime.fromtimestamp(at, UTC),
        )


async def test_a_tenant_without_a_budget_reserves_nothing_and_writes_nothing(redis: Redis) -> None:
    tenant = _tenant()
    budgets = ModelBudgets(redis)
    assert await budgets.reserve(tenant, 10**9) is None  # no settings at all
    await Registry(redis).put_tenant(TenantSettings(tenant_id=tenant))
    assert await budgets.reserve(tenant, 10**9) is None  # settings, no budget
    assert await budgets.usage(tenant) is None
    assert await redis.exists(keys.tenant_model_tokens(tenant)) == 0


async def test_contending_calls_never_reserve_past_the_budget(redis: Redis) -> None:
    """60 calls, released together by a barrier, each asking 30 of a budget of 1,000:
    exactly 33 are granted (990), the others refused naming the budget; nothing is
    counted twice."""
    tenant = _tenant()
    await _budget(redis, tenant, 1000)
    clients = [Redis.from_url(redis_url(redis)) for _ in range(6)]
    barrier = asyncio.Barrier(60)

    async def one(i: int) -> bool:
        budgets = ModelBudgets(clients[i % len(clients)])
        await barrier.wait()
        try:
            return await budgets.reserve(tenant, 30) is not None
        except BudgetSpent as exc:
            assert "model_token_budget" in str(exc) and f"{tenant!r}" in str(exc)
            return False

    try:
        granted = await asyncio.gather(*(one(i) for i in range(60)))
    finally:
        for c in clients:
            await c.aclose()
    assert sum(granted) == 1000 // 30
    usage = await ModelBudgets(redis).usage(tenant)
    assert usage is not None
    assert (usage.used, usage.reserved, usage.remaining) == (0, 990, 10)


def redis_url(client: Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs.get('db', 0)}"


async def test_settling_counts_what_was_used_and_frees_the_rest(redis: Redis) -> None:
    tenant = _tenant()
    await _budget(redis, tenant, 100)
    budgets = ModelBudgets(redis)
    first = await budgets.reserve(tenant, 60)
    assert first is not None
    with pytest.raises(BudgetSpent, match=r"used 0 of its 100 .* 60 more held .* up to 50"):
        await budgets.reserve(tenant, 50)
    await budgets.settle(first, 12)  # the reply was short: 48 of the 60 come back
    usage = await budgets.usage(tenant)
    assert usage is not None and (usage.used, usage.reserved, usage.remaining) == (12, 0, 88)
    second = await budgets.reserve(tenant, 50)
    assert second is not None
    await budgets.settle(second, 0)  # a failed call uses nothing
    usage = await budgets.usage(tenant)
    assert usage is not None and (usage.used, usage.reserved) == (12, 0)


async def test_a_new_window_starts_at_zero_and_old_reservations_do_not_touch_it(
    redis: Redis,
) -> None:
    tenant = _tenant()
    await _budget(redis, tenant, 100, "hour")
    budgets = ModelBudgets(redis)
    at = calendar.timegm((2026, 12, 7, 10, 59, 0))
    old = await budgets.reserve(tenant, 90, at_s=at)
    assert old is not None
    with pytest.raises(BudgetSpent):
        await budgets.reserve(tenant, 20, at_s=at)
    fresh = await budgets.reserve(tenant, 20, at_s=at + 60)  # 11:00: the next hour
    assert fresh is not None
    await budgets.settle(old, 90)  # ended with the last hour: changes nothing now
    usage = await budgets.usage(tenant, at_s=at + 60)
    assert usage is not None and (usage.used, usage.reserved) == (0, 20)


async def test_a_changed_budget_applies_to_the_next_call(redis: Redis) -> None:
    tenant = _tenant()
    await _budget(redis, tenant, 10)
    budgets = ModelBudgets(redis)
    with pytest.raises(BudgetSpent):
        await budgets.reserve(tenant, 11)
    await _budget(redis, tenant, 11)
    assert await budgets.reserve(tenant, 11) is not None


@pytest.mark.parametrize(
    ("budget", "field"),
    [
        pytest.param({"tokens": 0}, "tokens", id="zero"),
        pytest.param({"tokens": -5}, "tokens", id="negative"),
        pytest.param({"tokens": 10**13}, "tokens", id="too-large"),
        pytest.param({"tokens": 10, "window": "week"}, "window", id="window"),
        pytest.param({"tokens": 10, "per": "day"}, "per", id="unknown-field"),
        pytest.param({"window": "day"}, "tokens", id="no-tokens"),
    ],
)
def test_a_malformed_budget_is_refused_naming_the_field(
    budget: dict[str, object], field: str
) -> None:
    with pytest.raises(ValidationError) as info:
        TenantSettings.model_validate({"tenant_id": "t", "model_token_budget": budget})
    assert f"model_token_budget.{field}" in str(info.value)
    with pytest.raises(ValidationError) as info:
        ModelTokenBudget.model_validate(budget)
    assert field in str(info.value)


def test_a_runtime_pools_budget_is_published_in_its_tenant_settings() -> None:
    spec = RuntimePoolSpec.model_validate(
        {"tenantId": "acme", "runtimePrefix": "acme", "redis": {"name": "r"},
         "modelTokenBudget": {"tokens": 5000, "window": "month"}}
    )  # fmt: skip
    budget = spec.tenant_settings().model_token_budget
    assert budget == ModelTokenBudget(tokens=5000, window=BudgetWindow.MONTH)
    with pytest.raises(ValidationError, match=r"modelTokenBudget\.tokens"):
        RuntimePoolSpec.model_validate(
            {
                "tenantId": "acme",
                "runtimePrefix": "acme",
                "redis": {"name": "r"},
                "modelTokenBudget": {"tokens": 0},
            }
        )


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModelServer]:
    with model_server() as s:
        monkeypatch.setenv(
            "AIRUNTIME_MODEL_PROVIDERS",
            json.dumps({"gpt": {"base_url": s.openai_url, "models": ["small"]}}),
        )
        yield s


def _chain(n: int, max_tokens: int, retry: bool = False) -> dict[str, object]:
    steps: list[dict[str, object]] = []
    for i in range(n):
        step: dict[str, object] = {
            "id": f"s{i}",
            "uses": "model",
            "with": {"provider": "gpt", "model": "small", "prompt": "one two three",
                     "max_tokens": max_tokens},
        }  # fmt: skip
        if i:
            step["depends_on"] = [f"s{i - 1}"]
        if retry:
            step["retry"] = {"max_attempts": 3, "backoff_initial_s": 0.01, "jitter": 0}
        steps.append(step)
    return {"id": "budgeted", "steps": steps}


async def _run(redis: Redis, tenant: str, doc: dict[str, object]) -> tuple[str, dict[str, object]]:
    store = ExecutionStore(redis)
    eid = await store.create(
        compile_pipeline(parse_pipeline(doc)), context=ExecutionContextSnapshot(tenant_id=tenant)
    )
    status = await WorkerPool(store, settings=PoolSettings(workers=2)).run(eid)
    snap = await store.snapshot(eid)
    assert snap is not None
    return status, snap


async def test_model_steps_stop_when_the_budget_has_no_room_for_a_reply(
    server: ModelServer, redis: Redis
) -> None:
    """Each call of the chain reports 3 prompt and 4 reply tokens and may get up to 20:
    a budget of 50 lets calls start while at most 30 are used, so five run and the sixth
    fails without a retry, naming the budget; the usage holds what the calls reported."""
    tenant = _tenant()
    await _budget(redis, tenant, 50)
    per_call, longest = 3 + 4, 20
    allowed = next(n for n in range(100) if n * per_call + longest > 50)
    status, snap = await _run(redis, tenant, _chain(allowed + 1, longest, retry=True))
    assert status == "Failed"
    steps = snap["steps"]
    assert isinstance(steps, dict)
    assert [steps[f"s{i}"]["status"] for i in range(allowed + 1)] == (
        ["completed"] * allowed + ["failed"]
    )
    refused = steps[f"s{allowed}"]
    assert refused["attempts"] == 1, "a spent budget is not retried"
    assert "model_token_budget" in refused["error"] and "BudgetSpent" in refused["error"]
    assert len(server.seen) == allowed, "the refused call was never sent"
    usage = await ModelBudgets(redis).usage(tenant)
    assert usage is not None and (usage.used, usage.reserved) == (allowed * per_call, 0)
    refusals = {k: v for k, v in totals().calls.items() if k[0] == tenant and k[3] == "refused"}
    assert refusals == {(tenant, "gpt", "-", "refused"): 1}


async def test_a_failed_call_gives_back_what_it_held(server: ModelServer, redis: Redis) -> None:
    """A call answered 503 is retried; the failed attempt counts nothing, so the budget
    holds only what the successful call reported."""
    tenant = _tenant()
    await _budget(redis, tenant, 1000)
    server.answers.append((503, {"error": {"message": "overloaded"}}))
    status, _ = await _run(redis, tenant, _chain(1, 100, retry=True))
    assert status == "Succeeded"
    assert len(server.seen) == 2
    usage = await ModelBudgets(redis).usage(tenant)
    assert usage is not None and (usage.used, usage.reserved) == (3 + 4, 0)


async def test_without_a_budget_model_steps_are_not_limited(
    server: ModelServer, redis: Redis
) -> None:
    tenant = _tenant()
    status, _ = await _run(redis, tenant, _chain(3, 10**6 // 1000))
    assert status == "Succeeded" and len(server.seen) == 3
    assert await redis.exists(keys.tenant_model_tokens(tenant)) == 0
