"""A master of the Valkey Cluster is killed (SIGKILL) while a few hundred executions run:
its replica is promoted, the clients follow, every execution finishes, and no step is
completed twice.

Replication is asynchronous: a transition the killed master acknowledged but had not
sent to its replica is lost with it. The engine's state stays exactly-once anyway:
a lost claim or completion leaves the step as the replica knew it (Ready, or Running
under an older claim whose lease then runs out and is recovered), a late report under a
claim the new primary does not know is refused by its fencing token, so the ledger ends
with exactly one ``step_completed`` per step, each under the token of the step's last
claim. What a failover costs is a handler run again (at-least-once at the handler),
counted here and printed.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import pytest

from airuntime.core.redis_client import CountingRedisCluster, connect
from airuntime.devstack.cluster import LocalCluster
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import HandlerRegistry, StepContext
from airuntime.engine.store_results import LedgerEvent
from airuntime.engine.worker_pool import PoolSettings, WorkerPool
from tests.dags import fan, plan_of

pytestmark = [pytest.mark.timeout(240)]

EXECUTIONS = 300
FAN = 3
CONCURRENT = 40
"""Executions driven at once (each by its own participation of one pool)."""


@pytest.fixture
def failover_cluster() -> Iterator[LocalCluster]:
    """A cluster of its own: this test kills one of its masters."""
    with LocalCluster(shards=3, replicas=1, node_timeout_ms=1500) as cluster:
        yield cluster


class Work:
    """The steps' handler: counts every run and tells the test when to strike."""

    def __init__(self, strike_after: int) -> None:
        self.runs: Counter[tuple[str, str]] = Counter()
        self.strike_after = strike_after
        self.strike = asyncio.Event()

    async def __call__(self, ctx: StepContext) -> str:
        self.runs[(ctx.execution_id, ctx.step_id)] += 1
        if self.runs.total() >= self.strike_after:
            self.strike.set()
        await asyncio.sleep(0)
        return ctx.step_id


def _fenced(events: list[LedgerEvent]) -> list[str]:
    """Problems of one ledger: a step completed other than once, or under a token that
    is not the one of the step's last claim before the completion."""
    problems: list[str] = []
    last_claim: dict[str, str] = {}
    completed: Counter[str] = Counter()
    for e in events:
        step = e.get("step")
        if e.type == "step_claimed":
            last_claim[step] = e.get("token")
        elif e.type == "step_completed":
            completed[step] += 1
            if e.get("token") != last_claim.get(step):
                problems.append(f"{step} completed under {e.get('token')}, not its last claim")
    problems += [f"{step} completed {n} times" for step, n in completed.items() if n != 1]
    return problems


async def _wait_replicated(client: CountingRedisCluster) -> None:
    """Every primary's replica has what was written so far (WAIT 1 per primary): the
    executions exist on both sides before the strike, so only their progress is at risk."""
    for node in client.get_primaries():
        acked = await client.execute_command("WAIT", 1, 5000, target_nodes=node)
        assert int(acked) >= 1, f"{node.name}: replica did not acknowledge"


async def test_a_killed_master_fails_over_and_every_execution_finishes_once(
    failover_cluster: LocalCluster,
) -> None:
    steps = FAN + 2
    work = Work(strike_after=EXECUTIONS * steps // 3)
    reg = HandlerRegistry(autoload=True)
    reg.register("work", work)
    plan = plan_of(fan(FAN), uses="work", registry=reg)
    client = connect(failover_cluster.url)
    assert isinstance(client, CountingRedisCluster)
    try:
        store = ExecutionStore(client)
        eids = [await store.create(plan, retention_s=600) for _ in range(EXECUTIONS)]
        await _wait_replicated(client)
        pool = WorkerPool(store, reg, PoolSettings(workers=2, lease_ms=4000))
        gate = asyncio.Semaphore(CONCURRENT)

        async def drive(eid: str) -> str:
            async with gate:
                return str(await pool.run(eid))

        runs = asyncio.gather(*(drive(e) for e in eids))
        await work.strike.wait()
        victim = failover_cluster.masters()[0]
        await asyncio.to_thread(failover_cluster.kill, victim)
        at_kill = work.runs.total()
        assert not runs.done(), "the master died mid-run"
        await asyncio.to_thread(failover_cluster.wait_healthy, 60)
        assert victim not in failover_cluster.masters()
        statuses = await asyncio.wait_for(runs, 180)
        problems = {eid: p for eid in eids if (p := _fenced(await store.events(eid)))}
    finally:
        await client.aclose()
    assert Counter(statuses) == Counter({"Succeeded": EXECUTIONS})
    assert problems == {}
    assert all(work.runs[(e, s.id)] >= 1 for e in eids for s in plan.steps)
    again = work.runs.total() - EXECUTIONS * steps
    print(
        f"\nfailover of {victim} after {at_kill} handler runs: {again} run(s) repeated of "
        f"{EXECUTIONS * steps}; redis errors met by the pool: {pool.stats.redis_errors}"
    )
