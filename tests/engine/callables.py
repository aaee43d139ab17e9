"""Callables for the ``python`` handler tests: the module the tests allow
(``AIRUNTIME_PYTHON_HANDLER_MODULES=tests.engine.callables``)."""

from __future__ import annotations

import asyncio
import os  # noqa: F401  (reachable by name: the policy must refuse walking into it)
import threading
from json import dumps  # noqa: F401  (defined elsewhere: the policy must refuse it)
from typing import Any

from airuntime.engine.handlers import current_step


def thread_name(prefix: str) -> str:
    return f"{prefix}{threading.current_thread().name}"


async def async_add(a: int, b: int) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"sum": a + b, "thread": threading.current_thread().name}


def add(a: int, b: int) -> int:
    return a + b


class Tools:
    """A class whose methods are reached through a dotted attribute path."""

    @staticmethod
    def double(x: int) -> int:
        return 2 * x


NOT_CALLABLE = 42


def step_key() -> str | None:
    """The running step's idempotency key, read in the handler's thread."""
    step = current_step()
    return None if step is None else step.idempotency_key


async def async_step_key() -> str | None:
    """The running step's idempotency key, read on the loop."""
    step = current_step()
    return None if step is None else step.idempotency_key
