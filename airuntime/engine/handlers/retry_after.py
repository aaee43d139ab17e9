"""How long an HTTP server asked a client to wait before trying again.

Why this module exists: a provider that answers 429 or 503 usually says when to come
back (``Retry-After``: seconds or an HTTP date; OpenAI also sends ``retry-after-ms``).
A step retried sooner by its backoff spends an attempt on a refusal it was told about,
so the ``http`` and ``model`` handlers pass the wait on with their
:class:`~airuntime.engine.handlers.TransientError` (``retry_after_s``) and the engine
schedules the retry no earlier.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

__all__ = ["retry_after_s"]


def _seconds(text: str, scale: float) -> float | None:
    try:
        value = float(text) * scale
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def retry_after_s(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The wait the response's headers ask for, in seconds (None: none, or unreadable).

    ``retry-after-ms`` first (the finer one), then ``Retry-After`` as seconds or as an
    HTTP date (a date in the past is 0). ``headers`` is case-insensitive when it is
    httpx's; ``now`` is for tests of the date form."""
    millis = headers.get("retry-after-ms")
    if millis:
        found = _seconds(millis.strip(), 0.001)
        if found is not None:
            return found
    value = headers.get("retry-after")
    if not value:
        return None
    value = value.strip()
    found = _seconds(value, 1.0)
    if found is not None:
        return found
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
