"""The control plane on a real Valkey Cluster (3 masters + 3 replicas).

The rest of ``tests/control_plane`` runs on standalone servers with the slot guard on
(``AIRUNTIME_SLOT_CHECK=1``: every script and transaction is checked to touch one hash
slot). Here the same code runs where a cross-slot call would be refused: tenants whose
shared queues live on different masters submit through the HTTP API, the background
pump claims from each tenant's queue, runtimes execute, the outcome reader ends the
shared runs, and every read endpoint answers from the cluster; then the master of the
control slot (shared runs, run index, registry) fails over, planned, while runs flow,
and the clients follow it with nothing lost.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from airuntime.control_plane.api import create_app
from airuntime.control_plane.rbac import Authenticator, TokenEntry
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.control_plane.shared_runs import SharedRunStatus
from airuntime.core import keys
from airuntime.core.redis_client import CountingRedisCluster, connect
from airuntime.devstack.cluster import LocalCluster
from airuntime.engine.execution_store import ExecutionStore
from runtime_pod.host import RuntimeHost
from tests.control_plane.support import SHARED_RUNTIME, fan_pipeline, serving, wait_for

pytestmark = pytest.mark.timeout(300)

TENANTS = [f"tenant-{c}" for c in "abcdefgh"]
STEPS = 5
PIPELINE = fan_pipeline(STEPS, "on-cluster")


def _settings() -> ControlPlaneSettings:
    return ControlPlaneSettings(scale_out_enabled=False, reconcile_interval_s=0.5)


def _api(cp: ControlPlane) -> httpx.AsyncClient:
    auth = Authenticator(
        [
            TokenEntry(token=f"token-{t}", user=f"user-{t}", tenant=t, roles=["operator"])
            for t in TENANTS
        ]
    )
    app = create_app(cp, auth)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cp")


def _as(tenant: str) -> dict[str, str]:
    return {"authorization": f"Bearer token-{tenant}"}


async def _try_submit(api: httpx.AsyncClient, tenant: str) -> str | None:
    """The new run's id; None for a 503 (Redis unavailable: retry after a while)."""
    resp = await api.post("/v1/runs", json={"pipeline": PIPELINE}, headers=_as(tenant))
    if resp.status_code == 503:
        assert "retry-after" in resp.headers, resp.headers
        return None
    assert resp.status_code in (200, 201, 202), resp.text
    return str(resp.json()["shared_run_id"])


async def _submit(api: httpx.AsyncClient, tenant: str) -> str:
    srid = await _try_submit(api, tenant)
    assert srid is not None, "refused with 503"
    return srid


async def _all_succeeded(cp: ControlPlane, ids: list[str]) -> bool:
    runs = await cp.runs.get_many(ids)
    return len(runs) == len(ids) and all(r.status is SharedRunStatus.SUCCEEDED for r in runs)


async def _each_step_completed_once(
    redis: CountingRedisCluster, cp: ControlPlane, ids: list[str]
) -> None:
    store = ExecutionStore(redis)
    for run in await cp.runs.get_many(ids):
        assert run.execution_id, run
        events = await store.events(run.execution_id)
        done = Counter(e.get("step") for e in events if e.type == "step_completed")
        assert sorted(done.values()) == [1] * STEPS, (run.shared_run_id, done)


async def test_tenants_on_different_shards_run_through_the_api_pump_and_runtimes(
    valkey_cluster: LocalCluster, cluster_redis: CountingRedisCluster
) -> None:
    owners = {t: valkey_cluster.master_of(keys.squeue_pending(t)) for t in TENANTS}
    assert len(set(owners.values())) == 3, f"the tenants' queues should span the shards: {owners}"
    cp = ControlPlane(cluster_redis, _settings())
    host = RuntimeHost(cluster_redis, SHARED_RUNTIME, instances=2)
    async with serving(cp, host), _api(cp) as api:
        ids = {t: [await _submit(api, t) for _ in range(3)] for t in TENANTS}
        every = [srid for runs in ids.values() for srid in runs]
        await wait_for(lambda: _all_succeeded(cp, every), timeout_s=120, what="every run Succeeded")
        await _each_step_completed_once(cluster_redis, cp, every)
        for tenant, own in ids.items():
            listed = (await api.get("/v1/runs?limit=100", headers=_as(tenant))).json()["runs"]
            assert sorted(r["shared_run_id"] for r in listed) == sorted(own)
            srid = own[0]
            for view in ("", "/events", "/trace", "/report"):
                resp = await api.get(f"/v1/runs/{srid}{view}", headers=_as(tenant))
                assert resp.status_code == 200, (view, resp.text)
            other = TENANTS[(TENANTS.index(tenant) + 1) % len(TENANTS)]
            assert (await api.get(f"/v1/runs/{srid}", headers=_as(other))).status_code == 404
        assert await cp.queue.pending_count() == 0


@pytest_asyncio.fixture
async def own_cluster() -> AsyncIterator[LocalCluster]:
    """A cluster of its own: a failover changes which node is whose master."""
    cluster = LocalCluster(shards=3, replicas=1)
    await asyncio.to_thread(cluster.start)
    try:
        yield cluster
    finally:
        await asyncio.to_thread(cluster.stop)


async def _all_healthy(cp: ControlPlane) -> bool:
    return not cp.unhealthy_loops()


async def test_the_control_slots_master_fails_over_while_runs_flow(
    own_cluster: LocalCluster,
) -> None:
    redis = connect(own_cluster.url)
    assert isinstance(redis, CountingRedisCluster)
    cp = ControlPlane(redis, _settings())
    host = RuntimeHost(redis, SHARED_RUNTIME, instances=2)
    control_master = own_cluster.master_of(keys.shared_run("any"))
    try:
        async with serving(cp, host), _api(cp) as api:
            before = [await _submit(api, t) for t in TENANTS for _ in range(2)]
            await wait_for(lambda: _all_succeeded(cp, before), timeout_s=120, what="first runs")

            async def submit_while_failing_over() -> list[str]:
                submitted: list[str] = []
                for i in range(24):
                    tenant = TENANTS[i % len(TENANTS)]
                    # The control slot may be unavailable for a moment: 503, retried.
                    srid = await wait_for(
                        lambda t=tenant: _try_submit(api, t), timeout_s=30, interval_s=0.1
                    )
                    submitted.append(srid)
                return submitted

            submitting = asyncio.create_task(submit_while_failing_over())
            new_master = await asyncio.to_thread(own_cluster.failover, control_master)
            during = await submitting
            assert own_cluster.master_of(keys.shared_run("any")) == new_master != control_master
            after = [await _submit(api, t) for t in TENANTS]
            every = [*before, *during, *after]
            await wait_for(
                lambda: _all_succeeded(cp, every), timeout_s=120, what="every run Succeeded"
            )
            await _each_step_completed_once(redis, cp, every)
            # A loop whose Redis call the failover broke is restarted with backoff and
            # reported unhealthy meanwhile; each must be healthy again.
            await wait_for(lambda: _all_healthy(cp), timeout_s=60, what="every loop healthy again")
    finally:
        await redis.aclose()
