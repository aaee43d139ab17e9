"""A tenant's secrets, end to end on real servers: the API stores them write-only, an
``http`` step sends them, and nothing a run records or any route answers holds a value.

A real control plane (its FastAPI app over httpx's ASGI transport) and a runtime host
share one Valkey; a real HTTP server on loopback (allowed by
``AIRUNTIME_HTTP_HANDLER_ALLOW``) answers with the ``Authorization`` header it received,
as a service that echoes a credential in a reply or an error would.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
import pytest
import pytest_asyncio
from redis.asyncio import Redis

from airuntime.control_plane.service import ControlPlane
from airuntime.core import keys
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.pipeline.problems import format_loc
from airuntime.engine.secret_sealing import Sealer
from airuntime.engine.tenant_secrets import MAX_SECRETS_PER_TENANT, TenantSecrets
from tests.control_plane.support import api_over, drain_until_finished
from tests.echo_service import Echo, echo_service

pytestmark = pytest.mark.timeout(120)

TOKENS: Final = {
    "alice-a": ("tenant-a", ["operator"]),
    "vera-a": ("tenant-a", ["viewer"]),
    "sam-a": ("tenant-a", ["submitter"]),
    "bob-b": ("tenant-b", ["operator"]),
    "root": ("default", ["admin"]),
}
A_VALUE: Final = f"a-credential-{uuid.uuid4().hex}"
B_VALUE: Final = f"b-credential-{uuid.uuid4().hex}"


def auth(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer token-{name}"}


@pytest.fixture
def echo(monkeypatch: pytest.MonkeyPatch) -> Iterator[Echo]:
    monkeypatch.setenv("AIRUNTIME_HTTP_HANDLER_ALLOW", "127.0.0.1/32")
    with echo_service() as service:
        yield service


@dataclass
class World:
    client: httpx.AsyncClient
    cp: ControlPlane
    redis: Redis
    answers: list[httpx.Response] = field(default_factory=list)
    """Every answer the API gave in this test (none may carry a value)."""

    async def call(self, method: str, path: str, who: str | None, body: Any = None) -> Any:
        kwargs: dict[str, Any] = {"headers": auth(who) if who else {}}
        if body is not None:
            kwargs["json"] = body
        resp = await self.client.request(method, path, **kwargs)
        self.answers.append(resp)
        return resp

    def assert_no_value_answered(self) -> None:
        for resp in self.answers:
            for value in (A_VALUE, B_VALUE):
                assert value not in resp.text, f"{resp.request.url} answered a value: {resp.text}"


@pytest_asyncio.fixture
async def world(redis: Redis) -> AsyncIterator[World]:
    async with api_over(redis, TOKENS) as (client, cp):
        world = World(client, cp, redis)
        yield world
        world.assert_no_value_answered()


def http_pipeline(path: str, header: str = "Bearer ${secrets.API_TOKEN}", **step: Any) -> Any:
    return {
        "id": "calls-out",
        "steps": [
            {
                "id": "call",
                "uses": "http",
                "with": {"url": "${inputs.base}" + path, "headers": {"Authorization": header}},
                **step,
            }
        ],
    }


async def run_to_end(world: World, who: str, tenant: str, pipeline: Any, base: str) -> Any:
    resp = await world.call(
        "POST", "/v1/runs", who, {"pipeline": pipeline, "inputs": {"base": base}}
    )
    assert resp.status_code == 202, resp.text
    srid = resp.json()["shared_run_id"]
    done = await drain_until_finished(world.cp, {srid: tenant})
    return srid, done[srid]


def refusals(resp: httpx.Response) -> list[tuple[str, str]]:
    """A refused pipeline's problems: (location inside the pipeline, message)."""
    assert resp.status_code == 422, resp.text
    out = []
    for item in resp.json()["detail"]:
        loc = item["loc"]
        assert loc[:2] == ["body", "pipeline"], item
        out.append((format_loc(loc[2:]), item["msg"]))
    return out


# -- the API: write-only, per tenant, by role ---------------------------------------------------


