"""Steering a run through the API: answering an ``input`` step (409 naming the step and
its state when it is not waiting), pause and resume, replay, and who may do what."""

from __future__ import annotations

import socket
from typing import Any

import yaml
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.examples import pipeline_path
from airuntime.history import open_history_store
from tests.control_plane.support import wait_for
from tests.history.conftest import settings
from tests.runs.conftest import Api, auth, serving_api
from tests.runs.support import ended, step_status, submit


def example(name: str) -> dict[str, Any]:
    with pipeline_path(name) as path:
        doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


async def test_an_input_step_answered_through_the_api_completes_the_run(api: Api) -> None:
    srid = await submit(api.client, example("human-input"))
    await step_status(api.client, srid, "approve", "input_wait")
    url = f"/v1/runs/{srid}/input"
    for step, state in (("draft", "completed"), ("publish", "pending")):
        resp = await api.client.post(url, json={"step": step, "value": 1}, headers=auth("alice-a"))
        assert resp.status_code == 409, resp.text
        assert f"step {step!r} is {state}, not waiting for input" in resp.json()["detail"]
    unknown = await api.client.post(url, json={"step": "nope", "value": 1}, headers=auth("alice-a"))
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"] == ["body", "step"]
    viewer = await api.client.post(url, json={"step": "approve"}, headers=auth("viewer-a"))
    assert viewer.status_code == 403

    answer = {"approved": True, "by": "ana"}
    ok = await api.client.post(
        url, json={"step": "approve", "value": answer}, headers=auth("sub-a")
    )
    assert ok.status_code == 200 and ok.json()["replayed"] is False, ok.text
    body = await ended(api.client, srid)
    assert body["status"] == "Succeeded"
    assert body["steps"]["approve"]["output"] == answer
    assert body["steps"]["publish"]["output"]["approval"] == answer
    again = await api.client.post(
        url, json={"step": "approve", "value": 2}, headers=auth("alice-a")
    )
    assert again.status_code == 409
    assert "step 'approve' is completed, not waiting for input" in again.json()["detail"]
    # The same answer sent again (its answer lost) is that answer, even once the run ended.
    resent = await api.client.post(
        url,
        json={"step": "approve", "value": dict(reversed(answer.items()))},
        headers=auth("sub-a"),
    )
    assert resent.status_code == 200, resent.text
    assert resent.json()["replayed"] is True and resent.json()["status"] == "Succeeded"
    not_input = await api.client.post(  # a completed step that is no input step
        url,
        json={"step": "draft", "value": body["steps"]["draft"]["output"]},
        headers=auth("alice-a"),
    )
    assert not_input.status_code == 409, not_input.text
    events = (await api.client.get(f"/v1/runs/{srid}/events", headers=auth("alice-a"))).json()
    provided = [e for e in events["events"] if e["type"] == "input_provided"]
    assert provided == [{**provided[0], "fields": {"step": "approve", "actor": "sub-a"}}]


SLOW_CHAIN = {
    "id": "chain",
    "steps": [
        {"id": "gate", "uses": "input"},
        {"id": "a", "uses": "echo", "with": {"value": 1}, "depends_on": ["gate"]},
        {"id": "b", "uses": "echo", "with": {"value": 2}, "depends_on": ["a"]},
    ],
}


async def test_pause_holds_the_run_and_resume_lets_it_finish(api: Api) -> None:
    srid = await submit(api.client, SLOW_CHAIN)
    await step_status(api.client, srid, "gate", "input_wait")
    sub = await api.client.post(f"/v1/runs/{srid}/pause", headers=auth("sub-a"))
    assert sub.status_code == 403, "pausing needs the operator's cancel capability"
    paused = await api.client.post(f"/v1/runs/{srid}/pause", headers=auth("alice-a"))
    assert paused.status_code == 200, paused.text
    assert paused.json()["status"] in ("Pausing", "Paused")
    # The answer lands while paused: the step completes, but nothing after it is claimed.
    answered = await api.client.post(
        f"/v1/runs/{srid}/input", json={"step": "gate", "value": "go"}, headers=auth("alice-a")
    )
    assert answered.status_code == 200, answered.text
    body = (await api.client.get(f"/v1/runs/{srid}", headers=auth("alice-a"))).json()
    assert body["execution"]["status"] == "Paused", body["execution"]
    assert body["steps"]["a"]["status"] == "ready" and body["status"] == "Dispatched"

    resumed = await api.client.post(f"/v1/runs/{srid}/resume", headers=auth("alice-a"))
    assert resumed.status_code == 200, resumed.text
    final = await ended(api.client, srid)
    assert final["status"] == "Succeeded" and final["steps"]["b"]["output"] == 2
    types = [
        e["type"]
        for e in (await api.client.get(f"/v1/runs/{srid}/events", headers=auth("alice-a"))).json()[
            "events"
        ]
    ]
    assert types.index("execution_paused") < types.index("execution_resumed")
    late = await api.client.post(f"/v1/runs/{srid}/pause", headers=auth("alice-a"))
    assert late.status_code == 409 and "ended Succeeded" in late.json()["detail"]


