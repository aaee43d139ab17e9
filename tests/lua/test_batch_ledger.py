"""One ledger entry per claim batch and per completion batch, read back per step.

On the embedded Valkey, Debian's redis-server 7 and a 3-shard Valkey Cluster
(``engine_redis``): the raw stream holds one ``steps_claimed`` / ``steps_completed``
entry per batch whose lists carry every step's attempt, worker and token;
:meth:`ExecutionStore.events` and the run trace read them per step. The per-step
reader itself refuses malformed batch entries naming the field.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from airuntime.control_plane.run_ledger import LedgerEntry, LedgerReader
from airuntime.control_plane.run_material import ExecutionMaterial, Source
from airuntime.control_plane.run_trace import build_trace
from airuntime.core.execution_layout import execution_keys_for
from airuntime.core.redis_client import RedisClient
from airuntime.core.reply_text import reply_text
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.ledger_batches import BatchEntryError, per_step
from tests.dags import plan_of


@pytest.fixture
def store(engine_redis: RedisClient) -> ExecutionStore:
    return ExecutionStore(engine_redis)


async def _raw(redis: RedisClient, eid: str) -> list[tuple[str, dict[str, str]]]:
    reply: Any = await redis.xrange(execution_keys_for(redis, eid).events)
    return [(reply_text(i), {reply_text(k): reply_text(v) for k, v in f.items()}) for i, f in reply]


async def _two_steps_run(store: ExecutionStore) -> tuple[str, list[LedgerEntry]]:
    """Steps ``a`` and ``b`` claimed by ``pool-9`` in one batch and completed by its
    slot ``w3`` in one batch; the execution and its ledger as the API reads it."""
    eid = await store.create(plan_of({"a": [], "b": []}))
    claims = (await store.claim(eid, "pool-9", 5, 30_000)).claims
    await store.complete(eid, "pool-9", [(c.step_id, c.token, "pool-9/w3", "null") for c in claims])
    return eid, await LedgerReader(store.redis, None).all(eid, "")


def _material(eid: str) -> ExecutionMaterial:
    """The execution as the views see it, for the trace of steps ``a`` and ``b``."""
    return ExecutionMaterial(
        execution_id=eid,
        tenant_id="",
        pipeline_id="t",
        status="Succeeded",
        created_at_ms=0,
        started_at_ms=None,
        finished_at_ms=None,
        counts={},
        plan={"steps": [{"id": "a", "deps": []}, {"id": "b", "deps": []}]},
        inputs={},
        context={},
        steps={},
        snapshot=None,
        source=Source.HOT,
    )


async def test_a_claim_batch_and_a_completion_batch_are_one_entry_each(
    store: ExecutionStore, engine_redis: RedisClient
) -> None:
    eid = await store.create(plan_of({"a": [], "b": [], "c": [], "d": ["a", "b", "c"]}))
    batch = await store.claim(eid, "pool-1", 10, 30_000)
    assert [c.step_id for c in batch.claims] == ["a", "b", "c"]
    raw = await _raw(engine_redis, eid)
    claimed = [f for _, f in raw if f["type"] == "steps_claimed"]
    assert len(claimed) == 1 and not [f for _, f in raw if f["type"] == "step_claimed"]
    entry = claimed[0]
    assert entry["worker"] == "pool-1"
    assert json.loads(entry["steps"]) == ["a", "b", "c"]
    assert json.loads(entry["tokens"]) == [c.token for c in batch.claims]
    assert json.loads(entry["attempts"]) == ["1", "1", "1"]

    # Two accepted (by different slots), one stale token: the accepted share one
    # entry, the rejected gets its own.
    a, b, _ = batch.claims
    result = await store.complete(
        eid,
        "pool-1",
        [
            ("a", a.token, "pool-1/w0", "1"),
            ("b", b.token, "pool-1/w1", "2"),
            ("c", "pool-1#999", "pool-1/w2", "3"),
        ],
    )
    assert result.codes == [1, 1, -3]
    raw = await _raw(engine_redis, eid)
    completed = [f for _, f in raw if f["type"] == "steps_completed"]
    assert len(completed) == 1 and not [f for _, f in raw if f["type"] == "step_completed"]
    assert json.loads(completed[0]["steps"]) == ["a", "b"]
    assert json.loads(completed[0]["workers"]) == ["pool-1/w0", "pool-1/w1"]
    assert json.loads(completed[0]["tokens"]) == [a.token, b.token]
    rejected = [f for _, f in raw if f["type"] == "completion_rejected"]
    assert [(f["step"], f["code"]) for f in rejected] == [("c", "-3")]

    # Read per step: one view per step, in batch order, sharing the batch's entry id.
    events = await store.events(eid)
    claims = [e for e in events if e.type == "step_claimed"]
    assert [(e.get("step"), e.get("worker"), e.get("token"), e.get("attempt")) for e in claims] == [
        (c.step_id, "pool-1", c.token, "1") for c in batch.claims
    ]
    assert len({e.id for e in claims}) == 1
    done = [e for e in events if e.type == "step_completed"]
    assert [(e.get("step"), e.get("worker")) for e in done] == [
        ("a", "pool-1/w0"),
        ("b", "pool-1/w1"),
    ]
    assert "steps_claimed" not in {e.type for e in events}


async def test_the_claim_that_follows_a_completion_is_its_own_batch_entry(
    store: ExecutionStore, engine_redis: RedisClient
) -> None:
    eid = await store.create(plan_of({"a": [], "b": ["a"], "c": ["a"]}))
    (a,) = (await store.claim(eid, "p", 5, 30_000)).claims
    result = await store.complete(eid, "p", [("a", a.token, "p/w0", "null")], claim_next=5)
    assert sorted(c.step_id for c in result.claims) == ["b", "c"]
    types = [f["type"] for _, f in await _raw(engine_redis, eid)]
    assert types == ["execution_created", "steps_claimed", "steps_completed", "steps_claimed"]
    views = [(e.type, e.get("step")) for e in await store.events(eid)]
    assert views[1:] == [
        ("step_claimed", "a"),
        ("step_completed", "a"),
        *[("step_claimed", c.step_id) for c in result.claims],
    ]


async def test_a_retried_step_claimed_again_carries_its_new_attempt(
    store: ExecutionStore,
) -> None:
    eid = await store.create(plan_of({"a": []}, steps={"a": {"retry": {"max_attempts": 2}}}))
    (first,) = (await store.claim(eid, "p", 1, 30_000)).claims
    await store.fail(eid, "p/w0", "a", first.token, "boom", retryable=True, delay_ms=0)
    (second,) = (await store.claim(eid, "p", 1, 30_000)).claims
    claims = [e for e in await store.events(eid) if e.type == "step_claimed"]
    assert [(e.get("attempt"), e.get("token")) for e in claims] == [
        ("1", first.token),
        ("2", second.token),
    ]


async def test_the_run_trace_reads_batch_entries_per_step(store: ExecutionStore) -> None:
    eid, ledger = await _two_steps_run(store)
    rows = {r["step"]: r for r in build_trace(_material(eid), ledger)["steps"]}
    for step in ("a", "b"):
        (attempt,) = rows[step]["attempts"]
        assert attempt["worker"] == "pool-9"
        assert attempt["outcome"] == "completed"
        assert attempt["ended_at_ms"] >= attempt["claimed_at_ms"] == rows[step]["start_ms"]


async def test_a_damaged_batch_entry_costs_the_trace_its_steps_not_the_trace(
    store: ExecutionStore, caplog: pytest.LogCaptureFixture
) -> None:
    eid, ledger = await _two_steps_run(store)
    damaged = next(e for e in ledger if e.type == "steps_claimed")
    damaged.fields["tokens"] = "not json"
    with caplog.at_level("WARNING", logger="airuntime.control_plane.run_trace"):
        rows = {r["step"]: r for r in build_trace(_material(eid), ledger)["steps"]}
    assert rows["a"]["attempts"] == [] and rows["b"]["attempts"] == []
    assert f"ledger entry {damaged.entry_id} (seq {damaged.seq}) left out" in caplog.text
    assert "'tokens' is not JSON" in caplog.text


def test_other_entries_pass_through_unchanged() -> None:
    fields = {"type": "step_failed", "step": "a", "error": "x"}
    assert list(per_step("step_failed", fields)) == [("step_failed", fields)]


def test_a_worker_id_with_any_character_survives() -> None:
    worker = 'host,"odd":1/w0'
    fields = {
        "type": "steps_completed",
        "steps": json.dumps(["a", "b"]),
        "attempts": json.dumps(["1", "3"]),
        "workers": json.dumps([worker, "w"]),
        "tokens": json.dumps(["t#1", "t#2"]),
    }
    assert list(per_step("steps_completed", fields)) == [
        (
            "step_completed",
            {
                "type": "step_completed",
                "step": "a",
                "attempt": "1",
                "worker": worker,
                "token": "t#1",
            },
        ),
        (
            "step_completed",
            {"type": "step_completed", "step": "b", "attempt": "3", "worker": "w", "token": "t#2"},
        ),
    ]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"steps": "[1]"}, "'steps' is not a list of strings"),
        ({"steps": "a,b"}, "'steps' is not JSON"),
        ({"steps": '["a"]', "tokens": '["x", "y"]'}, "2 token values for 1 steps"),
        ({"tokens": '["x"]'}, "no 'steps' field"),
        ({"steps": '{"a": 1}'}, "'steps' is not a list of strings"),
    ],
)
def test_a_malformed_batch_entry_is_refused_naming_the_field(
    fields: dict[str, str], message: str
) -> None:
    with pytest.raises(BatchEntryError, match=message):
        list(per_step("steps_claimed", fields))