async def test_a_secret_is_set_listed_and_deleted_and_never_read_back(world: World) -> None:
    path = "/v1/tenants/tenant-a/secrets"
    put = await world.call("PUT", f"{path}/API_TOKEN", "alice-a", {"value": A_VALUE})
    assert put.status_code == 200, put.text
    view = put.json()
    assert set(view) == {"name", "updated_at_ms", "updated_by", "sealed_with"}
    assert (view["name"], view["updated_by"]) == ("API_TOKEN", "alice-a")
    assert view["sealed_with"] is None, "no AIRUNTIME_SECRETS_KEYS here: stored as written"
    for who in ("alice-a", "vera-a", "root"):  # a viewer and an admin read the names
        listed = await world.call("GET", path, who)
        assert listed.status_code == 200 and [s["name"] for s in listed.json()] == ["API_TOKEN"]
    replaced = await world.call("PUT", f"{path}/API_TOKEN", "root", {"value": A_VALUE + "-2"})
    assert replaced.status_code == 200 and replaced.json()["updated_by"] == "root"
    for who in ("vera-a", "sam-a"):  # reading and submitting do not let one write
        resp = await world.call("PUT", f"{path}/OTHER", who, {"value": A_VALUE})
        assert resp.status_code == 403, resp.text
        assert (await world.call("DELETE", f"{path}/API_TOKEN", who)).status_code == 403
    assert (await world.call("DELETE", f"{path}/API_TOKEN", "alice-a")).status_code == 204
    gone = await world.call("DELETE", f"{path}/API_TOKEN", "alice-a")
    assert gone.status_code == 404 and "API_TOKEN" in gone.text
    assert (await world.call("GET", path, "alice-a")).json() == []
    assert await world.redis.hlen(keys.tenant_secrets("tenant-a")) == 0


async def test_another_tenant_and_nobody_get_nothing(world: World) -> None:
    path = "/v1/tenants/tenant-a/secrets"
    assert (
        await world.call("PUT", f"{path}/API_TOKEN", "alice-a", {"value": A_VALUE})
    ).status_code == 200
    before = (await world.call("GET", path, "alice-a")).json()
    for method, sub, body in (
        ("GET", "", None),
        ("PUT", "/API_TOKEN", {"value": B_VALUE}),
        ("PUT", "/NEW_ONE", {"value": B_VALUE}),
        ("DELETE", "/API_TOKEN", None),
    ):
        resp = await world.call(method, path + sub, "bob-b", body)
        assert resp.status_code == 404, (method, sub, resp.text)
        assert "API_TOKEN" not in resp.text or sub == "/API_TOKEN"
        assert (await world.call(method, path + sub, None, body)).status_code == 401
    assert (await world.call("GET", path, "alice-a")).json() == before
    own = await world.call("GET", "/v1/tenants/tenant-b/secrets", "bob-b")
    assert own.status_code == 200 and own.json() == []
    stored = await world.redis.hget(keys.tenant_secrets("tenant-a"), "API_TOKEN")
    assert stored is not None and json.loads(stored)["value"] == A_VALUE


@pytest.mark.parametrize(
    ("sub", "body", "field", "words"),
    [
        pytest.param("/bad-name", {"value": A_VALUE}, "name", '"bad-name"', id="name-hyphen"),
        pytest.param("/9LIVES", {"value": A_VALUE}, "name", '"9LIVES"', id="name-digit-first"),
        pytest.param("/" + "N" * 65, {"value": A_VALUE}, "name", "NNNN", id="name-too-long"),
        pytest.param(
            "/T", {"value": "abc"}, "value", "3 characters, under the minimum", id="short"
        ),
        pytest.param("/T", {"value": "x" * 4097}, "value", "4097 characters, over", id="long"),
        pytest.param(
            "/T", {"value": "line\r\nX-Evil: 1"}, "value", "not printable ASCII (code 13", id="crlf"
        ),
        pytest.param(
            "/T", {"value": "pässword"}, "value", "not printable ASCII (code 228", id="latin-1"
        ),
        pytest.param("/T", {"value": 12345}, "value", "string", id="not-a-string"),
        pytest.param("/T", {"value": A_VALUE, "note": 1}, "note", "Extra inputs", id="extra-field"),
        pytest.param("/T", {}, "value", "Field required", id="no-value"),
    ],
)
async def test_a_bad_secret_is_refused_naming_the_field_and_nothing_is_stored(
    world: World, sub: str, body: Any, field: str, words: str
) -> None:
    resp = await world.call("PUT", f"/v1/tenants/tenant-a/secrets{sub}", "alice-a", body)
    assert resp.status_code == 422, resp.text
    assert field in resp.text and words in resp.text, resp.text
    if isinstance(body.get("value"), str) and len(body["value"]) >= 4:
        assert body["value"] not in resp.text, "a refused value is never quoted back"
    assert await world.redis.hlen(keys.tenant_secrets("tenant-a")) == 0


