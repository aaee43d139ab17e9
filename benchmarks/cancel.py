"""Cancel latency: from the cancel request to every step of the execution stopped.

Run ``python -m benchmarks.cancel [--json] [--quick] [--cancels N] [--concurrent K]
[--redis-url URL --flush]`` from the repository root. Without ``--redis-url`` a private
embedded Valkey is started; the database is flushed before each scenario. The default
run (2 x 240 cancels) takes about 15 s on a 2-core machine, ``--quick`` (2 x 48) about 5 s.

Set-up (one process, real Redis, the real engine)
-------------------------------------------------
* one :class:`~airuntime.engine.worker_pool.WorkerPool` (as in a runtime instance: one
  pool, one control-channel subscription, many executions), 4 workers per execution;
* every execution has four steps that would run for 30 s if nobody stopped them, all
  running when the cancel comes: two **async** ones (the built-in ``sleep``), one
  **sync** one blocked in ``ctx.wait_cancelled(30)`` (a thread waiting on I/O) and one
  **sync busy** one hashing 64 KiB chunks and checking ``ctx.is_cancelled()`` between
  them (a thread computing);
* ``--concurrent`` executions (default 4) run at once; when all their steps are running,
  after a random pause shorter than the pool's control read period (so the cancel lands
  at a random moment of that period, as a real one would), they are all cancelled at the
  same moment (each ``controlExecution`` its own call), then the next round starts,
  until ``--cancels`` executions were cancelled.

Scenarios
---------
* ``notice``: the pool's control feed is on (the default): the cancel reaches the
  workers through the control channel.
* ``fallback``: the feed is off, as if every notice were lost: the workers learn of the
  cancel from their periodic control-state read (``control_poll_ms``, 200 ms): what a
  missed notice costs.

What is measured
----------------
``stopped_ms``: from just before the cancel request is sent to the moment the last of
the execution's four handlers returned (each handler stamps ``time.perf_counter()`` in a
``finally``; the sync ones in their thread). ``finalized_ms``: from the same start to
the participation returning ``Cancelled`` (the stops were recorded with ``stopSteps``
and the execution finalized in Redis). Every execution is checked to end Cancelled with
its four steps recorded ``step_stopped`` and none completed. Percentiles are
nearest-rank. The target is ``stopped_ms`` p99 <= 250 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import random
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from redis.asyncio import Redis

from airuntime.devstack.process_redis import default_embedded_server
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.handlers import (
    HandlerRegistry,
    StepCancelled,
    StepContext,
    builtin,
    set_shared_executor,
)
from airuntime.engine.pipeline import compile_pipeline, parse_pipeline
from airuntime.engine.worker_pool import PoolSettings, WorkerPool

TARGET_P99_MS = 250.0
STEPS = 4
SCENARIOS = ("notice", "fallback")
PIPELINE: dict[str, Any] = {
    "id": "cancel-bench",
    "steps": [
        {"id": "async_a", "uses": "tracked_sleep", "with": {"seconds": 30}},
        {"id": "async_b", "uses": "tracked_sleep", "with": {"seconds": 30}},
        {"id": "sync_wait", "uses": "tracked_wait"},
        {"id": "sync_busy", "uses": "tracked_busy"},
    ],
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def rank(p: float) -> float:
        return round(ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)], 1)

    return {
        "p50": rank(50),
        "p90": rank(90),
        "p99": rank(99),
        "max": round(ordered[-1], 1),
        "mean": round(sum(ordered) / len(ordered), 1),
    }


class Tracker:
    """Which handlers of which execution run, and when the last of them returned."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self.running: dict[str, int] = {}
        self.last_exit: dict[str, float] = {}
        self.finished_normally = 0
        self._changed = asyncio.Event()

    def entered(self, eid: str) -> None:
        with self._lock:
            self.running[eid] = self.running.get(eid, 0) + 1
        self._loop.call_soon_threadsafe(self._changed.set)

    def exited(self, eid: str) -> None:
        now = time.perf_counter()
        with self._lock:
            self.last_exit[eid] = max(self.last_exit.get(eid, 0.0), now)

    async def wait_running(self, eids: list[str]) -> None:
        while any(self.running.get(e, 0) < STEPS for e in eids):
            self._changed.clear()
            if all(self.running.get(e, 0) >= STEPS for e in eids):
                return
            await self._changed.wait()

    def registry(self) -> HandlerRegistry:
        reg = HandlerRegistry(autoload=True)
        reg.register("tracked_sleep", self._tracked_sleep)
        reg.register("tracked_wait", self._sync(self._wait))
        reg.register("tracked_busy", self._sync(self._busy))
        return reg

    async def _tracked_sleep(self, ctx: StepContext) -> Any:
        self.entered(ctx.execution_id)
        try:
            result = await builtin.sleep(ctx)
            self.finished_normally += 1
            return result
        finally:
            self.exited(ctx.execution_id)

    def _sync(self, body: Callable[[StepContext], Any]) -> Callable[[StepContext], Any]:
        def handler(ctx: StepContext) -> Any:
            self.entered(ctx.execution_id)
            try:
                return body(ctx)
            finally:
                self.exited(ctx.execution_id)

        return handler

    def _wait(self, ctx: StepContext) -> Any:
        if ctx.wait_cancelled(30):
            raise StepCancelled("cancelled while waiting")
        self.finished_normally += 1
        return None

    def _busy(self, ctx: StepContext) -> Any:
        chunk = bytes(64 * 1024)
        digest = hashlib.sha256()
        give_up = time.monotonic() + 30
        while not ctx.is_cancelled():
            digest.update(chunk)
            if time.monotonic() > give_up:
                self.finished_normally += 1
                return digest.hexdigest()
        raise StepCancelled("cancelled while computing")


