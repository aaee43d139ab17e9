"""Retry backoff that every worker computes identically.

The delay before the next attempt of a step is a pure function of the step's
:class:`~airuntime.engine.pipeline.RetryPolicy`, the attempt that just failed, and the execution and
step ids.  Jitter is derived from a hash of those ids instead of ``random`` so that replays,
tests and any worker in any process agree on when a step becomes ready again.
"""

from __future__ import annotations

import hashlib

from airuntime.engine.pipeline import RetryPolicy

__all__ = ["jitter_fraction", "retry_delay_s", "should_retry"]

_TWO_53 = float(1 << 53)


def jitter_fraction(execution_id: str, step_id: str, attempt: int) -> float:
    """A deterministic number in ``[0, 1)``: ``sha256(f"{execution_id}:{step_id}:{attempt}")``."""
    digest = hashlib.sha256(f"{execution_id}:{step_id}:{attempt}".encode()).digest()
    # top 53 bits: every value is exactly representable and strictly below 1.0
    return (int.from_bytes(digest[:8], "big") >> 11) / _TWO_53


def _base_delay(policy: RetryPolicy, attempt: int) -> float:
    """``min(backoff_max_s, initial * multiplier ** (attempt - 1))`` without overflowing."""
    initial, cap = policy.backoff_initial_s, policy.backoff_max_s
    if initial == 0.0:
        return 0.0
    try:
        grown = initial * policy.backoff_multiplier ** (attempt - 1)
    except OverflowError:
        return cap
    return min(cap, grown)


def retry_delay_s(policy: RetryPolicy, attempt: int, execution_id: str, step_id: str) -> float:
    """Seconds to wait before retrying after 1-based ``attempt`` failed.

    ``min(backoff_max_s, backoff_initial_s * backoff_multiplier ** (attempt - 1))`` scaled by
    ``1 + jitter * u`` with ``u = jitter_fraction(execution_id, step_id, attempt)``; the result
    is never above ``backoff_max_s * (1 + jitter)``.
    """
    if attempt < 1:
        raise ValueError(f"attempt: must be >= 1 (value={attempt})")
    base = _base_delay(policy, attempt)
    u = jitter_fraction(execution_id, step_id, attempt)
    delay = base * (1.0 + policy.jitter * u)
    return min(delay, policy.backoff_max_s * (1.0 + policy.jitter))


def should_retry(policy: RetryPolicy, attempt: int) -> bool:
    """True when another attempt is allowed after 1-based ``attempt`` failed."""
    return attempt < policy.max_attempts