async def test_a_tenant_keeps_at_most_its_cap_of_secrets(world: World) -> None:
    path = "/v1/tenants/tenant-a/secrets"
    for i in range(MAX_SECRETS_PER_TENANT):
        resp = await world.call("PUT", f"{path}/S{i}", "alice-a", {"value": f"value-{i}"})
        assert resp.status_code == 200, resp.text
    over = await world.call("PUT", f"{path}/ONE_MORE", "alice-a", {"value": "value-x"})
    assert over.status_code == 409 and f"{MAX_SECRETS_PER_TENANT} secrets already" in over.text
    again = await world.call("PUT", f"{path}/S0", "alice-a", {"value": "value-new"})
    assert again.status_code == 200, "replacing a stored one is always allowed"
    assert await world.redis.hlen(keys.tenant_secrets("tenant-a")) == MAX_SECRETS_PER_TENANT


# -- runs: the value is sent, and recorded nowhere ------------------------------------------------


async def _everything_recorded(world: World, srid: str, who: str, execution_id: str) -> str:
    """What the API answers about the run and what Redis holds of its execution."""
    parts = []
    for suffix in ("", "/events", "/trace", "/report"):
        resp = await world.call("GET", f"/v1/runs/{srid}{suffix}", who)
        assert resp.status_code == 200, resp.text
        parts.append(resp.text)
    store = ExecutionStore(world.redis)
    parts.append(json.dumps(await store.snapshot(execution_id)))
    parts.append(str(await world.redis.get(store.keys_of(execution_id).plan)))
    parts.append(str(await world.redis.xrange(store.keys_of(execution_id).events)))
    return "\n".join(parts)


async def keys_holding(redis: Redis, value: str) -> list[str]:
    """Every Redis key whose content contains ``value`` (whatever its type)."""
    needle = value.encode()
    found = []
    async for key in redis.scan_iter(count=1000):
        kind = (await redis.type(key)).decode()
        if kind == "string":
            content: Any = await redis.get(key)
        elif kind == "hash":
            content = await redis.hgetall(key)
        elif kind == "list":
            content = await redis.lrange(key, 0, -1)
        elif kind == "set":
            content = await redis.smembers(key)
        elif kind == "zset":
            content = await redis.zrange(key, 0, -1)
        elif kind == "stream":
            content = await redis.xrange(key)
        else:
            content = b""
        if needle in (content if isinstance(content, bytes) else repr(content).encode()):
            found.append(key.decode())
    return sorted(found)


async def test_an_http_step_sends_the_secret_and_its_output_shows_stars(
    world: World, echo: Echo
) -> None:
    put = await world.call(
        "PUT", "/v1/tenants/tenant-a/secrets/API_TOKEN", "alice-a", {"value": A_VALUE}
    )
    assert put.status_code == 200
    srid, done = await run_to_end(world, "sam-a", "tenant-a", http_pipeline("/headers"), echo.base)
    assert done["run"]["status"] == "completed", done
    assert echo.seen == [f"Bearer {A_VALUE}"], "the service got the value"
    details = (await world.call("GET", f"/v1/runs/{srid}", "sam-a")).json()
    output = details["execution"]["snapshot"]["steps"]["call"]["output"]
    assert output == {"status": 200, "json": {"authorization": "Bearer ***"}}
    recorded = await _everything_recorded(world, srid, "sam-a", done["run"]["execution_id"])
    assert "${secrets.API_TOKEN}" in recorded, "the plan keeps the reference as written"
    assert A_VALUE not in recorded
    assert await keys_holding(world.redis, A_VALUE) == [keys.tenant_secrets("tenant-a")]


@pytest.mark.parametrize(
    ("path", "words"),
    [
        pytest.param("/fail", "HTTP 500: upstream refused Bearer ***", id="retried-then-failed"),
        pytest.param("/refuse", "bad credential: Bearer ***", id="answered-400"),
        pytest.param("/fail-long", "HTTP 500: " + "." * 180 + " Bearer ***", id="quoted-cut"),
    ],
)
async def test_an_echoed_secret_is_scrubbed_from_errors_and_replies(
    world: World, echo: Echo, path: str, words: str
) -> None:
    await world.call("PUT", "/v1/tenants/tenant-a/secrets/API_TOKEN", "alice-a", {"value": A_VALUE})
    pipeline = http_pipeline(path, retry={"max_attempts": 2, "backoff_initial_s": 0.01})
    srid, done = await run_to_end(world, "alice-a", "tenant-a", pipeline, echo.base)
    recorded = await _everything_recorded(world, srid, "alice-a", done["run"]["execution_id"])
    assert words in recorded, recorded[:2000]
    assert A_VALUE not in recorded
    assert await keys_holding(world.redis, A_VALUE) == [keys.tenant_secrets("tenant-a")]
    assert set(echo.seen) == {f"Bearer {A_VALUE}"}


