"""Tenant isolation, replayed: everything tenant B (or nobody) can send, against tenant A.

A real control plane (its FastAPI app over httpx's ASGI transport, the ``http`` provider
with the runtime token) and two real runtime hosts with an HTTP intake -- tenant A's
Dedicated runtime and tenant B's -- share one Valkey. Tenant A submits runs whose inputs
and outputs carry a secret; two complete on A's runtime, one stays queued. Then:

* every control-plane route (enumerated from ``app.routes``: a new route fails
  :func:`test_every_route_is_replayed_or_declared_tenant_free` until it is replayed
  here or declared tenant-free with a reason) is replayed with B's token -- A's runs
  answer 404, A's tenant settings 404 (the API never confirms another tenant exists),
  lists hold nothing of A -- and with no token (401); no body ever carries A's secret,
  run ids or execution ids;
* a tenant-A run request is posted straight to B's runtime intake: refused with the
  runtime token (403 ``not_visible``), 401 without it or with a wrong one, and nothing
  is accepted or queued in Redis;
* B's pipelines try the handler escapes (``python`` into ``builtins``/``os``/
  ``importlib`` or a private name of an allowed module; ``http`` to loopback, the
  metadata address, the Valkey port): refused at submit with a 422 naming the step and
  the value, or -- when the URL is only known at run time -- a failed step naming the
  refusal, and A's secret never appears in B's outputs.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from redis.asyncio import Redis

from airuntime.control_plane.api import create_app
from airuntime.control_plane.console.session import csrf_token
from airuntime.control_plane.metrics import ControlPlaneMetrics
from airuntime.control_plane.rbac import Authenticator, TokenEntry
from airuntime.control_plane.service import ControlPlane
from airuntime.core import keys
from airuntime.core.context import ExecutionContextSnapshot
from airuntime.engine.execution_store import ExecutionStore
from airuntime.fleet.instance_settings import InstanceConfig
from airuntime.fleet.registry import Registry
from airuntime.fleet.runs import RunRequest
from airuntime.fleet.tenancy import DEFAULT_ALLOWED_HANDLERS, IsolationMode, TenantSettings
from runtime_pod.host import RuntimeHost
from tests.control_plane.support import (
    drain_until_finished,
    manual_cp,
    running_cp,
    running_host,
    wait_finished,
)

pytestmark = pytest.mark.timeout(120)

RUNTIME_TOKEN: Final = "isolation-runtime-token-0123456789"
SECRET: Final = f"tenant-a-secret-{uuid.uuid4().hex}"
A_SECRET_NAME: Final = "TENANT_A_API_KEY"
ALLOWED_MODULE: Final = "tests.control_plane.support"
A_PIPELINE: Final = {
    "id": "a-private",
    "steps": [{"id": "keep", "uses": "echo", "with": {"value": "${inputs.secret}"}}],
}
B_PIPELINE: Final = {"id": "b-own", "steps": [{"id": "b", "uses": "noop"}]}


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


ALICE: Final = _bearer("token-alice-a")
BOB: Final = _bearer("token-bob-b")
NOBODY: Final[dict[str, str]] = {}


def _dedicated(tenant: str, **extra: Any) -> TenantSettings:
    return TenantSettings(
        tenant_id=tenant,
        isolation_mode=IsolationMode.DEDICATED,
        prefer_dedicated=True,
        allow_shared_fallback=False,
        runtime_prefix=f"{tenant}-runtime",
        **extra,
    )


def _runtime(tenant: str) -> InstanceConfig:
    return InstanceConfig(
        provider="http",
        tenant_id=tenant,
        isolation_mode=IsolationMode.DEDICATED,
        allow_shared_fallback=False,
        runtime_prefix=f"{tenant}-runtime",
        heartbeat_s=0.5,
        assist=False,
    )


@dataclass
class World:
    """The running system and what tenant A has in it."""

    app: FastAPI
    client: httpx.AsyncClient
    cp: ControlPlane
    redis: Redis
    a_host: RuntimeHost
    b_host: RuntimeHost
    valkey_port: int
    a_finished: list[str] = field(default_factory=list)
    """A's shared runs that completed (on A's runtime)."""
    a_queued: str = ""
    """A's shared run still queued globally."""
    a_ids: set[str] = field(default_factory=set)
    """Every id of A's: shared run ids, RunIds, ExecutionIds."""

    def forbidden(self) -> set[str]:
        """What no answer to B (or to nobody) may contain."""
        return {SECRET, A_SECRET_NAME, *self.a_ids}

    async def call(
        self, method: str, path: str, headers: dict[str, str], body: Any = None
    ) -> httpx.Response:
        kwargs: dict[str, Any] = {"headers": headers}
        if body is not None:
            kwargs["json"] = body
        return await self.client.request(method, path, **kwargs)


