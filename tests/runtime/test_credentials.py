"""A runtime process keeps its credentials away from the steps it runs.

A real ``airt runtime`` gets the shared Redis URL, its runtime token, a CLI API
token and the keys tenant secrets are sealed under in its environment; a ``python``
step (a sync function, so it runs in the handler thread pool) reads ``os.environ``,
starts a subprocess that prints its own environment, and reads
``/proc/self/environ``. None of them holds any of the four values, while the runtime
works with them (it took the run from Redis, serves its settings API with the token,
and an ``http`` step sends a tenant secret it opened with the keys).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest

from airuntime.engine.secret_sealing import Sealer
from airuntime.engine.tenant_secrets import TenantSecrets
from airuntime.fleet.providers import RedisProvider
from tests.conftest import RedisServerInfo
from tests.echo_service import echo_service
from tests.runtime.conftest import Runtime
from tests.runtime.support import AIRT, eventually, request, subprocess_env, tenant_settings
from tests.runtime.test_processes import _ready

pytestmark = pytest.mark.timeout(90)
only_valkey = pytest.mark.parametrize(
    "redis_server", [pytest.param("valkey", id="valkey")], indirect=True
)
ROOT = Path(__file__).resolve().parents[2]
PROBE = "tests.runtime.env_probe:read_environment"


@only_valkey
async def test_a_step_finds_neither_the_redis_url_nor_any_token_in_its_environment(
    redis_server: RedisServerInfo, runtime: Runtime, tmp_path: Path
) -> None:
    token, api_token = "rt-secret-3f9a1c", "api-secret-77d2e0"
    sealing_key, value = "sealing-key-" + "k" * 40, "tenant-credential-5c0ffee"
    redis_url = redis_server.url
    await runtime.registry.put_tenant(
        tenant_settings("tenant-a", allowed_handlers=("python", "http"))
    )
    await TenantSecrets(runtime.redis, sealer=Sealer((sealing_key,))).put(
        "tenant-a", "API_TOKEN", value, "alice"
    )
    env = subprocess_env(
        redis_url,
        AIRUNTIME_HOME=str(tmp_path),
        AIRUNTIME_RUNTIME_TOKEN=token,
        AIRUNTIME_API_TOKEN=api_token,
        AIRUNTIME_SECRETS_KEYS=sealing_key,
        AIRUNTIME_PYTHON_HANDLER_MODULES="tests.runtime.env_probe",
        AIRUNTIME_HTTP_HANDLER_ALLOW="127.0.0.1/32",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    )
    echo_ctx = echo_service()
    echo = echo_ctx.__enter__()
    proc = await asyncio.create_subprocess_exec(
        AIRT, "runtime", "--prefix", "creds", "--heartbeat-s", "0.2",
        env=env, cwd=tmp_path, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        ready = await _ready(proc)
        [iid] = ready["instances"]
        desc = await runtime.registry.get(iid)
        assert desc is not None
        doc = {
            "id": "peek",
            "steps": [
                {"id": "env", "uses": "python", "with": {"callable": PROBE}},
                {"id": "call", "uses": "http",
                 "with": {"url": f"{echo.base}/headers",
                          "headers": {"Authorization": "Bearer ${secrets.API_TOKEN}"}}},
            ],
        }  # fmt: skip
        run_id = await RedisProvider(runtime.redis).deliver(desc, request(doc))
        outputs: list[dict[str, object]] = []

        async def finished() -> bool:
            record = await runtime.index.get_for_tenant(run_id, "tenant-a")
            if record is None or not record.status.terminal or record.execution_id is None:
                return False
            snap = await runtime.store.snapshot(record.execution_id)
            assert snap is not None and snap["status"] == "Succeeded", snap
            outputs.append(snap["steps"]["env"]["output"])
            outputs.append(snap["steps"]["call"]["output"])
            return True

        await eventually(finished, "the step ran", timeout=40)
        [seen, called] = outputs
        environ = seen["os_environ"]
        assert isinstance(environ, dict)
        for name in ("AIRUNTIME_REDIS_URL", "AIRUNTIME_RUNTIME_TOKEN", "AIRUNTIME_API_TOKEN",
                     "AIRUNTIME_SECRETS_KEYS"):  # fmt: skip
            assert name not in environ, name
        assert environ.get("AIRUNTIME_HOME") == str(tmp_path), "other settings stay"
        for where in ("os_environ", "child_environ", "proc_environ"):
            text = str(seen[where])
            for secret in (redis_url, token, api_token, sealing_key):
                assert secret not in text, f"{secret!r} visible in {where}"
        # The keys went from the environment, not from the pools: the sealed value opened.
        assert echo.seen == [f"Bearer {value}"]
        assert called == {"status": 200, "json": {"authorization": "Bearer ***"}}

        # The runtime itself still holds what it needs: its API answers the token.
        async with httpx.AsyncClient(base_url=desc.endpoint, timeout=10) as client:
            ok = await client.get("/v1/settings", headers={"authorization": f"Bearer {token}"})
            assert ok.status_code == 200
            assert (await client.get("/v1/settings")).status_code == 401
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 30)
        echo_ctx.__exit__(None, None, None)