async def test_a_run_uses_its_own_tenants_secret_of_that_name(world: World, echo: Echo) -> None:
    await world.call("PUT", "/v1/tenants/tenant-a/secrets/API_TOKEN", "alice-a", {"value": A_VALUE})
    refused = await world.call(
        "POST",
        "/v1/runs",
        "bob-b",
        {"pipeline": http_pipeline("/headers"), "inputs": {"base": echo.base}},
    )
    [(where, message)] = refusals(refused)
    assert where == "steps[0].with.headers.Authorization"
    assert "secret 'API_TOKEN' is not defined for tenant 'tenant-b'" in message
    assert await world.cp.queue.pending_items("tenant-b") == [], "a refused submit queues nothing"
    assert echo.seen == []
    await world.call("PUT", "/v1/tenants/tenant-b/secrets/API_TOKEN", "bob-b", {"value": B_VALUE})
    _, done = await run_to_end(world, "bob-b", "tenant-b", http_pipeline("/headers"), echo.base)
    assert done["run"]["status"] == "completed", done
    assert echo.seen == [f"Bearer {B_VALUE}"], "B's run sent B's value, never A's"


async def test_a_secret_deleted_after_the_submit_fails_the_step_naming_it(
    world: World, echo: Echo
) -> None:
    await world.call("PUT", "/v1/tenants/tenant-a/secrets/API_TOKEN", "alice-a", {"value": A_VALUE})
    resp = await world.call(
        "POST",
        "/v1/runs",
        "alice-a",
        {"pipeline": http_pipeline("/headers"), "inputs": {"base": echo.base}},
    )
    assert resp.status_code == 202, resp.text
    srid = resp.json()["shared_run_id"]
    assert (
        await world.call("DELETE", "/v1/tenants/tenant-a/secrets/API_TOKEN", "alice-a")
    ).status_code == 204
    done = await drain_until_finished(world.cp, {srid: "tenant-a"})
    assert done[srid]["run"]["status"] == "failed", done
    details = (await world.call("GET", f"/v1/runs/{srid}", "alice-a")).json()
    step = details["execution"]["snapshot"]["steps"]["call"]
    assert "secret 'API_TOKEN' is not defined for tenant 'tenant-a'" in step["error"]
    assert step["attempts"] == 1, "a missing secret is not retried"
    assert echo.seen == [], "nothing was sent without it"


@pytest.mark.parametrize(
    ("step", "where", "words"),
    [
        pytest.param(
            {"uses": "echo", "with": {"value": "${secrets.API_TOKEN}"}},
            "steps[0].with.value",
            "only in the header values of an 'http' step",
            id="not-http",
        ),
        pytest.param(
            {"uses": "http", "with": {"url": "https://example.com/${secrets.API_TOKEN}"}},
            "steps[0].with.url",
            "only in the header values",
            id="in-the-url",
        ),
        pytest.param(
            {"uses": "http", "with": {"url": "https://example.com",
                                      "headers": {"A": "${secrets.API_TOKEN} ${inputs.x}"}}},
            "steps[0].with.headers.A",
            "cannot also name a step output or a run input",
            id="mixed-with-an-input",
        ),
        pytest.param(
            {"uses": "http", "with": {"url": "https://example.com",
                                      "headers": {"A": "${secrets.bad-name}"}}},
            "steps[0].with.headers.A",
            "malformed secret reference",
            id="malformed",
        ),
    ],
)  # fmt: skip
async def test_a_secret_named_where_it_may_not_be_is_refused_at_submit(
    world: World, step: dict[str, Any], where: str, words: str
) -> None:
    await world.call("PUT", "/v1/tenants/tenant-a/secrets/API_TOKEN", "alice-a", {"value": A_VALUE})
    pipeline = {"id": "misplaced", "inputs": {"x": {"default": 1}}, "steps": [{"id": "s", **step}]}
    resp = await world.call("POST", "/v1/runs", "alice-a", {"pipeline": pipeline})
    [(at, message)] = refusals(resp)
    assert at == where and words in message, (at, message)
    assert await world.cp.queue.pending_items("tenant-a") == []


