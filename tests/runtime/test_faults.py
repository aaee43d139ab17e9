"""A runtime survives Redis faults: its loops are supervised, its runs finish.

* A background loop that fails is restarted with backoff, counted in
  ``airuntime_loop_errors_total{loop}``, named by ``/readyz`` (503) and in the published
  descriptor; while the controller fails the instance advertises ``can_accept_run:
  false``.
* Valkey killed with ``-9`` and started again (same address, its append-only file):
  every loop comes back by itself, the run that was executing finishes, is marked
  finished and has its outcome, and new runs are accepted through the inbox.
* The inbox reader answers what was read but never acknowledged before a drop (its
  own pending entries, and entries a dead consumer left idle).
* Blocking calls never outlive the client's socket timeout.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from airuntime.core import keys
from airuntime.core.redis_client import connect
from airuntime.fleet.instance_settings import InstanceConfig
from airuntime.fleet.outcomes import RunOutcome
from airuntime.fleet.providers import DeliveryError, RedisProvider
from airuntime.fleet.registry import Registry
from airuntime.fleet.runs import RunStatus
from runtime_pod.host import RuntimeHost
from runtime_pod.inbox import GROUP
from runtime_pod.instance import RuntimeInstance
from tests.runtime.conftest import MakeHost, Runtime
from tests.runtime.restartable import RestartableValkey
from tests.runtime.support import (
    TEST_TOKEN,
    Gate,
    HeartbeatProbe,
    RunWatcher,
    eventually,
    handlers_with,
    pipeline,
    request,
    tenant_settings,
)

pytestmark = pytest.mark.timeout(120)


async def _loop_errors(client: httpx.AsyncClient, loop: str) -> float:
    text = (await client.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        if family.name == "airuntime_loop_errors":
            return sum(s.value for s in family.samples if s.labels.get("loop") == loop)
    return 0.0


class ControllerFault:
    """Makes the controller's next Redis reads fail like a dropped connection."""

    def __init__(self, instance: RuntimeInstance) -> None:
        self.armed = True
        real = instance.index.queue_head

        async def queue_head(instance_id: str, count: int) -> list[str]:
            if self.armed:
                raise RedisConnectionError("injected: connection reset by peer")
            return await real(instance_id, count)

        instance.index.queue_head = queue_head  # type: ignore[method-assign]


async def test_a_failing_controller_is_restarted_counted_advertised_and_recovers(
    runtime: Runtime, hosts: MakeHost
) -> None:
    host = await hosts()
    inst = host.instances[0]
    probe = HeartbeatProbe(inst)
    fault = ControllerFault(inst)
    async with httpx.AsyncClient(base_url=host.endpoint, timeout=10) as client:

        def advertised(up: bool) -> bool:
            d = probe.last
            return (
                d is not None
                and d.capacity.can_accept_run is up
                and (d.unhealthy_loops == () if up else d.unhealthy_loops == ("controller",))
            )

        await probe.signal.wait_for(lambda: advertised(False), "the controller is failing")
        desc = await runtime.registry.get(inst.instance_id)
        assert desc is not None and desc.unhealthy_loops == ("controller",)
        assert not desc.capacity.can_accept_run
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json() == {
            "status": "unhealthy",
            "unhealthy_loops": {inst.instance_id: ["controller"]},
        }
        assert await _loop_errors(client, "controller") >= 1
        run_id = await inst.accept(request(pipeline(1)))  # accepted, waits in the queue
        assert runtime.watcher.states[run_id] == ["queued"]

        fault.armed = False
        runtime.gate.open()
        assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"

        await probe.signal.wait_for(lambda: advertised(True), "the controller recovered")
        assert (await client.get("/readyz")).status_code == 200
    health = inst.supervisor.loops["controller"]
    assert health.healthy and health.restarts >= 1 and "injected" in (health.last_error or "")


# -- a real outage: Valkey killed and restarted ----------------------------------------------


async def _host_on(redis: Redis, watcher: RunWatcher, gate: Gate) -> RuntimeHost:
    config = InstanceConfig(provider="redis", heartbeat_s=0.1, lease_ms=1000, workers=4)
    host = RuntimeHost(
        redis, config, instances=1, http_port=0, handlers=handlers_with(gate), token=TEST_TOKEN
    )
    await host.start()
    inst = host.instances[0]
    metrics_hook = inst.hooks.on_run_state

    def both(run_id: str, state: str) -> None:
        assert metrics_hook is not None
        metrics_hook(run_id, state)
        watcher(run_id, state)

    inst.hooks.on_run_state = both
    return host


async def _ready(client: httpx.AsyncClient) -> bool:
    return (await client.get("/readyz")).status_code == 200


