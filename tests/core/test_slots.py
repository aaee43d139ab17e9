"""The hash-slot guard refuses cross-slot script calls and transactions on any server."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from airuntime.core import slots
from airuntime.core.errors import ScriptError
from airuntime.core.keys import CLUSTER_EXECUTION_BUCKETS, ExecutionKeys
from airuntime.core.scripts import library
from airuntime.core.slots import (
    SLOT_CHECK_ENV,
    ensure_single_slot,
    ensure_transaction_slot,
    slot_check_enabled,
    slot_check_from_environment,
    slots_of,
)


@pytest.fixture
def guard_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SLOT_CHECK_ENV, "1")
    monkeypatch.setattr(slots, "_enabled", None)  # read again; restored after the test


def test_the_suite_runs_with_the_guard_on() -> None:
    assert slot_check_enabled()
    assert slot_check_from_environment()


def test_keys_with_one_hash_tag_share_a_slot_and_others_do_not() -> None:
    assert len(slots_of(["air:{q:t1}:pending", "air:{q:t1}:item:sr-1"])) == 1
    assert len(slots_of(["air:{q:t1}:pending", "air:{q:t2}:pending"])) == 2


def test_a_cross_slot_key_list_is_refused_naming_the_call_and_the_slots() -> None:
    with pytest.raises(ScriptError) as refused:
        ensure_single_slot("Lua script 'x'", ["air:{a}:one", "air:{b}:two"])
    text = str(refused.value)
    assert "'x'" in text and "air:{a}:one" in text and "air:{b}:two" in text
    assert "2 hash slots" in text


INDEX = "air:{t}:instances"


async def test_a_cross_slot_script_call_is_refused_before_it_reaches_redis(
    redis: Redis, guard_on: None
) -> None:
    # publishInstance-2 with a descriptor key in another slot than its index: refused,
    # and nothing was written.
    stray = "air:{elsewhere}:instance:i-1"
    with pytest.raises(ScriptError, match="publishInstance"):
        await library().call(redis, "publishInstance", [stray, INDEX], ["i-1", "{}", 1])
    assert await redis.exists(stray, INDEX) == 0
    # The same call with both keys in one slot passes.
    reply = await library().call(
        redis, "publishInstance", ["air:{t}:instance:i-1", INDEX], ["i-1", "{}", 1000]
    )
    assert int(reply[0]) == 1


async def test_call_many_checks_every_call(redis: Redis, guard_on: None) -> None:
    good = (["air:{t}:instance:i-1", INDEX], ["i-1", "{}", 1000])
    bad = (["air:{x}:instance:i-2", INDEX], ["i-2", "{}", 1000])
    with pytest.raises(ScriptError, match="hash slots"):
        await library().call_many(redis, "publishInstance", [good, bad])
    assert await redis.zcard(INDEX) == 0


async def test_a_cross_slot_transaction_is_refused(redis: Redis, guard_on: None) -> None:
    pipe = redis.pipeline(transaction=True)
    pipe.set("air:{a}:x", 1)
    pipe.delete("air:{a}:y", "air:{b}:z")
    with pytest.raises(ScriptError, match="transaction 'demo'"):
        ensure_transaction_slot("demo", pipe)
    ensure_transaction_slot("watched ok", redis.pipeline(transaction=True), "air:{a}:w")
    with pytest.raises(ScriptError, match=r"air:\{c\}:w"):
        ensure_transaction_slot("watched", pipe, "air:{c}:w")


async def test_every_key_of_an_mset_counts_not_its_values(redis: Redis, guard_on: None) -> None:
    same = redis.pipeline(transaction=True)
    same.mset({"air:{a}:x": "air:{b}:value", "air:{a}:y": "air:{c}:value"})
    ensure_transaction_slot("one slot", same)  # the values name other slots: not keys
    split = redis.pipeline(transaction=True)
    split.mset({"air:{a}:x": 1, "air:{b}:y": 2})
    with pytest.raises(ScriptError, match=r"air:\{b\}:y"):
        ensure_transaction_slot("two slots", split)


def test_the_guard_is_off_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SLOT_CHECK_ENV, "0")
    monkeypatch.setattr(slots, "_enabled", None)  # a process that starts like this
    pipe_keys = ["air:{a}:x", "air:{b}:y"]
    assert not slot_check_enabled()
    library().checked("publishInstance", pipe_keys)  # not refused: the check is off
    monkeypatch.delenv(SLOT_CHECK_ENV)
    assert not slot_check_from_environment()


def test_the_variable_is_read_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read at the first check, then kept: a later change of the environment does not
    turn the guard off in the middle of a process."""
    monkeypatch.setattr(slots, "_enabled", None)
    assert slot_check_enabled()
    monkeypatch.setenv(SLOT_CHECK_ENV, "0")
    assert slot_check_enabled()
    with pytest.raises(ScriptError):
        library().checked("publishInstance", ["air:{a}:x", "air:{b}:y"])


def test_execution_scripts_are_checked_in_the_bucket_layout_only() -> None:
    """The standalone one-bucket layout keeps the pre-cluster key names (cross-slot by
    design, never on a cluster); the bucket layout of a cluster is checked like any
    script -- a bucket key of another execution is refused."""
    lib = library()
    standalone = ExecutionKeys("ex-1").for_script(23)
    assert len(slots_of(standalone)) > 1
    lib.checked("completeSteps", standalone)  # exempt: a standalone server's layout
    clustered = ExecutionKeys("ex-1", buckets=CLUSTER_EXECUTION_BUCKETS).for_script(23)
    lib.checked("completeSteps", clustered)  # one slot
    other = ExecutionKeys("ex-2", buckets=CLUSTER_EXECUTION_BUCKETS)
    assert other.bucket != ExecutionKeys("ex-1", buckets=CLUSTER_EXECUTION_BUCKETS).bucket
    with pytest.raises(ScriptError, match="completeSteps"):
        lib.checked("completeSteps", [*clustered[:-1], other.for_script(23)[-1]])