@dataclass
class Result:
    scenario: str
    cancels: int
    concurrent: int
    stopped_ms: dict[str, float]
    finalized_ms: dict[str, float]
    target_p99_ms: float
    meets_target: bool
    duration_s: float
    problems: list[str] = field(default_factory=list)


async def _round(
    store: ExecutionStore,
    pool: WorkerPool,
    tracker: Tracker,
    plan: Any,
    k: int,
    rng: random.Random,
) -> tuple[list[float], list[float], list[str]]:
    eids = [await store.create(plan) for _ in range(k)]
    runs = {eid: asyncio.create_task(pool.run(eid)) for eid in eids}
    await tracker.wait_running(eids)
    # The cancel lands at a random moment of the pool's periodic control read (whose
    # timers started with the round), as a real one would.
    await asyncio.sleep(rng.uniform(0, pool.settings.control_poll_ms / 1000))
    started: dict[str, float] = {}
    finalized: dict[str, float] = {}

    async def cancel(eid: str) -> None:
        started[eid] = time.perf_counter()
        await store.cancel(eid, actor="bench")
        await runs[eid]
        finalized[eid] = time.perf_counter()

    await asyncio.gather(*(cancel(eid) for eid in eids))
    problems: list[str] = []
    for eid in eids:
        if runs[eid].result() != "Cancelled":
            problems.append(f"{eid}: {runs[eid].result()}")
        events = await store.events(eid)
        stopped = sum(1 for e in events if e.type == "step_stopped")
        completed = sum(1 for e in events if e.type == "step_completed")
        if (stopped, completed) != (STEPS, 0):
            problems.append(f"{eid}: {stopped} stopped, {completed} completed")
    stop_ms = [(tracker.last_exit[e] - started[e]) * 1000 for e in eids]
    final_ms = [(finalized[e] - started[e]) * 1000 for e in eids]
    return stop_ms, final_ms, problems


async def run_scenario(url: str, scenario: str, cancels: int, k: int) -> Result:
    redis = Redis.from_url(url)
    await redis.flushdb()
    loop = asyncio.get_running_loop()
    tracker = Tracker(loop)
    registry = tracker.registry()
    plan = compile_pipeline(parse_pipeline(PIPELINE), registry)
    store = ExecutionStore(redis)
    settings = PoolSettings(workers=STEPS, control_feed=scenario == "notice")
    pool = WorkerPool(store, registry, settings, pool_id=f"bench-{scenario}")
    stop_ms: list[float] = []
    final_ms: list[float] = []
    problems: list[str] = []
    rng = random.Random(11)
    wall = time.perf_counter()
    try:
        while len(stop_ms) < cancels:
            n = min(k, cancels - len(stop_ms))
            s, f, p = await _round(store, pool, tracker, plan, n, rng)
            stop_ms += s
            final_ms += f
            problems += p
    finally:
        await redis.aclose()
    if tracker.finished_normally:
        problems.append(f"{tracker.finished_normally} handlers ran to their end")
    stopped = percentiles(stop_ms)
    return Result(
        scenario=scenario,
        cancels=len(stop_ms),
        concurrent=k,
        stopped_ms=stopped,
        finalized_ms=percentiles(final_ms),
        target_p99_ms=TARGET_P99_MS,
        meets_target=stopped["p99"] <= TARGET_P99_MS and not problems,
        duration_s=round(time.perf_counter() - wall, 2),
        problems=problems[:10],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cancel", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--json", action="store_true", help="print one JSON list")
    parser.add_argument("--quick", action="store_true", help="48 cancels per scenario")
    parser.add_argument("--cancels", type=int, default=240, help="cancels per scenario (>= 200)")
    parser.add_argument("--concurrent", type=int, default=4, help="executions cancelled at once")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--redis-url", help="use this Redis/Valkey (needs --flush)")
    parser.add_argument("--flush", action="store_true", help="allow FLUSHDB of --redis-url")
    args = parser.parse_args(argv)
    if args.redis_url and not args.flush:
        parser.error("--redis-url: the benchmark flushes the database; pass --flush to allow it")
    if args.cancels < 1 or args.concurrent < 1:
        parser.error("--cancels and --concurrent must be >= 1")
    cancels = 48 if args.quick else args.cancels
    # Two sync handlers per execution, each holding a thread until it is stopped.
    set_shared_executor(
        ThreadPoolExecutor(max_workers=2 * args.concurrent + 4, thread_name_prefix="bench")
    )

    results: list[Result] = []
    with contextlib.ExitStack() as stack:
        url: str = args.redis_url or stack.enter_context(default_embedded_server()).url
        for scenario in args.scenarios:
            log(f"cancel {scenario}: {cancels} cancels, {args.concurrent} at once ...")
            results.append(asyncio.run(run_scenario(url, scenario, cancels, args.concurrent)))
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        for r in results:
            st, fi = r.stopped_ms, r.finalized_ms
            print(
                f"{r.scenario:8s} {r.cancels} cancels  cancel->stopped p50 {st['p50']:.1f} ms "
                f"p99 {st['p99']:.1f} ms  cancel->finalized p50 {fi['p50']:.1f} ms "
                f"p99 {fi['p99']:.1f} ms  target p99 <= {r.target_p99_ms:.0f} ms: "
                f"{'met' if r.meets_target else 'MISSED'}"
                + (f"  problems: {r.problems}" if r.problems else "")
            )
    return 0 if all(r.meets_target for r in results if r.scenario == "notice") else 1


if __name__ == "__main__":
    sys.exit(main())
