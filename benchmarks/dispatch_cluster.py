"""Dispatch on a 1-shard and a 3-shard Valkey Cluster, with Redis CPU per shard.

Run ``python -m benchmarks.dispatch --cluster [--json] [--runs N] [--tenants T]
[--shards 1 3]`` from the repository root. For each shard count a
:class:`airuntime.devstack.cluster.LocalCluster` (no replicas: they would take CPU from
the two cores the figures are about) is started and the **backlog** scenario of
:mod:`benchmarks.dispatch` runs on it unchanged (one control plane with the background
pump, three runtime instances, ``N`` single-step runs) -- except that the runs belong to
``T`` tenants (default 8), because the shared queue is sharded per tenant: one tenant's
queue is one slot, so one shard.

What is measured
----------------
* ``completed_runs_per_s`` and ``pump_runs_per_s`` as in the dispatch benchmark;
* ``cpu_s`` per primary = delta of ``used_cpu_user + used_cpu_sys`` (``INFO cpu``) over
  the scenario; ``share`` = that primary's part; ``cpu_us_per_run`` = total Redis CPU /
  runs.

The control plane's records (shared runs, the registry) share one slot (``{air}``), so
their shard carries more than a third; the tenants' queues, the executions (each run's
execution is in one of 128 buckets) and the runtime run index (16 run buckets by
RunId) spread over all three.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass
from typing import Any

from airuntime.devstack.cluster import LocalCluster
from benchmarks import dispatch
from benchmarks.cluster_split import primary_cpu_s


@dataclass
class ShardDispatch:
    shards: int
    runs: int
    tenants: int
    completed_runs_per_s: float
    pump_runs_per_s: float
    cpu_s: dict[int, float]

    def as_dict(self) -> dict[str, Any]:
        total = sum(self.cpu_s.values()) or 1e-9
        return {
            "shards": self.shards,
            "runs": self.runs,
            "tenants": self.tenants,
            "completed_runs_per_s": self.completed_runs_per_s,
            "pump_runs_per_s": self.pump_runs_per_s,
            "cpu_us_per_run": round(1e6 * total / self.runs, 1),
            "cpu_s": {p: round(c, 3) for p, c in self.cpu_s.items()},
            "share": {p: round(c / total, 3) for p, c in self.cpu_s.items()},
        }


def run_shards(shards: int, runs: int, tenants: int) -> ShardDispatch:
    with LocalCluster(shards=shards, replicas=0) as cluster:
        masters = cluster.masters()
        before = {p: primary_cpu_s(p) for p in masters}
        result = asyncio.run(
            dispatch.run_scenario(cluster.url, "backlog", runs, 4, 200.0, tenants=tenants)
        )
        after = {p: primary_cpu_s(p) for p in masters}
    return ShardDispatch(
        shards,
        runs,
        tenants,
        result.completed_runs_per_s,
        result.pump_runs_per_s,
        {p: after[p] - before[p] for p in masters},
    )


def _print(rows: list[ShardDispatch]) -> None:
    for row in rows:
        d = row.as_dict()
        split = "  ".join(f"{p}: {c:.2f} s ({d['share'][p]:.0%})" for p, c in row.cpu_s.items())
        print(
            f"{row.shards} shard(s), {row.runs} runs of {row.tenants} tenants: "
            f"{row.completed_runs_per_s:.0f} runs/s, {d['cpu_us_per_run']} us of Redis CPU "
            f"per run; per primary {split}"
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dispatch --cluster")
    parser.add_argument("--cluster", action="store_true", help="(this mode)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 3])
    args = parser.parse_args(argv)
    rows = [run_shards(n, args.runs, args.tenants) for n in args.shards]
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    else:
        _print(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
