"""Real ``airt runtime`` processes: startup rules, registration, SIGTERM, kill -9.

Waiting on another process (its ready line, its ledger entries, its exit) has a
deadline; everything inside this process waits on events.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.fleet.providers import RedisProvider
from airuntime.fleet.registry import Registry
from airuntime.k8s.v1alpha1 import RuntimePoolSpec
from airuntime_operator.deployments import runtime_env
from tests.conftest import RedisServerInfo
from tests.runtime.conftest import Runtime
from tests.runtime.support import (
    AIRT,
    completions,
    eventually,
    pipeline,
    request,
    subprocess_env,
)

pytestmark = pytest.mark.timeout(90)
only_valkey = pytest.mark.parametrize(
    "redis_server", [pytest.param("valkey", id="valkey")], indirect=True
)


async def _airt(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        AIRT, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _spawn_runtime(
    url: str | None, home: Path, *args: str, **env: str
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        AIRT,
        "runtime",
        *args,
        env=subprocess_env(url, AIRUNTIME_HOME=str(home), **env),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def _ready(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    """The host's ``{"event": "ready", ...}`` line on stderr."""
    assert proc.stderr is not None
    seen: list[str] = []
    async with asyncio.timeout(30):
        while True:
            line = (await proc.stderr.readline()).decode()
            if not line:
                raise AssertionError(f"airt runtime exited ({await proc.wait()}): {seen}")
            seen.append(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == "ready":
                return event


async def _terminated(proc: asyncio.subprocess.Process) -> int:
    """SIGTERM, then the exit code (a clean shutdown drains and unregisters)."""
    proc.send_signal(signal.SIGTERM)
    return await asyncio.wait_for(proc.wait(), 30)


async def _killed(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL a process the test left running (its assertions failed)."""
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


async def _listed(url: str) -> dict[str, dict[str, Any]]:
    code, out, err = await _airt("instances", "--json", env=subprocess_env(url))
    assert code == 0, err
    return {d["instance_id"]: d for d in json.loads(out)}


async def test_airt_runtime_without_a_redis_url_exits_2_saying_so(tmp_path: Path) -> None:
    code, _, err = await _airt(
        "runtime", "--tenant", "team-x", "--prefix", "px", "--workers", "2",
        env=subprocess_env(None, AIRUNTIME_HOME=str(tmp_path)),
    )  # fmt: skip
    assert code == 2, err
    assert "AIRUNTIME_REDIS_URL" in err, err


@only_valkey
async def test_airt_runtime_is_listed_by_airt_instances_before_a_heartbeat_and_gone_after_sigterm(
    redis_server: RedisServerInfo, runtime: Runtime, tmp_path: Path
) -> None:
    url = redis_server.url
    proc = await _spawn_runtime(
        url, tmp_path, "--tenant", "team-x", "--prefix", "px", "--workers", "3",
        "--heartbeat-s", "30",  # registration cannot be waiting for a heartbeat
    )  # fmt: skip
    try:
        ready = await _ready(proc)
        assert ready["instances"] == ["px-1"]
        listed = await _listed(url)
        assert set(listed) == {"px-1"}
        desc = listed["px-1"]
        assert (desc["tenant_id"], desc["runtime_prefix"], desc["status"]) == (
            "team-x",
            "px",
            "Ready",
        )
        assert desc["capacity"]["worker_count"] == 3 and desc["capacity"]["can_accept_run"]
        assert desc["endpoint"].startswith("http://127.0.0.1:")

        assert await _terminated(proc) == 0
    finally:
        await _killed(proc)
    assert await _listed(url) == {}
    assert await runtime.registry.get("px-1") is None


async def test_a_killed_instance_loses_nothing_its_execution_and_queued_runs_finish_elsewhere(
    redis_server: RedisServerInfo, runtime: Runtime, tmp_path: Path
) -> None:
    n = 200
    proc = await _spawn_runtime(
        redis_server.url, tmp_path, "--prefix", "doomed", "--workers", "4",
        "--max-concurrent-runs", "1", "--heartbeat-s", "0.3", "--lease-ms", "500",
    )  # fmt: skip
    try:
        [doomed] = (await _ready(proc))["instances"]
        desc = await runtime.registry.get(doomed)
        assert desc is not None
        delivery = RedisProvider(runtime.redis)
        big = await delivery.deliver(
            desc, request(pipeline(n, uses="sleep", with_={"seconds": 0.02}))
        )
        waiting = [
            await delivery.deliver(desc, request(pipeline(3, uses="noop"))) for _ in range(2)
        ]
        execution: list[str] = []

        async def claimed_steps() -> bool:
            record = await runtime.index.get_for_tenant(big, "tenant-a")
            if record is None or record.execution_id is None:
                return False
            execution[:] = [record.execution_id]
            events = await runtime.store.events(record.execution_id)
            return sum(e.type == "step_claimed" for e in events) >= 8

        await eventually(claimed_steps, f"{doomed} claimed steps")
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 30)
    finally:
        await _killed(proc)
    [eid] = execution
    for run_id in waiting:
        record = await runtime.index.get_for_tenant(run_id, "tenant-a")
        assert record is not None and record.status == "queued" and record.instance_id == doomed

    await runtime.start("survivor", lease_ms=500, workers=8, max_local_workers_per_execution=4)
    for run_id in (big, *waiting):
        state = await runtime.watcher.reached(run_id, "completed", "failed", timeout=40)
        assert state == "completed", run_id
        record = await runtime.index.get_for_tenant(run_id, "tenant-a")
        assert record is not None and record.instance_id == "survivor"
        adopted_from = await runtime.redis.hget(keys.run(run_id), "adopted_from")
        assert adopted_from == doomed.encode()

    events = await runtime.store.events(eid)
    done = completions(events)
    assert len(done) == n and set(done.values()) == {1}, "every step completed exactly once"
    assert [e for e in events if e.type == "step_recovered"], "the dead claims were recovered"
    owners = {e.get("worker").split("@")[0] for e in events if e.type == "step_claimed"}
    assert owners == {doomed, "survivor"}
    assert (await runtime.store.info(eid)).status == "Succeeded"


def _pod_env(spec: RuntimePoolSpec, redis_url: str, pod_name: str) -> dict[str, str]:
    """The env the operator writes for a pool's pod, resolved as the kubelet would."""
    resolved = {
        "AIRUNTIME_REDIS_URL": redis_url,  # secretKeyRef
        "AIRUNTIME_INSTANCE_ID": pod_name,  # fieldRef metadata.name
        "AIRUNTIME_ADVERTISE_HOST": "127.0.0.1",  # fieldRef status.podIP
    }
    env = {e["name"]: e.get("value", resolved.get(e["name"])) for e in runtime_env(spec)}
    env["AIRUNTIME_HTTP_PORT"] = "0"  # a pod's port is fixed; here, any free one
    return {name: value for name, value in env.items() if value is not None}


@only_valkey
async def test_a_runtime_configured_only_by_the_operators_pod_env_is_its_pools_instance(
    redis_server: RedisServerInfo, runtime: Runtime, tmp_path: Path
) -> None:
    spec = RuntimePoolSpec.model_validate(
        {
            "tenantId": "acme",
            "isolationMode": "Dedicated",
            "runtimePrefix": "acme-rt",
            "workersPerInstance": 6,
            "maxConcurrentRunsPerInstance": 2,
            "localQueueCapacity": 40,
            "maxLocalWorkersPerExecution": 3,
            "maxConcurrentStepTasks": 7,
            "redis": {"name": "redis-credentials", "key": "url"},
        }
    )
    env = _pod_env(spec, redis_server.url, "acme-rt-5d8f-x2x9q")
    assert env["AIRUNTIME_TENANT_GROUP_ID"] == "", "no group: the operator writes it empty"
    # The operator publishes the pool's tenant settings; the pod has no step-task limit
    # of its own and takes the pool's before its first run.
    client = Redis.from_url(redis_server.url)
    try:
        await Registry(client).put_tenant(spec.tenant_settings())
    finally:
        await client.aclose()
    proc = await _spawn_runtime(None, tmp_path, **env, AIRUNTIME_RUNTIME_TOKEN="pod-token")
    try:
        assert (await _ready(proc))["instances"] == ["acme-rt-5d8f-x2x9q"]
        desc = (await _listed(redis_server.url))["acme-rt-5d8f-x2x9q"]
        assert (desc["tenant_id"], desc["tenant_group_id"], desc["isolation_mode"]) == (
            "acme",
            None,
            "Dedicated",
        )
        assert (desc["runtime_prefix"], desc["allow_shared_fallback"]) == ("acme-rt", False)
        capacity = desc["capacity"]
        assert (capacity["worker_count"], capacity["max_concurrent_runs"]) == (6, 2)
        assert (capacity["queue_capacity"], capacity["max_local_workers_per_execution"]) == (40, 3)
        assert desc["endpoint"].startswith("http://127.0.0.1:")
        async with httpx.AsyncClient(base_url=desc["endpoint"]) as http:
            settings = await http.get("/v1/settings", headers={"authorization": "Bearer pod-token"})
        assert settings.status_code == 200, settings.text
        assert settings.json() == {"max_concurrent_step_tasks": 7}
        assert await _terminated(proc) == 0
    finally:
        await _killed(proc)
