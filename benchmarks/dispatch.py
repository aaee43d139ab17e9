"""Shared-queue dispatch: runs/s through the background pump, and submit-to-ExecutionId latency.

Run ``python -m benchmarks.dispatch [--json] [--runs N] [--redis-url URL --flush]``
from the repository root. Without ``--redis-url`` a private embedded Valkey
(:class:`airuntime.devstack.embedded.EmbeddedServer`) is started; the database is flushed
before each scenario. The whole run takes 25-45 s on a 2-core machine (the paced
scenario alone lasts runs / rate = 10 s by default).

Set-up (one process, everything real except the process boundary)
-----------------------------------------------------------------
* one :class:`~runtime_pod.host.RuntimeHost` with **3 Shared runtime instances**
  (``runtime-instance-1..3``), each with 64 run slots (``max_concurrent_runs``), 64
  workers, 1 worker per execution, a local queue of ``2 x runs`` and assistance off,
  reached through the ``local`` provider (the control plane's in-process transport);
* one :class:`~airuntime.control_plane.service.ControlPlane` with the **background pump**
  (readiness gate, batches of 100, 50 ms idle wait), QueueFirst submit, scale-out off;
* ``--runs`` (default 1,000) shared runs of a one-step ``noop`` pipeline, tenant
  ``default``. Every run goes through the whole path: shared run store, Redis shared
  queue, claim (Lua), snapshot restore, dispatch-time admission with a Redis slot
  reservation (Lua), provider delivery, settle (Lua), local queue, background
  controller, ExecutionId, DAG engine (Lua), run index.

Scenarios
---------
* ``backlog``: all runs are submitted first (by a control plane without a pump), then
  the pumping control plane starts; the readiness gate passes at once (the runtimes
  are up) and the pump drains the backlog. ``pump_runs_per_s`` = runs / (last
  dispatch - pump start). Latencies here are mostly time spent queued behind the
  backlog, reported for completeness.
* ``streaming``: runtimes and pump are up, then ``--submitters`` (default 4) concurrent
  tasks submit the runs as fast as they can; the pump dispatches while they submit.
  ``pump_runs_per_s`` = runs / (last dispatch - first submit): it cannot exceed the
  submit rate, which is reported as ``submit_runs_per_s``. When submitting is faster
  than pumping, latencies again mostly measure queueing.
* ``paced``: as ``streaming``, but one submitter submits on a fixed schedule of
  ``--rate`` runs/s (default 100, below the pump's capacity on a 2-core machine), so
  ``submit_to_execution_ms`` is the latency of an unsaturated pump: queue wake-up,
  claim, admission, delivery, local start.

What is measured
----------------
From the records the system writes, not from the benchmark's own stopwatch:
``created_at_ms`` (submit, on the shared run), ``dispatched_at_ms`` (shared run,
written after the runtime accepted), ``started_at_ms`` (run index record, written
when the background controller created the ExecutionId) and ``finished_at_ms``.
All of them come from ``time.time()`` of this one process (control plane and
runtimes are in-process), so they are on one clock; the Redis server's clock
offset (``TIME``) is reported as ``redis_clock_offset_ms`` for reference (script-side
timestamps use the server clock). ``submit_to_execution_ms`` = started - created;
``submit_to_dispatch_ms`` = dispatched - created; ``dispatch_to_execution_ms`` =
started - dispatched (local queue wait + start). Percentiles are nearest-rank.
``completed_runs_per_s`` = runs / (last finish - the same start as the pump rate).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from redis.asyncio import Redis

from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.control_plane.shared_runs import SharedRun, SharedRunStatus
from airuntime.core import keys
from airuntime.core.context import ExecutionContextSnapshot
from airuntime.devstack.embedded import EmbeddedServer
from runtime_pod.config import InstanceConfig
from runtime_pod.host import RuntimeHost

PIPELINE: dict[str, Any] = {"id": "tiny", "steps": [{"id": "a", "uses": "noop"}]}
INSTANCES = 3
SLOTS = 64
SNAPSHOT = ExecutionContextSnapshot(tenant_id="default", user_id="bench")
SCENARIOS = ("backlog", "streaming", "paced")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def rank(p: float) -> float:
        return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]

    return {
        "p50": rank(50),
        "p90": rank(90),
        "p99": rank(99),
        "max": ordered[-1],
        "mean": round(sum(ordered) / len(ordered), 1),
    }


def _deltas(later: list[float], earlier: list[float]) -> dict[str, float]:
    return percentiles([b - a for b, a in zip(later, earlier, strict=True)])


@dataclass
class Result:
    scenario: str
    runs: int
    instances: int
    pump_runs_per_s: float
    completed_runs_per_s: float
    submit_runs_per_s: float | None
    submit_to_execution_ms: dict[str, float]
    submit_to_dispatch_ms: dict[str, float]
    dispatch_to_execution_ms: dict[str, float]
    runs_per_instance: dict[str, int]
    duration_s: float
    redis_clock_offset_ms: float
    notes: list[str] = field(default_factory=list)


async def _clock_offset_ms(redis: Redis) -> float:
    before = time.time()
    sec, usec = await redis.time()
    after = time.time()
    return round((sec + usec / 1e6 - (before + after) / 2) * 1000, 2)


async def _submit_all(cp: ControlPlane, runs: int, concurrency: int) -> list[str]:
    ids: list[str] = []
    remaining = iter(range(runs))

    async def submitter() -> None:
        for _ in remaining:
            ids.append((await cp.submit(PIPELINE, SNAPSHOT)).shared_run_id)

    await asyncio.gather(*(submitter() for _ in range(concurrency)))
    return ids


async def _submit_paced(cp: ControlPlane, runs: int, rate: float) -> list[str]:
    ids: list[str] = []
    t0 = time.perf_counter()
    for i in range(runs):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        ids.append((await cp.submit(PIPELINE, SNAPSHOT)).shared_run_id)
    return ids


async def _wait_done(redis: Redis, cp: ControlPlane, runs: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (
            await cp.queue.pending_count() == 0
            and await redis.zcard(keys.squeue_claimed()) == 0
            and await redis.zcard(keys.runs_in_state("queued")) == 0
            and await redis.zcard(keys.runs_in_state("running")) == 0
            and await redis.zcard(keys.runs_by_tenant("default")) == runs
        ):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"runs did not finish within {timeout_s} s")


async def _collect(
    redis: Redis, cp: ControlPlane, ids: list[str]
) -> list[tuple[SharedRun, dict[str, str]]]:
    pipe = redis.pipeline(transaction=False)
    for srid in ids:
        pipe.get(keys.shared_run(srid))
    shared = [SharedRun.model_validate_json(raw) for raw in await pipe.execute()]
    pipe = redis.pipeline(transaction=False)
    for run in shared:
        assert run.status is SharedRunStatus.DISPATCHED and run.run_id, run
        pipe.hgetall(keys.run(run.run_id))
    records = [{k.decode(): v.decode() for k, v in raw.items()} for raw in await pipe.execute()]
    return list(zip(shared, records, strict=True))


def _stack(redis: Redis, runs: int) -> tuple[RuntimeHost, ControlPlane]:
    """The runtimes and the pumping control plane of one scenario (not started)."""
    config = InstanceConfig(
        provider="local",
        workers=SLOTS,
        max_local_workers_per_execution=1,
        max_concurrent_runs=SLOTS,
        queue_capacity=2 * runs,
        heartbeat_s=1.0,
        assist=False,
    )
    settings = ControlPlaneSettings(
        background_pump=True, scale_out_enabled=False, control_plane_id="bench-cp"
    )
    return RuntimeHost(redis, config, instances=INSTANCES), ControlPlane(redis, settings)


@dataclass(frozen=True)
class _Load:
    runs: int
    submitters: int
    rate: float


@dataclass
class _Driven:
    ids: list[str]
    start_ms: float
    """Where the rates start; 0 until known (streaming/paced: the first submit)."""
    submit_rate: float | None = None
    notes: list[str] = field(default_factory=list)


async def _drive(
    redis: Redis, host: RuntimeHost, cp: ControlPlane, scenario: str, args: _Load
) -> _Driven:
    """Start runtimes and pump, submit the runs as the scenario says."""
    if scenario == "backlog":
        feeder = ControlPlane(
            redis, ControlPlaneSettings(background_pump=False, control_plane_id="feeder")
        )
        ids = await _submit_all(feeder, args.runs, args.submitters)
        await host.start()
        for inst in host.instances:
            cp.local.add(inst)
        start_ms = time.time() * 1000
        await cp.start()
        return _Driven(
            ids, start_ms, notes=["latencies include the time spent queued behind the backlog"]
        )
    await host.start()
    for inst in host.instances:
        cp.local.add(inst)
    await cp.start()
    await asyncio.wait_for(cp.background.ready.wait(), 10)
    t0 = time.perf_counter()
    if scenario == "paced":
        ids = await _submit_paced(cp, args.runs, args.rate)
    else:
        ids = await _submit_all(cp, args.runs, args.submitters)
    return _Driven(ids, 0.0, submit_rate=round(args.runs / (time.perf_counter() - t0), 1))


def _result(
    scenario: str, rows: list[tuple[SharedRun, dict[str, str]]], driven: _Driven, offset: float
) -> Result:
    runs = len(rows)
    created = [float(r.created_at_ms) for r, _ in rows]
    dispatched = [float(r.dispatched_at_ms or 0) for r, _ in rows]
    started = [float(rec["started_at_ms"]) for _, rec in rows]
    finished = [float(rec["finished_at_ms"]) for _, rec in rows]
    statuses = {rec["status"] for _, rec in rows}
    notes = list(driven.notes)
    if statuses != {"completed"}:
        notes.append(f"run statuses: {sorted(statuses)}")
    start_ms = driven.start_ms if scenario == "backlog" else min(created)
    per_instance: dict[str, int] = {}
    for _, rec in rows:
        per_instance[rec["instance_id"]] = per_instance.get(rec["instance_id"], 0) + 1
    return Result(
        scenario=scenario,
        runs=runs,
        instances=INSTANCES,
        pump_runs_per_s=round(runs / ((max(dispatched) - start_ms) / 1000), 1),
        completed_runs_per_s=round(runs / ((max(finished) - start_ms) / 1000), 1),
        submit_runs_per_s=driven.submit_rate,
        submit_to_execution_ms=_deltas(started, created),
        submit_to_dispatch_ms=_deltas(dispatched, created),
        dispatch_to_execution_ms=_deltas(started, dispatched),
        runs_per_instance=dict(sorted(per_instance.items())),
        duration_s=round((max(finished) - start_ms) / 1000, 3),
        redis_clock_offset_ms=offset,
        notes=notes,
    )


async def run_scenario(url: str, scenario: str, runs: int, submitters: int, rate: float) -> Result:
    redis = Redis.from_url(url)
    await redis.flushdb()
    host, cp = _stack(redis, runs)
    offset = await _clock_offset_ms(redis)
    try:
        driven = await _drive(redis, host, cp, scenario, _Load(runs, submitters, rate))
        await _wait_done(redis, cp, runs, timeout_s=120)
        rows = await _collect(redis, cp, driven.ids)
    finally:
        with contextlib.suppress(Exception):
            await cp.stop()
        with contextlib.suppress(Exception):
            await host.stop(drain_timeout_s=5)
        await redis.aclose()
    return _result(scenario, rows, driven, offset)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.dispatch", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--json", action="store_true", help="print one JSON list")
    parser.add_argument("--runs", type=int, default=1000, help="shared runs per scenario")
    parser.add_argument("--submitters", type=int, default=4, help="concurrent submit tasks")
    parser.add_argument("--rate", type=float, default=100.0, help="runs/s of the paced scenario")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--redis-url", help="use this Redis/Valkey (needs --flush)")
    parser.add_argument("--flush", action="store_true", help="allow FLUSHDB of --redis-url")
    args = parser.parse_args(argv)
    if args.redis_url and not args.flush:
        parser.error("--redis-url: the benchmark flushes the database; pass --flush to allow it")
    if args.runs < 1 or args.submitters < 1 or args.rate <= 0:
        parser.error("--runs and --submitters must be >= 1, --rate > 0")

    wall = time.perf_counter()
    results: list[Result] = []
    with contextlib.ExitStack() as stack:
        url: str = args.redis_url or stack.enter_context(EmbeddedServer()).url
        for scenario in args.scenarios:
            log(f"dispatch {scenario}: {args.runs} runs over {INSTANCES} instances ...")
            results.append(
                asyncio.run(run_scenario(url, scenario, args.runs, args.submitters, args.rate))
            )
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        for r in results:
            lat = r.submit_to_execution_ms
            print(
                f"{r.scenario:9s} pump {r.pump_runs_per_s:8.1f} runs/s  "
                f"completed {r.completed_runs_per_s:8.1f} runs/s  "
                f"submit->ExecutionId p50 {lat['p50']:.0f} ms p99 {lat['p99']:.0f} ms  "
                f"per instance {r.runs_per_instance}"
            )
    log(f"wall time {time.perf_counter() - wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
