"""Archive throughput and what archiving costs the engine.

Run ``python -m benchmarks.history [--json] [--runs N] [--pg-dsn postgresql://...]``
from the repository root; a private embedded Valkey is started. Two measurements:

* **archive throughput**: N finished executions (a four-step diamond, 8 ledger entries
  each) are archived from the outbox by one :class:`ExecutionArchiver` into a fresh
  SQLite file (and PostgreSQL with ``--pg-dsn``, an empty migrated database): runs/s and
  rows/s (an execution row + its ledger rows);
* **engine steps/s with archiving on vs off**: the same N executions run (16 at a time,
  one worker pool) once with ``archive_hold_s`` (finalization queues them on the outbox
  and an archiver drains it concurrently into SQLite) and once without; the ratio
  on/off is printed (target: at most 10% slower, ratio >= 0.9).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from airuntime.core.supervision import Supervisor
from airuntime.devstack.embedded import EmbeddedServer
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.pipeline import compile_pipeline, parse_pipeline
from airuntime.engine.worker_pool import PoolSettings, WorkerPool
from airuntime.history import open_history_store
from airuntime.history.archiver import ExecutionArchiver

DIAMOND: dict[str, Any] = {
    "id": "diamond",
    "steps": [
        {"id": "a", "uses": "noop"},
        {"id": "b", "uses": "noop", "depends_on": ["a"]},
        {"id": "c", "uses": "noop", "depends_on": ["a"]},
        {"id": "d", "uses": "noop", "depends_on": ["b", "c"]},
    ],
}
CONCURRENT = 16


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def run_executions(redis: Redis, n: int, archive: bool) -> float:
    """Seconds to run ``n`` diamonds to their end, ``CONCURRENT`` at a time."""
    store = ExecutionStore(redis)
    plan = compile_pipeline(parse_pipeline(DIAMOND))
    pool = WorkerPool(store, settings=PoolSettings(workers=4, control_feed=False))
    hold = 3600 if archive else None
    started = time.perf_counter()
    for start in range(0, n, CONCURRENT):

        async def one() -> None:
            eid = await store.create(plan, retention_s=60, archive_hold_s=hold)
            await pool.run(eid)

        await asyncio.gather(*(one() for _ in range(min(CONCURRENT, n - start))))
    return time.perf_counter() - started


async def archive_throughput(url: str, dsn: str, n: int) -> dict[str, Any]:
    redis = Redis.from_url(url)
    await redis.flushdb()
    await run_executions(redis, n, archive=True)
    history = await open_history_store(dsn)
    archiver = ExecutionArchiver(redis, history, batch=256)
    started = time.perf_counter()
    while await archiver.backlog():
        await archiver.archive_once()
    seconds = time.perf_counter() - started
    await history.close()
    await redis.aclose()
    return {
        "measure": "archive_throughput",
        "backend": history.backend,
        "runs": archiver.stats.archived,
        "rows": archiver.stats.rows,
        "seconds": round(seconds, 3),
        "runs_per_s": round(archiver.stats.archived / seconds, 1),
        "rows_per_s": round(archiver.stats.rows / seconds, 1),
    }


async def engine_overhead(url: str, dsn: str, n: int) -> dict[str, Any]:
    redis = Redis.from_url(url)
    await redis.flushdb()
    off = await run_executions(redis, n, archive=False)
    history = await open_history_store(dsn)
    supervisor = Supervisor("bench")
    archiver = ExecutionArchiver(redis, history, batch=256, idle_s=0.05)
    supervisor.start("archiver", archiver.run)
    on = await run_executions(redis, n, archive=True)
    await supervisor.stop()
    await history.close()
    await redis.aclose()
    steps = 4 * n
    return {
        "measure": "engine_steps_per_s",
        "runs": n,
        "steps_per_s_archive_off": round(steps / off, 1),
        "steps_per_s_archive_on": round(steps / on, 1),
        "archived_while_running": archiver.stats.archived,
        "ratio_on_off": round(off / on, 3),
        "target_ratio": 0.9,
    }


async def run_all(url: str, runs: int, pg_dsn: str | None, tmp: Path) -> list[dict[str, Any]]:
    results = []
    dsns = [f"sqlite:///{tmp / 'throughput.db'}"] + ([pg_dsn] if pg_dsn else [])
    for dsn in dsns:
        log(f"archive throughput: {runs} runs into {dsn.split(':')[0]} ...")
        results.append(await archive_throughput(url, dsn, runs))
    log(f"engine with archiving on vs off: {runs} runs each ...")
    results.append(await engine_overhead(url, f"sqlite:///{tmp / 'overhead.db'}", runs))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.history")
    parser.add_argument("--json", action="store_true", help="print one JSON list")
    parser.add_argument("--runs", type=int, default=2000, help="executions per measurement")
    parser.add_argument("--pg-dsn", help="also measure a migrated, empty PostgreSQL database")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(EmbeddedServer()).url
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        results = asyncio.run(run_all(url, args.runs, args.pg_dsn, tmp))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            print(" ".join(f"{k}={v}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