@pytest_asyncio.fixture
async def world(
    valkey: Redis, valkey_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[World]:
    monkeypatch.setenv("AIRUNTIME_PYTHON_HANDLER_MODULES", ALLOWED_MODULE)
    registry = Registry(valkey)
    await registry.put_tenant(_dedicated("tenant-a", model_token_budget=A_BUDGET))
    python_too = (*DEFAULT_ALLOWED_HANDLERS, "python")  # B may use python: the module
    await registry.put_tenant(_dedicated("tenant-b", allowed_handlers=python_too))  # rule decides
    a_host = RuntimeHost(valkey, _runtime("tenant-a"), http_port=0, token=RUNTIME_TOKEN)
    b_host = RuntimeHost(valkey, _runtime("tenant-b"), http_port=0, token=RUNTIME_TOKEN)
    cp = manual_cp(valkey, scale_out_enabled=False, runtime_token=RUNTIME_TOKEN)
    auth = Authenticator(
        [
            TokenEntry(token="token-alice-a", user="alice", tenant="tenant-a", roles=["operator"]),
            TokenEntry(token="token-bob-b", user="bob", tenant="tenant-b", roles=["operator"]),
        ]
    )
    app = create_app(cp, auth, ControlPlaneMetrics(cp))
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(running_host(a_host))
        await stack.enter_async_context(running_host(b_host))
        await stack.enter_async_context(running_cp(cp))
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cp")
        stack.push_async_callback(client.aclose)
        port = urlsplit(valkey_url).port
        assert port is not None
        world = World(app, client, cp, valkey, a_host, b_host, port)
        await _tenant_a_works(world)
        yield world


async def _submit(world: World, who: dict[str, str], body: dict[str, Any]) -> str:
    resp = await world.call("POST", "/v1/runs", who, body)
    assert resp.status_code == 202, resp.text
    srid: str = resp.json()["shared_run_id"]
    return srid


async def _tenant_a_works(world: World) -> None:
    """Two of A's runs complete on A's runtime (their output is the secret); a third
    stays queued. A stores the secret as a tenant secret too."""
    stored = await world.call(
        "PUT", f"/v1/tenants/tenant-a/secrets/{A_SECRET_NAME}", ALICE, {"value": SECRET}
    )
    assert stored.status_code == 200, stored.text
    body = {"pipeline": A_PIPELINE, "inputs": {"secret": SECRET}, "metadata": {"note": SECRET}}
    finished = [await _submit(world, ALICE, body) for _ in range(2)]
    done = await drain_until_finished(world.cp, dict.fromkeys(finished, "tenant-a"))
    a_instance = world.a_host.instances[0].instance_id
    store = ExecutionStore(world.redis)
    for srid, details in done.items():
        run = details["run"]
        assert run["status"] == "completed" and run["instance_id"] == a_instance, details
        snapshot = await store.snapshot(run["execution_id"])
        assert SECRET in json.dumps(snapshot), "A's output carries the secret"
        world.a_ids |= {srid, run["run_id"], run["execution_id"]}
    world.a_finished = finished
    world.a_queued = await _submit(world, ALICE, body)
    world.a_ids.add(world.a_queued)


def _assert_clean(
    world: World, resp: httpx.Response, what: str, echoed: frozenset[str] = frozenset()
) -> None:
    """No A data in the answer (``echoed``: what the caller itself sent, e.g. the id it
    asked for, which a 404 may repeat)."""
    leaked = sorted(x for x in world.forbidden() - echoed if x in resp.text)
    assert not leaked, f"{what} answered {resp.status_code} with tenant A's {leaked}: {resp.text}"


# -- the control-plane API, route by route ---------------------------------------------------

Replay = Callable[[World], Awaitable[None]]


async def _get_run(world: World) -> None:
    for srid in [*world.a_finished, world.a_queued]:
        resp = await world.call("GET", f"/v1/runs/{srid}", BOB)
        assert resp.status_code == 404, resp.text
        _assert_clean(world, resp, "GET /v1/runs/{id} (B)", frozenset({srid}))
        assert (await world.call("GET", f"/v1/runs/{srid}", NOBODY)).status_code == 401


async def _cancel_run(world: World) -> None:
    for srid in [*world.a_finished, world.a_queued]:
        resp = await world.call("POST", f"/v1/runs/{srid}/cancel", BOB)
        assert resp.status_code == 404, resp.text
        _assert_clean(world, resp, "POST /v1/runs/{id}/cancel (B)", frozenset({srid}))
        assert (await world.call("POST", f"/v1/runs/{srid}/cancel", NOBODY)).status_code == 401
    still = (await world.call("GET", f"/v1/runs/{world.a_queued}", ALICE)).json()
    assert still["status"] == "QueuedGlobally", "B's cancel must not touch A's run"


async def _list_runs(world: World) -> None:
    own = await _submit(world, BOB, {"pipeline": B_PIPELINE})
    resp = await world.call("GET", "/v1/runs?limit=1000", BOB)
    assert resp.status_code == 200, resp.text
    assert [r["shared_run_id"] for r in resp.json()["runs"]] == [own]
    _assert_clean(world, resp, "GET /v1/runs (B)")
    assert (await world.call("GET", "/v1/runs", NOBODY)).status_code == 401


async def _submit_as_a(world: World) -> None:
    """B cannot submit into A's tenant or group, whatever the body says."""
    for extra, status in (({"tenant_id": "tenant-a"}, 422), ({"tenant_group_id": "tenant-a"}, 403)):
        resp = await world.call("POST", "/v1/runs", BOB, {"pipeline": B_PIPELINE, **extra})
        assert resp.status_code == status, (extra, resp.text)
    assert (
        await world.call("POST", "/v1/runs", NOBODY, {"pipeline": B_PIPELINE})
    ).status_code == 401
    listed = (await world.call("GET", "/v1/runs", ALICE)).json()
    assert {r["shared_run_id"] for r in listed["runs"]} == {*world.a_finished, world.a_queued}


async def _queue(world: World) -> None:
    resp = await world.call("GET", "/v1/queue", BOB)
    assert resp.status_code == 200 and resp.json() == {"pending": 0, "pending_by_tenant": {}}
    mine = (await world.call("GET", "/v1/queue", ALICE)).json()
    assert mine == {"pending": 1, "pending_by_tenant": {"tenant-a": 1}}, "A's run is queued"
    assert (await world.call("GET", "/v1/queue", NOBODY)).status_code == 401


async def _drain(world: World) -> None:
    """The operator role drives the shared pump for every tenant (a platform action): the
    answer is counts only, never a run of A's; A's run goes to A's runtime."""
    resp = await world.call("POST", "/v1/queue/drain", BOB, {"max_count": 10})
    assert resp.status_code == 200, resp.text
    assert set(resp.json()) == {"dispatched", "failed", "cycles", "stopped", "seconds"}
    _assert_clean(world, resp, "POST /v1/queue/drain (B)")
    assert (await world.call("POST", "/v1/queue/drain", NOBODY)).status_code == 401
    details = await wait_finished(world.cp, world.a_queued, "tenant-a")
    assert details["run"]["instance_id"] == world.a_host.instances[0].instance_id


async def _instances(world: World) -> None:
    resp = await world.call("GET", "/v1/instances", BOB)
    assert resp.status_code == 200, resp.text
    assert [i["instance_id"] for i in resp.json()] == [world.b_host.instances[0].instance_id]
    assert "tenant-a" not in resp.text
    assert (await world.call("GET", "/v1/instances", NOBODY)).status_code == 401


async def _model_providers(world: World) -> None:
    """B sees the providers B may call (the allowlists themselves are covered by the test
    of allowed_model_providers), nothing of A's; without a token 401."""
    resp = await world.call("GET", "/v1/model-providers", BOB)
    assert resp.status_code == 200, resp.text
    _assert_clean(world, resp, "GET /v1/model-providers (B)")
    assert (await world.call("GET", "/v1/model-providers", NOBODY)).status_code == 401


async def _tenant_settings(world: World) -> None:
    resp = await world.call("GET", "/v1/tenants/tenant-a/settings", BOB)
    assert resp.status_code == 404, resp.text
    assert "runtime_prefix" not in resp.text and "tenant-a-runtime" not in resp.text
    own = await world.call("GET", "/v1/tenants/tenant-b/settings", BOB)
    assert own.status_code == 200 and own.json()["tenant_id"] == "tenant-b"
    assert (await world.call("GET", "/v1/tenants/tenant-a/settings", NOBODY)).status_code == 401


async def _put_tenant_settings(world: World) -> None:
    path = "/v1/tenants/tenant-a/settings"
    before = (await world.call("GET", path, ALICE)).json()
    changed = {**before, "max_concurrent_runs": 99}
    for who, status in ((BOB, 403), (ALICE, 403), (NOBODY, 401)):  # admins only
        resp = await world.call("PUT", path, who, changed)
        assert resp.status_code == status, resp.text
        assert "tenant-a-runtime" not in resp.text
    assert (await world.call("GET", path, ALICE)).json() == before


async def _put_step_slots(world: World) -> None:
    before = (await world.call("GET", "/v1/tenants/tenant-a/settings", ALICE)).json()
    resp = await world.call("PUT", "/v1/tenants/tenant-a/step-slots", BOB, {"limit": 1})
    assert resp.status_code == 404, resp.text
    assert "runtime_prefix" not in resp.text and "tenant-a-runtime" not in resp.text
    assert (
        await world.call("PUT", "/v1/tenants/tenant-a/step-slots", NOBODY, {"limit": 1})
    ).status_code == 401
    assert (await world.call("GET", "/v1/tenants/tenant-a/settings", ALICE)).json() == before
    own = await world.call("PUT", "/v1/tenants/tenant-b/step-slots", BOB, {"limit": 5})
    assert own.status_code == 200 and own.json()["tenant_id"] == "tenant-b"


A_BUDGET: Final = {"tokens": 424_242, "window": "month"}
A_USAGE: Final = "/v1/tenants/tenant-a/model-usage"


async def _model_usage(world: World) -> None:
    """B cannot read A's model token budget (404: not even that A has one), nobody at all
    (401); A reads its own, B its own (none)."""
    resp = await world.call("GET", A_USAGE, BOB)
    assert resp.status_code == 404, resp.text
    _assert_clean(world, resp, "GET /v1/tenants/{id}/model-usage (B)")
    assert "424" not in resp.text and "month" not in resp.text
    assert (await world.call("GET", A_USAGE, NOBODY)).status_code == 401
    mine = await world.call("GET", A_USAGE, ALICE)
    assert mine.status_code == 200 and mine.json()["budget"] == 424_242, mine.text
    own = await world.call("GET", "/v1/tenants/tenant-b/model-usage", BOB)
    assert own.status_code == 200 and own.json()["budget"] is None, own.text


A_SECRETS: Final = "/v1/tenants/tenant-a/secrets"


async def _secrets(world: World) -> None:
    """B cannot list A's secrets (404, not even the names), nobody at all (401); B's own
    list holds nothing of A's."""
    resp = await world.call("GET", A_SECRETS, BOB)
    assert resp.status_code == 404, resp.text
    _assert_clean(world, resp, "GET /v1/tenants/{id}/secrets (B)")
    assert (await world.call("GET", A_SECRETS, NOBODY)).status_code == 401
    own = await world.call("GET", "/v1/tenants/tenant-b/secrets", BOB)
    assert own.status_code == 200 and own.json() == [], own.text


async def _a_secret_unchanged(world: World) -> None:
    listed = (await world.call("GET", A_SECRETS, ALICE)).json()
    assert [(s["name"], s["updated_by"]) for s in listed] == [(A_SECRET_NAME, "alice")]
    stored = await world.redis.hget(keys.tenant_secrets("tenant-a"), A_SECRET_NAME)
    assert stored is not None and json.loads(stored)["value"] == SECRET


async def _put_secret(world: World) -> None:
    """B can neither replace A's secret nor add one to A's tenant; nobody 401."""
    for name in (A_SECRET_NAME, "PLANTED"):
        path = f"{A_SECRETS}/{name}"
        resp = await world.call("PUT", path, BOB, {"value": "from-tenant-b"})
        assert resp.status_code == 404, resp.text
        _assert_clean(world, resp, "PUT /v1/tenants/{id}/secrets/{name} (B)", frozenset({name}))
        assert (await world.call("PUT", path, NOBODY, {"value": "nobody"})).status_code == 401
    await _a_secret_unchanged(world)


async def _delete_secret(world: World) -> None:
    path = f"{A_SECRETS}/{A_SECRET_NAME}"
    resp = await world.call("DELETE", path, BOB)
    assert resp.status_code == 404, resp.text
    _assert_clean(world, resp, "DELETE /v1/tenants/{id}/secrets/{name} (B)", frozenset({path}))
    assert (await world.call("DELETE", path, NOBODY)).status_code == 401
    await _a_secret_unchanged(world)


def _run_route(method: str, suffix: str, body: dict[str, Any] | None = None) -> Replay:
    """A replay of a route on one of A's runs: B gets 404 and nothing of A's, nobody 401;
    a steering route changes nothing of A's run."""

    async def replay(world: World) -> None:
        for srid in [*world.a_finished, world.a_queued]:
            before = (await world.call("GET", f"/v1/runs/{srid}", ALICE)).json()
            path = f"/v1/runs/{srid}{suffix}"
            resp = await world.call(method, path, BOB, body)
            assert resp.status_code == 404, (path, resp.text)
            _assert_clean(world, resp, f"{method} /v1/runs/{{id}}{suffix} (B)", frozenset({srid}))
            assert (await world.call(method, path, NOBODY, body)).status_code == 401
            after = (await world.call("GET", f"/v1/runs/{srid}", ALICE)).json()
            assert after["status"] == before["status"], f"B's {method} {suffix} moved A's run"
        mine = (await world.call("GET", "/v1/runs?limit=1000", ALICE)).json()["runs"]
        assert not [r for r in mine if r.get("replay_of")], "B's replay made no run of A's"

    return replay


# -- the web console (/ui): the same answers through the session cookie -----------------------

BOB_COOKIE: Final = {"cookie": "airt_console=token-bob-b"}


async def _console(world: World, method: str, path: str, who: dict[str, str]) -> httpx.Response:
    """A console request; a POST carries the session's CSRF token, as its forms do."""
    if method == "GET":
        return await world.client.get(path, headers=who)
    token = who.get("cookie", "=").split("=", 1)[1]
    return await world.client.post(path, headers=who, data={"csrf": csrf_token(token)})


def _console_run_route(method: str, suffix: str) -> Replay:
    """B's session gets 404 and nothing of A's for A's runs, nobody 401; a steering
    request changes nothing of A's run."""

    async def replay(world: World) -> None:
        for srid in [*world.a_finished, world.a_queued]:
            before = (await world.call("GET", f"/v1/runs/{srid}", ALICE)).json()
            path = f"/ui/runs/{srid}{suffix}"
            resp = await _console(world, method, path, BOB_COOKIE)
            assert resp.status_code == 404, (path, resp.text)
            _assert_clean(world, resp, f"{method} /ui/runs/{{id}}{suffix} (B)", frozenset({srid}))
            assert (await _console(world, method, path, NOBODY)).status_code == 401
            after = (await world.call("GET", f"/v1/runs/{srid}", ALICE)).json()
            assert after["status"] == before["status"], f"B's {method} {suffix} moved A's run"

    return replay


def _console_page(path: str) -> Replay:
    """A console page of B's holds nothing of A's; nobody is sent to sign in."""

    async def replay(world: World) -> None:
        resp = await _console(world, "GET", path, BOB_COOKIE)
        assert resp.status_code == 200, resp.text
        _assert_clean(world, resp, f"GET {path} (B)")
        assert "tenant-a" not in resp.text
        page = await world.client.get(path, headers={"accept": "text/html"})
        assert page.status_code == 303 and "/ui/login" in page.headers["location"]

    return replay


async def _console_drain(world: World) -> None:
    resp = await _console(world, "POST", "/ui/queue/drain", BOB_COOKIE)
    assert resp.status_code == 303, resp.text
    _assert_clean(world, resp, "POST /ui/queue/drain (B)")
    assert (await _console(world, "POST", "/ui/queue/drain", NOBODY)).status_code == 401


CONSOLE: Final[dict[tuple[str, str], Replay]] = {
    ("GET", "/ui/runs"): _console_page("/ui/runs"),
    ("GET", "/ui/queue"): _console_page("/ui/queue"),
    ("GET", "/ui/instances"): _console_page("/ui/instances"),
    ("POST", "/ui/queue/drain"): _console_drain,
    ("GET", "/ui/runs/{shared_run_id}"): _console_run_route("GET", ""),
    ("GET", "/ui/runs/{shared_run_id}/state"): _console_run_route("GET", "/state"),
    ("GET", "/ui/runs/{shared_run_id}/events"): _console_run_route("GET", "/events"),
    ("GET", "/ui/runs/{shared_run_id}/gantt"): _console_run_route("GET", "/gantt"),
    ("GET", "/ui/runs/{shared_run_id}/ledger"): _console_run_route("GET", "/ledger"),
    ("POST", "/ui/runs/{shared_run_id}/{action}"): _console_run_route("POST", "/cancel"),
}


async def _mcp_call(world: World, headers: dict[str, str], tool: str, **args: Any) -> Any:
    """One JSON-RPC ``tools/call`` to ``/mcp`` (stateless: no session needed)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": tool, "arguments": args}}  # fmt: skip
    mcp_headers = {**headers, "accept": "application/json, text/event-stream"}
    return await world.call("POST", "/mcp", mcp_headers, body)


async def _mcp(world: World) -> None:
    """The MCP tools as B: A's runs are "not found", lists and the queue hold nothing of
    A's, A's settings are not found; without a token 401. (tests/mcp covers every tool.)"""
    for srid in [*world.a_finished, world.a_queued]:
        for tool in ("get_run", "run_ledger", "cancel_run", "replay_run"):
            resp = await _mcp_call(world, BOB, tool, shared_run_id=srid)
            assert resp.status_code == 200, resp.text
            result = resp.json()["result"]
            assert result["isError"] is True and "not found" in resp.text, resp.text
            _assert_clean(world, resp, f"MCP {tool} (B)", frozenset({srid}))
    for tool, args in (("list_runs", {}), ("queue_status", {}), ("list_instances", {}),
                       ("list_model_providers", {}),
                       ("list_secrets", {"tenant_id": "tenant-a"}),
                       ("model_usage", {"tenant_id": "tenant-a"}),
                       ("get_tenant_settings", {"tenant_id": "tenant-a"})):  # fmt: skip
        resp = await _mcp_call(world, BOB, tool, **args)
        assert resp.status_code == 200, resp.text
        _assert_clean(world, resp, f"MCP {tool} (B)")
    assert (await _mcp_call(world, NOBODY, "list_runs")).status_code == 401
    still = (await world.call("GET", f"/v1/runs/{world.a_queued}", ALICE)).json()
    assert still["status"] == "QueuedGlobally", "B's MCP cancel must not touch A's run"


REPLAYED: Final[dict[tuple[str, str], Replay]] = {
    ("GET", "/mcp"): _mcp,
    ("GET", "/v1/runs/{shared_run_id}"): _get_run,
    ("POST", "/v1/runs/{shared_run_id}/cancel"): _cancel_run,
    ("GET", "/v1/runs/{shared_run_id}/events"): _run_route("GET", "/events"),
    ("GET", "/v1/runs/{shared_run_id}/trace"): _run_route("GET", "/trace"),
    ("GET", "/v1/runs/{shared_run_id}/report"): _run_route("GET", "/report"),
    ("POST", "/v1/runs/{shared_run_id}/input"): _run_route(
        "POST", "/input", {"step": "a", "value": "from B"}
    ),
    ("POST", "/v1/runs/{shared_run_id}/pause"): _run_route("POST", "/pause"),
    ("POST", "/v1/runs/{shared_run_id}/resume"): _run_route("POST", "/resume"),
    ("POST", "/v1/runs/{shared_run_id}/replay"): _run_route("POST", "/replay"),
    ("GET", "/v1/runs"): _list_runs,
    ("POST", "/v1/runs"): _submit_as_a,
    ("GET", "/v1/queue"): _queue,
    ("POST", "/v1/queue/drain"): _drain,
    ("GET", "/v1/instances"): _instances,
    ("GET", "/v1/model-providers"): _model_providers,
    ("GET", "/v1/tenants/{tenant_id}/settings"): _tenant_settings,
    ("PUT", "/v1/tenants/{tenant_id}/settings"): _put_tenant_settings,
    ("PUT", "/v1/tenants/{tenant_id}/step-slots"): _put_step_slots,
    ("GET", "/v1/tenants/{tenant_id}/model-usage"): _model_usage,
    ("GET", "/v1/tenants/{tenant_id}/secrets"): _secrets,
    ("PUT", "/v1/tenants/{tenant_id}/secrets/{name}"): _put_secret,
    ("DELETE", "/v1/tenants/{tenant_id}/secrets/{name}"): _delete_secret,
    **CONSOLE,
}
TENANT_FREE: Final[dict[tuple[str, str], str]] = {
    ("GET", "/healthz"): "process liveness, no state",
    ("GET", "/readyz"): "Redis and loop health, no tenant data",
    ("GET", "/metrics"): "platform telemetry for Prometheus: tenant ids and counts, no run "
    "ids, inputs or outputs (checked below)",
    ("GET", "/openapi.json"): "the API's description",
    ("GET", "/docs"): "the API's description",
    ("GET", "/docs/oauth2-redirect"): "the API's description",
    ("GET", "/redoc"): "the API's description",
    ("GET", "/"): "a browser's way to the console: a redirect to its runs page",
    ("GET", "/ui"): "the console's redirect to its runs page",
    ("GET", "/ui/login"): "the console's sign-in form",
    ("POST", "/ui/login"): "checks a token; answers a cookie or the sign-in form",
    ("POST", "/ui/logout"): "drops the console's cookie",
    ("GET", "/ui/static"): "the console's CSS, JS and licence (package files)",
}

NOT_200: Final[dict[tuple[str, str], int]] = {
    ("GET", "/"): 303,  # to /ui/runs
    ("GET", "/ui"): 303,  # to /ui/runs
    ("POST", "/ui/login"): 401,  # no token given: the form again
    ("POST", "/ui/logout"): 401,  # no session
    ("GET", "/ui/static"): 307,  # a directory: to /ui/static/, not a file
}


def _routes(routes: Iterable[Any], prefix: str = "") -> set[tuple[str, str]]:
    """(method, path) of every route, through included routers (FastAPI keeps those
    as router objects); a route of an unknown shape fails rather than slip past."""
    found: set[tuple[str, str]] = set()
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            extra = getattr(getattr(route, "include_context", None), "prefix", "") or ""
            found |= _routes(inner.routes, prefix + extra)
            continue
        path = getattr(route, "path", None)
        assert isinstance(path, str) and path, f"cannot enumerate route {route!r}"
        methods = getattr(route, "methods", None) or {"GET"}
        found |= {(m, prefix + path) for m in methods if m not in ("HEAD", "OPTIONS")}
    return found


async def test_every_route_is_replayed_or_declared_tenant_free(world: World) -> None:
    routes = _routes(world.app.routes)
    assert not set(REPLAYED) & set(TENANT_FREE)
    missing = sorted(routes - set(REPLAYED) - set(TENANT_FREE))
    assert not missing, f"routes neither replayed nor declared tenant-free: {missing}"
    gone = sorted((set(REPLAYED) | set(TENANT_FREE)) - routes)
    assert not gone, f"listed routes the app does not have: {gone}"


@pytest.mark.parametrize("route", list(REPLAYED), ids=[f"{m} {p}" for m, p in REPLAYED])
async def test_tenant_b_and_nobody_get_nothing_of_tenant_a(
    world: World, route: tuple[str, str]
) -> None:
    await REPLAYED[route](world)


async def test_tenant_free_routes_carry_no_run_data(world: World) -> None:
    for method, path in TENANT_FREE:
        resp = await world.call(method, path, NOBODY)
        assert resp.status_code == NOT_200.get((method, path), 200), (path, resp.text)
        _assert_clean(world, resp, path)


# -- the runtime intake ---------------------------------------------------------------------


async def _runs_in_redis(world: World) -> tuple[set[bytes], set[bytes], int]:
    b_queue = keys.instance_queue(world.b_host.instances[0].instance_id)
    return (
        set(await world.redis.keys(keys.run("*"))),
        set(await world.redis.keys(keys.shared_run_to_run("*"))),
        await world.redis.llen(b_queue),
    )


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        pytest.param(_bearer(RUNTIME_TOKEN), 403, id="right-token"),
        pytest.param(NOBODY, 401, id="no-token"),
        pytest.param(_bearer("not-the-runtime-token"), 401, id="wrong-token"),
    ],
)
async def test_a_tenant_a_run_posted_to_tenant_bs_runtime_is_refused(
    world: World, headers: dict[str, str], status: int
) -> None:
    before = await _runs_in_redis(world)
    b_instance = world.b_host.instances[0].instance_id
    hijack = RunRequest(
        shared_run_id=world.a_queued,  # A's real, still queued, shared run
        pipeline=A_PIPELINE,
        inputs={"secret": SECRET},
        snapshot=ExecutionContextSnapshot(tenant_id="tenant-a", user_id="alice"),
    )
    async with httpx.AsyncClient(base_url=world.b_host.endpoint, timeout=10) as client:
        resp = await client.post(
            f"/v1/instances/{b_instance}/runs",
            json=hijack.model_dump(mode="json"),
            headers=headers,
        )
    assert resp.status_code == status, resp.text
    if status == 403:
        answer = resp.json()
        assert answer["reason"] == "not_visible" and "tenant-a" in answer["error"], answer
    assert await _runs_in_redis(world) == before, "nothing accepted or queued"
    details = (await world.call("GET", f"/v1/runs/{world.a_queued}", ALICE)).json()
    assert details["status"] == "QueuedGlobally" and "run" not in details


# -- handler escapes ---------------------------------------------------------------------------


def _escapes(valkey_port: int) -> list[tuple[str, str, str]]:
    """(handler, value, what the refusal says) of each escape B tries."""
    return [
        ("python", "builtins:exec", "module 'builtins' is not allowed"),
        ("python", "os:system", "module 'os' is not allowed"),
        ("python", "importlib:import_module", "module 'importlib' is not allowed"),
        ("python", f"{ALLOWED_MODULE}:_private", "_private"),
        ("http", "http://127.0.0.1/", "loopback"),
        ("http", "http://169.254.169.254/latest/meta-data/", "cloud metadata"),
        ("http", f"http://127.0.0.1:{valkey_port}/", "loopback"),
        ("http", f"http://localhost:{valkey_port}/", "loopback"),
    ]


async def test_handler_escapes_are_refused_at_submit_naming_step_and_value(world: World) -> None:
    for n, (handler, value, reason) in enumerate(_escapes(world.valkey_port)):
        key = "callable" if handler == "python" else "url"
        step = f"escape{n}"
        pipeline = {
            "id": "b-escape",
            "steps": [{"id": step, "uses": handler, "with": {key: value}}],
        }
        resp = await world.call("POST", "/v1/runs", BOB, {"pipeline": pipeline})
        assert resp.status_code == 422, (value, resp.text)
        (problem,) = resp.json()["detail"]
        assert problem["msg"].count(repr(step)) == 1, problem  # named once, not twice
        assert repr(value) in problem["msg"] and reason in problem["msg"], problem
    listed = (await world.call("GET", "/v1/runs", BOB)).json()
    assert listed["runs"] == [], "no refused pipeline became a run"


async def test_a_model_step_cannot_choose_where_the_platforms_key_goes(world: World) -> None:
    """A ``model`` step names a provider the platform defines, written out; a URL of its
    own, a provider it makes up or one chosen by a reference are refused at submit."""
    target = f"http://127.0.0.1:{world.valkey_port}/v1"
    tries = [
        ({"provider": "nope", "model": "m", "prompt": "p"}, "with.provider", "unknown provider"),
        ({"provider": "${inputs.p}", "model": "m", "prompt": "p"}, "with.provider", "written out"),
        ({"provider": "nope", "model": "m", "prompt": "p", "base_url": target},
         "with.base_url", "unknown field(s) base_url"),
    ]  # fmt: skip
    for with_, where, reason in tries:
        pipeline = {"id": "b-model", "steps": [{"id": "ask", "uses": "model", "with": with_}]}
        resp = await world.call("POST", "/v1/runs", BOB, {"pipeline": pipeline})
        assert resp.status_code == 422, (with_, resp.text)
        messages = [f"{'.'.join(map(str, p['loc']))}: {p['msg']}" for p in resp.json()["detail"]]
        assert any(where in m and reason in m for m in messages), messages
    listed = (await world.call("GET", "/v1/runs", BOB)).json()
    assert listed["runs"] == [], "no refused pipeline became a run"


async def test_a_tenant_calls_only_the_model_providers_its_settings_allow(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B may call the platform's ``local`` provider only; A, with no such setting, any:
    B's step naming ``openai`` is 422 at submit (and would be at a runtime's intake)."""
    nowhere = {"base_url": "http://127.0.0.1:9/v1"}  # no call is made: refused or queued
    providers = {"openai": nowhere, "local": nowhere}
    monkeypatch.setenv("AIRUNTIME_MODEL_PROVIDERS", json.dumps(providers))
    python_too = (*DEFAULT_ALLOWED_HANDLERS, "python")
    restricted = _dedicated(
        "tenant-b", allowed_handlers=python_too, allowed_model_providers=("local",)
    )
    await Registry(world.redis).put_tenant(restricted)

    def ask(provider: str) -> dict[str, Any]:
        with_ = {"provider": provider, "model": "m", "prompt": "p"}
        step = {"id": "ask", "uses": "model", "with": with_}
        return {"pipeline": {"id": f"ask-{provider}", "steps": [step]}}

    # What each may name, as GET /v1/model-providers lists it (names, never URLs).
    for who, names in ((BOB, ["local"]), (ALICE, ["local", "openai"])):
        listed = (await world.call("GET", "/v1/model-providers", who)).json()
        assert [p["name"] for p in listed] == names, listed
        assert "127.0.0.1" not in json.dumps(listed)
    resp = await world.call("POST", "/v1/runs", BOB, ask("openai"))
    assert resp.status_code == 422, resp.text
    (problem,) = resp.json()["detail"]
    assert "provider 'openai' is not allowed for this tenant (local)" in problem["msg"], problem
    await _submit(world, BOB, ask("local"))
    await _submit(world, ALICE, ask("openai"))
    # The runtime's intake holds the same rule for a request that did not come through
    # the control plane's submit.
    before = await _runs_in_redis(world)
    b_instance = world.b_host.instances[0].instance_id
    request = RunRequest(
        shared_run_id="sr-00000000000000000000000000000b0b",
        pipeline=ask("openai")["pipeline"],
        snapshot=ExecutionContextSnapshot(tenant_id="tenant-b", user_id="bob"),
    )
    async with httpx.AsyncClient(base_url=world.b_host.endpoint, timeout=10) as client:
        resp = await client.post(
            f"/v1/instances/{b_instance}/runs",
            json=request.model_dump(mode="json"),
            headers=_bearer(RUNTIME_TOKEN),
        )
    assert resp.status_code == 400, resp.text
    assert "provider 'openai' is not allowed for this tenant" in resp.text
    assert await _runs_in_redis(world) == before, "nothing accepted or queued"


async def test_an_http_escape_known_only_at_run_time_fails_the_step_and_shows_nothing_of_a(
    world: World,
) -> None:
    target = f"http://127.0.0.1:{world.valkey_port}/"
    pipeline = {
        "id": "b-late-escape",
        "steps": [
            {"id": "probe", "uses": "http", "with": {"url": "${inputs.target}"}},
            {"id": "echo", "uses": "echo", "with": {"value": "${inputs.target}"}},
        ],
    }
    srid = await _submit(world, BOB, {"pipeline": pipeline, "inputs": {"target": target}})
    details = (await drain_until_finished(world.cp, {srid: "tenant-b"}))[srid]
    run = details["run"]
    assert run["status"] == "failed" and run["instance_id"] == (
        world.b_host.instances[0].instance_id
    ), details
    assert details["steps"]["probe"] == "failed", details
    snapshot = await ExecutionStore(world.redis).snapshot(run["execution_id"])
    assert snapshot is not None
    error = json.dumps(snapshot["steps"]["probe"])
    assert "127.0.0.1" in error and "loopback" in error, error
    assert SECRET not in json.dumps(snapshot) and SECRET not in json.dumps(details)
    for a_id in world.a_ids:
        assert a_id not in json.dumps(snapshot), "B's run shows an id of A's"
