"""Shared-queue dispatch: runs/s through the background pump, and submit-to-ExecutionId latency.

Run ``python -m benchmarks.dispatch [--json] [--runs N] [--sweep N ...] [--quick]
[--breakdown] [--no-celery] [--redis-url URL --flush]`` from the repository root. Without
``--redis-url`` a private embedded Valkey is started as ``airt`` starts its own
(:func:`airuntime.devstack.process_redis.default_embedded_server`: a unix socket); the
database is flushed before each scenario. The paced scenario alone lasts runs / rate =
5 s by default.
``--cluster``: the backlog scenario on a 1-shard and a 3-shard Valkey Cluster with Redis
CPU per shard (:mod:`benchmarks.dispatch_cluster`).

Peer, ratios and checks
-----------------------
* **Celery** (:mod:`benchmarks.celery_jobs`, skipped by ``--no-celery``): the same
  number of independent no-op jobs on the same server, ``--submitters`` threads
  submitting, every result awaited; ``ratios`` = airuntime completed runs/s / Celery
  jobs/s for ``backlog`` and ``streaming``.
* ``spread_ratio`` per scenario: runs on the most loaded instance / on the least loaded.
* ``server_commands_per_run`` and ``redis_cpu_us_per_run`` per scenario: the server's
  ``total_commands_processed`` and ``used_cpu_user + used_cpu_sys`` deltas from the
  first submit to the last run's end, divided by the runs: figures the machine's speed
  does not move, to compare commits on a box whose speed drifts.
* ``python_cpu_us_per_run``: the CPU the airuntime processes (this one, and the
  runtime child of ``--runtime-process``) used over the same window, per run.
* ``--sweep 1000 10000 100000``: the backlog scenario at each size; ``ms_per_run`` and
  its ratio to the smallest size (the target: flat within 15%). A size of at most
  10,000 runs is measured three times and its median taken (``runs_per_s_each`` lists
  all): a drain of 1,000 runs lasts half a second, and one slow moment moves the whole
  ratio; 100,000 runs are measured once.
* ``--breakdown``: one more backlog of ``--runs`` runs with every command's server time
  logged (:mod:`benchmarks.command_times`, ``SLOWLOG``): ``breakdown`` lists each
  script's (``EVALSHA <name>``) and plain command's calls and µs a run, largest first.
  A script's time includes the commands it runs, which are also listed under their
  names. The logging slows the server, so that backlog's rates are not reported.
* ``failures`` lists every missed target (the issue's: backlog 2,000 and streaming 1,500
  runs/s, 5x Celery, spread 1.3, paced p99 20 ms, sweep flat within 15%).
  ``--quick`` (CI: 300 runs, backlog + streaming + Celery, no paced run, no sweep) exits
  1 only when a ratio to Celery is below half its target (2.5) or a spread above twice
  its target (2.6).

Set-up (one process, everything real except the process boundary)
-----------------------------------------------------------------
* the process's garbage collector set as the deployed entry points set theirs
  (:mod:`airuntime.core.gc_tuning`; ``AIRUNTIME_GC_GEN0_THRESHOLD=0`` for Python's own);
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
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis as sync_redis
from redis.asyncio import Redis

from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.control_plane.shared_runs import SharedRun, SharedRunStatus
from airuntime.core import keys
from airuntime.core.context import ExecutionContextSnapshot
from airuntime.core.gc_tuning import gen0_threshold_from_env, tune_collector
from airuntime.core.redis_client import connect
from airuntime.core.run_layout import run_buckets_for
from airuntime.devstack.process_redis import default_embedded_server
from benchmarks.command_times import CommandTimes
from benchmarks.redis_probe import ServerSample
from benchmarks.runtime_process import RuntimeProcess
from runtime_pod.config import InstanceConfig
from runtime_pod.host import RuntimeHost

PIPELINE: dict[str, Any] = {"id": "tiny", "steps": [{"id": "a", "uses": "noop"}]}
INSTANCES = 3
SLOTS = 64
SNAPSHOT = ExecutionContextSnapshot(tenant_id="default", user_id="bench")


def _snapshots(tenants: int) -> list[ExecutionContextSnapshot]:
    """The tenants runs are submitted for, in turn (``default`` alone by default)."""
    if tenants == 1:
        return [SNAPSHOT]
    return [SNAPSHOT.model_copy(update={"tenant_id": f"tenant-{i}"}) for i in range(tenants)]


SCENARIOS = ("backlog", "streaming", "paced")
_DISPATCHED_OR_ENDED = frozenset(
    {SharedRunStatus.DISPATCHED, SharedRunStatus.SUCCEEDED, SharedRunStatus.FAILED}
)


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
    spread_ratio: float
    """Runs on the most loaded instance / runs on the least loaded one."""
    duration_s: float
    redis_clock_offset_ms: float
    notes: list[str] = field(default_factory=list)
    server_commands_per_run: float | None = None
    """Commands the server processed (each command a script runs counts) per run, from
    the first submit to the last run's end: a figure the machine's speed does not move."""
    redis_cpu_us_per_run: float | None = None
    """Redis CPU (``INFO cpu`` user + sys) per run over the same window."""
    python_cpu_us_per_run: float | None = None
    """CPU (user + sys) of the airuntime processes per run over the same window: this
    process (control plane, submitters, and the runtimes unless ``--runtime-process``)
    plus the runtime child when there is one. Like the Redis figure, it moves little
    with the box's speed, so commits compare by it."""


