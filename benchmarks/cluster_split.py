"""DAG throughput on a 1-shard and a 3-shard Valkey Cluster, with Redis CPU per shard.

Run ``python -m benchmarks.dag_throughput --cluster [--json] [--executions N]
[--shape fanout-500]`` (or ``python -m benchmarks.cluster_split``) from the repository
root. For each shard count a :class:`airuntime.devstack.cluster.LocalCluster` (no
replicas: they would take CPU from the two cores the figures are about) is started,
``N`` executions of the shape are created (not timed), then **2 worker processes**
(this module's ``worker`` entry: one :class:`~airuntime.engine.worker_pool.WorkerPool`
per process participating in every execution at once, 64 slots each) drain them.

What is measured
----------------
* ``steps_per_s`` = all steps / (last ``execution_finalized`` - first claim entry),
  server time from the ledgers' stream ids (the nodes share this machine's clock).
* ``cpu_s`` per primary = delta of ``used_cpu_user + used_cpu_sys`` (``INFO cpu``)
  from before the workers start to after they exit; ``share`` = that primary's part of
  the total; ``cpu_us_per_step`` = total Redis CPU / steps.

One execution lives in one bucket, so in one slot, so on one shard: a single large DAG
never spreads; many executions do (their buckets are spread evenly over the slots).
Two cores cannot show a linear speed-up of three shards; the per-shard CPU shows how the
load divides.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import redis

from airuntime.core.execution_layout import execution_keys_for
from airuntime.core.redis_client import CountingRedisCluster, connect
from airuntime.devstack.cluster import LocalCluster
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.worker_pool import PoolSettings, WorkerPool
from benchmarks.dag_shapes import deps_of, plan_of, steps_of
from benchmarks.redis_probe import CLAIM_TYPES, entries, stream_ms

WORKER_PROCESSES = 2
SLOTS = 64
DEFAULT_EXECUTIONS = 96
DEFAULT_SHAPE = "fanout-125"
RUN_TIMEOUT_S = 300.0


@dataclass
class ShardRow:
    shards: int
    executions: int
    steps: int
    seconds: float
    cpu_s: dict[int, float]
    round_trips: int

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds

    @property
    def cpu_us_per_step(self) -> float:
        return sum(self.cpu_s.values()) * 1e6 / self.steps

    def as_dict(self) -> dict[str, Any]:
        total = sum(self.cpu_s.values()) or 1.0
        return {
            **asdict(self),
            "steps_per_s": round(self.steps_per_s),
            "cpu_us_per_step": round(self.cpu_us_per_step, 1),
            "share": {port: round(cpu / total, 3) for port, cpu in self.cpu_s.items()},
        }


def primary_cpu_s(port: int) -> float:
    """Redis CPU seconds (user + sys, ``INFO cpu``) the node on ``port`` has used."""
    with redis.Redis(host="127.0.0.1", port=port) as client:
        info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _create(url: str, shape: str, n: int) -> list[str]:
    client = connect(url)
    try:
        store = ExecutionStore(client)
        plan = plan_of(deps_of(shape), shape)
        return [await store.create(plan) for _ in range(n)]
    finally:
        await client.aclose()


async def _window(url: str, eids: list[str]) -> tuple[float, list[str]]:
    """(seconds from the first claim to the last finalization, statuses)."""
    client = connect(url)
    first, last, statuses = float("inf"), 0.0, []
    try:
        for eid in eids:
            stream = execution_keys_for(client, eid).events
            head = entries(await client.xrange(stream, count=50))
            claims = [stream_ms(i) for i, f in head if f.get("type") in CLAIM_TYPES]
            tail = entries(await client.xrevrange(stream, count=5))
            final = [(i, f) for i, f in tail if f.get("type") == "execution_finalized"]
            statuses.append(final[0][1].get("status", "") if final else "unfinished")
            first = min(first, *claims) if claims else first
            last = max(last, stream_ms(final[0][0])) if final else last
    finally:
        await client.aclose()
    return max(last - first, 1) / 1000, statuses


def run_shards(shards: int, shape: str, executions: int) -> ShardRow:
    with LocalCluster(shards=shards, replicas=0) as cluster:
        eids = asyncio.run(_create(cluster.url, shape, executions))
        masters = cluster.masters()
        before = {p: primary_cpu_s(p) for p in masters}
        cmd = [sys.executable, "-m", "benchmarks.cluster_split", "worker", cluster.url, *eids]
        procs = [
            subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            for _ in range(WORKER_PROCESSES)
        ]
        outs = [p.communicate(timeout=RUN_TIMEOUT_S)[0] for p in procs]
        after = {p: primary_cpu_s(p) for p in masters}
        seconds, statuses = asyncio.run(_window(cluster.url, eids))
    if any(p.returncode for p in procs) or set(statuses) != {"Succeeded"}:
        raise RuntimeError(f"{shards} shard(s): workers {[p.returncode for p in procs]}, "
                           f"statuses {sorted(set(statuses))}")  # fmt: skip
    round_trips = sum(int(json.loads(o.strip().splitlines()[-1])["round_trips"]) for o in outs)
    cpu = {p: after[p] - before[p] for p in masters}
    return ShardRow(shards, executions, executions * steps_of(shape), seconds, cpu, round_trips)


async def _work(url: str, eids: list[str]) -> int:
    """One worker process: participate in every execution at once; round trips made."""
    client = connect(url)
    assert isinstance(client, CountingRedisCluster)
    try:
        pool = WorkerPool(ExecutionStore(client), settings=PoolSettings(workers=SLOTS))
        statuses = await asyncio.gather(*(pool.run(e) for e in eids))
        if set(statuses) != {"Succeeded"}:
            raise RuntimeError(f"statuses {sorted(set(statuses))}")
        return client.round_trips
    finally:
        await client.aclose()


def _print(rows: list[ShardRow]) -> None:
    print(f"{'shards':>6} {'executions':>10} {'steps':>7} {'steps/s':>8} "
          f"{'redis us/step':>13}  cpu per primary (s, share)")  # fmt: skip
    for r in rows:
        d = r.as_dict()
        split = "  ".join(f"{p}: {c:.2f} s ({d['share'][p]:.0%})" for p, c in r.cpu_s.items())
        print(f"{r.shards:>6} {r.executions:>10} {r.steps:>7} {r.steps_per_s:>8.0f} "
              f"{r.cpu_us_per_step:>13.1f}  {split}")  # fmt: skip
    if len(rows) == 2:
        print(f"ratio 3-shard/1-shard steps/s: {rows[1].steps_per_s / rows[0].steps_per_s:.2f}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        print(json.dumps({"round_trips": asyncio.run(_work(argv[1], argv[2:]))}))
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dag_throughput --cluster")
    parser.add_argument("--cluster", action="store_true", help="(this mode)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--shape", default=DEFAULT_SHAPE)
    parser.add_argument("--executions", type=int, default=DEFAULT_EXECUTIONS)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 3])
    args = parser.parse_args(argv)
    started = time.perf_counter()
    rows = [run_shards(n, args.shape, args.executions) for n in args.shards]
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    else:
        _print(rows)
    print(f"wall time {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
