"""One deadline poll for synchronous tests that wait for a served process's state.

Why this exists: a test driving a control plane in another process or thread (over
HTTP, a browser, the Kubernetes API) can only observe its state; this polls a probe
until it holds and fails naming what it waited for at the deadline. The interval is
not an ordering sleep: nothing depends on when the probe runs, only on it holding.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT = 60.0


def wait_until(
    probe: Callable[[], T | None],
    *,
    within: float = DEFAULT_TIMEOUT,
    what: str,
    interval: float = 0.1,
) -> T:
    """``probe()``'s first truthy value; fails with ``what`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    last = probe()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g}s waiting for {what}; last: {last!r}")
        time.sleep(interval)
        last = probe()
    return last