async def _clock_offset_ms(redis: Redis) -> float:
    before = time.time()
    sec, usec = await redis.time()
    after = time.time()
    return round((sec + usec / 1e6 - (before + after) / 2) * 1000, 2)


async def _submit_all(cp: ControlPlane, runs: int, concurrency: int, tenants: int = 1) -> list[str]:
    ids: list[str] = []
    remaining = iter(range(runs))
    snapshots = _snapshots(tenants)

    async def submitter() -> None:
        for i in remaining:
            ids.append((await cp.submit(PIPELINE, snapshots[i % tenants])).shared_run_id)

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


async def _wait_done(
    redis: Redis, cp: ControlPlane, runs: int, timeout_s: float, tenants: int = 1
) -> None:
    deadline = time.monotonic() + timeout_s
    buckets = keys.run_buckets(run_buckets_for(redis))  # one on a standalone server
    indexes = [b.by_tenant(s.tenant_id) for s in _snapshots(tenants) for b in buckets]
    states = [b.in_state(state) for b in buckets for state in ("queued", "running")]
    while time.monotonic() < deadline:
        if (
            await cp.queue.pending_count() == 0
            and await cp.queue.claimed_count() == 0
            and sum([await redis.zcard(state) for state in states]) == 0
            and sum([await redis.zcard(index) for index in indexes]) == runs
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
        # Dispatched, or already ended by the runtime's outcome (the outcome reader).
        assert run.status in _DISPATCHED_OR_ENDED and run.run_id, run
        pipe.hgetall(keys.run(run.run_id, run_buckets_for(redis)))
    records = [{k.decode(): v.decode() for k, v in raw.items()} for raw in await pipe.execute()]
    return list(zip(shared, records, strict=True))


Runtimes = RuntimeHost | RuntimeProcess


def _stack(
    redis: Redis, runs: int, url: str, runtime_process: bool
) -> tuple[Runtimes, ControlPlane]:
    """The runtimes and the pumping control plane of one scenario (not started)."""
    settings = ControlPlaneSettings(
        background_pump=True, scale_out_enabled=False, control_plane_id="bench-cp"
    )
    if runtime_process:
        child = RuntimeProcess(redis, url, instances=INSTANCES, slots=SLOTS, queue=2 * runs)
        return child, ControlPlane(redis, settings)
    config = InstanceConfig(
        provider="local",
        workers=SLOTS,
        max_local_workers_per_execution=1,
        max_concurrent_runs=SLOTS,
        queue_capacity=2 * runs,
        heartbeat_s=1.0,
        assist=False,
    )
    return RuntimeHost(redis, config, instances=INSTANCES), ControlPlane(redis, settings)


@dataclass(frozen=True)
class _Load:
    runs: int
    submitters: int
    rate: float
    tenants: int = 1


@dataclass
class _Driven:
    ids: list[str]
    start_ms: float
    """Where the rates start; 0 until known (streaming/paced: the first submit)."""
    submit_rate: float | None = None
    notes: list[str] = field(default_factory=list)


async def _drive(
    redis: Redis, host: Runtimes, cp: ControlPlane, scenario: str, args: _Load
) -> _Driven:
    """Start runtimes and pump, submit the runs as the scenario says."""
    if scenario == "backlog":
        feeder = ControlPlane(
            redis, ControlPlaneSettings(background_pump=False, control_plane_id="feeder")
        )
        ids = await _submit_all(feeder, args.runs, args.submitters, args.tenants)
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
        ids = await _submit_all(cp, args.runs, args.submitters, args.tenants)
    return _Driven(ids, 0.0, submit_rate=round(args.runs / (time.perf_counter() - t0), 1))


def _spread(per_instance: dict[str, int]) -> float:
    counts = [per_instance.get(f"runtime-instance-{i + 1}", 0) for i in range(INSTANCES)]
    return round(max(counts) / min(counts), 2) if min(counts) else float("inf")


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
        spread_ratio=_spread(per_instance),
        duration_s=round((max(finished) - start_ms) / 1000, 3),
        redis_clock_offset_ms=offset,
        notes=notes,
    )


