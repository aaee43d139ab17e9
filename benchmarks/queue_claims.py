"""The shared queue's claim path: items claimed + settled per second, by tenant count.

Run ``python -m benchmarks.queue_claims [--json] [--items N] [--batch N]
[--tenants 1 10 100]`` from the repository root (a private embedded Valkey is started).

Why this exists: the queue is sharded per tenant (``{q:<tenant>}``, one hash slot
each, so it spreads over a Redis Cluster), and a pump batch over many tenants costs a
read of every tenant's head and one claim script per tenant, where one global queue
paid one script per batch. For each tenant count, ``--items`` items are queued round-
robin over the tenants, then one pump claims batches of ``--batch`` and settles them
Dispatched until the queue is empty. Reported per tenant count: items/s, client round
trips per batch, and ``vs_one_tenant`` = items/s / items/s with one tenant, measured in
the same run (the cost of seeing many tenants; the absolute rate depends on the
machine). Nothing is asserted: this measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from airuntime.control_plane.shared_queue import QueueItemStatus, SharedQueue
from airuntime.core.redis_client import connect
from airuntime.devstack.embedded import EmbeddedServer


async def measure(url: str, tenants: int, items: int, batch: int) -> dict[str, Any]:
    redis = connect(url)
    try:
        await redis.flushall()
        queue = SharedQueue(redis)
        for i in range(items):
            await queue.enqueue(f"sr-{i:032x}", f"tenant-{i % tenants}")
        redis.round_trips = 0
        started, claimed, batches = time.perf_counter(), 0, 0
        while found := await queue.claim_batch("bench-pump", batch):
            claimed += len(found)
            batches += 1
            await queue.settle_many([(c, QueueItemStatus.DISPATCHED, "") for c in found])
        seconds = time.perf_counter() - started
    finally:
        await redis.aclose()
    return {
        "tenants": tenants,
        "items": claimed,
        "items_per_s": round(claimed / seconds, 1),
        "round_trips_per_batch": round(redis.round_trips / max(1, batches), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.queue_claims")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--items", type=int, default=5000, help="items per tenant count")
    parser.add_argument("--batch", type=int, default=64, help="items per claim batch")
    parser.add_argument("--tenants", type=int, nargs="+", default=[1, 10, 100])
    args = parser.parse_args(argv)
    if args.items < 1 or args.batch < 1 or min(args.tenants) < 1:
        parser.error("--items, --batch and --tenants must be >= 1")
    counts = sorted(set(args.tenants) | {1})
    with EmbeddedServer() as server:
        rows = [asyncio.run(measure(server.url, t, args.items, args.batch)) for t in counts]
    base = rows[0]["items_per_s"]
    for row in rows:
        row["vs_one_tenant"] = round(row["items_per_s"] / base, 2)
    if args.json:
        print(json.dumps({"batch": args.batch, "results": rows}, indent=2))
    else:
        for row in rows:
            print(
                f"{row['tenants']:>5} tenants  {row['items_per_s']:>9,.0f} items/s  "
                f"{row['round_trips_per_batch']:.1f} round trips/batch  "
                f"{row['vs_one_tenant']}x one tenant"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
