"""Step-slot admission wired into a runtime instance, and its live setting.

One FIFO slot controller per instance bounds step handlers across all executions;
the limit changes live through the host's settings API, ``airt runtime settings
set --endpoint`` and the tenant settings the operator publishes in Redis; invalid
values are refused with a message naming the setting, and a bad persisted value
stops ``airt runtime`` from starting.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime_pod.settings_store import SettingsStore
from runtime_pod.step_slots import SlotEvidence, StepSlot, StepSlotController
from tests.conftest import RedisServerInfo
from tests.runtime.conftest import MakeHost, Runtime
from tests.runtime.support import (
    AIRT,
    TEST_TOKEN,
    HeartbeatProbe,
    Signal,
    pipeline,
    request,
    subprocess_env,
    tenant_settings,
)

AUTH = {"authorization": f"Bearer {TEST_TOKEN}"}

pytestmark = pytest.mark.timeout(60)
KEY = "max_concurrent_step_tasks"
# CLI tests spawn `airt` processes; the server kind does not matter to them.
only_valkey = pytest.mark.parametrize(
    "redis_server", [pytest.param("valkey", id="valkey")], indirect=True
)


class RecordingSlots(StepSlotController):
    """Records the order in which step tasks ask for a slot (their arrival)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.arrivals: list[str] = []
        self.signal = Signal()

    def slot(self, execution_id: str) -> StepSlot:
        self.arrivals.append(execution_id)
        self.signal.notify()
        return super().slot(execution_id)


async def _airt(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        AIRT,
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_one_step_slot_runs_handlers_of_two_executions_one_at_a_time_in_fifo_order(
    runtime: Runtime,
) -> None:
    slots = RecordingSlots(1)
    inst = await runtime.start(
        "slot-1", slots=slots, workers=4, max_local_workers_per_execution=2, max_concurrent_runs=2
    )
    runs = [await inst.accept(request(pipeline(2))) for _ in range(2)]
    await slots.signal.wait_for(lambda: len(slots.arrivals) == 4, "4 step tasks asked for a slot")
    assert len(set(slots.arrivals)) == 2, "both executions are waiting"
    gate = runtime.gate
    for k in range(1, 5):
        await gate.wait_entered(k)
        assert len(gate.inside()) == 1, "one handler at a time across both executions"
        gate.release(gate.entered[k - 1])
    assert [key.split("/")[0] for key in gate.entered] == slots.arrivals, "FIFO by arrival"
    assert gate.max_total == 1
    for run_id in runs:
        assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
    # The evidence left the controller when each run ended: it is on the run record and
    # in the execution's ledger, no longer in memory.
    for run_id in runs:
        record = await inst.run_status(run_id, "tenant-a")
        assert record is not None and record.execution_id in slots.arrivals
        assert record.step_slots is not None
        counts = {k: record.step_slots[k] for k in ("admitted", "succeeded", "failed")}
        assert counts == {"admitted": 2, "succeeded": 2, "failed": 0}
        assert slots.evidence(record.execution_id) == SlotEvidence(), "popped"


async def test_a_live_limit_change_over_http_and_the_cli_applies_at_once_and_persists(
    runtime: Runtime, hosts: MakeHost, tmp_path: Path
) -> None:
    path = tmp_path / "settings.yaml"
    SettingsStore(path).set(KEY, 1)
    host = await hosts(
        settings_store=SettingsStore(path), workers=8, max_local_workers_per_execution=8
    )
    inst = host.instances[0]
    assert inst.slots.limit == 1, "the persisted value is used at startup"
    probe = HeartbeatProbe(inst)
    run_id = await inst.accept(request(pipeline(8)))
    await runtime.gate.wait_entered(1)
    await probe.rounds(2)
    assert (len(runtime.gate.inside()), inst.slots.queued) == (1, 7)

    async with httpx.AsyncClient(base_url=host.endpoint, timeout=10, headers=AUTH) as client:
        resp = await client.put(f"/v1/settings/{KEY}", json={"value": 4})
        assert resp.status_code == 200 and resp.json() == {KEY: 4}
        await runtime.gate.wait_entered(4, "raising the limit admits queued steps at once")
        assert inst.slots.limit == 4 and len(runtime.gate.inside()) == 4
        assert SettingsStore(path).load().max_concurrent_step_tasks == 4
        assert (await client.get("/v1/settings")).json() == {KEY: 4}

    cli_home = tmp_path / "cli-home"
    code, out, err = await _airt(
        "runtime", "settings", "set", KEY, "6", "--endpoint", host.endpoint,
        env=subprocess_env(None, AIRUNTIME_HOME=str(cli_home), AIRUNTIME_RUNTIME_TOKEN=TEST_TOKEN),
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out) == {KEY: 6}
    await runtime.gate.wait_entered(6, "the CLI change applies without a restart")
    assert inst.slots.limit == 6
    assert SettingsStore(path).load().max_concurrent_step_tasks == 6
    assert not cli_home.exists(), "the CLI changed the host's settings, not a local file"
    runtime.gate.open()
    assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(-1, id="negative"),
        pytest.param("abc", id="text"),
        pytest.param(2.5, id="fraction"),
        pytest.param(True, id="boolean"),
        pytest.param(None, id="null"),
    ],
)
async def test_an_invalid_limit_over_http_is_refused_with_400_and_changes_nothing(
    hosts: MakeHost, tmp_path: Path, value: Any
) -> None:
    path = tmp_path / "settings.yaml"
    SettingsStore(path).set(KEY, 3)
    host = await hosts(settings_store=SettingsStore(path))
    async with httpx.AsyncClient(base_url=host.endpoint, timeout=10, headers=AUTH) as client:
        resp = await client.put(f"/v1/settings/{KEY}", json={"value": value})
    assert resp.status_code == 400, resp.text
    detail = resp.json()["detail"]
    assert KEY in detail and "integer >= 0" in detail and repr(value) in detail, detail
    assert host.instances[0].slots.limit == 3
    assert SettingsStore(path).load().max_concurrent_step_tasks == 3


