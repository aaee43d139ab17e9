"""The control plane's loops survive what killed them on main, with no manual action.

* **Redis dies and comes back.** A real Valkey with an append-only file is killed
  (SIGKILL) under a started control plane and started again on the same port: while
  it is gone the loops report unhealthy (``/readyz`` 503 naming them, the API answers
  503 with ``Retry-After``, ``airuntime_loop_errors_total`` counts), once it is back
  every loop is healthy again and the runs queued before the outage dispatch and end
  Succeeded.
* **A runtime freezes.** A real ``airt runtime`` process is stopped with SIGSTOP while
  runs are queued for it: deliveries time out (the blocking client outlives its block,
  so the pump never dies), the instance becomes suspect and admission skips it; after
  SIGCONT the mark expires and every run is dispatched once and ends Succeeded.

Waiting on other processes (Valkey, the runtime) has deadlines; nothing sleeps for order.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from airuntime.control_plane.api import create_app
from airuntime.control_plane.metrics import ControlPlaneMetrics
from airuntime.control_plane.rbac import Authenticator, TokenEntry
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.control_plane.shared_runs import SharedRunStatus
from airuntime.core import keys
from airuntime.devstack.child_process import free_port
from airuntime.devstack.embedded import EmbeddedServer
from airuntime.fleet.registry import Registry
from runtime_pod.host import RuntimeHost
from tests.control_plane.support import LOCAL_RUNTIME, TINY_PIPELINE, running_host, snap, wait_for
from tests.runtime.support import AIRT, subprocess_env

pytestmark = pytest.mark.timeout(300)

RUNS = 6


@pytest_asyncio.fixture
async def durable_valkey(tmp_path: Path) -> AsyncIterator[EmbeddedServer]:
    """A Valkey that keeps its data (AOF, fsync always) and its port across restarts."""
    server = EmbeddedServer(
        data_dir=tmp_path / "valkey",
        fixed_port=free_port(),
        extra_args=("--appendfsync", "always"),
    )
    await server.astart()
    try:
        yield server
    finally:
        await server.astop()


def _settings(**extra: object) -> ControlPlaneSettings:
    return ControlPlaneSettings(
        scale_out_enabled=False, reconcile_interval_s=0.2, retention_interval_s=0.5, **extra
    )


async def _all_succeeded(cp: ControlPlane, ids: list[str]) -> bool:
    try:
        runs = await cp.runs.get_many(ids)
    except RedisConnectionError:  # a pooled connection from before the restart
        return False
    return all(r.status is SharedRunStatus.SUCCEEDED for r in runs)


async def test_loops_recover_when_redis_is_killed_and_restarted(
    durable_valkey: EmbeddedServer,
) -> None:
    redis = Redis.from_url(durable_valkey.url)
    cp = ControlPlane(redis, _settings())
    metrics = ControlPlaneMetrics(cp)
    auth = Authenticator(
        [TokenEntry(token="token-admin", user="a", tenant="default", roles=["admin"])]
    )
    api = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(cp, auth, metrics)), base_url="http://cp"
    )
    headers = {"authorization": "Bearer token-admin"}
    await cp.start()
    try:
        await cp.wait_started()
        queued = [(await cp.submit(TINY_PIPELINE, snap())).shared_run_id for _ in range(RUNS)]

        os.kill(durable_valkey.pid or 0, signal.SIGKILL)
        await durable_valkey.astop()  # reaps the killed server; its data dir stays

        async def loops_failing() -> bool:
            # Both loops whose errors are counted below, not the first to notice: a call
            # under way when the server died is retried by the client with a backoff, so
            # a loop can ride out a short outage (CI at 8fc0845 restarted Valkey once
            # `outcomes` alone had failed, and `pump` counted no error).
            return {"pump", "outcomes"} <= set(cp.unhealthy_loops())

        await wait_for(loops_failing, what="the pump and outcomes loops to notice Redis is gone")
        ready = await api.get("/readyz")
        assert ready.status_code == 503
        submit = await api.post("/v1/runs", json={"pipeline": TINY_PIPELINE}, headers=headers)
        assert submit.status_code == 503, submit.text
        assert int(submit.headers["retry-after"]) > 0 and "Redis" in submit.json()["detail"]

        await durable_valkey.astart()  # same port, same data

        async def ready_again() -> bool:
            return not cp.unhealthy_loops() and (await api.get("/readyz")).status_code == 200

        await wait_for(ready_again, timeout_s=60, what="every loop healthy, /readyz 200 again")
        errors: dict[str, float] = {}

        async def scraped() -> bool:
            # The first scrape after the restart may meet a pooled connection from
            # before it and answer 503 (Retry-After), as Prometheus would see it.
            response = await api.get("/metrics")
            if response.status_code != 200:
                assert response.status_code == 503, response.text
                return False
            errors.update(
                (line.split('"')[1], float(line.rsplit(" ", 1)[1]))
                for line in response.text.splitlines()
                if line.startswith("airuntime_loop_errors_total{")
            )
            return True

        await wait_for(scraped, timeout_s=30, what="a 200 scrape of /metrics")
        assert errors["pump"] >= 1 and errors["outcomes"] >= 1, errors

        # A runtime that starts now, with a client of its own (its loops are not the
        # control plane's to keep alive).
        runtime_redis = Redis.from_url(durable_valkey.url)
        async with running_host(RuntimeHost(runtime_redis, LOCAL_RUNTIME, instances=1), cp):
            await wait_for(
                lambda: _all_succeeded(cp, queued),
                timeout_s=60,
                what="the runs queued before the outage to end Succeeded",
            )
        await runtime_redis.aclose()
    finally:
        await api.aclose()
        await cp.stop()
        await redis.aclose()


async def _spawn_runtime(url: str, home: Path) -> asyncio.subprocess.Process:
    env = subprocess_env(
        url,
        AIRUNTIME_HOME=str(home),
        AIRUNTIME_INSTANCE_ID="frozen-1",
        AIRUNTIME_RUNTIME_PREFIX="frozen",
        AIRUNTIME_WORKERS="2",
        # The registry entry must outlive the freeze: what is tested is an instance that
        # is registered but cannot be reached.
        AIRUNTIME_HEARTBEAT_S="20",
    )
    return await asyncio.create_subprocess_exec(
        AIRT,
        "runtime",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def test_a_frozen_runtime_is_skipped_then_served_and_the_pump_never_dies(
    valkey: Redis, valkey_url: str, tmp_path: Path
) -> None:
    cp = ControlPlane(
        valkey,
        _settings(
            delivery_timeout_s=1.0, delivery_failures_before_suspect=2, suspect_initial_s=1.0
        ),
    )
    runtime = await _spawn_runtime(valkey_url, tmp_path)
    try:

        async def registered() -> bool:
            d = await Registry(valkey).get("frozen-1")
            return d is not None and d.capacity.can_accept_run

        await wait_for(registered, timeout_s=60, what="the runtime registered")
        runtime.send_signal(signal.SIGSTOP)
        await cp.start()
        await cp.wait_started()
        ids = [(await cp.submit(TINY_PIPELINE, snap())).shared_run_id for _ in range(RUNS)]

        async def suspect() -> bool:
            return bool(await valkey.exists(keys.suspect_instance("frozen-1")))

        await wait_for(suspect, timeout_s=60, what="the frozen runtime marked suspect")
        assert "pump" not in cp.unhealthy_loops()
        runtime.send_signal(signal.SIGCONT)

        await wait_for(
            lambda: _all_succeeded(cp, ids), timeout_s=120, what="every run to end Succeeded"
        )
        assert cp.supervisor.loops["pump"].errors == 0, cp.supervisor.report()["pump"]
        runs = await cp.runs.get_many(ids)
        assert {r.assigned_instance_id for r in runs} == {"frozen-1"}
        assert len({r.run_id for r in runs}) == RUNS, "each shared run became one run"
        assert not await valkey.exists(keys.suspect_instance("frozen-1")), "cleared by success"
    finally:
        await cp.stop()
        if runtime.returncode is None:
            runtime.send_signal(signal.SIGCONT)
            runtime.terminate()
            await asyncio.wait_for(runtime.wait(), 30)
