"""Supervised loops: a failing loop is restarted with backoff, reported unhealthy until
it succeeds again, counted, and stopped for good only by the supervisor."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airuntime.core.supervision import Backoff, LoopContext, LoopState, Supervisor

FAST = Backoff(initial=0.001, maximum=0.005)


async def test_a_failing_loop_is_restarted_and_healthy_again_after_an_ok() -> None:
    attempts = 0
    failing = asyncio.Event()
    release = asyncio.Event()
    errors: list[tuple[str, str]] = []

    async def loop(ctx: LoopContext) -> None:
        nonlocal attempts
        attempts += 1
        if attempts <= 3:
            failing.set()
            raise ConnectionError(f"redis down ({attempts})")
        ctx.ok()
        await release.wait()

    sup = Supervisor("test", backoff=FAST, on_error=lambda n, e: errors.append((n, str(e))))
    sup.start("pump", loop)
    await failing.wait()
    assert sup.unhealthy() == ["pump"]
    await asyncio.wait_for(sup.wait_ok("pump"), 5)
    health = sup.loops["pump"]
    assert health.healthy and health.state is LoopState.RUNNING
    assert health.errors == 3 and health.restarts == 3 and health.consecutive_errors == 0
    assert errors == [("pump", f"redis down ({i})") for i in (1, 2, 3)]
    assert sup.unhealthy() == []
    assert sup.report()["pump"]["last_error"] == "ConnectionError: redis down (3)"
    await sup.stop()
    assert health.state is LoopState.STOPPED and not health.healthy


async def test_a_loop_failing_through_an_outage_of_any_length_is_restarted_until_it_recovers() -> (
    None
):
    # 3,000 failures in a row: the supervisor's backoff overflowed a float at the
    # 1,025th (~20 minutes of a Redis outage at the 2 s cap), and the OverflowError,
    # raised in the supervisor itself, ended the loop for good. No delay here.
    attempts = 0

    async def loop(ctx: LoopContext) -> None:
        nonlocal attempts
        attempts += 1
        if attempts <= 3000:
            raise ConnectionError("redis down")
        ctx.ok()
        await asyncio.Event().wait()

    sup = Supervisor("test", backoff=Backoff(initial=0.0, maximum=0.0))
    task = sup.start("pump", loop)
    await asyncio.wait_for(sup.wait_ok("pump"), 30)
    assert not task.done()
    health = sup.loops["pump"]
    assert health.healthy and health.errors == 3000 and health.restarts == 3000
    await sup.stop()


async def test_a_loop_that_returns_is_started_again() -> None:
    runs = 0
    third = asyncio.Event()

    async def loop(ctx: LoopContext) -> None:
        nonlocal runs
        runs += 1
        ctx.ok()
        if runs == 3:
            third.set()
            await asyncio.Event().wait()

    sup = Supervisor("test", backoff=FAST)
    sup.start("heartbeat", loop)
    await asyncio.wait_for(third.wait(), 5)
    assert sup.loops["heartbeat"].restarts == 2
    assert "returned" in (sup.loops["heartbeat"].last_error or "")
    await sup.stop()


async def test_stop_cancels_every_loop_and_a_name_is_unique_while_running() -> None:
    started = [asyncio.Event() for _ in range(5)]
    cancelled: list[int] = []

    def make(i: int):  # type: ignore[no-untyped-def]
        async def loop(ctx: LoopContext) -> None:
            ctx.ok()
            started[i].set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(i)
                raise

        return loop

    sup = Supervisor("test", backoff=FAST)
    for i in range(5):
        sup.start(f"loop-{i}", make(i))
    await asyncio.gather(*(e.wait() for e in started))
    with pytest.raises(ValueError, match="already running"):
        sup.start("loop-0", make(0))
    await sup.stop()
    assert sorted(cancelled) == list(range(5))


async def _read_that_swallows_a_cancellation(swallowed: asyncio.Event) -> None:
    """What a Redis client that retries a read whose cancellation surfaced as a timeout
    does: the cancellation is lost and the call returns as if nothing happened."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        swallowed.set()


@pytest.mark.parametrize("failing", [False, True], ids=["returns", "raises"])
async def test_stop_ends_loops_whose_cancellation_a_call_swallowed(failing: bool) -> None:
    """A loop (and each of its TaskGroup children, which a TaskGroup cancels only once)
    ends on stop although the call it was in swallowed the cancellation: returning from
    it (``ctx.ok()`` checks) or failing with a connection error (the supervisor checks)."""
    children = 4
    reading = asyncio.Barrier(children + 1)
    swallowed = [asyncio.Event() for _ in range(children)]
    turns = [0] * children

    async def follow(i: int, ctx: LoopContext) -> None:
        while True:
            turns[i] += 1
            if turns[i] == 1:
                await reading.wait()
            await _read_that_swallows_a_cancellation(swallowed[i])
            if failing and swallowed[i].is_set():
                raise ConnectionError("the read's connection was closed under it")
            ctx.ok()

    async def loop(ctx: LoopContext) -> None:
        async with asyncio.TaskGroup() as group:
            for i in range(children):
                group.create_task(follow(i, ctx))

    sup = Supervisor("test", backoff=FAST)
    sup.start("outcomes", loop)
    await reading.wait()
    await asyncio.wait_for(sup.stop(), 10)
    assert all(e.is_set() for e in swallowed)  # every child lost a cancellation...
    assert turns == [1] * children  # ...and none read again after it
    assert sup.loops["outcomes"].state is LoopState.STOPPED


@given(
    # Up to a year of failures a second: an outage of any length (2.0 ** 1024 and up
    # overflow a float).
    failures=st.integers(min_value=1, max_value=31_536_000),
    initial=st.floats(min_value=0.001, max_value=1.0),
    maximum=st.floats(min_value=0.001, max_value=30.0),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_backoff_stays_between_its_bounds(
    failures: int, initial: float, maximum: float, seed: int
) -> None:
    backoff = Backoff(initial=initial, maximum=maximum)
    delay = backoff.delay(failures, random.Random(seed))
    assert initial <= delay <= max(initial, maximum)


def test_backoff_grows_until_its_cap() -> None:
    backoff = Backoff(initial=0.1, maximum=1.6)
    rng = random.Random(7)
    ceilings = [max(backoff.delay(n, rng) for _ in range(2000)) for n in (1, 2, 3, 4, 5, 6)]
    assert ceilings[0] == pytest.approx(0.1)
    assert ceilings[1] == pytest.approx(0.2, rel=0.02)
    assert ceilings[3] == pytest.approx(0.8, rel=0.02)
    assert ceilings[5] == pytest.approx(1.6, rel=0.02)