async def test_a_reference_arriving_in_data_is_sent_as_text_not_as_the_secret(
    world: World, echo: Echo
) -> None:
    """A header whose value comes from a run input (or an earlier step's output, which
    may come from anywhere) that happens to read ``${secrets.API_TOKEN}`` sends that
    text: only a reference the author wrote in the header is substituted."""
    await world.call("PUT", "/v1/tenants/tenant-a/secrets/API_TOKEN", "alice-a", {"value": A_VALUE})
    pipeline = http_pipeline("/headers", header="${inputs.h}")
    pipeline["inputs"] = {"base": {"default": ""}, "h": {"default": ""}}
    resp = await world.call(
        "POST",
        "/v1/runs",
        "alice-a",
        {"pipeline": pipeline, "inputs": {"base": echo.base, "h": "${secrets.API_TOKEN}"}},
    )
    assert resp.status_code == 202, resp.text
    srid = resp.json()["shared_run_id"]
    done = await drain_until_finished(world.cp, {srid: "tenant-a"})
    assert done[srid]["run"]["status"] == "completed", done
    assert echo.seen == ["${secrets.API_TOKEN}"]


# -- sealed at rest (AIRUNTIME_SECRETS_KEYS) ----------------------------------------------------

PLATFORM_KEY: Final = "platform-key-" + "p" * 40


@pytest_asyncio.fixture
async def sealed_world(redis: Redis, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    """The control plane and the runtime hold the platform's key, as the chart sets them."""
    monkeypatch.setenv("AIRUNTIME_SECRETS_KEYS", PLATFORM_KEY)
    async with api_over(redis, TOKENS) as (client, cp):
        world = World(client, cp, redis)
        yield world
        world.assert_no_value_answered()


async def test_a_sealed_secret_is_in_no_key_and_still_sent(sealed_world: World, echo: Echo) -> None:
    """With keys, Redis holds the value nowhere, not even in the tenant's secrets; the
    listing names the key it is sealed under; the step still sends it and shows stars."""
    world = sealed_world
    put = await world.call(
        "PUT", "/v1/tenants/tenant-a/secrets/API_TOKEN", "alice-a", {"value": A_VALUE}
    )
    assert put.status_code == 200, put.text
    assert put.json()["sealed_with"] == Sealer((PLATFORM_KEY,)).fingerprint
    (listed,) = (await world.call("GET", "/v1/tenants/tenant-a/secrets", "vera-a")).json()
    assert listed["sealed_with"] == put.json()["sealed_with"]
    assert await keys_holding(world.redis, A_VALUE) == []
    srid, done = await run_to_end(world, "sam-a", "tenant-a", http_pipeline("/headers"), echo.base)
    assert done["run"]["status"] == "completed", done
    assert echo.seen == [f"Bearer {A_VALUE}"]
    details = (await world.call("GET", f"/v1/runs/{srid}", "sam-a")).json()
    output = details["execution"]["snapshot"]["steps"]["call"]["output"]
    assert output == {"status": 200, "json": {"authorization": "Bearer ***"}}
    assert await keys_holding(world.redis, A_VALUE) == []


async def test_a_value_sealed_under_a_key_the_runtime_lacks_fails_the_step_sending_nothing(
    sealed_world: World, echo: Echo
) -> None:
    """A control plane with other keys sealed it (a rotation half done): the step fails
    at once, naming the secret and the variable, and the service gets no request."""
    world = sealed_world
    elsewhere = TenantSecrets(world.redis, sealer=Sealer(("another-key-" + "q" * 40,)))
    await elsewhere.put("tenant-a", "API_TOKEN", A_VALUE, "alice")
    pipeline = http_pipeline("/headers", retry={"max_attempts": 3, "backoff_initial_s": 0.01})
    srid, done = await run_to_end(world, "sam-a", "tenant-a", pipeline, echo.base)
    assert done["run"]["status"] == "failed", done
    details = (await world.call("GET", f"/v1/runs/{srid}", "sam-a")).json()
    step = details["execution"]["snapshot"]["steps"]["call"]
    assert step["attempts"] == 1, "not retried: no retry brings the key"
    assert "secret 'API_TOKEN' of tenant 'tenant-a' cannot be read" in step["error"]
    assert "AIRUNTIME_SECRETS_KEYS here does not hold" in step["error"]
    assert echo.seen == []