async def run_scenario(
    url: str,
    scenario: str,
    runs: int,
    submitters: int,
    rate: float,
    *,
    tenants: int = 1,
    runtime_process: bool = False,
) -> Result:
    # Three instances and a control plane share this client; deployed, each is its own
    # process with its own pool of 100 connections, so the pool here is that large.
    redis = connect(url, max_connections=100 * (INSTANCES + 1))
    await redis.flushdb()
    host, cp = _stack(redis, runs, url, runtime_process)
    offset = await _clock_offset_ms(redis)
    probe = _probe(url)
    try:
        before = ServerSample.take(probe) if probe else None
        cpu_before = _python_cpu_s(host)
        driven = await _drive(redis, host, cp, scenario, _Load(runs, submitters, rate, tenants))
        # At least 100 runs/s: a 100,000-run backlog may take minutes.
        await _wait_done(redis, cp, runs, timeout_s=max(120.0, runs / 100), tenants=tenants)
        after = ServerSample.take(probe) if probe else None
        cpu_after = _python_cpu_s(host)
        rows = await _collect(redis, cp, driven.ids)
    finally:
        with contextlib.suppress(Exception):
            await cp.stop()
        with contextlib.suppress(Exception):
            await host.stop(drain_timeout_s=5)
        await redis.aclose()
        if probe:
            probe.close()
    result = _result(scenario, rows, driven, offset)
    if before and after:
        result.server_commands_per_run = round((after.commands - before.commands) / runs, 1)
        result.redis_cpu_us_per_run = round((after.cpu_s - before.cpu_s) * 1e6 / runs, 1)
    result.python_cpu_us_per_run = round((cpu_after - cpu_before) * 1e6 / runs, 1)
    return result


