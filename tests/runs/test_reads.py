"""Reading a run: every view is the same JSON before and after retention moved it to the
archive (SQLite and PostgreSQL), ledger paging and the SSE stream, trace and report,
the merged listing, and 404 for another tenant on every route."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from airuntime.core import keys
from tests.runs.archive import archive_and_expire
from tests.runs.conftest import Api, auth
from tests.runs.support import FAN, ended, submit

ROUTES = [
    ("get", ""),
    ("get", "/events"),
    ("get", "/trace"),
    ("get", "/report"),
    ("post", "/input"),
    ("post", "/pause"),
    ("post", "/resume"),
    ("post", "/replay"),
    ("post", "/cancel"),
]


async def _all_events(client: httpx.AsyncClient, srid: str, limit: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        resp = await client.get(f"/v1/runs/{srid}/events", params=params, headers=auth("alice-a"))
        assert resp.status_code == 200, resp.text
        page = resp.json()
        assert len(page["events"]) <= limit
        events += page["events"]
        cursor = page["next_cursor"]
        if cursor is None:
            return events


async def _views(client: httpx.AsyncClient, srid: str) -> dict[str, Any]:
    get = lambda path: client.get(f"/v1/runs/{srid}{path}", headers=auth("alice-a"))  # noqa: E731
    views: dict[str, Any] = {}
    for path in ("", "/trace", "/report"):
        resp = await get(path)
        assert resp.status_code == 200, f"{path}: {resp.text}"
        views[path] = resp.json()
    views["events/3"] = await _all_events(client, srid, 3)
    views["events/1000"] = (await get("/events?limit=999")).json()
    views["list"] = (await client.get("/v1/runs", headers=auth("alice-a"))).json()
    return views


async def test_every_view_is_identical_before_and_after_retention(api: Api) -> None:
    srid = await submit(api.client, FAN)
    details = await ended(api.client, srid)
    assert details["status"] == "Succeeded", details
    before = await _views(api.client, srid)

    await archive_and_expire(api.redis, api.history, srid)
    assert not await api.redis.exists(keys.shared_run(srid))
    assert not await api.redis.exists(keys.execution_keys(details["execution_id"]).meta)
    after = await _views(api.client, srid)

    for view in before:
        assert after[view] == before[view], f"{view} differs after retention"
    # ... and the views say something: the details, the ledger, the trace and the report.
    steps = before[""]["steps"]
    assert steps["flaky"]["attempts"] == 2 and steps["right"]["output"] == "r"
    assert steps["root"]["instance_id"] == "runtime-instance-1"
    assert before[""]["execution"]["snapshot"]["steps"]["sink"]["status"] == "completed"
    types = [e["type"] for e in before["events/3"]]
    assert types[0] == "execution_created" and "execution_finalized" in types
    assert "step_slots" in types and "run_started" in types
    assert [e["seq"] for e in before["events/3"]] == list(range(len(types)))
    assert before["events/1000"]["events"] == before["events/3"]
    flaky = next(s for s in before["/trace"]["steps"] if s["step"] == "flaky")
    assert [a["outcome"] for a in flaky["attempts"]] == ["retried", "completed"]
    report = before["/report"]
    assert report["retries"] == 1 and report["recoveries"] == 0
    assert report["critical_path"]["steps"][0] == "root"
    assert report["critical_path"]["steps"][-1] == "sink"
    assert report["step_slots"] and report["step_slots"][0]["admitted"] == "6"  # 5 steps, 1 retry
    assert [r["shared_run_id"] for r in before["list"]["runs"]] == [srid]


async def test_the_event_stream_follows_a_run_until_it_ended(api: Api) -> None:
    srid = await submit(api.client, FAN)
    async with api.client.stream(
        "GET",
        f"/v1/runs/{srid}/events",
        headers={**auth("alice-a"), "accept": "text/event-stream"},
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        text = "".join([chunk async for chunk in resp.aiter_text()])
    frames = [f for f in text.split("\n\n") if f.strip()]
    names = [
        line.removeprefix("event: ")
        for f in frames
        for line in f.splitlines()
        if line.startswith("event: ")
    ]
    assert names[-1] == "end" and "execution_finalized" in names
    data = [json.loads(f.splitlines()[-1].removeprefix("data: ")) for f in frames]
    assert data[-1]["status"] == "Succeeded"
    paged = (
        await api.client.get(f"/v1/runs/{srid}/events?limit=999", headers=auth("alice-a"))
    ).json()
    assert data[:-1] == paged["events"], "the stream carries exactly the ledger, in order"


async def test_a_cursor_of_another_run_or_a_forged_one_is_refused(api: Api) -> None:
    first, second = await submit(api.client, FAN), await submit(api.client, FAN)
    await ended(api.client, first)
    await ended(api.client, second)
    page = (
        await api.client.get(f"/v1/runs/{first}/events?limit=2", headers=auth("alice-a"))
    ).json()
    for bad in (page["next_cursor"], "not-a-cursor"):
        resp = await api.client.get(
            f"/v1/runs/{second}/events", params={"cursor": bad}, headers=auth("alice-a")
        )
        assert resp.status_code == 400 and "cursor" in resp.json()["detail"], resp.text
    listed = await api.client.get("/v1/runs", params={"cursor": "zz"}, headers=auth("alice-a"))
    assert listed.status_code == 400 and "cursor" in listed.json()["detail"]


async def test_the_listing_merges_hot_and_archived_runs_once_each_with_filters(api: Api) -> None:
    other = {**FAN, "id": "other", "steps": [{"id": "x", "uses": "noop"}]}
    ids = [await submit(api.client, FAN if i % 2 else other) for i in range(6)]
    created = {}
    for srid in ids:
        created[srid] = (await ended(api.client, srid))["created_at_ms"]
    for srid in ids[::2] + ids[3:4]:  # a mix: some archived, some hot
        await archive_and_expire(api.redis, api.history, srid)
    await submit(api.client, other, who="bob-b")  # another tenant's run is never listed

    seen: list[str] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await api.client.get("/v1/runs", params=params, headers=auth("alice-a"))).json()
        seen += [r["shared_run_id"] for r in page["runs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    newest_first = sorted(ids, key=lambda i: (created[i], i), reverse=True)
    assert seen == newest_first

    fan = await api.client.get("/v1/runs", params={"pipeline": "fan"}, headers=auth("alice-a"))
    assert {r["shared_run_id"] for r in fan.json()["runs"]} == set(ids[1::2])
    ok = await api.client.get("/v1/runs", params={"status": "Succeeded"}, headers=auth("alice-a"))
    assert len(ok.json()["runs"]) == 6
    failed = await api.client.get("/v1/runs", params={"status": "Failed"}, headers=auth("alice-a"))
    assert failed.json()["runs"] == []
    lo, hi = created[newest_first[-2]], created[newest_first[1]]
    window = await api.client.get(
        "/v1/runs",
        params={"created_from_ms": lo, "created_to_ms": hi},
        headers=auth("alice-a"),
    )
    expected = {i for i in ids if lo <= created[i] < hi}
    assert {r["shared_run_id"] for r in window.json()["runs"]} == expected


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p or '/'}" for m, p in ROUTES])
async def test_another_tenants_run_and_an_unknown_run_are_404_on_every_route(
    api: Api, method: str, path: str
) -> None:
    srid = await submit(api.client, FAN)
    await ended(api.client, srid)
    body = {"json": {"step": "root", "value": 1}} if path == "/input" else {}
    unknown = "sr-" + "0" * 32
    for target, archived in ((srid, False), (unknown, False), (srid, True)):
        if archived:
            await archive_and_expire(api.redis, api.history, srid)
        resp = await api.client.request(
            method, f"/v1/runs/{target}{path}", headers=auth("bob-b"), **body
        )
        assert resp.status_code == 404, f"{target} archived={archived}: {resp.text}"
    mine = await api.client.request(
        method, f"/v1/runs/{srid}{path}", headers=auth("alice-a"), **body
    )
    assert mine.status_code != 404, mine.text


async def test_the_openapi_document_names_every_answer_of_every_run_route(api: Api) -> None:
    spec = (await api.client.get("/openapi.json")).json()
    expected = {
        ("get", "/v1/runs"): {"200", "400", "401", "403", "422", "503"},
        ("get", "/v1/runs/{shared_run_id}"): {"200", "401", "403", "404", "503"},
        ("get", "/v1/runs/{shared_run_id}/events"): {"200", "400", "404"},
        ("get", "/v1/runs/{shared_run_id}/trace"): {"200", "404", "409"},
        ("get", "/v1/runs/{shared_run_id}/report"): {"200", "404", "409"},
        ("post", "/v1/runs/{shared_run_id}/input"): {"200", "400", "404", "409", "413", "422"},
        ("post", "/v1/runs/{shared_run_id}/pause"): {"200", "403", "404", "409"},
        ("post", "/v1/runs/{shared_run_id}/resume"): {"200", "403", "404", "409"},
        ("post", "/v1/runs/{shared_run_id}/replay"): {"202", "403", "404"},
    }
    for (method, path), codes in expected.items():
        documented = set(spec["paths"][path][method]["responses"])
        assert codes <= documented, f"{method} {path}: {sorted(codes - documented)} undocumented"
    events = spec["paths"]["/v1/runs/{shared_run_id}/events"]["get"]["responses"]["200"]
    assert "text/event-stream" in events["content"]


async def test_follow_true_on_an_archived_run_streams_its_ledger_from_the_cursor_and_ends(
    api: Api,
) -> None:
    srid = await submit(api.client, FAN)
    await ended(api.client, srid)
    first = (
        await api.client.get(f"/v1/runs/{srid}/events?limit=4", headers=auth("alice-a"))
    ).json()
    await archive_and_expire(api.redis, api.history, srid)
    resp = await api.client.get(
        f"/v1/runs/{srid}/events",
        params={"follow": "true", "cursor": first["next_cursor"], "limit": 2},
        headers=auth("alice-a"),
    )
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    frames = [f.splitlines() for f in resp.text.split("\n\n") if f.strip()]
    data = [json.loads(lines[-1].removeprefix("data: ")) for lines in frames]
    assert frames[-1][0] == "event: end" and data[-1]["status"] == "Succeeded"
    whole = await _all_events(api.client, srid, 999)
    assert first["events"] + data[:-1] == whole, "the stream goes on exactly after the cursor"


async def test_the_report_totals_the_model_calls_tokens_before_and_after_retention(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a run's model calls cost, per provider and model as the provider named it,
    from the completed steps' outputs: the same from Redis and from the archive."""
    from tests.engine.model_server import model_server

    with model_server() as server:
        providers = {
            "gpt": {"base_url": server.openai_url},
            "claude": {"api": "anthropic", "base_url": server.anthropic_url},
        }
        monkeypatch.setenv("AIRUNTIME_MODEL_PROVIDERS", json.dumps(providers))
        ask = lambda sid, provider, prompt: {  # noqa: E731
            "id": sid,
            "uses": "model",
            "with": {"provider": provider, "model": "m", "prompt": prompt},
        }
        pipeline = {
            "id": "costs",
            "steps": [
                ask("a", "gpt", "one two three"),
                ask("b", "gpt", "four five"),
                ask("c", "claude", "six"),
                {"id": "d", "uses": "echo", "with": {"value": {"usage": {"input_tokens": 99}}}},
            ],
        }
        srid = await submit(api.client, pipeline)
        details = await ended(api.client, srid)
        assert details["status"] == "Succeeded", details
        before = (await api.client.get(f"/v1/runs/{srid}/report", headers=auth("alice-a"))).json()
    # The test server counts words: a prompt's as input, the reply's ("echo: " + it) as output.
    assert before["model_usage"] == [
        {"provider": "claude", "model": "m", "calls": 1, "input_tokens": 1, "output_tokens": 2},
        {"provider": "gpt", "model": "m-2026", "calls": 2, "input_tokens": 5, "output_tokens": 7},
    ]
    await archive_and_expire(api.redis, api.history, srid)
    after = (await api.client.get(f"/v1/runs/{srid}/report", headers=auth("alice-a"))).json()
    assert after["model_usage"] == before["model_usage"]
