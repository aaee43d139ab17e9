"""DAG throughput of airuntime beside the floor of Redis work and a Celery chord, no-op steps.

Run ``python -m benchmarks.dag_throughput [--json] [--quick] [--redis-url URL]`` from
the repository root (``--cluster``: the same engine on a 1-shard and a 3-shard Valkey
Cluster with Redis CPU per shard, :mod:`benchmarks.cluster_split`). Without
``--redis-url`` one embedded Valkey, started as ``airt`` starts its own
(:func:`airuntime.devstack.process_redis.default_embedded_server`: a unix socket),
serves the whole run and every system uses it; airuntime and the floor use the URL's
database, Celery databases 1 (broker) and 2 (results). Each execution's and floor's
keys are deleted after its run.

What is measured
----------------
Shapes (:mod:`benchmarks.dag_shapes`, every step ``uses: noop``): ``fanout-2000``
(1 -> 2,000 -> 1), ``fanout-20000``, ``chain-2000``, ``random-2000`` (0-3 random
earlier parents, seed 7), and a size sweep ``fanout-1000``, ``fanout-10000``,
``fanout-100000``.

* **airuntime**: the execution is created paused (not timed), then **2 worker
  processes** (``python -m airuntime.cli worker EID --workers 64``, what ``airt
  worker`` does) start; once both have loaded the plan and listen on the control
  channel the execution is resumed, so process start-up is outside the figures. 64
  slots = ``PoolSettings.claim_batch``: one claim or completion call can carry a full
  batch; the handler is a no-op, so more slots buy nothing.
* **floor** (:mod:`benchmarks.floor`): the bare-minimum Lua drain of the same DAG
  (batch claim + batch complete with dependency counters; no ledger, leases, tokens,
  outputs or control checks), 2 processes with 64 slots each, started the same way.
* **celery** (:mod:`benchmarks.celery_peer`): ``chain(noop.si(), chord([noop.si()] *
  2000, noop.si()))`` run by ``celery worker --pool prefork --concurrency 2``, timed on
  the client from sending to the callback's result (~10 s).

Each airuntime/floor shape runs ``--repeat`` times (default 3; the row is the median by
steps/s, ``runs_steps_per_s`` lists all), the sweep's 100,000 steps too: its cost a
step is steady from run to run (15.6 / 15.8 / 16.0 µs of Redis CPU in three runs of
three), but one run alone reported anything from 1.14x to 1.37x the sweep's median.

* ``steps_per_s`` = steps / duration; the duration is server time: for airuntime from
  the first claim entry of the ledger to ``execution_finalized`` (stream ids are
  ``<server ms>-<seq>``), for the floor from its first claim to its last completion
  (``TIME`` in the script); for Celery the client's monotonic clock.
* ``redis_calls_per_step`` = client round trips / steps
  (:class:`airuntime.core.redis_client.CountingRedis`; an EVALSHA counts once). For
  Celery it is the server's command count (the tasks are sent by child processes).
* ``redis_cpu_us_per_step`` = delta of ``used_cpu_user + used_cpu_sys`` (``INFO cpu``)
  from the release of the workers to their exit, in microseconds / steps.
* ``server_commands_per_step`` = delta of ``total_commands_processed`` / steps (each
  command a script runs counts, plus the EVALSHA).

Output
------
Result rows (``system`` airuntime | floor | celery, ``shape``, ``steps`` and the figures
above; ``sweep: true`` on the sweep's rows), ratio rows (``system: "ratio
airuntime/floor"`` per shape, ``"ratio airuntime/celery"`` on fanout-2000: airuntime's
figure divided by the other's, measured in the same run) and target rows
(:mod:`benchmarks.dag_targets`: ``target``, ``shape``, ``value``, ``threshold``,
``met``, ``gate``). ``--json`` prints them as one JSON list, otherwise as tables; the
wall time goes to stderr.

``--quick`` (the CI regression guard, about a minute): fanout-2000, fanout-20000 and
chain-1000 once each (the two fan-outs are the sweep), plus a Celery chord of 500 (its
ratio compares steps/s with airuntime's fanout-2000); exit status 1 if a
ratio target (engine/floor on the fan-outs, airuntime/Celery) falls below its gate,
half its target. Absolute figures are reported, never gated. Without ``--quick`` the
exit status does not depend on the targets. ``--no-celery`` skips Celery (and its
ratio); ``--shapes``/``--sweep`` pick shapes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from airuntime.core import keys
from airuntime.core.redis_client import connect
from airuntime.core.settings import REDIS_URL_ENV as ENV_VAR
from airuntime.devstack.process_redis import default_embedded_server
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.pipeline import Plan
from benchmarks import floor
from benchmarks.celery_peer import run_celery
from benchmarks.dag_shapes import deps_of, plan_of
from benchmarks.dag_targets import gate_failures, target_rows
from benchmarks.redis_probe import CLAIM_TYPES, ServerSample, entries, stream_ms

WORKER_PROCESSES = 2
DEFAULT_SLOTS = 64
CELERY_FANOUT = 2000
QUICK_CELERY_FANOUT = 500
"""Quick mode's chord: Celery's rate hardly depends on the size, its time does (~2 s)."""
RUN_TIMEOUT_S = 180.0
DEFAULT_REPEAT = 3
SHAPES = ["fanout-2000", "fanout-20000", "chain-2000", "random-2000"]
SWEEP = ["fanout-1000", "fanout-10000", "fanout-100000"]
QUICK_SHAPES = ["fanout-2000", "fanout-20000", "chain-1000"]
QUICK_SWEEP = ["fanout-2000", "fanout-20000"]  # the quick shapes' own rows

# --------------------------------------------------------------------------- results


@dataclass
class Row:
    system: str
    shape: str
    steps: int
    duration_s: float
    round_trips: int | None
    server: tuple[ServerSample, ServerSample]
    join_lag_ms: int | None = None
    runs: list[float] | None = None
    """steps_per_s of every repetition (this row is the median one)."""
    sweep: bool = False

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.duration_s if self.duration_s > 0 else float("inf")

    @property
    def server_commands_per_step(self) -> float:
        return (self.server[1].commands - self.server[0].commands) / self.steps

    @property
    def redis_calls_per_step(self) -> float:
        if self.round_trips is None:
            return self.server_commands_per_step
        return self.round_trips / self.steps

    @property
    def redis_cpu_us_per_step(self) -> float:
        return (self.server[1].cpu_s - self.server[0].cpu_s) * 1e6 / self.steps

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "system": self.system,
            "shape": self.shape,
            "steps": self.steps,
            "steps_per_s": round(self.steps_per_s, 1),
            "redis_calls_per_step": round(self.redis_calls_per_step, 3),
            "redis_cpu_us_per_step": round(self.redis_cpu_us_per_step, 1),
            "duration_s": round(self.duration_s, 3),
            "server_commands_per_step": round(self.server_commands_per_step, 2),
        }
        if self.system == "airuntime":
            d["join_lag_ms"] = self.join_lag_ms
        if self.runs is not None:
            d["runs_steps_per_s"] = [round(x, 1) for x in self.runs]
        if self.sweep:
            d["sweep"] = True
        return d


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def ratio_row(a: Row, b: Row) -> dict[str, Any]:
    """``a``'s figures divided by ``b``'s (the same shape)."""
    return {
        "system": f"ratio {a.system}/{b.system}",
        "shape": a.shape,
        "steps": None,
        "steps_per_s": _ratio(a.steps_per_s, b.steps_per_s),
        "redis_calls_per_step": None,
        "redis_cpu_us_per_step": _ratio(a.redis_cpu_us_per_step, b.redis_cpu_us_per_step),
        "server_commands_per_step": _ratio(a.server_commands_per_step, b.server_commands_per_step),
    }


# --------------------------------------------------------------------------- processes


def _stop(proc: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def _reaped(procs: list[subprocess.Popen[Any]], *, on_error_only: bool = False) -> Iterator[None]:
    """Stop ``procs`` when the block ends (``on_error_only``: only if it raised)."""
    try:
        yield
    except BaseException:
        for p in procs:
            _stop(p)
        raise
    if not on_error_only:
        for p in procs:
            _stop(p)


def _outputs(what: str, procs: list[subprocess.Popen[str]]) -> list[str]:
    """Wait for the worker processes; their stdout (a failed one raises)."""
    with _reaped(procs):
        outputs = [p.communicate(timeout=RUN_TIMEOUT_S) for p in procs]
    for p, (stdout, stderr) in zip(procs, outputs, strict=True):
        if p.returncode != 0:
            raise RuntimeError(
                f"{what}: worker exited {p.returncode}: {stderr[-2000:]}{stdout[-500:]}"
            )
    return [stdout for stdout, _ in outputs]


def _last_json_line(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    raise ValueError(f"no JSON line in worker output: {text[-500:]!r}")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _median(rows: list[Row]) -> Row:
    rows = sorted(rows, key=lambda r: r.steps_per_s)
    median = rows[(len(rows) - 1) // 2]
    median.runs = [r.steps_per_s for r in rows]
    return median


# --------------------------------------------------------------------------- airuntime


@dataclass(frozen=True)
class LedgerWindow:
    first_claim_ms: int
    finalized_ms: int
    join_lag_ms: int | None
    status: str


def ledger_window(client: redis.Redis, execution_id: str) -> LedgerWindow:
    """First claim entry (``steps_claimed`` of a batch, ``step_claimed`` of one step),
    per-process first claims and ``execution_finalized``."""
    stream = keys.execution_keys(execution_id).events
    first_by_owner: dict[str, int] = {}
    start = "-"
    while len(first_by_owner) < WORKER_PROCESSES:
        page = entries(client.xrange(stream, min=start, count=5000))
        if not page:
            break
        for entry_id, f in page:
            if f.get("type") in CLAIM_TYPES:
                first_by_owner.setdefault(f.get("worker", ""), stream_ms(entry_id))
        start = "(" + page[-1][0]
    if not first_by_owner:
        raise RuntimeError(f"execution {execution_id}: no claim entry in the ledger")
    finalized: tuple[int, str] | None = None
    for entry_id, f in entries(client.xrevrange(stream, count=20)):
        if f.get("type") == "execution_finalized":
            finalized = (stream_ms(entry_id), f.get("status", ""))
            break
    if finalized is None:
        raise RuntimeError(f"execution {execution_id}: no execution_finalized entry in the ledger")
    firsts = sorted(first_by_owner.values())
    lag = firsts[-1] - firsts[0] if len(firsts) >= WORKER_PROCESSES else None
    return LedgerWindow(firsts[0], finalized[0], lag, finalized[1])


def drop_execution(client: redis.Redis, execution_id: str) -> None:
    client.delete(*keys.execution_keys(execution_id).all())
    client.zrem(keys.executions_index(), execution_id)
    client.zrem(keys.active_executions(), execution_id)


async def _create(url: str, plan: Plan) -> str:
    """A new execution of ``plan``, paused: the workers start it together (_release)."""
    client = connect(url)
    try:
        store = ExecutionStore(client)
        eid = await store.create(plan)
        await store.pause(eid, "benchmark")
        return eid
    finally:
        await client.aclose()


async def _resume(url: str, eid: str) -> None:
    client = connect(url)
    try:
        await ExecutionStore(client).resume(eid, "benchmark")
    finally:
        await client.aclose()


def _release(url: str, client: redis.Redis, eid: str) -> ServerSample:
    """Once every worker process has loaded the plan and listens on the control channel,
    resume the paused execution (its notice wakes them at once); the server sample
    taken just before. Process start-up and plan loading stay out of the figures."""
    channel = keys.control_channel()
    while int(dict(client.pubsub_numsub(channel)).get(channel.encode(), 0)) < WORKER_PROCESSES:
        time.sleep(0.005)
    before = ServerSample.take(client)
    asyncio.run(_resume(url, eid))
    return before


def run_airuntime(url: str, shape: str, slots: int, repeat: int) -> Row:
    """Run ``shape`` ``repeat`` times (a new execution each time); the median run."""
    plan = plan_of(deps_of(shape), shape)
    return _median([_run_once(url, shape, plan, slots) for _ in range(repeat)])


def _run_once(url: str, shape: str, plan: Plan, slots: int) -> Row:
    steps = len(plan.steps)
    eid = asyncio.run(_create(url, plan))
    # Rich prints the worker's JSON line; a wide "terminal" keeps it on one line.
    env = {**os.environ, ENV_VAR: url, "COLUMNS": "100000", "NO_COLOR": "1"}
    cmd = [sys.executable, "-m", "airuntime.cli", "worker", eid, "--workers", str(slots)]
    client = redis.Redis.from_url(url)
    try:
        procs = [
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for _ in range(WORKER_PROCESSES)
        ]
        with _reaped(procs, on_error_only=True):
            before = _release(url, client, eid)
        stdouts = _outputs(shape, procs)
        after = ServerSample.take(client)
        round_trips = sum(int(_last_json_line(out)["round_trips"]) for out in stdouts)
        window = ledger_window(client, eid)
        if window.status != "Succeeded":
            raise RuntimeError(f"{shape}: execution {eid} ended {window.status}")
        drop_execution(client, eid)
    finally:
        client.close()
    duration = max(window.finalized_ms - window.first_claim_ms, 1) / 1000
    return Row(
        "airuntime", shape, steps, duration, round_trips, (before, after), window.join_lag_ms
    )


# --------------------------------------------------------------------------- floor


def run_floor(url: str, shape: str, slots: int, repeat: int) -> Row:
    """The floor drain (:mod:`benchmarks.floor`) of ``shape``, ``repeat`` times; the median."""
    deps = deps_of(shape)
    return _median([_floor_once(url, shape, deps, slots) for _ in range(repeat)])


def _floor_once(url: str, shape: str, deps: dict[str, list[str]], slots: int) -> Row:
    client = redis.Redis.from_url(url)
    try:
        floor_id = floor.setup(client, deps)
        procs = floor.start_workers(url, floor_id, slots, WORKER_PROCESSES)
        with _reaped(procs, on_error_only=True):
            floor.release(client, floor_id, WORKER_PROCESSES)
            before = ServerSample.take(client)
        stdouts = _outputs(f"floor {shape}", procs)
        after = ServerSample.take(client)
        duration = floor.window_ms(client, floor_id) / 1000
        floor.drop(client, floor_id)
    finally:
        client.close()
    round_trips = sum(int(out.strip().splitlines()[-1]) for out in stdouts)
    return Row("floor", shape, len(deps), duration, round_trips, (before, after))


def celery_row(url: str, n: int) -> Row:
    duration, before, after = run_celery(url, n)
    return Row("celery", f"fanout-{n}", n + 2, duration, None, (before, after))


# --------------------------------------------------------------------------- main


def _print_tables(
    rows: list[Row], ratios: list[dict[str, Any]], targets: list[dict[str, Any]]
) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    table = Table(title="DAG throughput, no-op steps")
    for col in ("system", "shape", "steps", "steps/s", "duration s", "redis calls/step",
                "server cmds/step", "redis CPU us/step", "join lag ms"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("system", "shape") else "right")
    for r in rows:
        calls = f"{r.redis_calls_per_step:.3f}" + ("" if r.round_trips is not None else " (server)")
        table.add_row(
            r.system + (" (sweep)" if r.sweep else ""), r.shape, str(r.steps),
            f"{r.steps_per_s:,.0f}", f"{r.duration_s:.3f}", calls,
            f"{r.server_commands_per_step:.2f}", f"{r.redis_cpu_us_per_step:.1f}",
            "" if r.join_lag_ms is None else str(r.join_lag_ms),
        )  # fmt: skip
    console.print(table)
    rt = Table(title="Ratios (measured in this run)")
    for col in ("ratio", "shape", "steps/s", "redis CPU us/step", "server cmds/step"):
        rt.add_column(col)
    for ratio in ratios:
        figures = ("steps_per_s", "redis_cpu_us_per_step", "server_commands_per_step")
        rt.add_row(ratio["system"], ratio["shape"], *(str(ratio[f]) for f in figures))
    console.print(rt)
    tt = Table(title="Targets")
    for col in ("target", "shape", "value", "threshold", "met", "quick gate"):
        tt.add_column(col)
    for t in targets:
        gate = "" if t["gate"] is None else f"{t['gate']:,.3f}"
        tt.add_row(t["target"], t["shape"], f"{t['value']:,.3f}", f"{t['threshold']:,.3f}",
                   "[green]yes[/green]" if t["met"] else "[red]NO[/red]", gate)  # fmt: skip
    console.print(tt)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.dag_throughput", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--json", action="store_true", help="print one JSON list instead of tables")
    parser.add_argument("--redis-url", help="use this Redis/Valkey (default: an embedded Valkey)")
    parser.add_argument("--workers", type=int, default=DEFAULT_SLOTS, help="slots per process")
    parser.add_argument("--shapes", nargs="+", help="shapes (fanout-<n>, chain-<n>, random-<n>)")
    parser.add_argument("--sweep", nargs="*", help="sizes of the fan-out size sweep (shapes)")
    parser.add_argument("--repeat", type=int, help="runs per shape (default 3; quick: 1)")
    parser.add_argument("--no-celery", action="store_true", help="skip the Celery peer")
    parser.add_argument(
        "--quick", action="store_true",
        help="CI regression guard (< 1 min): fewer, smaller runs; exit 1 if a ratio "
        "(vs the floor, vs Celery) falls below half its target",
    )  # fmt: skip
    return parser


def measure(args: argparse.Namespace, url: str) -> list[Row]:
    shapes = args.shapes or (QUICK_SHAPES if args.quick else SHAPES)
    sweep = args.sweep if args.sweep is not None else (QUICK_SWEEP if args.quick else SWEEP)
    repeat = max(1, args.repeat or (1 if args.quick else DEFAULT_REPEAT))
    rows: list[Row] = []
    for shape in [*shapes, *(s for s in sweep if s not in shapes)]:
        is_sweep = shape in sweep
        log(f"airuntime {shape} ...")
        rows.append(run_airuntime(url, shape, args.workers, repeat))
        log(f"floor {shape} ...")
        rows.append(run_floor(url, shape, args.workers, repeat))
        rows[-1].sweep = rows[-2].sweep = is_sweep
    if not args.no_celery:
        n = QUICK_CELERY_FANOUT if args.quick else CELERY_FANOUT
        log(f"celery fanout-{n} ...")
        rows.append(celery_row(url, n))
    return rows


def ratios_of(rows: list[Row]) -> list[dict[str, Any]]:
    air = {r.shape: r for r in rows if r.system == "airuntime"}
    out = [ratio_row(air[r.shape], r) for r in rows if r.system == "floor" and r.shape in air]
    for cel in (r for r in rows if r.system == "celery"):
        # The same fan-out, or (quick mode's smaller chord) airuntime's fanout-2000.
        peer = air.get(cel.shape) or air.get(f"fanout-{CELERY_FANOUT}")
        if peer is not None:
            row = ratio_row(peer, cel)
            if peer.shape != cel.shape:
                row["shape"] = f"{peer.shape} vs celery {cel.shape}"
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--cluster" in argv:  # 1 vs 3 shards, Redis CPU per shard: benchmarks.cluster_split
        from benchmarks import cluster_split

        return cluster_split.main(argv)
    args = _parser().parse_args(argv)
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        url: str = args.redis_url or stack.enter_context(default_embedded_server()).url
        rows = measure(args, url)
    ratios = ratios_of(rows)
    targets = target_rows(ratios, [r.as_dict() for r in rows])
    if args.json:
        print(json.dumps([r.as_dict() for r in rows] + ratios + targets, indent=2))
    else:
        _print_tables(rows, ratios, targets)
    log(f"wall time {time.perf_counter() - started:.1f} s")
    failed = gate_failures(targets)
    if args.quick and failed:
        for t in failed:
            log(f"REGRESSION: {t['target']} on {t['shape']}: {t['value']} < gate {t['gate']}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
