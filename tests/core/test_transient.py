"""Retrying through transient Redis errors: until success, another error, or the deadline."""

from __future__ import annotations

import asyncio
import random

import pytest
from redis import exceptions as redis_errors

from airuntime.core.keys import EXECUTION_KEY_SUFFIXES, execution_keys
from airuntime.core.supervision import Backoff
from airuntime.core.transient import is_transient, retry_transient

FAST = Backoff(initial=0.001, maximum=0.004)


class Flaky:
    """Raises ``errors`` one by one, then returns ``value``."""

    def __init__(self, errors: list[BaseException], value: str = "done") -> None:
        self.errors = list(errors)
        self.calls = 0
        self.value = value

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.value


async def test_transient_errors_are_retried_until_the_call_succeeds() -> None:
    seen: list[BaseException] = []
    call = Flaky(
        [
            redis_errors.ConnectionError("refused"),
            redis_errors.BusyLoadingError("loading"),
            redis_errors.TimeoutError("slow"),
            redis_errors.ReadOnlyError("replica"),
        ]
    )
    result = await retry_transient(
        call, what="t", backoff=FAST, on_error=seen.append, rng=random.Random(1)
    )
    assert result == "done" and call.calls == 5 and len(seen) == 4


async def test_an_outage_of_any_length_is_waited_out() -> None:
    # 3,000 failures in a row: the backoff's factor ** n overflowed a float at the
    # 1,025th (an outage of ~20 minutes at the usual 2 s cap) and the retry raised
    # OverflowError instead of waiting. No delay here: the count is what matters.
    call = Flaky([redis_errors.ConnectionError("refused")] * 3000)
    result = await retry_transient(call, what="t", backoff=Backoff(initial=0.0, maximum=0.0))
    assert result == "done" and call.calls == 3001


async def test_cluster_errors_are_waited_out_and_the_recovery_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The runtime's participations use this loop too (they had their own, which did
    not know the cluster's errors and failed a run during a failover)."""
    call = Flaky(
        [
            redis_errors.ClusterDownError("CLUSTERDOWN"),
            redis_errors.TryAgainError("TRYAGAIN"),
            redis_errors.SlotNotCoveredError("slot"),
        ]
    )
    with caplog.at_level("WARNING", logger="airuntime.core.transient"):
        assert await retry_transient(call, what="run r-1: finishing", backoff=FAST) == "done"
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("run r-1: finishing failed (CLUSTERDOWN)")
    assert lines[-1] == "run r-1: finishing: Redis back after 3 failed attempts"


async def test_other_errors_propagate_at_once() -> None:
    call = Flaky([redis_errors.ResponseError("WRONGTYPE"), redis_errors.ConnectionError("x")])
    with pytest.raises(redis_errors.ResponseError):
        await retry_transient(call, what="t", backoff=FAST)
    assert call.calls == 1


async def test_no_attempt_starts_after_the_deadline() -> None:
    loop = asyncio.get_running_loop()
    call = Flaky([redis_errors.ConnectionError(str(i)) for i in range(1000)])
    with pytest.raises(redis_errors.ConnectionError):
        await retry_transient(call, what="t", backoff=FAST, deadline=loop.time() + 0.05)
    assert 1 < call.calls < 1000


def test_what_counts_as_transient() -> None:
    assert is_transient(redis_errors.ConnectionError()) and is_transient(ConnectionResetError())
    assert not is_transient(redis_errors.ResponseError()) and not is_transient(ValueError())


def test_execution_scripts_get_their_keys_then_the_indexes() -> None:
    keys = execution_keys("E")
    n = len(EXECUTION_KEY_SUFFIXES)
    assert keys.for_script(n) == keys.all()
    assert keys.for_script(n + 1)[n:] == ["air:executions:active"]
    assert keys.for_script(n + 2)[n:] == ["air:executions:active", "air:archive:outbox"]
    assert keys.for_script(n + 3)[n:] == [
        "air:executions:active",
        "air:archive:outbox",
        "air:executions",
    ]
    assert keys.for_script(n + 4)[n + 3 :] == ["air:early-cancels"]
    with pytest.raises(ValueError, match="26"):
        keys.for_script(n + 5)
