"""Recovery times: from a fault to runs flowing again, per kind of fault.

Run ``python -m benchmarks.recovery [--json] [--rate R] [--after S]`` from the
repository root (the runtimes import the chaos test's handler module, ``tests.chaos``).
It takes about two minutes on a 2-core machine.

Set-up (real processes, as in ``tests/chaos``): a Valkey with an append-only file
(``appendfsync always``) on a fixed port, ``airt control-plane`` (background pump) and
three ``airt runtime`` processes (``http`` provider, heartbeat 0.5 s so the registry
entry expires after 1.5 s, step lease 2 s). Runs are the chaos DAG (five ``python``
steps root -> a, b, c -> sink recording an effect in SQLite, 0.02-0.1 s each),
submitted through the API at ``--rate`` runs/s from 2 s before the fault until
``--after`` s after it. Each scenario starts a fresh system.

Scenarios
---------
* ``runtime-kill``: ``kill -9`` of a runtime, a new one started at once (same prefix).
* ``runtime-freeze``: SIGSTOP of a runtime for its heartbeat TTL + 1 s, then SIGCONT.
* ``control-plane-kill``: ``kill -9`` of the control plane, restarted at once.
* ``valkey-restart``: Valkey killed (SIGKILL) and started again on its port from its
  append-only file.
* ``runtime-unreachable``: a runtime frozen for 8 s while it stays registered (heartbeat
  5 s, TTL 15 s): deliveries to it time out (2 s), it is marked suspect, admission skips it.

What is measured (from the moment the fault begins)
-------------------------------------------------
* ``flowing_s``: until the first run submitted after the fault is Succeeded (new work
  completes again);
* ``affected_s``: until every run that was in flight when the fault began is terminal
  (the runs the fault hit have recovered);
* ``runs``/``succeeded``: every run submitted in the scenario, and how many Succeeded
  (all of them, or the benchmark says so).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from airuntime.control_plane.shared_runs import SharedRunStatus, SharedRunStore
from tests.chaos.cluster import Cluster, ClusterConfig, pipeline, retrying

Fault = Callable[[Cluster], Awaitable[None]]


@dataclass
class Figures:
    scenario: str
    flowing_s: float
    affected_s: float
    in_flight: int
    runs: int
    succeeded: int


async def _runtime_kill(c: Cluster) -> None:
    await c.kill_runtime("chaos-1")
    await c.start_runtime()


async def _runtime_freeze(c: Cluster) -> None:
    c.freeze("chaos-1")
    await asyncio.sleep(c.config.heartbeat_ttl_s + 1.0)
    c.thaw("chaos-1")


async def _control_plane_kill(c: Cluster) -> None:
    await c.kill_control_plane()
    await c.start_control_plane()


async def _valkey_restart(c: Cluster) -> None:
    c.stop_valkey(kill=True)
    await c.start_valkey()


async def _runtime_unreachable(c: Cluster) -> None:
    c.freeze("chaos-1")
    await asyncio.sleep(8.0)
    c.thaw("chaos-1")


SCENARIOS: dict[str, tuple[Fault, ClusterConfig]] = {
    "runtime-kill": (_runtime_kill, ClusterConfig()),
    "runtime-freeze": (_runtime_freeze, ClusterConfig()),
    "control-plane-kill": (_control_plane_kill, ClusterConfig()),
    "valkey-restart": (_valkey_restart, ClusterConfig()),
    "runtime-unreachable": (_runtime_unreachable, ClusterConfig(heartbeat_s=5.0)),
}


class Tracker:
    """Submits runs at a steady rate and notes when each is seen terminal."""

    def __init__(self, cluster: Cluster, rate: float) -> None:
        self.cluster = cluster
        self.gap_s = 1.0 / rate
        self.submitted: dict[str, float] = {}
        self.ended: dict[str, tuple[float, SharedRunStatus]] = {}
        self.doc = pipeline(cluster.db, sleeps=(0.02, 0.05, 0.1))

    async def submit_until(self, stop: asyncio.Event) -> None:
        n = 0
        while not stop.is_set():
            srid = await self.cluster.submit(n, self.doc)
            self.submitted[srid] = time.monotonic()
            n += 1
            await asyncio.sleep(self.gap_s)

    async def poll(self) -> None:
        store = SharedRunStore(self.cluster.redis)
        while True:
            open_ids = [s for s in self.submitted if s not in self.ended]
            runs = await retrying(lambda ids=open_ids: store.get_many(ids)) if open_ids else []
            now = time.monotonic()
            for run in runs or []:
                if run.status.terminal:
                    self.ended[run.shared_run_id] = (now, run.status)
            await asyncio.sleep(0.05)


async def scenario(name: str, rate: float, after_s: float, root: Path) -> Figures:
    fault, config = SCENARIOS[name]
    cluster = Cluster(root / name, config)
    await cluster.start()
    tracker = Tracker(cluster, rate)
    stop = asyncio.Event()
    submitting = asyncio.create_task(tracker.submit_until(stop))
    polling = asyncio.create_task(tracker.poll())
    try:
        await asyncio.sleep(2.0)
        t0 = time.monotonic()
        in_flight = [s for s in tracker.submitted if s not in tracker.ended]
        await fault(cluster)
        await asyncio.sleep(after_s)
        stop.set()
        await submitting
        deadline = time.monotonic() + 180
        # the tracker polls Redis; this waits on its notes, with a deadline
        while len(tracker.ended) < len(tracker.submitted) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    finally:
        polling.cancel()
        await cluster.stop()
    return _figures(name, tracker, t0, in_flight)


def _figures(name: str, tracker: Tracker, t0: float, in_flight: list[str]) -> Figures:
    nan = float("nan")
    later = [
        tracker.ended[s][0] - t0
        for s, at in tracker.submitted.items()
        if at >= t0 and s in tracker.ended and tracker.ended[s][1] is SharedRunStatus.SUCCEEDED
    ]
    hit = [tracker.ended[s][0] - t0 if s in tracker.ended else nan for s in in_flight]
    ok = sum(1 for _, status in tracker.ended.values() if status is SharedRunStatus.SUCCEEDED)
    return Figures(
        scenario=name,
        flowing_s=round(min(later), 2) if later else nan,
        affected_s=round(max(hit), 2) if hit else 0.0,
        in_flight=len(in_flight),
        runs=len(tracker.submitted),
        succeeded=ok,
    )


async def main(args: argparse.Namespace) -> list[Figures]:
    out: list[Figures] = []
    with tempfile.TemporaryDirectory(prefix="airt-recovery-") as tmp:
        for name in args.scenario or list(SCENARIOS):
            figures = await scenario(name, args.rate, args.after, Path(tmp))
            out.append(figures)
            if not args.json:
                print(
                    f"{name:20s} flowing {figures.flowing_s:6.2f} s  affected "
                    f"{figures.affected_s:6.2f} s  ({figures.in_flight} in flight; "
                    f"{figures.succeeded}/{figures.runs} Succeeded)",
                    flush=True,
                )
    return out


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--rate", type=float, default=10.0, help="runs submitted per second")
    parser.add_argument("--after", type=float, default=6.0, help="seconds of submissions after")
    parser.add_argument("--scenario", action="append", choices=list(SCENARIOS))
    args = parser.parse_args()
    figures = asyncio.run(main(args))
    if args.json:
        json.dump([asdict(f) for f in figures], sys.stdout, indent=2)
        print()
    if any(f.succeeded != f.runs for f in figures):
        sys.exit(1)


if __name__ == "__main__":
    cli()
