"""The ``redis`` provider delivers a batch in one round trip and gets one answer per run.

A pump hands an instance N runs at once (``deliver_many``): N inbox entries added in
one pipeline with one reply list, each naming its ``reply_id``; the instance accepts
the entries it read together and pushes their answers at once. Each run still gets
its own answer (RunId, or the refusal of that run alone), matched by ``reply_id``
whatever order the answers arrive in, and a run nobody answers times out alone.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.fleet.providers import DeliveryError, RedisProvider
from airuntime.fleet.registry import InstanceDescriptor
from airuntime.fleet.runs import RunRequest
from runtime_pod.inbox import GROUP
from tests.control_plane.support import descriptor
from tests.runtime.conftest import MakeHost, Runtime
from tests.runtime.support import pipeline, request

pytestmark = pytest.mark.timeout(60)


async def _descriptor(runtime: Runtime, instance_id: str) -> InstanceDescriptor:
    desc = await runtime.registry.get(instance_id)
    assert desc is not None
    return desc


async def test_a_batch_gets_each_runs_own_answer_in_order(
    runtime: Runtime, hosts: MakeHost, redis: Redis
) -> None:
    host = await hosts(provider="redis")
    inst = host.instances[0]
    desc = await _descriptor(runtime, inst.instance_id)
    good = [request(pipeline(1, uses="noop")) for _ in range(3)]
    unknown = request({"id": "p", "steps": [{"id": "a", "uses": "no-such-handler"}]})
    other_tenant_twin = good[0].model_copy(
        update={"snapshot": good[0].snapshot.model_copy(update={"tenant_id": "tenant-b"})}
    )
    batch = [good[0], unknown, good[1], good[0], other_tenant_twin, good[2]]
    answers = await RedisProvider(redis).deliver_many(desc, batch)
    run_ids = [a for a in answers if isinstance(a, str)]
    assert isinstance(answers[0], str) and answers[3] == answers[0], "same SharedRunId, one run"
    assert isinstance(answers[1], DeliveryError) and "no-such-handler" in str(answers[1])
    assert isinstance(answers[4], DeliveryError) and answers[4].reason == "conflict"
    assert isinstance(answers[2], str) and isinstance(answers[5], str)
    assert len(set(run_ids)) == 3
    for run_id in set(run_ids):
        assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
    inbox = keys.instance_inbox(inst.instance_id)
    assert await redis.xlen(inbox) == 0, "every entry answered, acknowledged and deleted"
    assert (await redis.xpending(inbox, GROUP))["pending"] == 0


async def test_a_batch_for_an_instance_without_inbox_fails_every_run_at_once(
    redis: Redis,
) -> None:
    desc = descriptor("gone-1", provider="redis")
    reqs = [request(pipeline(1)) for _ in range(3)]
    answers = await RedisProvider(redis, timeout_s=30).deliver_many(desc, reqs)
    assert all(isinstance(a, DeliveryError) and a.reason == "unreachable" for a in answers)
    assert await redis.exists(keys.instance_inbox("gone-1")) == 0, "never created"


async def test_answers_are_matched_by_reply_id_and_strays_are_ignored(
    redis: Redis,
) -> None:
    """An inbox with no runtime reading it: the test answers as a runtime would, in
    reverse order, after a stray answer and a repeated one (a re-read after a
    restart answers again)."""
    desc = descriptor("manual-1", provider="redis")
    inbox = keys.instance_inbox("manual-1")
    await redis.xgroup_create(inbox, GROUP, id="0", mkstream=True)
    reqs = [request(pipeline(1)) for _ in range(3)]
    delivery = RedisProvider(redis, timeout_s=30)

    async def answer() -> None:
        entries = (await redis.xreadgroup(GROUP, "c", {inbox: ">"}, count=10, block=20_000))[0][1]
        assert len(entries) == 3
        fields = [{k.decode(): v.decode() for k, v in f.items()} for _, f in entries]
        reply_to = fields[0]["reply_to"]
        assert {f["reply_to"] for f in fields} == {reply_to}, "one reply list for the batch"
        sent = [RunRequest.model_validate_json(f["request"]) for f in fields]
        assert [s.shared_run_id for s in sent] == [r.shared_run_id for r in reqs]
        values = [json.dumps({"reply_id": "7", "run_id": "stray"}), "not json"]
        values += [
            json.dumps({"reply_id": f["reply_id"], "run_id": f"run-{f['reply_id']}"})
            for f in reversed(fields)
        ]
        values.append(json.dumps({"reply_id": "1", "run_id": "again"}))
        await redis.rpush(reply_to, *values)

    answered = asyncio.create_task(answer())
    answers = await delivery.deliver_many(desc, reqs)
    await answered
    assert answers == ["run-0", "run-1", "run-2"]


async def test_a_run_nobody_answers_times_out_alone(redis: Redis) -> None:
    desc = descriptor("half-1", provider="redis")
    inbox = keys.instance_inbox("half-1")
    await redis.xgroup_create(inbox, GROUP, id="0", mkstream=True)
    reqs = [request(pipeline(1)) for _ in range(2)]

    async def answer_first_only() -> None:
        entries = (await redis.xreadgroup(GROUP, "c", {inbox: ">"}, count=10, block=20_000))[0][1]
        f = {k.decode(): v.decode() for k, v in entries[0][1].items()}
        await redis.rpush(f["reply_to"], json.dumps({"reply_id": f["reply_id"], "run_id": "r0"}))

    answered = asyncio.create_task(answer_first_only())
    answers = await RedisProvider(redis, timeout_s=1.0).deliver_many(desc, reqs)
    await answered
    assert answers[0] == "r0"
    assert isinstance(answers[1], DeliveryError) and answers[1].reason == "timeout"
