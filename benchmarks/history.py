"""Archive throughput and what archiving costs the engine.

Run ``python -m benchmarks.history [--json] [--runs N] [--pg-dsn postgresql://...]``
from the repository root; a private embedded Valkey is started. Two measurements:

* **archive throughput**: N finished executions (a four-step diamond, 8 ledger entries
  each) are archived from the outbox by one :class:`ExecutionArchiver` into a fresh
  SQLite file (and PostgreSQL with ``--pg-dsn``, an empty migrated database): runs/s and
  rows/s (an execution row + its ledger rows);
* **engine steps/s with archiving on vs off**: the same N executions run (16 at a time,
  one worker pool) with ``archive_hold_s`` (finalization queues them on the outbox and an
  archiver in another process, as the control plane is, drains it into SQLite) and
  without, in five rounds of the two (off-on, on-off, ...; the archiver process runs
  throughout and the outbox is drained after each "on" phase); the median of the rounds'
  off/on ratios is printed (target: at most 10% slower, ratio >= 0.9);
* **the same on the engine benchmark's DAG** (``fanout-2000`` of
  :mod:`benchmarks.dag_throughput`: 1 -> 2,000 -> 1), eight executions one after another
  on one 64-slot pool, five rounds the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from airuntime.core import keys
from airuntime.core.redis_client import RedisClient, connect
from airuntime.core.supervision import Supervisor
from airuntime.devstack.embedded import EmbeddedServer
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.pipeline import compile_pipeline, parse_pipeline
from airuntime.engine.worker_pool import PoolSettings, WorkerPool
from airuntime.history import open_history_store
from airuntime.history.archiver import ExecutionArchiver
from benchmarks.dag_shapes import deps_of, plan_of, steps_of

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


async def run_executions(redis: RedisClient, n: int, archive: bool) -> float:
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
    redis = connect(url)
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


async def _archiver_process(url: str, dsn: str) -> asyncio.subprocess.Process:
    """An archiver in its own process, as deployed: the control plane archives, the
    runtimes execute; they share only Redis (and, on this machine, the cores). Started
    once before the first round and returned when it is archiving: its interpreter
    start (about 0.8 s of CPU) must not fall into an "on" phase."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks.history",
        "--archiver",
        url,
        dsn,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    if (await proc.stdout.readline()).strip() != b"ready":
        raise RuntimeError("the archiver process did not start")
    return proc


async def _stop(proc: asyncio.subprocess.Process) -> None:
    proc.terminate()
    await proc.wait()


async def _drained(redis: RedisClient) -> int:
    """Wait until the archiver has emptied the outbox; how many entries it held."""
    left = held = await redis.zcard(keys.archive_outbox())
    while left:
        await asyncio.sleep(0.05)
        left = await redis.zcard(keys.archive_outbox())
    return held