def _python_cpu_s(host: Runtimes) -> float:
    """CPU seconds (user + sys) used so far by this process and, with
    ``--runtime-process``, the runtime child (from ``/proc/<pid>/stat``; a child that
    has not started yet counts 0)."""
    used = time.process_time()
    if isinstance(host, RuntimeProcess) and host.proc is not None:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{host.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            used += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return used


def _probe(url: str) -> sync_redis.Redis | None:
    """A plain client for the server counters (None on a cluster URL: per-shard
    figures are :mod:`benchmarks.dispatch_cluster`'s)."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return None
    return sync_redis.Redis.from_url(url)


# The targets, and what --quick fails below (half of each).
TARGET_BACKLOG_RUNS_PER_S = 2000.0
TARGET_STREAMING_RUNS_PER_S = 1500.0
TARGET_CELERY_RATIO = 5.0
TARGET_SPREAD = 1.3
TARGET_PACED_P99_MS = 20.0
QUICK_RUNS = 300
SWEEP_REPEATS = 3
SWEEP_REPEAT_UP_TO = 10_000
"""Sweep sizes up to this many runs are measured SWEEP_REPEATS times (median)."""


@dataclass
class Report:
    results: list[Result]
    celery_jobs_per_s: float | None
    ratios: dict[str, float]
    """airuntime completed runs/s / Celery jobs/s, per scenario (backlog, streaming)."""
    sweep: list[dict[str, Any]]
    """Backlog at each size: runs, completed runs/s, ms per run, ms per run / the smallest's."""
    failures: list[str]
    breakdown: list[dict[str, Any]] = field(default_factory=list)
    """--breakdown: server time a run by script and command (:func:`_breakdown`)."""
    breakdown_complete: bool | None = None
    """Whether the server's log held every command of that backlog."""


def _ratios(results: list[Result], celery: float | None) -> dict[str, float]:
    if not celery:
        return {}
    return {
        r.scenario: round(r.completed_runs_per_s / celery, 2)
        for r in results
        if r.scenario in ("backlog", "streaming")
    }


def _breakdown(
    url: str, runs: int, submitters: int, runtime_process: bool
) -> tuple[list[dict[str, Any]], bool | None]:
    """A backlog of ``runs`` runs with every command's server time logged: each
    script's and command's calls and µs a run (none on a cluster URL)."""
    client = _probe(url)
    if client is None:
        log("dispatch breakdown: needs a standalone server, skipped")
        return [], None
    log(f"dispatch breakdown: backlog of {runs} runs, every command logged ...")
    try:
        # ~130 commands a run, and the scripts' calls: room for twice that.
        with CommandTimes(client, capacity=runs * 300) as times:
            asyncio.run(
                run_scenario(url, "backlog", runs, submitters, 1.0, runtime_process=runtime_process)
            )
    finally:
        client.close()
    return [asdict(row) for row in times.per(runs)], times.complete


def _sweep(
    url: str, sizes: list[int], submitters: int, runtime_process: bool
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for n in sizes:
        each: list[float] = []
        for i in range(SWEEP_REPEATS if n <= SWEEP_REPEAT_UP_TO else 1):
            log(f"dispatch sweep: backlog of {n} runs ({i + 1}) ...")
            r = asyncio.run(
                run_scenario(url, "backlog", n, submitters, 1.0, runtime_process=runtime_process)
            )
            each.append(r.completed_runs_per_s)
        rate = statistics.median(each)
        rows.append(
            {
                "runs": n,
                "completed_runs_per_s": rate,
                "ms_per_run": round(1000 / rate, 3),
                "runs_per_s_each": each,
            }
        )
    for row in rows:
        row["vs_smallest"] = round(row["ms_per_run"] / rows[0]["ms_per_run"], 2)
    return rows


def _failures(report: Report, quick: bool) -> list[str]:
    """What misses its target (full run: reported), or half of it (--quick: fails)."""
    scale = 0.5 if quick else 1.0
    out: list[str] = []
    for scenario, ratio in report.ratios.items():
        if ratio < TARGET_CELERY_RATIO * scale:
            out.append(f"{scenario}: airuntime/celery {ratio} < {TARGET_CELERY_RATIO * scale}")
    for r in report.results:
        if r.spread_ratio > TARGET_SPREAD / scale:
            out.append(f"{r.scenario}: spread {r.spread_ratio} > {round(TARGET_SPREAD / scale, 2)}")
    if quick:
        return out
    for r in report.results:
        if r.scenario == "paced" and r.submit_to_execution_ms["p99"] > TARGET_PACED_P99_MS:
            p99 = r.submit_to_execution_ms["p99"]
            out.append(f"paced: submit->ExecutionId p99 {p99} ms > {TARGET_PACED_P99_MS}")
        target = {"backlog": TARGET_BACKLOG_RUNS_PER_S, "streaming": TARGET_STREAMING_RUNS_PER_S}
        if r.scenario in target and r.completed_runs_per_s < target[r.scenario]:
            out.append(f"{r.scenario}: {r.completed_runs_per_s} runs/s < {target[r.scenario]}")
    for row in report.sweep:
        if abs(row["vs_smallest"] - 1) > 0.15:
            out.append(f"sweep: {row['runs']} runs cost {row['vs_smallest']}x the smallest")
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.dispatch", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--runs", type=int, default=1000, help="shared runs per scenario")
    parser.add_argument("--submitters", type=int, default=4, help="concurrent submit tasks")
    parser.add_argument("--rate", type=float, default=200.0, help="runs/s of the paced scenario")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--no-celery", action="store_true", help="skip the Celery peer")
    parser.add_argument(
        "--runtime-process",
        action="store_true",
        help="run the 3 instances in one `airt runtime` child process (redis provider), "
        "as deployed, instead of in the benchmark's process",
    )
    parser.add_argument(
        "--sweep", type=int, nargs="*", default=None, help="backlog sizes (e.g. 1000 10000 100000)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"CI: {QUICK_RUNS} runs, backlog + streaming + Celery; exit 1 below half a target",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="one more backlog with every command's server time logged: µs a run by script",
    )
    parser.add_argument("--redis-url", help="use this Redis/Valkey (needs --flush)")
    parser.add_argument("--flush", action="store_true", help="allow FLUSHDB of --redis-url")
    return parser


def _print(report: Report) -> None:
    for r in report.results:
        lat = r.submit_to_execution_ms
        print(
            f"{r.scenario:9s} pump {r.pump_runs_per_s:8.1f} runs/s  "
            f"completed {r.completed_runs_per_s:8.1f} runs/s  "
            f"submit->ExecutionId p50 {lat['p50']:.0f} ms p99 {lat['p99']:.0f} ms  "
            f"spread {r.spread_ratio}  per instance {r.runs_per_instance}  "
            f"server cmds/run {r.server_commands_per_run}  redis CPU us/run "
            f"{r.redis_cpu_us_per_run}  python CPU us/run {r.python_cpu_us_per_run}"
        )
    if report.celery_jobs_per_s is not None:
        print(f"celery    {report.celery_jobs_per_s:.1f} jobs/s  airuntime/celery {report.ratios}")
    for row in report.sweep:
        print(
            f"sweep     {row['runs']:>7.0f} runs  {row['completed_runs_per_s']:8.1f} runs/s  "
            f"{row['ms_per_run']:.3f} ms/run  {row['vs_smallest']}x the smallest"
        )
    if report.breakdown:
        print(
            f"server time a run by script and command (log complete: {report.breakdown_complete})"
        )
        for item in report.breakdown:
            print(
                f"  {item['us_per_unit']:8.1f} us/run  {item['calls_per_unit']:7.2f} calls/run  "
                f"{item['us_per_call']:8.1f} us/call  {item['name']}"
            )
    for failure in report.failures:
        print(f"MISSED    {failure}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--cluster" in argv:  # 1 vs 3 shards, Redis CPU per shard
        from benchmarks import dispatch_cluster

        return dispatch_cluster.main(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.redis_url and not args.flush:
        parser.error("--redis-url: the benchmark flushes the database; pass --flush to allow it")
    if args.runs < 1 or args.submitters < 1 or args.rate <= 0:
        parser.error("--runs and --submitters must be >= 1, --rate > 0")
    if args.sweep is not None and any(n < 1 for n in args.sweep):
        parser.error("--sweep: sizes must be >= 1")
    if args.quick:
        args.runs, args.scenarios, args.sweep = QUICK_RUNS, ["backlog", "streaming"], None
    # This process plays the deployed control plane and runtimes: its collector is set
    # as their entry points set theirs (AIRUNTIME_GC_GEN0_THRESHOLD=0: Python's own).
    try:
        tune_collector(gen0_threshold_from_env())
    except ValueError as exc:
        parser.error(str(exc))

    wall = time.perf_counter()
    results: list[Result] = []
    celery: float | None = None
    with contextlib.ExitStack() as stack:
        url: str = args.redis_url or stack.enter_context(default_embedded_server()).url
        for scenario in args.scenarios:
            log(f"dispatch {scenario}: {args.runs} runs over {INSTANCES} instances ...")
            results.append(
                asyncio.run(
                    run_scenario(
                        url,
                        scenario,
                        args.runs,
                        args.submitters,
                        args.rate,
                        runtime_process=args.runtime_process,
                    )
                )
            )
        if not args.no_celery:
            from benchmarks.celery_jobs import celery_jobs_per_s

            log(f"celery: {args.runs} no-op jobs, each result awaited ...")
            celery = celery_jobs_per_s(url, args.runs, args.submitters)
        sweep = (
            _sweep(url, sorted(args.sweep), args.submitters, args.runtime_process)
            if args.sweep
            else []
        )
        breakdown, complete = (
            _breakdown(url, args.runs, args.submitters, args.runtime_process)
            if args.breakdown
            else ([], None)
        )
    report = Report(results, celery, _ratios(results, celery), sweep, [], breakdown, complete)
    report.failures = _failures(report, args.quick)
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        _print(report)
    log(f"wall time {time.perf_counter() - wall:.1f} s")
    return 1 if args.quick and report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
