"""Stopping asyncio tasks reliably.

redis-py can swallow a cancellation that lands inside a command: the task then
carries on (back to its loop) instead of ending, so one ``cancel()`` followed by
``gather`` may wait forever. :func:`cancel_and_wait` cancels again until every
task has really ended. Every stop path of airuntime uses it.

Cancelling again does not reach every task, though: a ``TaskGroup`` passes the first
cancellation of its parent to its children and no later one, so a child loop whose
cancellation a Redis call swallowed reads forever and its parent waits for it forever
(seen with the outcome reader's per-bucket readers on a cluster). Loops therefore check
:func:`raise_if_cancelling` at each turn (supervised loops in ``LoopContext.ok`` and
after a failure, retry loops before each retry): a cancellation asked for stays asked
for (``Task.cancelling()``) even when its ``CancelledError`` was swallowed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]], *, retry_s: float = 0.5) -> None:
    """Cancel ``tasks`` and return once every one has ended (their outcomes retrieved)."""
    tasks = list(tasks)
    pending = {t for t in tasks if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=retry_s)
    await asyncio.gather(*tasks, return_exceptions=True)


def raise_if_cancelling() -> None:
    """Raise ``CancelledError`` when the current task was asked to stop and is still
    running: its ``CancelledError`` was swallowed on the way (see the module doc)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError("cancelled (the cancellation was swallowed on the way)")
