"""Registration, graceful stop, crash expiry, the tenant-aware run index, assistance.

An instance registers before its first heartbeat, leaves the registry on ``stop()``
and, when it crashes, disappears once its registration TTL expires. Status and cancel
by RunId answer "not found" to another tenant. Idle workers assist running executions
only of tenants that may use the instance.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError

from airuntime.core import keys
from airuntime.engine.handlers import HandlerRegistry
from airuntime.fleet.registry import InstanceDescriptor
from airuntime.fleet.runs import RunStatus
from airuntime.fleet.tenancy import IsolationMode, TenantSettings
from tests.runtime.conftest import Runtime
from tests.runtime.support import (
    DEADLINE_S,
    HeartbeatProbe,
    completions,
    crash,
    eventually,
    pipeline,
    request,
    tenant_settings,
)

pytestmark = pytest.mark.timeout(60)


async def test_an_instance_registers_before_its_first_heartbeat_and_stop_unregisters_it(
    runtime: Runtime,
) -> None:
    inst = runtime.instance("reg-1", heartbeat_s=30, workers=3, runtime_prefix="reg")
    await inst.start()
    published = await runtime.registry.get("reg-1")
    assert published is not None, "registered by start(), not a heartbeat later"
    assert (published.runtime_prefix, published.capacity.worker_count) == ("reg", 3)
    assert [d.instance_id for d in await runtime.registry.list_all()] == ["reg-1"]

    await inst.stop()
    assert await runtime.registry.get("reg-1") is None
    assert await runtime.registry.list_all() == []


async def test_stop_returns_even_when_a_redis_call_swallows_the_cancellation(
    runtime: Runtime,
) -> None:
    """redis-py (8.1) sometimes swallows a cancellation that lands inside a command; the
    heartbeat then carries on as if never cancelled. Reproduced here deterministically."""
    inst = runtime.instance("reg-1", heartbeat_s=0.05)
    original = inst.registry.publish_if_queued  # a standalone server's publication
    inside = asyncio.Event()
    armed = [True]

    async def publish(descriptor: InstanceDescriptor, ttl_ms: int, queue: str) -> tuple[bool, int]:
        task = asyncio.current_task()
        if armed[0] and task is not None and task.get_name().endswith(":heartbeat"):
            armed[0] = False
            inside.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                return True, 0  # swallowed, as redis-py does
        return await original(descriptor, ttl_ms, queue)

    inst.registry.publish_if_queued = publish  # type: ignore[method-assign]
    await inst.start()
    await asyncio.wait_for(inside.wait(), DEADLINE_S)
    await asyncio.wait_for(inst.stop(), DEADLINE_S)
    assert inst.supervisor.unhealthy() == list(inst.supervisor.loops), "every loop stopped"
    assert await runtime.registry.get("reg-1") is None


async def test_a_crashed_instance_disappears_when_its_registration_expires(
    runtime: Runtime,
) -> None:
    inst = await runtime.start("reg-1", heartbeat_s=0.2)  # registration TTL 0.6 s
    survivor = await runtime.start("reg-2", heartbeat_s=0.2)
    await crash(inst)
    assert await runtime.registry.get("reg-1") is not None, "nobody unregistered it"

    async def expired() -> bool:
        return await runtime.registry.get("reg-1") is None

    await eventually(expired, "the crashed instance's registration expired")
    assert [d.instance_id for d in await runtime.registry.list_all()] == [survivor.instance_id]


async def test_graceful_stop_mid_run_fails_no_step_and_another_instance_finishes_the_run(
    runtime: Runtime,
) -> None:
    n = 60
    first = await runtime.start("stop-1", lease_ms=400, max_local_workers_per_execution=4)
    run_id = await first.accept(request(pipeline(n, uses="sleep", with_={"seconds": 0.02})))
    await runtime.watcher.reached(run_id, "running")
    record = await first.run_status(run_id, "tenant-a")
    assert record is not None and record.execution_id is not None
    eid = record.execution_id

    await runtime.steps.signal.wait_for(
        lambda: runtime.steps.outcomes[eid]["completed"] >= 8, "the first instance ran steps"
    )
    await first.stop(drain_timeout_s=0.05)
    assert await runtime.registry.get("stop-1") is None

    await runtime.start("stop-2", lease_ms=400)
    assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
    events = await runtime.store.events(eid)
    assert [e.fields for e in events if e.type in ("step_failed", "step_retry_scheduled")] == []
    done = completions(events)
    assert len(done) == n and set(done.values()) == {1}, "every step completed exactly once"
    final = await runtime.index.get_for_tenant(run_id, "tenant-a")
    assert final is not None and final.instance_id == "stop-2"


# -- tenant-aware run index -------------------------------------------------------------


async def test_another_tenant_cannot_read_or_cancel_a_run_nor_learn_its_execution_id(
    runtime: Runtime,
) -> None:
    inst = await runtime.start("ten-1")
    other = await runtime.start("ten-2", tenant_id="tenant-b", isolation_mode="Dedicated")
    run_id = await inst.accept(request(pipeline(1), tenant="tenant-a"))
    await runtime.gate.wait_entered(1)

    for via in (inst, other):
        assert await via.run_status(run_id, "tenant-b") is None
        assert await via.cancel_run(run_id, "tenant-b") is None
        assert await via.run_status("run-does-not-exist", "tenant-b") is None
    assert await runtime.index.list_for_tenant("tenant-b") == []

    own = await inst.run_status(run_id, "tenant-a")
    assert own is not None and own.status is RunStatus.RUNNING and own.execution_id
    events = await runtime.store.events(own.execution_id)
    assert [e for e in events if e.type == "cancel_requested"] == [], "the run is unaffected"
    runtime.gate.open()
    assert await runtime.watcher.reached(run_id, "completed", "failed", "cancelled") == "completed"
    assert [r.run_id for r in await runtime.index.list_for_tenant("tenant-a")] == [run_id]


# -- assistance ---------------------------------------------------------------------------


def _claimers(events: list, prefix: str) -> set[str]:  # type: ignore[type-arg]
    return {
        e.get("worker").split("@")[0]
        for e in events
        if e.type == "step_claimed" and e.get("worker").startswith(prefix)
    }


async def test_an_idle_instance_assists_a_running_execution_of_a_visible_tenant(
    runtime: Runtime,
) -> None:
    owner = await runtime.start("owner", workers=4, max_local_workers_per_execution=2)
    await runtime.start("helper", workers=4, max_local_workers_per_execution=2)
    run_id = await owner.accept(request(pipeline(8)))
    await runtime.gate.wait_entered(4, "two handlers on the owner and two on the helper")
    assert len(runtime.gate.inside()) == 4
    runtime.gate.open()
    assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
    record = await owner.run_status(run_id, "tenant-a")
    assert record is not None and record.execution_id is not None
    assert record.instance_id == "owner", "assisting does not take the run over"
    events = await runtime.store.events(record.execution_id)
    assert _claimers(events, "") == {"owner", "helper"}
    assert set(completions(events).values()) == {1}


async def test_a_dedicated_tenants_run_is_never_assisted_by_instances_it_cannot_use(
    runtime: Runtime,
) -> None:
    await runtime.registry.put_tenant(
        tenant_settings("tenant-a", isolation_mode=IsolationMode.DEDICATED)
    )
    dedicated: dict[str, Any] = {
        "workers": 4,
        "max_local_workers_per_execution": 2,
        "isolation_mode": "Dedicated",
    }
    owner = await runtime.start("a-1", tenant_id="tenant-a", **dedicated)
    outsiders = [
        await runtime.start("b-1", tenant_id="tenant-b", **dedicated),
        await runtime.start("shared-1", workers=4),
    ]
    probes = [HeartbeatProbe(o) for o in outsiders]
    run_id = await owner.accept(request(pipeline(6), tenant="tenant-a"))
    await runtime.gate.wait_entered(2)
    for probe in probes:
        await probe.rounds(3)  # two full heartbeat rounds with idle workers
    assert len(runtime.gate.inside()) == 2, "nobody joined"

    await runtime.start("a-2", tenant_id="tenant-a", **dedicated)
    await runtime.gate.wait_entered(4, "an instance of the tenant assists")
    runtime.gate.open()
    assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
    record = await owner.run_status(run_id, "tenant-a")
    assert record is not None and record.execution_id is not None
    events = await runtime.store.events(record.execution_id)
    assert _claimers(events, "") == {"a-1", "a-2"}


async def test_an_instance_lacking_the_pipelines_handlers_neither_assists_nor_fails_the_run(
    runtime: Runtime,
) -> None:
    owner = await runtime.start("owner", workers=4, max_local_workers_per_execution=2)
    stranger = await runtime.start(
        "stranger",
        workers=4,
        handlers=HandlerRegistry(autoload=True),  # no "gate" handler
    )
    probe = HeartbeatProbe(stranger)
    run_id = await owner.accept(request(pipeline(4)))
    await runtime.gate.wait_entered(2)
    await probe.rounds(3)  # two full heartbeat rounds in which it could assist
    record = await owner.run_status(run_id, "tenant-a")
    assert record is not None and record.status is RunStatus.RUNNING, record
    runtime.gate.open()
    assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
    assert runtime.watcher.states[run_id] == ["queued", "running", "completed"]


async def test_tenant_settings_reads_follow_every_change_and_refuse_a_corrupt_record(
    runtime: Runtime,
) -> None:
    # Parsed settings are shared per stored text: a change is seen at the next read, by
    # one read and by a batch read alike, and going back to no settings gives defaults.
    registry = runtime.registry
    first = await registry.tenant("tenant-a")
    assert first.isolation_mode is IsolationMode.SHARED and first.allow_shared_fallback

    await registry.put_tenant(tenant_settings("tenant-a", isolation_mode=IsolationMode.DEDICATED))
    changed = await registry.tenant("tenant-a")
    assert changed.isolation_mode is IsolationMode.DEDICATED
    assert not changed.allow_shared_fallback
    assert (await registry.tenants(["tenant-a"]))["tenant-a"] == changed

    await registry.put_tenant(tenant_settings("tenant-a", allowed_handlers=("noop",)))
    again = await registry.tenants(["tenant-a", "tenant-b"])
    assert again["tenant-a"].allowed_handlers == ("noop",)
    assert again["tenant-a"].isolation_mode is IsolationMode.SHARED
    assert again["tenant-b"] == await registry.tenant("tenant-b")

    await registry.delete_tenant("tenant-a")
    assert await registry.tenant("tenant-a") == TenantSettings(tenant_id="tenant-a") != first

    await runtime.redis.set(keys.tenant_settings("tenant-a"), b'{"tenant_id": "tenant-a", "x": 1}')
    for _ in range(2):  # refused each time: a refusal is never remembered as settings
        with pytest.raises(ValidationError, match="x"):
            await registry.tenant("tenant-a")
