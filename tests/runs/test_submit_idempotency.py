"""Submitting with an ``Idempotency-Key`` (:mod:`airuntime.control_plane.submit_idempotency`)
against a real control plane and runtime on Valkey, through the API app: the same
request sent again is the run it created (however many contend at once, and after the
run was archived and left Redis), another request with the key is 409, another tenant's
equal key is its own, a malformed key is 422 naming the header. Through the CLI, a
connection cut after the request reached the server (the answer lost: a real TCP proxy
in between) is sent again by ``airt submit`` and still makes one run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from airuntime.control_plane.shared_queue import SharedQueue
from airuntime.core import keys
from airuntime.history import HistoryStore
from tests.control_plane.support import wait_for
from tests.runs.archive import archive_and_expire
from tests.runs.conftest import Api, auth, serving_api
from tests.runs.support import ended

TINY: dict[str, Any] = {"id": "tiny", "steps": [{"id": "a", "uses": "noop"}]}
BODY: dict[str, Any] = {"pipeline": TINY, "inputs": {"n": 1}}


async def post(
    api: Api, body: dict[str, Any], key: str | None, who: str = "alice-a"
) -> httpx.Response:
    headers = {**auth(who), **({"idempotency-key": key} if key is not None else {})}
    return await api.client.post("/v1/runs", json=body, headers=headers)


async def tenant_runs(redis: Redis, tenant: str) -> list[bytes]:
    return list(await redis.zrange(keys.shared_runs_by_tenant(tenant), 0, -1))


async def test_the_same_request_sent_again_is_the_run_it_created(api: Api) -> None:
    first = await post(api, BODY, "order-42")
    assert first.status_code == 202 and first.json()["replayed"] is False, first.text
    assert "idempotent-replayed" not in first.headers
    srid = first.json()["shared_run_id"]
    await ended(api.client, srid)
    again = await post(api, {"inputs": {"n": 1}, "pipeline": TINY}, "order-42")  # keys reordered
    assert again.status_code == 202, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["shared_run_id"] == srid and again.json()["replayed"] is True
    assert again.json()["status"] == "Succeeded"  # the run as it is now
    assert await tenant_runs(api.redis, "tenant-a") == [srid.encode()]
    plain = await post(api, BODY, None)  # without a key: a new run, as before
    assert plain.status_code == 202 and plain.json()["shared_run_id"] != srid


async def test_the_key_with_another_request_is_refused_naming_its_run(api: Api) -> None:
    srid = (await post(api, BODY, "k-1")).json()["shared_run_id"]
    others = (
        {**BODY, "inputs": {"n": 2}},
        {**BODY, "metadata": {"who": "x"}},
        {**BODY, "mode": "DirectDispatch"},
    )
    for other in others:
        refused = await post(api, other, "k-1")
        assert refused.status_code == 409, refused.text
        detail = refused.json()["detail"]
        assert "idempotency key 'k-1' was used for another request" in detail
        assert srid in detail, detail
    assert await tenant_runs(api.redis, "tenant-a") == [srid.encode()]


async def test_another_tenants_equal_key_is_its_own(api: Api) -> None:
    a = await post(api, BODY, "shared-name")
    b = await post(api, BODY, "shared-name", who="bob-b")
    assert a.status_code == b.status_code == 202
    assert b.json()["replayed"] is False
    assert a.json()["shared_run_id"] != b.json()["shared_run_id"]
    assert len(await tenant_runs(api.redis, "tenant-b")) == 1


@pytest.mark.parametrize(
    "key",
    ["", "has space", "x" * 256, "tab\there", "é-accent"],
    ids=["empty", "space", "long", "tab", "non-ascii"],
)
async def test_a_malformed_key_is_422_naming_the_header(api: Api, key: str) -> None:
    headers = {**auth("alice-a"), "idempotency-key": key.encode("utf-8")}
    resp = await api.client.post("/v1/runs", json=BODY, headers=headers)  # type: ignore[arg-type]
    assert resp.status_code == 422, resp.text
    assert resp.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"], resp.text
    assert await tenant_runs(api.redis, "tenant-a") == []


async def test_many_submissions_with_one_key_at_once_make_one_run(api: Api) -> None:
    """Twenty-four at once: each misses the key when it looks first, so all reach the
    creating script; one creates the run, the others find the key set, write no
    record and take back the queue item they sent with it."""
    contenders = 24
    arrived, gate = asyncio.Event(), asyncio.Event()
    waiting = 0

    async def contender() -> httpx.Response:
        nonlocal waiting
        waiting += 1
        if waiting == contenders:
            arrived.set()
        await gate.wait()
        return await post(api, BODY, "burst")

    tasks = [asyncio.create_task(contender()) for _ in range(contenders)]
    await arrived.wait()  # every contender is at the gate
    gate.set()
    answers = await asyncio.gather(*tasks)
    assert {r.status_code for r in answers} == {202}, [r.text for r in answers]
    srids = {r.json()["shared_run_id"] for r in answers}
    assert len(srids) == 1, srids
    assert sum(not r.json()["replayed"] for r in answers) == 1
    (srid,) = srids
    assert await tenant_runs(api.redis, "tenant-a") == [srid.encode()]
    await ended(api.client, srid)
    queue = SharedQueue(api.redis)
    assert await queue.pending_items("tenant-a") == []  # no item left behind for a loser
    assert await queue.claimed_count() == 0


async def test_a_replay_after_the_run_left_redis_answers_from_the_archive(api: Api) -> None:
    srid = (await post(api, BODY, "archived-one")).json()["shared_run_id"]
    await ended(api.client, srid)
    await archive_and_expire(api.redis, api.history, srid)
    assert await api.redis.exists(keys.shared_run(srid)) == 0
    again = await post(api, BODY, "archived-one")
    assert again.status_code == 202, again.text
    assert again.json()["shared_run_id"] == srid and again.json()["status"] == "Succeeded"
    assert again.json()["replayed"] is True


@contextlib.asynccontextmanager
async def answer_losing_proxy(upstream: str) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP proxy to ``upstream`` whose first connection forwards the request and then
    closes without passing the answer back (the request reached the server; its answer
    was lost); later connections pass through. Yields its URL and the number of bytes
    it dropped for each connection it cut."""
    host, port = upstream.removeprefix("http://").split(":")
    cut: list[int] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(host, int(port))
        if not cut:
            cut.append(0)
            upward = asyncio.create_task(pipe(client_r, server_w))
            answer = await server_r.read(65536)  # the server answered: drop it
            cut[0] = len(answer)
            upward.cancel()
            client_w.transport.abort()
            server_w.close()
            return
        await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    bound = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{bound}", cut
    finally:
        server.close()
        await server.wait_closed()


