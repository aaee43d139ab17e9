"""The control-plane HTTP API: RBAC, tenant scoping, and 4xx (never 500) on bad input.

The app runs in-process over httpx's ASGI transport with a real ControlPlane on a
real Redis and a real runtime host, so a submitted run really executes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from redis.asyncio import Redis

from airuntime.control_plane.service import ControlPlane, PipelineRefused
from airuntime.core import keys
from airuntime.core.context import ExecutionContextSnapshot
from tests.control_plane.support import (
    api_over,
    refusing_tenant_a_runtime,
)

PIPELINE = {"id": "api-test", "steps": [{"id": "a", "uses": "echo", "with": {"value": 1}}]}
TOKENS = {
    "alice-a": ("tenant-a", ["operator"]),
    "bob-b": ("tenant-b", ["operator"]),
    "viewer-a": ("tenant-a", ["viewer"]),
    "admin-x": ("default", ["admin"]),
}


@pytest_asyncio.fixture
async def api(redis: Redis) -> AsyncIterator[tuple[httpx.AsyncClient, ControlPlane]]:
    async with api_over(redis, TOKENS) as both:
        yield both


def auth(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer token-{name}"}


async def _completed(
    client: httpx.AsyncClient, cp: ControlPlane, srid: str, who: str
) -> dict[str, Any]:
    for _ in range(300):
        await cp.drain(10)
        body: dict[str, Any] = (await client.get(f"/v1/runs/{srid}", headers=auth(who))).json()
        if (body.get("run") or {}).get("status") == "completed":
            return body
        await asyncio.sleep(0.02)
    raise AssertionError(f"run {srid} did not complete: {body}")


async def test_a_submitted_run_belongs_to_the_callers_tenant_and_completes(api: Any) -> None:
    client, cp = api
    resp = await client.post("/v1/runs", json={"pipeline": PIPELINE}, headers=auth("alice-a"))
    assert resp.status_code == 202, resp.text
    srid = resp.json()["shared_run_id"]
    body = await _completed(client, cp, srid, "alice-a")
    assert body["snapshot"]["tenant_id"] == "tenant-a" and body["snapshot"]["user_id"] == "alice-a"
    assert body["execution_id"] and body["steps"]["a"]["status"] == "completed"
    assert body["steps"]["a"]["output"] == 1 and body["run"]["instance_id"] == "runtime-instance-1"
    listed = (await client.get("/v1/runs", headers=auth("alice-a"))).json()
    assert [r["shared_run_id"] for r in listed["runs"]] == [srid]


async def test_another_tenant_gets_404_for_read_and_cancel_and_sees_nothing_in_lists(
    api: Any,
) -> None:
    client, _ = api
    srid = (
        await client.post("/v1/runs", json={"pipeline": PIPELINE}, headers=auth("alice-a"))
    ).json()["shared_run_id"]
    assert (await client.get(f"/v1/runs/{srid}", headers=auth("bob-b"))).status_code == 404
    assert (await client.post(f"/v1/runs/{srid}/cancel", headers=auth("bob-b"))).status_code == 404
    assert (await client.get("/v1/runs", headers=auth("bob-b"))).json()["runs"] == []
    queue = (await client.get("/v1/queue", headers=auth("bob-b"))).json()
    assert queue == {"pending": 0, "pending_by_tenant": {}}
    assert (
        await client.get("/v1/tenants/tenant-a/settings", headers=auth("bob-b"))
    ).status_code == 404
    still = (await client.get(f"/v1/runs/{srid}", headers=auth("alice-a"))).json()
    assert still["status"] == "QueuedGlobally", "bob's cancel must not touch alice's run"


@pytest.mark.parametrize(
    ("method", "path", "who", "status"),
    [
        pytest.param("post", "/v1/runs", None, 401, id="no token"),
        pytest.param("post", "/v1/runs", "nobody", 401, id="unknown token"),
        pytest.param("post", "/v1/runs", "viewer-a", 403, id="viewer cannot submit"),
        pytest.param("post", "/v1/queue/drain", "viewer-a", 403, id="viewer cannot drain"),
        pytest.param("get", "/v1/instances", None, 401, id="instances need a token"),
    ],
)
async def test_rbac_refuses_missing_tokens_and_capabilities(
    api: Any, method: str, path: str, who: str | None, status: int
) -> None:
    client, _ = api
    headers = auth(who) if who else {}
    resp = await getattr(client, method)(
        path, headers=headers, **({"json": {"pipeline": PIPELINE}} if method == "post" else {})
    )
    assert resp.status_code == status, resp.text


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        pytest.param({}, "pipeline", id="no pipeline"),
        pytest.param({"pipeline": {"id": "x", "steps": []}}, "steps", id="no steps"),
        pytest.param(
            {"pipeline": {"id": "x", "steps": [{"id": "a", "uses": "nope"}]}},
            "unknown handler 'nope'",
            id="bad handler",
        ),
        pytest.param({"pipeline_yaml": "id: [unclosed"}, "pipeline_yaml", id="bad yaml"),
        pytest.param({"pipeline": PIPELINE, "mode": "Sometimes"}, "mode", id="bad mode"),
        pytest.param({"pipeline": PIPELINE, "surprise": 1}, "surprise", id="unknown field"),
    ],
)
async def test_bad_requests_get_4xx_naming_the_field_and_write_nothing(
    api: Any, redis: Redis, body: dict[str, Any], needle: str
) -> None:
    client, _ = api
    before = await redis.dbsize()
    resp = await client.post("/v1/runs", json=body, headers=auth("alice-a"))
    assert 400 <= resp.status_code < 500, resp.text
    assert needle in resp.text
    assert await redis.dbsize() == before, "a refused submission leaves nothing behind"


async def test_instances_settings_drain_metrics_and_openapi(api: Any) -> None:
    client, _ = api
    instances = (await client.get("/v1/instances", headers=auth("admin-x"))).json()
    assert len(instances) == 1 and instances[0]["capacity"]["can_accept_run"] is True
    # A tenant without stored settings is Shared, so it sees the shared instance too.
    assert len((await client.get("/v1/instances", headers=auth("alice-a"))).json()) == 1
    settings = (await client.get("/v1/tenants/tenant-a/settings", headers=auth("alice-a"))).json()
    assert settings["tenant_id"] == "tenant-a"
    drained = (
        await client.post("/v1/queue/drain", json={"max_count": 5}, headers=auth("alice-a"))
    ).json()
    assert drained["stopped"] == "empty"
    bad = await client.post("/v1/queue/drain", json={"max_count": 0}, headers=auth("alice-a"))
    assert bad.status_code == 422 and "max_count" in bad.text
    metrics = (await client.get("/metrics")).text
    for name in (
        "airuntime_shared_queue_depth",
        "airuntime_admission_decisions_total",
        "airuntime_pump_cycles_total",
    ):
        assert name in metrics
    spec = (await client.get("/openapi.json")).json()
    assert "/v1/runs/{shared_run_id}/cancel" in spec["paths"]
    assert (await client.get("/healthz")).json() == {"status": "ok"}


async def test_drain_with_stop_on_failure_stops_at_the_first_failed_delivery(
    api: Any, redis: Redis
) -> None:
    """tenant-a's only runtime refuses every delivery. A drain asked to stop on failure
    stops at tenant-a's run and leaves the default tenant's run behind it queued; the
    default drain goes on and dispatches it."""
    client, cp = api
    broken = await refusing_tenant_a_runtime(redis, cp)
    submitted = [
        (await client.post("/v1/runs", json={"pipeline": PIPELINE}, headers=auth(who))).json()
        for who in ("alice-a", "admin-x")
    ]
    failing, behind = (s["shared_run_id"] for s in submitted)

    stopped = await client.post(
        "/v1/queue/drain", json={"stop_on_failure": True}, headers=auth("alice-a")
    )
    assert stopped.status_code == 200, stopped.text
    assert {k: v for k, v in stopped.json().items() if k != "seconds"} == {
        "dispatched": 0,
        "failed": 1,
        "cycles": 1,
        "stopped": "failure",
    }
    assert len(broken.contexts) == 1  # one delivery attempt, then the pump stopped
    assert (await cp.queue.item(failing, "tenant-a"))["status"] == "Pending"
    left = await cp.queue.item(behind, "default")
    assert left["status"] == "Pending" and "claims" not in left  # never even claimed
    assert await cp.queue.pending_count() == 2

    went_on = (await client.post("/v1/queue/drain", headers=auth("alice-a"))).json()
    assert (went_on["dispatched"], went_on["failed"], went_on["stopped"]) == (1, 1, "empty")
    assert (await cp.queue.item(behind, "default"))["status"] == "Dispatched"
    assert (await cp.queue.item(failing, "tenant-a"))["status"] == "Pending"


async def test_settings_stored_through_the_api_are_read_by_the_next_submit(
    api: Any, redis: Redis
) -> None:
    """A settings write through this control plane's API makes it forget the settings it
    kept for submits: the next submit reads them at once instead of finding them
    changed in the creating script first (which would have queued, then cancelled, an
    item beside it)."""
    client, cp = api
    echo = {"id": "echoing", "steps": [{"id": "say", "uses": "echo"}]}
    await cp.submit(echo, ExecutionContextSnapshot(tenant_id="tenant-b"))
    assert cp.tenant_settings.reads == 1
    path = "/v1/tenants/tenant-b/settings"
    settings = (await client.get(path, headers=auth("admin-x"))).json()
    resp = await client.put(
        path, json={**settings, "allowed_handlers": ["noop"]}, headers=auth("admin-x")
    )
    assert resp.status_code == 200, resp.text
    with pytest.raises(PipelineRefused):
        await cp.submit(echo, ExecutionContextSnapshot(tenant_id="tenant-b"))
    assert cp.tenant_settings.reads == 2
    items = await redis.keys(keys.squeue_item("tenant-b", "*"))
    assert len(items) == 1, "no item queued for the refused submit: refused before any write"


async def test_settings_change_whole_by_admin_and_step_slots_by_the_tenants_operators(
    api: Any, redis: Redis
) -> None:
    client, cp = api
    path = "/v1/tenants/tenant-a/settings"
    settings = (await client.get(path, headers=auth("admin-x"))).json()
    changed = {**settings, "max_concurrent_runs": 7, "allowed_handlers": ["echo"]}
    resp = await client.put(path, json=changed, headers=auth("admin-x"))
    assert resp.status_code == 200, resp.text
    stored = await cp.registry.tenant("tenant-a")
    assert (stored.max_concurrent_runs, stored.allowed_handlers) == (7, ("echo",))
    # Only an admin changes settings whole; a body must be the path's tenant, valid and
    # without unknown fields; a refusal writes nothing.
    before = await redis.dump(keys.tenant_settings("tenant-a"))

    async def put(body: dict[str, Any], who: str | None) -> httpx.Response:
        return await client.put(path, json=body, headers=auth(who) if who else {})

    refused = [
        (await put(changed, "alice-a"), 403, "admin"),
        (await put(changed, "viewer-a"), 403, "admin"),
        (await put(changed, None), 401, "bearer"),
        (await put({**changed, "tenant_id": "tenant-b"}, "admin-x"), 422, "tenant_id"),
        (await put({**changed, "workers_per_instance": 0}, "admin-x"), 422, "workers_per_instance"),
        (await put({**changed, "surprise": 1}, "admin-x"), 422, "surprise"),
    ]
    for resp, status, needle in refused:
        assert (resp.status_code, needle in resp.text) == (status, True), resp.text
    assert await redis.dump(keys.tenant_settings("tenant-a")) == before

    slots = "/v1/tenants/tenant-a/step-slots"
    resp = await client.put(slots, json={"limit": 3}, headers=auth("alice-a"))
    assert resp.status_code == 200, resp.text
    assert resp.json()["max_concurrent_step_tasks"] == 3
    assert (await cp.registry.tenant("tenant-a")).max_concurrent_runs == 7, "only the limit"
    for resp, status, needle in [
        (await client.put(slots, json={"limit": 4}, headers=auth("bob-b")), 404, "not found"),
        (await client.put(slots, json={"limit": 4}, headers=auth("viewer-a")), 403, "cancel"),
        (await client.put(slots, json={"limit": -1}, headers=auth("alice-a")), 422, "limit"),
        (await client.put(slots, json={"limit": "x"}, headers=auth("alice-a")), 422, "limit"),
    ]:
        assert (resp.status_code, needle in resp.text) == (status, True), resp.text
    assert (await cp.registry.tenant("tenant-a")).max_concurrent_step_tasks == 3
    other = await client.put(
        "/v1/tenants/tenant-b/step-slots", json={"limit": 9}, headers=auth("admin-x")
    )
    assert other.status_code == 200 and other.json()["max_concurrent_step_tasks"] == 9