@only_valkey
async def test_an_invalid_limit_through_the_cli_exits_2_and_changes_nothing(
    hosts: MakeHost, tmp_path: Path
) -> None:
    path = tmp_path / "settings.yaml"
    SettingsStore(path).set(KEY, 3)
    host = await hosts(settings_store=SettingsStore(path))
    for value in ("-1", "abc", "1.5"):
        code, _, err = await _airt(
            "runtime", "settings", "set", KEY, value, "--endpoint", host.endpoint,
            env=subprocess_env(None, AIRUNTIME_RUNTIME_TOKEN=TEST_TOKEN),
        )  # fmt: skip
        assert code == 2, err
        assert f"{KEY}: must be an integer >= 0, got '{value}'" in err, err
    assert host.instances[0].slots.limit == 3
    assert SettingsStore(path).load().max_concurrent_step_tasks == 3


@only_valkey
@pytest.mark.parametrize(
    "content",
    [
        pytest.param(f"{KEY}: -3\n", id="negative"),
        pytest.param(f"{KEY}: many\n", id="text"),
    ],
)
async def test_a_bad_persisted_limit_stops_airt_runtime_from_starting(
    redis_server: RedisServerInfo, tmp_path: Path, content: str
) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text(content)
    code, _, err = await _airt(
        "runtime", "--settings-file", str(path), "--prefix", "bad",
        env=subprocess_env(redis_server.url),
    )  # fmt: skip
    assert code == 2, err
    flat = " ".join(err.split())
    assert str(path) in flat and KEY in flat, err


async def test_tenant_settings_published_in_redis_change_the_limit_on_the_next_heartbeat(
    runtime: Runtime,
) -> None:
    inst = await runtime.start(
        "slot-1",
        tenant_id="tenant-a",
        max_concurrent_step_tasks=1,
        workers=4,
        max_local_workers_per_execution=4,
    )
    probe = HeartbeatProbe(inst)
    run_id = await inst.accept(request(pipeline(4)))
    await runtime.gate.wait_entered(1)
    await probe.rounds(2)
    assert (len(runtime.gate.inside()), inst.slots.queued) == (1, 3)

    await runtime.registry.put_tenant(tenant_settings("tenant-a", max_concurrent_step_tasks=3))
    await runtime.gate.wait_entered(3, "the operator's limit applies on the next heartbeat")
    assert inst.slots.limit == 3 and len(runtime.gate.inside()) == 3
    runtime.gate.open()
    assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