async def test_airt_submit_sends_a_request_whose_answer_was_lost_again_and_makes_one_run(
    hot: Redis, store: HistoryStore, tmp_path: Path
) -> None:
    import uvicorn

    from airuntime.control_plane.api import create_app
    from tests.runs.conftest import authenticator

    pipeline = tmp_path / "tiny.yaml"
    pipeline.write_text(json.dumps(TINY))  # JSON is YAML
    async with serving_api(hot, store) as api:
        app = create_app(api.cp, authenticator(), history=store)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        serving = asyncio.create_task(server.serve())

        async def started() -> bool:
            return server.started

        await wait_for(started, what="uvicorn started")
        upstream = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        try:
            async with answer_losing_proxy(upstream) as (url, cut):
                env = {"PATH": "/usr/bin:/bin", "COLUMNS": "200", "AIRUNTIME_API_URL": url,
                       "AIRUNTIME_API_TOKEN": "token-alice-a"}  # fmt: skip
                code = (
                    "import sys; from airuntime.cli.app import main; sys.argv[0] = 'airt'; main()"
                )
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-c", code, "submit", str(pipeline),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                )  # fmt: skip
                out, err = await asyncio.wait_for(proc.communicate(), 120)
        finally:
            server.should_exit = True
            await serving
    stderr = err.decode()
    assert proc.returncode == 0, stderr
    assert cut and cut[0] > 0, "the first answer was dropped"
    assert "sending it again (idempotency key airt-" in stderr, stderr
    assert "(the run this idempotency key created)" in stderr, stderr
    answered = json.loads(out)
    assert answered["replayed"] is True
    assert await tenant_runs(hot, "tenant-a") == [answered["shared_run_id"].encode()]


async def test_a_replay_asked_again_with_its_key_is_one_new_run(api: Api) -> None:
    original = (await post(api, BODY, None)).json()["shared_run_id"]
    await ended(api.client, original)
    other = (await post(api, {**BODY, "inputs": {"n": 2}}, None)).json()["shared_run_id"]
    url = f"/v1/runs/{original}/replay"
    headers = {**auth("alice-a"), "idempotency-key": "replay-once"}
    first = await api.client.post(url, headers=headers)
    again = await api.client.post(url, headers=headers)
    assert first.status_code == again.status_code == 202, (first.text, again.text)
    assert first.json()["replayed"] is False and again.json()["replayed"] is True
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["shared_run_id"] == first.json()["shared_run_id"] != original
    assert again.json()["replay_of"] == original
    refused = await api.client.post(f"/v1/runs/{other}/replay", headers=headers)
    assert refused.status_code == 409, refused.text  # the key stands for the first replay
    assert first.json()["shared_run_id"] in refused.json()["detail"]
    assert len(await tenant_runs(api.redis, "tenant-a")) == 3  # two originals, one replay
