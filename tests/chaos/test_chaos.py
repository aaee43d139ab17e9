"""Chaos: a few hundred runs through real processes while everything is broken in turn.

The system: a Valkey with an append-only file (``appendfsync always``) on a fixed
port, ``airt control-plane`` (background pump) and three ``airt runtime`` processes
(``http`` provider, runtime token). Each run is a fan-out/fan-in DAG of five ``python``
steps recording a side effect in SQLite (:mod:`tests.chaos.effects`). While the runs
are submitted and running, faults chosen by a seeded RNG (``CHAOS_SEED`` overrides the
seed; it is printed) hit the system: ``kill -9`` of a runtime and a new one started with
the same prefix, a runtime frozen with SIGSTOP beyond its heartbeat TTL then SIGCONT,
``kill -9`` of the control plane and a restart, Valkey stopped (SIGTERM or SIGKILL) and
started again on the same port from its append-only file, Valkey frozen (SIGSTOP) past
the clients' socket timeout and let go. Submissions go on throughout, each sent again
with its ``Idempotency-Key`` until it is answered (the number answered with the run an
earlier attempt had created is printed). Nothing else is done by hand.
The ``valkey-cluster`` variant runs the same on a 3-master + 3-replica Valkey Cluster
(every process given a ``redis+cluster://`` URL), where a master failing over to its
replica (planned: nothing acknowledged is lost) replaces the Valkey restart.

What must hold: every submitted shared run exists and ends Succeeded within
``RECOVERY_BOUND_S`` of the last fault; every run has one execution, whose ledger holds
exactly one ``step_completed`` per step; the deduped ``effects`` table has exactly one row
per (execution, step), each with its own idempotency key, while the raw ``attempts``
table may hold more (the at-least-once runs the dedupe absorbed, printed).
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from airuntime.control_plane.shared_runs import SharedRun, SharedRunStatus, SharedRunStore
from airuntime.engine.execution_store import ExecutionStore
from tests.chaos.cluster import STEPS, Cluster, ClusterConfig, pipeline, retrying, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

RUNS = 300
RECOVERY_BOUND_S = 90.0
"""Every run terminal within this long after the last fault (the control plane's claim
lease, 30 s, bounds how long a run claimed by a killed pump waits)."""
SUBMIT_GAP_S = 0.06

Fault = Callable[[Cluster, random.Random], Awaitable[str]]


async def kill_runtime(cluster: Cluster, rng: random.Random) -> str:
    victim = rng.choice(sorted(cluster.runtimes))
    await cluster.kill_runtime(victim)
    await asyncio.sleep(rng.uniform(0.3, 1.5))  # the fault's duration, not a wait for order
    new = await cluster.start_runtime()
    return f"kill -9 {victim}, started {new}"


async def freeze_runtime(cluster: Cluster, rng: random.Random) -> str:
    victim = rng.choice(sorted(cluster.runtimes))
    frozen_s = cluster.config.heartbeat_ttl_s + rng.uniform(0.5, 2.0)
    cluster.freeze(victim)
    await asyncio.sleep(frozen_s)
    cluster.thaw(victim)
    return f"SIGSTOP {victim} for {frozen_s:.1f} s"


async def kill_control_plane(cluster: Cluster, rng: random.Random) -> str:
    await cluster.kill_control_plane()
    down_s = rng.uniform(0.3, 1.5)
    await asyncio.sleep(down_s)
    await cluster.start_control_plane()
    return f"kill -9 control plane, down {down_s:.1f} s"


async def restart_valkey(cluster: Cluster, rng: random.Random) -> str:
    kill = rng.random() < 0.5
    cluster.stop_valkey(kill=kill)
    down_s = rng.uniform(0.3, 2.0)
    await asyncio.sleep(down_s)
    await cluster.start_valkey()
    return f"Valkey {'SIGKILL' if kill else 'SIGTERM'}, down {down_s:.1f} s"


async def freeze_valkey(cluster: Cluster, rng: random.Random) -> str:
    """Longer than the clients' socket timeout (5 s): calls under way time out, and
    what they had sent still runs once the server goes on."""
    frozen_s = rng.uniform(6.0, 9.0)
    cluster.freeze_valkey()
    await asyncio.sleep(frozen_s)
    cluster.thaw_valkey()
    return f"SIGSTOP Valkey for {frozen_s:.1f} s"


async def fail_over_a_master(cluster: Cluster, rng: random.Random) -> str:
    return await cluster.fail_over(rng)


FAULTS: tuple[Fault, ...] = (
    kill_runtime,
    freeze_runtime,
    kill_control_plane,
    restart_valkey,
    freeze_valkey,
)
CLUSTER_FAULTS: tuple[Fault, ...] = (
    kill_runtime,
    freeze_runtime,
    kill_control_plane,
    fail_over_a_master,
)
"""On a Valkey Cluster a master fails over instead of the one Valkey restarting."""


def schedule(rng: random.Random, faults: tuple[Fault, ...] = FAULTS) -> list[Fault]:
    """Every fault once, two more drawn at random, in a random order."""
    plan = [*faults, *rng.choices(faults, k=2)]
    rng.shuffle(plan)
    return plan


async def submit_all(cluster: Cluster, ids: dict[int, str], started: asyncio.Event) -> None:
    doc = pipeline(cluster.db)
    for n in range(RUNS):
        ids[n] = await cluster.submit(n, doc)
        if n == 20:
            started.set()
        await asyncio.sleep(SUBMIT_GAP_S)  # pacing: runs keep arriving during the faults


async def inject(cluster: Cluster, rng: random.Random, started: asyncio.Event) -> None:
    await started.wait()
    t0 = time.monotonic()
    faults = CLUSTER_FAULTS if cluster.config.valkey_cluster else FAULTS
    for fault in schedule(rng, faults):
        await asyncio.sleep(rng.uniform(1.0, 3.0))
        what = await fault(cluster, rng)
        print(f"chaos: t={time.monotonic() - t0:5.1f} s  {what}")


async def shared_runs(cluster: Cluster, ids: list[str]) -> list[SharedRun] | None:
    return await retrying(lambda: SharedRunStore(cluster.redis).get_many(ids))


@pytest.mark.parametrize("store", ["valkey", "valkey-cluster"], ids=["valkey", "valkey-cluster"])
async def test_every_run_ends_once_with_one_effect_per_step_under_faults(
    tmp_path: Path, store: str
) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.randrange(2**32))
    print(f"\nchaos: seed {seed} (CHAOS_SEED={seed} repeats this schedule) on {store}")
    rng = random.Random(seed)
    cluster = Cluster(tmp_path, ClusterConfig(valkey_cluster=store == "valkey-cluster"))
    await cluster.start()
    try:
        ids: dict[int, str] = {}
        started = asyncio.Event()
        await asyncio.gather(submit_all(cluster, ids, started), inject(cluster, rng, started))
        last_fault = time.monotonic()
        srids = [ids[n] for n in range(RUNS)]

        async def all_terminal() -> bool:
            runs = await shared_runs(cluster, srids)
            return runs is not None and all(r.status.terminal for r in runs)

        await until(all_terminal, RECOVERY_BOUND_S, f"{RUNS} runs terminal after the last fault")
        took = time.monotonic() - last_fault
        print(f"chaos: all runs terminal {took:.1f} s after the last fault")
        print(f"chaos: {cluster.replayed} submissions answered with an earlier attempt's run")
        runs = await shared_runs(cluster, srids)
        assert runs is not None and len(runs) == RUNS, "a submitted run is missing"
        statuses = Counter(r.status for r in runs)
        failed = [
            (r.shared_run_id, r.status, r.assigned_instance_id, r.execution_id, r.reason)
            for r in runs
            if r.status is not SharedRunStatus.SUCCEEDED
        ]
        assert statuses == {SharedRunStatus.SUCCEEDED: RUNS}, (statuses, failed[:5])
        await check_ledgers(cluster, runs)
        check_effects(cluster.db, runs)
    finally:
        await cluster.stop()


async def check_ledgers(cluster: Cluster, runs: list[SharedRun]) -> None:
    """Each run's execution completed each step exactly once (the ledger's word)."""
    store = ExecutionStore(cluster.redis)
    for run in runs:
        assert run.execution_id, f"{run.shared_run_id} succeeded without an execution"
        events = await store.events(run.execution_id)
        done = Counter(e.get("step") for e in events if e.type == "step_completed")
        assert done == dict.fromkeys(STEPS, 1), (run.shared_run_id, run.execution_id, done)


def check_effects(db_path: str, runs: list[SharedRun]) -> None:
    """One deduped effect per (execution, step); one execution per run."""
    db = sqlite3.connect(db_path)
    try:
        per_step = db.execute(
            "SELECT execution, step, COUNT(*), COUNT(DISTINCT idempotency_key) "
            "FROM effects GROUP BY execution, step"
        ).fetchall()
        attempts = db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0]
        executions_per_n = dict(
            db.execute("SELECT n, COUNT(DISTINCT execution) FROM attempts GROUP BY n").fetchall()
        )
        execution_of_n = dict(db.execute("SELECT DISTINCT n, execution FROM attempts").fetchall())
        by_pid = db.execute("SELECT COUNT(DISTINCT pid) FROM attempts").fetchone()[0]
    finally:
        db.close()
    assert len(per_step) == len(runs) * len(STEPS), f"{len(per_step)} (execution, step) effects"
    assert all(count == 1 and keys == 1 for _, _, count, keys in per_step), [
        row for row in per_step if row[2] != 1
    ]
    assert executions_per_n == dict.fromkeys(range(len(runs)), 1), "a run ran two executions"
    for n, run in enumerate(sorted(runs, key=lambda r: r.inputs["n"])):
        assert run.inputs["n"] == n and execution_of_n[n] == run.execution_id, (n, run)
    effects = len(per_step)
    print(
        f"chaos: {effects} effects, {attempts} attempts recorded: the dedupe absorbed "
        f"{attempts - effects} duplicate runs; handlers ran in {by_pid} processes"
    )
    assert attempts >= effects
