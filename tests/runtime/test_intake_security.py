"""The runtime API and intake under hostile callers.

* A run reaches only instances its tenant may use, whatever path it came by (local
  call, Redis inbox, HTTP): a tenant-A run posted straight to tenant B's Dedicated
  runtime is refused ``not_visible`` (HTTP 403), naming tenant and instance, and
  nothing is written.
* A pipeline may use only the handlers its tenant's allowlist names: ``invalid`` (400)
  naming the step and the handler.
* The intake and the settings API need the runtime token (401 without it, or with a
  wrong one; never a 500); probes and metrics stay open. A runtime that takes runs
  over HTTP will not start without a token.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.core.errors import ConfigError
from airuntime.fleet.instance_settings import InstanceConfig
from airuntime.fleet.providers import DeliveryError, HttpProvider
from airuntime.fleet.tenancy import IsolationMode
from runtime_pod.host import RuntimeHost
from runtime_pod.instance import RunRefused
from tests.runtime.conftest import MakeHost, Runtime
from tests.runtime.support import (
    AIRT,
    TEST_HANDLERS,
    TEST_TOKEN,
    pipeline,
    request,
    subprocess_env,
    tenant_settings,
)

pytestmark = pytest.mark.timeout(60)
AUTH = {"authorization": f"Bearer {TEST_TOKEN}"}
PATHS = ["local", "redis", "http"]


async def _nothing_written(redis: Redis, instance_id: str) -> None:
    assert await redis.keys(keys.run("*")) == []
    assert await redis.keys(keys.shared_run_to_run("*")) == []
    assert await redis.llen(keys.instance_queue(instance_id)) == 0
    assert await redis.zcard(keys.executions_index()) == 0


async def _submit(path: str, host: RuntimeHost, redis: Redis, body: dict[str, Any]) -> Any:
    """(status, answer) of delivering ``body`` to the host's first instance by ``path``."""
    inst = host.instances[0]
    if path == "local":
        try:
            return 202, {"run_id": await inst.accept(body)}
        except RunRefused as exc:
            return None, {"error": str(exc), "reason": exc.reason}
    if path == "redis":
        reply_to = keys.reply_list(uuid.uuid4().hex)
        await redis.xadd(
            keys.instance_inbox(inst.instance_id),
            {"request": json.dumps(body), "reply_to": reply_to},
        )
        got = await redis.blpop([reply_to], timeout=10)
        assert got is not None, "the inbox answered"
        return None, json.loads(got[1])
    async with httpx.AsyncClient(timeout=10, headers=AUTH) as client:
        resp = await client.post(f"{host.endpoint}/v1/instances/{inst.instance_id}/runs", json=body)
    return resp.status_code, resp.json()


@pytest.mark.parametrize("path", PATHS)
async def test_a_run_of_a_tenant_that_may_not_use_the_instance_is_refused_on_every_path(
    runtime: Runtime, hosts: MakeHost, redis: Redis, path: str
) -> None:
    await runtime.registry.put_tenant(
        tenant_settings("tenant-a", isolation_mode=IsolationMode.DEDICATED)
    )
    host = await hosts(
        provider="redis" if path == "redis" else "http",
        tenant_id="tenant-b",
        isolation_mode="Dedicated",
        runtime_prefix="tenant-b-runtime",
    )
    iid = host.instances[0].instance_id
    status, answer = await _submit(
        path, host, redis, request(pipeline(1), tenant="tenant-a").model_dump(mode="json")
    )
    assert answer["reason"] == "not_visible", answer
    assert "tenant-a" in answer["error"] and iid in answer["error"], answer
    assert status in (None, 403)
    await _nothing_written(redis, iid)

    # The owner's runs are taken; a Shared tenant's are not (Dedicated runtime).
    own = await _submit(path, host, redis, request(pipeline(1), tenant="tenant-b").model_dump())
    assert "run_id" in own[1], own
    shared = await _submit(path, host, redis, request(pipeline(1), tenant="other").model_dump())
    assert shared[1]["reason"] == "not_visible"


