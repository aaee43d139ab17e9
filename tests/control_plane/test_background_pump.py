"""The background pump's readiness gate, then dispatch over the HTTP provider.

The gate is observed through the registry reads it makes (an event fires after a
given number of polls), never through elapsed time: while nothing ready and able to
accept a run is registered, the pump does not run a single dispatch cycle (with
scale-out enabled a premature cycle would visibly park the run in
ScaleOutRequested). Once a pooled HTTP runtime host registers its children, the
gate passes and the queued run is dispatched to a ``runtime-http-*`` child and
completes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis

from airuntime.control_plane.dispatch import DispatchResult
from airuntime.control_plane.pump import BackgroundPump, PumpResult, PumpStop, SharedQueuePump
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.control_plane.shared_runs import SharedRunStatus
from airuntime.core.supervision import Supervisor
from airuntime.fleet.registry import InstanceDescriptor, InstanceStatus, Registry
from runtime_pod.config import InstanceConfig
from runtime_pod.host import RuntimeHost
from tests.control_plane.support import (
    TINY_PIPELINE,
    descriptor,
    publish,
    run_body,
    running_cp,
    running_host,
    snap,
    wait_finished,
    wait_for,
)


class PollCountingRegistry(Registry):
    """The real registry; ``polled(n)`` fires once ``list_all`` ran n more times."""

    def __init__(self, redis: Redis) -> None:
        super().__init__(redis)
        self.polls = 0
        self._waiters: list[tuple[int, asyncio.Event]] = []

    async def list_all(self) -> list[InstanceDescriptor]:
        found = await super().list_all()
        self.polls += 1
        for target, event in self._waiters:
            if self.polls >= target:
                event.set()
        return found

    async def polled(self, more: int) -> None:
        event = asyncio.Event()
        self._waiters.append((self.polls + more, event))
        await asyncio.wait_for(event.wait(), 10)


RUNTIME_TOKEN = "runtime-token-for-tests"


async def test_background_pump_waits_for_a_ready_runtime_then_dispatches_over_http(
    redis: Redis,
) -> None:
    observed: list[DispatchResult] = []
    cp = ControlPlane(
        redis,
        ControlPlaneSettings(
            background_pump=True, scale_out_enabled=True, runtime_token=RUNTIME_TOKEN
        ),
        observer=observed.append,
    )
    gate_registry = PollCountingRegistry(redis)
    cp.background.registry = gate_registry
    config = InstanceConfig(provider="http", runtime_prefix="runtime-http", heartbeat_s=0.5)
    host = RuntimeHost(redis, config, instances=2, http_port=0, token=RUNTIME_TOKEN)
    async with running_cp(cp):
        run = await cp.submit(TINY_PIPELINE, snap())

        # 1. Nothing registered: the gate keeps looking, no dispatch cycle runs.
        await gate_registry.polled(3)
        assert not cp.background.ready.is_set()

        # 2. Registered but not dispatchable: Starting, or Ready with a paused queue.
        await publish(redis, descriptor("runtime-starting-1", status=InstanceStatus.STARTING))
        await publish(redis, descriptor("runtime-paused-1", paused=True))
        await gate_registry.polled(3)
        assert not cp.background.ready.is_set()
        assert observed == []
        queued = await cp.runs.get(run.shared_run_id)
        assert queued is not None and queued.status is SharedRunStatus.QUEUED_GLOBALLY
        assert (await cp.queue.item(run.shared_run_id, "default"))["status"] == "Pending"

        # 3. A pooled HTTP host registers its children: the gate passes, the pump dispatches.
        async with running_host(host):
            await asyncio.wait_for(cp.background.ready.wait(), 10)
            await wait_finished(cp, run.shared_run_id, "default")
            # The shared run ends when the control plane reads the runtime's outcome.
            body = await wait_for(
                lambda: _when_succeeded(cp, run.shared_run_id),
                timeout_s=30,
                what="the shared run to end Succeeded",
            )

    children = {i.instance_id for i in host.instances}
    assert children == {"runtime-http-1", "runtime-http-2"}
    assert body["status"] == "Succeeded"
    assert body["assigned_instance_id"] in children
    assert body["run"]["status"] == "completed" and body["execution_id"]
    assert [(r.success, r.instance_id) for r in observed] == [(True, body["assigned_instance_id"])]


async def _when_succeeded(cp: ControlPlane, shared_run_id: str) -> dict[str, Any] | None:
    body = await run_body(cp, shared_run_id, "default")
    return body if body is not None and body["status"] == "Succeeded" else None


class GatedPump(SharedQueuePump):
    """A pump whose passes find nothing; the first one waits for the test to submit."""

    def __init__(self) -> None:
        self.passes = 0
        self.inside_first = asyncio.Event()
        self.release_first = asyncio.Event()
        self.second_pass = asyncio.Event()

    async def pump_batches(self, max_runs: int = 1000, batch: int = 64) -> PumpResult:
        self.passes += 1
        if self.passes == 1:
            self.inside_first.set()  # the pass has looked at the queues: empty
            await self.release_first.wait()
        else:
            self.second_pass.set()
        return PumpResult(stopped=PumpStop.EMPTY)


async def test_a_submit_during_an_empty_pass_is_not_left_for_the_idle_period(
    redis: Redis,
) -> None:
    """The submit's wake-up lands while a pass that found nothing is still running: the
    pump looks again at once instead of sleeping its idle period (an hour here)."""
    pump = GatedPump()
    background = BackgroundPump(pump, Registry(redis), idle_s=3600)
    background.ready.set()
    supervisor = Supervisor("pump-test")
    supervisor.start("pump", background.run)
    try:
        await asyncio.wait_for(pump.inside_first.wait(), 10)
        background.wake.set()  # what ControlPlane.submit does
        pump.release_first.set()
        await asyncio.wait_for(pump.second_pass.wait(), 10)
    finally:
        await supervisor.stop()
    assert pump.passes == 2
