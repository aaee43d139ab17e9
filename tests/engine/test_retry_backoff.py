"""Deterministic retry backoff."""

from __future__ import annotations

import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airuntime.engine.pipeline import RetryPolicy
from airuntime.engine.retry import jitter_fraction, retry_delay_s, should_retry


@pytest.mark.parametrize(
    ("policy", "delays"),
    [
        pytest.param(
            RetryPolicy(max_attempts=6), [1.0, 2.0, 4.0, 8.0, 16.0, 32.0], id="doubling from 1 s"
        ),
        pytest.param(
            RetryPolicy(backoff_initial_s=0.5, backoff_multiplier=3.0, backoff_max_s=5.0),
            [0.5, 1.5, 4.5, 5.0, 5.0],
            id="capped at backoff_max_s",
        ),
        pytest.param(RetryPolicy(backoff_multiplier=1.0), [1.0, 1.0, 1.0], id="a constant delay"),
        pytest.param(RetryPolicy(backoff_initial_s=0.0), [0.0, 0.0], id="no delay at all"),
    ],
)
def test_delays_without_jitter_follow_the_formula(policy: RetryPolicy, delays: list[float]) -> None:
    got = [retry_delay_s(policy, attempt, "exec", "step") for attempt in range(1, len(delays) + 1)]
    assert got == pytest.approx(delays)


def test_the_same_arguments_always_give_the_same_delay() -> None:
    policy = RetryPolicy(max_attempts=5, jitter=0.5)
    first = [retry_delay_s(policy, a, "e-1", "s") for a in range(1, 6)]
    random.seed(12345)  # the global random state must not matter
    random.random()
    assert [retry_delay_s(policy, a, "e-1", "s") for a in range(1, 6)] == first


def test_jitter_is_not_random_module_based(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*_: object) -> float:
        raise AssertionError("retry_delay_s must not use the random module")

    monkeypatch.setattr(random, "random", forbidden)
    monkeypatch.setattr(random, "uniform", forbidden)
    retry_delay_s(RetryPolicy(jitter=1.0), 1, "e", "s")


def test_jitter_fraction_is_the_documented_hash() -> None:
    import hashlib

    digest = hashlib.sha256(b"exec-7:fetch:3").digest()
    expected = (int.from_bytes(digest[:8], "big") >> 11) / 2**53
    assert jitter_fraction("exec-7", "fetch", 3) == expected
    policy = RetryPolicy(backoff_initial_s=2.0, backoff_multiplier=1.0, jitter=0.5)
    assert retry_delay_s(policy, 3, "exec-7", "fetch") == pytest.approx(2.0 * (1 + 0.5 * expected))


def test_jitter_differs_between_executions_steps_and_attempts() -> None:
    policy = RetryPolicy(backoff_multiplier=1.0, jitter=1.0)
    delays = {
        retry_delay_s(policy, attempt, execution, step)
        for execution in ("e1", "e2", "e3")
        for step in ("a", "b", "c")
        for attempt in (1, 2, 3)
    }
    assert len(delays) == 27


def test_jitter_fractions_spread_over_the_unit_interval() -> None:
    samples = [jitter_fraction("exec", f"step-{i}", 1) for i in range(4000)]
    assert 0.47 < statistics.fmean(samples) < 0.53
    assert min(samples) < 0.01 and max(samples) > 0.99


POLICIES = st.builds(
    lambda initial, multiplier, extra, jitter, attempts: RetryPolicy(
        max_attempts=attempts,
        backoff_initial_s=initial,
        backoff_multiplier=multiplier,
        backoff_max_s=initial + extra,
        jitter=jitter,
    ),
    st.floats(min_value=0, max_value=1e6),
    st.floats(min_value=1, max_value=1e6),
    st.floats(min_value=0, max_value=1e6),
    st.floats(min_value=0, max_value=1),
    st.integers(min_value=1, max_value=100),
)
IDS = st.text(min_size=1, max_size=40)


@given(POLICIES, st.integers(min_value=1, max_value=100), IDS, IDS)
def test_the_delay_stays_within_bounds(
    policy: RetryPolicy, attempt: int, eid: str, sid: str
) -> None:
    delay = retry_delay_s(policy, attempt, eid, sid)
    try:
        grown = policy.backoff_initial_s * policy.backoff_multiplier ** (attempt - 1)
    except OverflowError:  # 0 * huge is still 0
        grown = float("inf") if policy.backoff_initial_s > 0 else 0.0
    base = min(policy.backoff_max_s, grown)
    assert 0.0 <= delay <= policy.backoff_max_s * (1 + policy.jitter)
    assert delay >= base * (1 - 1e-12)
    assert delay <= base * (1 + policy.jitter) * (1 + 1e-12)
    assert delay == retry_delay_s(policy, attempt, eid, sid)


@given(POLICIES.map(lambda p: p.model_copy(update={"jitter": 0.0})), IDS)
def test_without_jitter_the_delay_never_decreases(policy: RetryPolicy, eid: str) -> None:
    delays = [retry_delay_s(policy, a, eid, "s") for a in range(1, 40)]
    assert delays == sorted(delays)


@given(st.text(), st.text(), st.integers(min_value=1, max_value=10**6))
def test_jitter_fraction_is_in_the_half_open_unit_interval(
    eid: str, sid: str, attempt: int
) -> None:
    assert 0.0 <= jitter_fraction(eid, sid, attempt) < 1.0


def test_huge_growth_does_not_overflow() -> None:
    policy = RetryPolicy(
        max_attempts=100,
        backoff_initial_s=1e300,
        backoff_multiplier=1e300,
        backoff_max_s=1e301,
        jitter=1.0,
    )
    assert retry_delay_s(policy, 100, "e", "s") <= 2e301


@pytest.mark.parametrize("attempt", [pytest.param(0, id="zero"), pytest.param(-1, id="negative")])
def test_attempts_are_one_based(attempt: int) -> None:
    with pytest.raises(ValueError, match=f"attempt: must be >= 1 \\(value={attempt}\\)"):
        retry_delay_s(RetryPolicy(), attempt, "e", "s")


@pytest.mark.parametrize(
    ("max_attempts", "failed_attempt", "expected"),
    [
        pytest.param(1, 1, False, id="a single attempt is never retried"),
        pytest.param(4, 3, True, id="the third of four attempts is retried"),
        pytest.param(4, 4, False, id="the last attempt is not retried"),
    ],
)
def test_should_retry(max_attempts: int, failed_attempt: int, expected: bool) -> None:
    assert should_retry(RetryPolicy(max_attempts=max_attempts), failed_attempt) is expected