async def _alternate(
    url: str, dsn: str, rounds: int, run: Callable[[bool], Awaitable[float]]
) -> tuple[float, float, float, int]:
    """``run(archive)`` off and on, ``rounds`` times, with one archiver process running
    throughout (idle while archiving is off, as the control plane's is); after each "on"
    phase the outbox is drained before the next phase starts, so no phase pays for
    another's archiving. The order alternates (off-on, on-off, ...) and each round's two
    phases are compared with each other: this VM's speed drifts by tens of percent
    from one minute to the next, so only neighbours are comparable. Returns the median
    seconds off and on, the median of the rounds' off/on ratios, and how many
    executions were still in the outbox when their "on" phase ended."""
    offs: list[float] = []
    ons: list[float] = []
    behind = 0
    redis = connect(url)
    proc = await _archiver_process(url, dsn)
    try:
        for i in range(rounds):
            for archive in (False, True) if i % 2 == 0 else (True, False):
                (ons if archive else offs).append(await run(archive))
                if archive:
                    behind += await _drained(redis)
    finally:
        await _stop(proc)
        await redis.aclose()
    ratios = sorted(off / on for off, on in zip(offs, ons, strict=True))
    return _median(offs), _median(ons), ratios[len(ratios) // 2], behind


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


async def engine_overhead(url: str, dsn: str, n: int, rounds: int = 5) -> dict[str, Any]:
    """Steps/s with archiving off and on, alternated ``rounds`` times (off, on, off, on:
    neither side always runs on the fuller Redis); the archiver drains the outbox from
    another process while the executions run."""
    redis = connect(url)
    await redis.flushdb()
    await run_executions(redis, min(n, 200), archive=False)  # warm-up
    off, on, ratio, behind = await _alternate(
        url, dsn, rounds, lambda archive: run_executions(redis, n, archive)
    )
    await redis.aclose()
    steps = 4 * n
    return {
        "measure": "engine_steps_per_s",
        "runs": n,
        "rounds": rounds,
        "steps_per_s_archive_off": round(steps / off, 1),
        "steps_per_s_archive_on": round(steps / on, 1),
        "runs_with_archiving": rounds * n,
        "archived_while_running": rounds * n - behind,
        "ratio_on_off": round(ratio, 3),
        "target_ratio": 0.9,
    }


FANOUT = "fanout-2000"
"""The engine benchmark's shape (:mod:`benchmarks.dag_throughput`): 1 -> 2,000 -> 1."""


async def _run_fanouts(redis: RedisClient, n: int, archive: bool) -> float:
    """Seconds to run ``n`` fan-outs one after another on one 64-slot pool."""
    store = ExecutionStore(redis)
    plan = plan_of(deps_of(FANOUT), FANOUT)
    pool = WorkerPool(store, settings=PoolSettings(workers=64, control_feed=False))
    started = time.perf_counter()
    for _ in range(n):
        eid = await store.create(plan, retention_s=60, archive_hold_s=3600 if archive else None)
        await pool.run(eid)
    return time.perf_counter() - started


async def fanout_overhead(url: str, dsn: str, n: int = 8, rounds: int = 5) -> dict[str, Any]:
    """The same on/off comparison on the engine benchmark's DAG: few, large executions
    (the diamonds above are the archiver's worst case: many small ones)."""
    redis = connect(url)
    await redis.flushdb()
    await _run_fanouts(redis, 1, archive=False)  # warm-up
    off, on, ratio, _ = await _alternate(
        url, dsn, rounds, lambda archive: _run_fanouts(redis, n, archive)
    )
    await redis.aclose()
    steps = n * steps_of(FANOUT)
    return {
        "measure": "engine_steps_per_s_fanout",
        "shape": FANOUT,
        "executions": n,
        "rounds": rounds,
        "steps_per_s_archive_off": round(steps / off, 1),
        "steps_per_s_archive_on": round(steps / on, 1),
        "ratio_on_off": round(ratio, 3),
        "target_ratio": 0.9,
    }


async def archive_forever(url: str, dsn: str) -> None:
    """``--archiver URL DSN``: the child process of :func:`engine_overhead`."""
    redis = connect(url)
    history = await open_history_store(dsn)
    supervisor = Supervisor("bench-archiver")
    archiver = ExecutionArchiver(redis, history)  # as the control plane runs it
    supervisor.start("archiver", archiver.run)
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await supervisor.stop()
    await history.close()
    await redis.aclose()


async def run_all(url: str, runs: int, pg_dsn: str | None, tmp: Path) -> list[dict[str, Any]]:
    results = []
    dsns = [f"sqlite:///{tmp / 'throughput.db'}"] + ([pg_dsn] if pg_dsn else [])
    for dsn in dsns:
        log(f"archive throughput: {runs} runs into {dsn.split(':')[0]} ...")
        results.append(await archive_throughput(url, dsn, runs))
    log(f"engine with archiving on vs off: {runs} runs each ...")
    results.append(await engine_overhead(url, f"sqlite:///{tmp / 'overhead.db'}", runs))
    log(f"engine with archiving on vs off: the engine benchmark's {FANOUT} ...")
    results.append(await fanout_overhead(url, f"sqlite:///{tmp / 'fanout.db'}"))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.history")
    parser.add_argument("--json", action="store_true", help="print one JSON list")
    parser.add_argument("--runs", type=int, default=2000, help="executions per measurement")
    parser.add_argument("--pg-dsn", help="also measure a migrated, empty PostgreSQL database")
    parser.add_argument("--archiver", nargs=2, metavar=("URL", "DSN"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.archiver:
        asyncio.run(archive_forever(*args.archiver))
        return 0
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
