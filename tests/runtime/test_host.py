"""The runtime host: pooled instances, intake through the three providers, /metrics.

A host with ``instances=3`` hosts three dispatch targets ``<prefix>-<n>``, each with
its own capacity descriptor in the registry; the host itself is never registered.
Every provider (in-process, Redis stream inbox, HTTP) delivers to the same intake,
which is idempotent by SharedRunId and refuses a request without a snapshot.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.fleet.providers import HttpProvider, LocalProvider, RedisProvider, RuntimeProvider
from airuntime.fleet.registry import InstanceDescriptor
from runtime_pod.host import RuntimeHost
from runtime_pod.instance import RunRefused
from tests.runtime.conftest import MakeHost, Runtime
from tests.runtime.support import TEST_TOKEN, HeartbeatProbe, pipeline, request

pytestmark = pytest.mark.timeout(60)

PROVIDERS = [
    pytest.param("local", id="local"),
    pytest.param("redis", id="redis"),
    pytest.param("http", id="http"),
]


async def _descriptor(runtime: Runtime, instance_id: str) -> InstanceDescriptor:
    desc = await runtime.registry.get(instance_id)
    assert desc is not None, f"{instance_id} is registered"
    return desc


def _provider(name: str, host: RuntimeHost, redis: Redis, client: httpx.AsyncClient) -> Any:
    if name == "local":
        local = LocalProvider()
        for inst in host.instances:
            local.add(inst)
        return local
    if name == "redis":
        return RedisProvider(redis)
    return HttpProvider(client, token=TEST_TOKEN)


async def test_a_pooled_host_hosts_three_registered_dispatch_targets_but_not_itself(
    runtime: Runtime, hosts: MakeHost
) -> None:
    # assist=False: an idle instance would otherwise lend its workers to the busy one's
    # execution, and the point here is that each descriptor reports its own capacity.
    host = await hosts(instances=3, runtime_prefix="pool", provider="http", workers=2, assist=False)
    ids = [i.instance_id for i in host.instances]
    assert ids == ["pool-1", "pool-2", "pool-3"]
    registered = await runtime.registry.list_all()
    assert [d.instance_id for d in registered] == ids, "the host itself is not registered"
    for desc in registered:
        assert (desc.endpoint, desc.provider, desc.runtime_prefix) == (
            host.endpoint,
            "http",
            "pool",
        )
        assert desc.capacity.worker_count == 2 and desc.capacity.can_accept_run

    probes = {i.instance_id: HeartbeatProbe(i) for i in host.instances}
    async with httpx.AsyncClient(timeout=10) as client:
        delivery = HttpProvider(client, token=TEST_TOKEN)
        busy = await delivery.deliver(await _descriptor(runtime, "pool-2"), request(pipeline(2)))
        await runtime.gate.wait_entered(2)
        for probe in probes.values():
            await probe.rounds(2)
        capacity = {d.instance_id: d.capacity for d in await runtime.registry.list_all()}
        assert capacity["pool-2"].running_run_count == 1
        assert capacity["pool-2"].available_worker_count == 0
        assert not capacity["pool-2"].can_accept_run
        for other in ("pool-1", "pool-3"):
            assert capacity[other].running_run_count == 0 and capacity[other].can_accept_run

        others = {
            iid: await delivery.deliver(await _descriptor(runtime, iid), request(pipeline(1)))
            for iid in ("pool-1", "pool-3")
        }
        ready = (await client.get(f"{host.endpoint}/readyz")).json()
        assert ready == {"status": "ready", "instances": ids}
    runtime.gate.open()
    for iid, run_id in {**others, "pool-2": busy}.items():
        assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
        record = await runtime.index.get_for_tenant(run_id, "tenant-a")
        assert record is not None and record.instance_id == iid


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_delivering_the_same_shared_run_id_twice_creates_one_run_id(
    runtime: Runtime, hosts: MakeHost, redis: Redis, provider: str
) -> None:
    host = await hosts(provider=provider)
    desc = await _descriptor(runtime, host.instances[0].instance_id)
    assert desc.provider == provider
    async with httpx.AsyncClient(timeout=10) as client:
        delivery: RuntimeProvider = _provider(provider, host, redis, client)
        req = request(pipeline(2, uses="noop"))
        first = await delivery.deliver(desc, req)
        assert await delivery.deliver(desc, req) == first
        twin = request(pipeline(2, uses="noop"))
        a, b = await asyncio.gather(delivery.deliver(desc, twin), delivery.deliver(desc, twin))
    assert a == b != first
    for run_id in (first, a):
        assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
        assert runtime.watcher.states[run_id] == ["queued", "running", "completed"]
    assert len(await redis.keys(keys.run("*"))) == 2
    assert await redis.zcard(keys.executions_index()) == 2, "one execution per SharedRunId"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_every_intake_refuses_a_request_without_snapshot_naming_it(
    runtime: Runtime, hosts: MakeHost, redis: Redis, provider: str
) -> None:
    host = await hosts(provider=provider)
    inst = host.instances[0]
    body = request(pipeline(1)).model_dump(mode="json")
    del body["snapshot"]
    if provider == "local":
        with pytest.raises(RunRefused) as refused:
            await inst.accept(body)
        answer = {"error": str(refused.value), "reason": refused.value.reason}
    elif provider == "redis":
        reply_to = f"air:test-reply:{uuid.uuid4().hex}"
        await redis.xadd(
            keys.instance_inbox(inst.instance_id),
            {"request": json.dumps(body), "reply_to": reply_to},
        )
        got = await redis.blpop([reply_to], timeout=10)
        assert got is not None, "the inbox answered"
        answer = json.loads(got[1])
    else:
        async with httpx.AsyncClient(timeout=10) as client:
            resp = await client.post(
                f"{host.endpoint}/v1/instances/{inst.instance_id}/runs",
                json=body,
                headers={"authorization": f"Bearer {TEST_TOKEN}"},
            )
        assert resp.status_code == 400
        answer = resp.json()
    assert answer["reason"] == "invalid"
    assert "snapshot" in answer["error"], answer
    assert (
        await redis.keys(keys.run("*")) == []
        and await redis.keys(keys.shared_run_to_run("*")) == []
    )
    assert await runtime.index.queue_length(inst.instance_id) == 0


# -- /metrics -----------------------------------------------------------------------------

METRICS = (
    "airuntime_queue_depth",
    "airuntime_run_transitions",
    "airuntime_runs_running",
    "airuntime_workers_active",
    "airuntime_workers_available",
    "airuntime_steps",
    "airuntime_step_duration_seconds",
    "airuntime_step_slot_wait_seconds",
    "airuntime_step_slots_active",
    "airuntime_step_slots_queued",
    "airuntime_claims",
    "airuntime_claim_conflicts",
    "airuntime_lease_recoveries",
)


async def _scrape(client: httpx.AsyncClient, host: RuntimeHost) -> dict[str, dict[str, float]]:
    resp = await client.get(f"{host.endpoint}/metrics")
    assert resp.status_code == 200
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(resp.text):
        samples = out.setdefault(family.name, {})
        for s in family.samples:
            label = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "instance")
            samples[f"{s.name}{{{label}}}"] = s.value
    return out


async def test_metrics_expose_queue_runs_workers_steps_slots_claims_and_recoveries(
    runtime: Runtime, hosts: MakeHost
) -> None:
    host = await hosts(workers=3, max_local_workers_per_execution=3, max_concurrent_step_tasks=2)
    async with httpx.AsyncClient(timeout=10) as client:
        before = await _scrape(client, host)
        assert set(METRICS) <= set(before), sorted(set(METRICS) - set(before))
        assert before["airuntime_claims"] == {"airuntime_claims{}": 0}
        assert before["airuntime_workers_available"] == {"airuntime_workers_available{}": 3}

        probe = HeartbeatProbe(host.instances[0])
        run_id = await host.instances[0].accept(request(pipeline(5)))
        await runtime.gate.wait_entered(2)
        await probe.rounds(2)
        during = await _scrape(client, host)
        assert during["airuntime_runs_running"] == {"airuntime_runs_running{}": 1}
        assert during["airuntime_workers_active"] == {"airuntime_workers_active{}": 3}
        assert during["airuntime_step_slots_active"] == {"airuntime_step_slots_active{}": 2}
        assert during["airuntime_step_slots_queued"] == {"airuntime_step_slots_queued{}": 1}

        runtime.gate.open()
        assert await runtime.watcher.reached(run_id, "completed", "failed") == "completed"
        after = await _scrape(client, host)
    transitions = after["airuntime_run_transitions"]
    assert transitions["airuntime_run_transitions_total{state=completed}"] == 1
    assert transitions["airuntime_run_transitions_total{state=running}"] == 1
    assert after["airuntime_claims"]["airuntime_claims{}"] == 5
    assert after["airuntime_steps"]["airuntime_steps_total{outcome=completed}"] == 5
    assert after["airuntime_step_duration_seconds"]["airuntime_step_duration_seconds_count{}"] == 5
    assert (
        after["airuntime_step_slot_wait_seconds"]["airuntime_step_slot_wait_seconds_count{}"] == 5
    )
    assert after["airuntime_workers_available"] == {"airuntime_workers_available{}": 3}
    assert after["airuntime_runs_running"] == {"airuntime_runs_running{}": 0}
    assert after["airuntime_claim_conflicts"] == {"airuntime_claim_conflicts{}": 0}
    assert after["airuntime_lease_recoveries"] == {"airuntime_lease_recoveries{}": 0}