@pytest.mark.parametrize("path", PATHS)
async def test_a_handler_outside_the_tenants_allowlist_is_refused_naming_step_and_handler(
    runtime: Runtime,
    hosts: MakeHost,
    redis: Redis,
    path: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The platform allows the module; the tenant's allowlist decides about ``python``.
    monkeypatch.setenv("AIRUNTIME_PYTHON_HANDLER_MODULES", "tests.engine.callables")
    host = await hosts(provider="redis" if path == "redis" else "http")
    doc = {
        "id": "p",
        "steps": [
            {"id": "fine", "uses": "noop"},
            {
                "id": "sneaky",
                "uses": "python",
                "with": {"callable": "tests.engine.callables:add", "kwargs": {"a": 1, "b": 2}},
            },
        ],
    }
    status, answer = await _submit(path, host, redis, request(doc).model_dump(mode="json"))
    assert answer["reason"] == "invalid", answer
    assert "steps[1]" in answer["error"] and "'python'" in answer["error"], answer
    assert "not allowed" in answer["error"]
    assert status in (None, 400)
    await _nothing_written(redis, host.instances[0].instance_id)

    await runtime.registry.put_tenant(
        tenant_settings("tenant-a", allowed_handlers=("noop", "python"))
    )
    allowed = await _submit(path, host, redis, request(doc).model_dump(mode="json"))
    assert "run_id" in allowed[1], allowed


async def test_an_allowlist_narrowed_after_acceptance_fails_the_run_at_its_start(
    runtime: Runtime,
) -> None:
    """The allowlist is checked again when the run starts (read with the start batch):
    a handler the tenant lost while its run waited in the local queue never runs."""
    inst = runtime.instance("narrowed-1")
    run_id = await inst.accept(request(pipeline(1)))  # a "gate" step: allowed now
    revoked = tuple(h for h in TEST_HANDLERS if h != "gate")
    await runtime.registry.put_tenant(tenant_settings("tenant-a", allowed_handlers=revoked))
    await inst.start()
    assert await runtime.watcher.reached(run_id, "completed", "failed") == "failed"
    assert not runtime.gate.entered, "the handler never ran"
    record = await inst.run_status(run_id, "tenant-a")
    assert record is not None and record.failure_reason is not None
    assert "'gate'" in record.failure_reason and "not allowed" in record.failure_reason


# -- the runtime token ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no-token"),
        pytest.param({"authorization": "Bearer not-the-token"}, id="wrong-token"),
        pytest.param({"authorization": f"Basic {TEST_TOKEN}"}, id="not-bearer"),
        pytest.param({"authorization": "Bearer"}, id="empty-bearer"),
    ],
)
async def test_intake_and_settings_need_the_runtime_token_and_probes_stay_open(
    runtime: Runtime, hosts: MakeHost, redis: Redis, headers: dict[str, str]
) -> None:
    host = await hosts(provider="http")
    iid = host.instances[0].instance_id
    body = request(pipeline(1)).model_dump(mode="json")
    async with httpx.AsyncClient(base_url=host.endpoint, timeout=10, headers=headers) as client:
        for method, url, payload in (
            ("POST", f"/v1/instances/{iid}/runs", body),
            ("GET", "/v1/instances", None),
            ("GET", "/v1/settings", None),
            ("PUT", "/v1/settings/max_concurrent_step_tasks", {"value": 1}),
        ):
            resp = await client.request(method, url, json=payload)
            assert resp.status_code == 401, (method, url, resp.text)
            assert resp.headers["www-authenticate"] == "Bearer"
        for probe in ("/healthz", "/readyz", "/metrics"):
            assert (await client.get(probe)).status_code == 200, probe
    assert host.instances[0].slots.limit == 0, "unchanged"
    await _nothing_written(redis, iid)
    with pytest.raises(DeliveryError) as refused:
        desc = await runtime.registry.get(iid)
        assert desc is not None
        await HttpProvider(token=headers.get("authorization", "x")[7:] or None).deliver(
            desc, request(pipeline(1))
        )
    assert refused.value.reason == "unauthorized"


async def test_a_host_without_a_token_keeps_its_intake_and_settings_closed(
    runtime: Runtime, redis: Redis
) -> None:
    host = RuntimeHost(redis, InstanceConfig(provider="redis", heartbeat_s=0.1), http_port=0)
    await host.start()
    try:
        async with httpx.AsyncClient(base_url=host.endpoint, timeout=10, headers=AUTH) as client:
            resp = await client.get("/v1/settings")
            assert resp.status_code == 401 and "AIRUNTIME_RUNTIME_TOKEN" in resp.json()["detail"]
            assert (await client.get("/readyz")).status_code == 200
    finally:
        await host.stop()


async def test_a_host_taking_runs_over_http_refuses_to_start_without_a_token(
    redis: Redis, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="AIRUNTIME_RUNTIME_TOKEN"):
        RuntimeHost(redis, InstanceConfig(provider="http"), http_port=0)
    proc = await asyncio.create_subprocess_exec(
        AIRT, "runtime", "--provider", "http", "--prefix", "px",
        env=subprocess_env("redis://127.0.0.1:1/0", AIRUNTIME_HOME=str(tmp_path)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2, err
    assert "AIRUNTIME_RUNTIME_TOKEN" in " ".join(err.decode().split())


async def test_airt_runtime_settings_show_and_set_send_the_token_from_the_environment(
    hosts: MakeHost, tmp_path: Path
) -> None:
    host = await hosts(provider="http")

    async def airt(*args: str, **env: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            AIRT, "runtime", "settings", *args, "--endpoint", host.endpoint,
            env=subprocess_env(None, AIRUNTIME_HOME=str(tmp_path), **env),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), " ".join(err.decode().split())

    code, out, err = await airt("show", AIRUNTIME_RUNTIME_TOKEN=TEST_TOKEN)
    assert code == 0, err
    assert json.loads(out) == {"max_concurrent_step_tasks": 0}
    code, _, err = await airt("set", "max_concurrent_step_tasks", "2")
    assert code == 2 and "AIRUNTIME_RUNTIME_TOKEN" in err, err
    code, _, err = await airt(
        "set", "max_concurrent_step_tasks", "2", AIRUNTIME_RUNTIME_TOKEN="wrong"
    )
    assert code == 2 and "401" in err and "invalid runtime token" in err, err
    assert host.instances[0].slots.limit == 0
