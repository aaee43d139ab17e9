"""Stopping asyncio tasks reliably.

redis-py can swallow a cancellation that lands inside a command: the task then
carries on (back to its loop) instead of ending, so one ``cancel()`` followed by
``gather`` may wait forever. :func:`cancel_and_wait` cancels again until every
task has really ended. Every stop path of airuntime uses it.
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