async def test_valkey_killed_and_restarted_every_loop_recovers_and_the_run_finishes(
    tmp_path: Path,
) -> None:
    server = RestartableValkey(tmp_path / "valkey")
    await server.start()
    redis = connect(server.url)
    gate, watcher = Gate(), RunWatcher()
    host: RuntimeHost | None = None
    try:
        await Registry(redis).put_tenant(tenant_settings("tenant-a"))
        host = await _host_on(redis, watcher, gate)
        inst = host.instances[0]
        req = request(pipeline(2))
        run_id = await inst.accept(req)
        await gate.wait_entered(2)
        async with httpx.AsyncClient(base_url=host.endpoint, timeout=10) as client:
            server.kill()

            async def noticed() -> bool:
                body = (await client.get("/readyz")).json()
                failing = body.get("unhealthy_loops", {}).get(inst.instance_id, [])
                # an outage, not a blip: the heartbeat failed three times in a row
                return "heartbeat" in failing and heartbeat.consecutive_errors >= 3

            heartbeat = inst.supervisor.loops["heartbeat"]
            await eventually(noticed, "/readyz names the failing loops")
            during = await client.post(
                f"/v1/instances/{inst.instance_id}/runs",
                json=request(pipeline(1)).model_dump(mode="json"),
                headers={"authorization": f"Bearer {TEST_TOKEN}"},
            )
            assert (during.status_code, during.json()["reason"]) == (503, "unavailable")
            await server.start()  # immediately: the server answers LOADING, then serves
            await eventually(lambda: _ready(client), "every loop recovered", timeout=30)
            assert await _loop_errors(client, "heartbeat") >= 1

            gate.open()
            assert await watcher.reached(run_id, "completed", "failed", timeout=40) == "completed"
            record = await inst.run_status(run_id, "tenant-a")
            assert record is not None and record.status is RunStatus.COMPLETED
            outcomes = [
                RunOutcome.from_fields(f) for _, f in await redis.xrange(keys.RunBucket(0).outcomes)
            ]
            assert [(o.run_id, o.status) for o in outcomes] == [(run_id, RunStatus.COMPLETED)]

            desc = await Registry(redis).get(inst.instance_id)
            assert desc is not None
            after = await RedisProvider(redis).deliver(desc, request(pipeline(1)))
            assert await watcher.reached(after, "completed", "failed", timeout=40) == "completed"
            # Pooled connections that died with the server fail once each when next
            # used: a loop may stumble on one, and comes back again by itself.
            await eventually(lambda: _ready(client), "every loop healthy", timeout=30)
    finally:
        gate.open()
        if host is not None:
            await host.stop(drain_timeout_s=5)
        await redis.aclose()
        server.kill()


# -- the inbox after a drop ----------------------------------------------------------------------


async def _post(redis: Redis, inst: RuntimeInstance, body: dict[str, Any]) -> str:
    """A provider's inbox entry; returns the reply list to wait on."""
    reply_to = keys.reply_list(uuid.uuid4().hex)
    await redis.xadd(
        keys.instance_inbox(inst.instance_id),
        {"request": json.dumps(body), "reply_to": reply_to},
    )
    return reply_to


async def test_inbox_entries_read_but_not_acknowledged_before_a_drop_are_answered(
    runtime: Runtime, redis: Redis
) -> None:
    inst = runtime.instance("inbox-1", provider="redis")
    assert inst.inbox is not None
    stream = keys.instance_inbox(inst.instance_id)
    await inst.inbox.ensure()
    mine = request(pipeline(1, uses="noop"))
    ghosts = request(pipeline(1, uses="noop"))
    reply_mine = await _post(redis, inst, mine.model_dump(mode="json"))
    # This instance's consumer read it, then lost Redis before answering.
    await redis.xreadgroup(GROUP, inst.inbox.consumer, {stream: ">"}, count=1)
    reply_ghost = await _post(redis, inst, ghosts.model_dump(mode="json"))
    # A consumer of an earlier process of this instance read it and died.
    await redis.xreadgroup(GROUP, "inbox-1@a-dead-pod", {stream: ">"}, count=1)
    assert (await redis.xpending(stream, GROUP))["pending"] == 2

    await inst.start()
    for reply_to, req in ((reply_mine, mine), (reply_ghost, ghosts)):

        async def answered(reply_to: str = reply_to) -> bool:
            return bool(await redis.exists(reply_to))

        await eventually(answered, f"{req.shared_run_id} answered")
        assert 0 < await redis.ttl(reply_to) <= 300, "reply lists expire"
        run_id = json.loads(await redis.lpop(reply_to))["run_id"]  # type: ignore[arg-type]
        assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
    assert (await redis.xpending(stream, GROUP))["pending"] == 0
    assert await redis.xlen(stream) == 0, "answered entries are deleted"
    assert 0 < await redis.pttl(stream) <= inst.config.heartbeat_ttl_ms * 10, "the inbox expires"

    await inst.stop()
    assert not await redis.exists(stream), "a stopped instance's inbox is gone"
    with pytest.raises(DeliveryError) as refused:
        desc = await inst.descriptor()
        await RedisProvider(redis, timeout_s=1).deliver(desc, request(pipeline(1)))
    assert refused.value.reason == "unreachable"
    assert not await redis.exists(stream), "delivering never recreates a dead inbox"


async def test_blocking_calls_block_in_slices_shorter_than_the_socket_timeout(
    runtime: Runtime, redis_server: Any
) -> None:
    client = Redis.from_url(redis_server.url, socket_timeout=0.3)
    try:
        listening = RuntimeInstance(
            client, InstanceConfig(provider="redis", heartbeat_s=0.1), "slices-1"
        )
        silent = runtime.instance("slices-2", provider="redis")  # an inbox nobody reads
        assert silent.inbox is not None
        await silent.inbox.ensure()
        await listening.start()
        try:
            with pytest.raises(DeliveryError) as waited:
                await RedisProvider(client, timeout_s=1.2).deliver(
                    await silent.descriptor(), request(pipeline(1, uses="noop"))
                )
            assert waited.value.reason == "timeout", "not a socket TimeoutError"
            run_id = await RedisProvider(client).deliver(
                await listening.descriptor(), request(pipeline(1, uses="noop"))
            )
            assert run_id.startswith("run-")
            assert listening.supervisor.loops["inbox"].errors == 0
        finally:
            await listening.stop()
    finally:
        await client.aclose()
