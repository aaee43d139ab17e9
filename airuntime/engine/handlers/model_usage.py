"""What the model calls of this process cost, per tenant, provider and model: for metrics.

Why this module exists: a platform that lends its provider keys to tenants needs to see
who spends them (a run's report totals one run; Prometheus totals the fleet). The
``model`` handler records each call here, in the process that made it; a runtime host
exposes the totals on ``/metrics`` (``airuntime_model_calls_total``,
``airuntime_model_tokens_total``, :mod:`runtime_pod.metrics`). Totals only ever grow
(Prometheus counters), under a lock: sync handlers' threads and the event loop share
the process.

The ``model`` label is the model the provider reported in a successful reply (what it
bills); a failed call is counted under ``-``, so a tenant naming made-up models (a
provider that serves any model refuses them) cannot grow the label set.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["CallOutcome", "UsageTotals", "record_call", "token_count", "totals"]


class CallOutcome(StrEnum):
    OK = "ok"
    RETRIED = "retried"
    """Failed in a way the step's retry policy may retry (network, 429, 5xx, ...)."""
    FAILED = "failed"
    REFUSED = "refused"
    """Not made: the tenant's model token budget had no room for it."""


@dataclass(frozen=True, slots=True)
class UsageTotals:
    calls: dict[tuple[str, str, str, str], int]
    """(tenant, provider, model, outcome) -> calls."""
    tokens: dict[tuple[str, str, str, str], int]
    """(tenant, provider, model, direction: input | output) -> tokens."""


def token_count(value: Any) -> int:
    """A token count as a provider reported it, or 0 when it reported none that reads
    as one (absent, negative, not an integer)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


_LOCK = threading.Lock()
_CALLS: Counter[tuple[str, str, str, str]] = Counter()
_TOKENS: Counter[tuple[str, str, str, str]] = Counter()


def record_call(
    tenant: str | None,
    provider: str,
    model: str | None,
    outcome: CallOutcome,
    input_tokens: int = 0,
    output_tokens: int = 0,
) -> None:
    """Count one call (``model``: as the provider reported it; None for a failed call)."""
    who = tenant or "-"
    which = model if outcome is CallOutcome.OK and model else "-"
    with _LOCK:
        _CALLS[who, provider, which, outcome.value] += 1
        if input_tokens > 0:
            _TOKENS[who, provider, which, "input"] += input_tokens
        if output_tokens > 0:
            _TOKENS[who, provider, which, "output"] += output_tokens


def totals() -> UsageTotals:
    """A copy of the totals so far."""
    with _LOCK:
        return UsageTotals(dict(_CALLS), dict(_TOKENS))
