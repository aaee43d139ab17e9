"""What a handler's StepContext offers for idempotency and for noticing a cancel, from
the event loop and from a handler thread."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from airuntime.engine.handlers import StepCancelled, StepContext, invoke


def ctx(attempt: int = 1) -> StepContext:
    return StepContext(
        execution_id="ex-1", step_id="s", attempt=attempt, inputs={}, pipeline_id="p"
    )


def test_the_idempotency_key_names_execution_step_and_attempt() -> None:
    assert ctx().idempotency_key == "ex-1:s:1"
    assert ctx(attempt=2).idempotency_key == "ex-1:s:2"


async def test_a_sync_handler_thread_sees_the_cancel() -> None:
    c = ctx()
    waiting = threading.Event()

    def handler(context: StepContext) -> str:
        waiting.set()
        if context.wait_cancelled(30):
            raise StepCancelled("told")
        return "ran to the end"

    task = asyncio.create_task(invoke(handler, c))
    await asyncio.to_thread(waiting.wait)
    assert c.mark_cancelled() is True, "a thread is running the handler"
    with pytest.raises(StepCancelled, match="told"):
        await task
    assert c.is_cancelled() and c.cancelled.is_set()


async def test_a_sync_handler_still_queued_for_a_thread_is_withdrawn() -> None:
    release = threading.Event()
    ran: list[str] = []
    executor = ThreadPoolExecutor(max_workers=1)
    try:
        blocker = asyncio.get_running_loop().run_in_executor(executor, release.wait)
        c = ctx()
        task = asyncio.create_task(invoke(lambda context: ran.append("ran"), c, executor))
        await asyncio.sleep(0)  # the handler is submitted and waits behind the blocker
        assert c.mark_cancelled() is False, "nothing runs it: the caller cancels the task"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        await blocker
    finally:
        executor.shutdown(wait=True)
    assert ran == []


async def test_an_async_handler_is_left_to_its_task() -> None:
    c = ctx()
    assert c.mark_cancelled() is False
    assert c.is_cancelled() and c.wait_cancelled(0)


async def test_an_async_handler_waiting_on_cancelled_is_woken() -> None:
    # The event is made when first asked for: before the cancel it wakes its waiter,
    # after the cancel it is made already set.
    c = ctx()
    started = asyncio.Event()

    async def handler(context: StepContext) -> str:
        started.set()
        await context.cancelled.wait()
        return "stopped when told"

    task = asyncio.create_task(invoke(handler, c))
    await started.wait()
    assert c.mark_cancelled() is False, "no thread: an async handler"
    assert await task == "stopped when told"
    late = ctx()
    late.mark_cancelled()
    assert late.cancelled.is_set()
