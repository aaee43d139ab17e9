"""Which tasks a piece of code starts: a task factory that records each task's coroutine."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterator
from typing import Any


@contextlib.contextmanager
def tasks_started() -> Iterator[list[str]]:
    """The qualified names of the coroutines of the tasks started on the running loop
    while the block runs."""
    loop = asyncio.get_running_loop()
    made: list[str] = []

    def counting_factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kw: Any
    ) -> asyncio.Task[Any]:
        made.append(getattr(coro, "__qualname__", repr(coro)))
        return asyncio.Task(coro, loop=loop, **kw)

    loop.set_task_factory(counting_factory)  # type: ignore[arg-type]
    try:
        yield made
    finally:
        loop.set_task_factory(None)