async def test_replay_submits_the_same_pipeline_inputs_and_context_linked_to_the_original(
    api: Api,
) -> None:
    doc = example("summarize-documents")
    srid = await submit(api.client, doc)
    original = await ended(api.client, srid)
    viewer = await api.client.post(f"/v1/runs/{srid}/replay", headers=auth("viewer-a"))
    assert viewer.status_code == 403
    resp = await api.client.post(f"/v1/runs/{srid}/replay", headers=auth("sub-a"))
    assert resp.status_code == 202, resp.text
    new = resp.json()
    assert new["replay_of"] == srid and new["shared_run_id"] != srid
    replayed = await ended(api.client, new["shared_run_id"])
    assert replayed["replay_of"] == srid
    assert replayed["snapshot"] == original["snapshot"]
    assert replayed["inputs"] == original["inputs"]

    def outputs(body: dict[str, Any]) -> dict[str, Any]:
        return {k: (v["status"], v.get("output"), v["attempts"]) for k, v in body["steps"].items()}

    assert outputs(replayed) == outputs(original)


async def test_steering_a_queued_run_is_409_until_it_has_an_execution(api: Api) -> None:
    await api.cp.stop()  # no pump: the run stays queued
    srid = await submit(api.client, SLOW_CHAIN)
    for path in ("pause", "resume"):
        resp = await api.client.post(f"/v1/runs/{srid}/{path}", headers=auth("alice-a"))
        assert resp.status_code == 409 and "no execution yet" in resp.json()["detail"]
    resp = await api.client.post(
        f"/v1/runs/{srid}/input", json={"step": "gate"}, headers=auth("alice-a")
    )
    assert resp.status_code == 409 and "'gate'" in resp.json()["detail"]
    trace = await api.client.get(f"/v1/runs/{srid}/trace", headers=auth("alice-a"))
    assert trace.status_code == 409 and "QueuedGlobally" in trace.json()["detail"]

    async def queued() -> bool:
        body = (await api.client.get(f"/v1/runs/{srid}", headers=auth("alice-a"))).json()
        return body["status"] == "QueuedGlobally" and "execution" not in body

    assert await wait_for(queued, what="the details of a queued run")


async def test_a_running_run_reads_from_redis_while_the_history_is_down(hot: Redis) -> None:
    """A history that is down fails no read of a run Redis holds: a running run whose
    execution Redis does not hold (the runtime recorded its id, not yet the execution)
    is answered from Redis, not looked up in the archive (it cannot be archived yet)."""
    with socket.socket() as s:  # a port nobody listens on: a real, refused connection
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = await open_history_store(
        f"postgresql://airuntime@127.0.0.1:{port}/airuntime",
        settings=settings(history_timeout_s=1.0, history_auto_migrate=False),
    )
    try:
        async with serving_api(hot, down) as api:
            srid = await submit(api.client, example("human-input"))
            await step_status(api.client, srid, "approve", "input_wait")
            detail = await api.client.get(f"/v1/runs/{srid}", headers=auth("alice-a"))
            assert detail.status_code == 200, detail.text
            execution_id = detail.json()["execution_id"]
            await hot.delete(*keys.execution_keys(execution_id).all())
            gone = await api.client.get(f"/v1/runs/{srid}", headers=auth("alice-a"))
            assert gone.status_code == 200, gone.text
            assert gone.json()["status"] not in {"Succeeded", "Failed", "Cancelled"}
            assert not gone.json().get("steps"), gone.json()
    finally:
        await down.close()
