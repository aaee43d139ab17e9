"""Queue-first dispatch over a pooled HTTP runtime host (reference 000_*, heavy scenario).

50 shared runs of 100 steps each, one ``RuntimeHost`` with 3 child instances behind
one HTTP server (``runtime-http-1..3``), the ``http`` provider, the Redis shared
queue / shared run store / admission reservations. Expected evidence: every run gets
an assigned child runtime identity (never the host's), no run is delivered twice,
reservations are written for every dispatch, and no instance ever runs more than
its ``max_concurrent_runs``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from redis.asyncio import Redis

from airuntime.control_plane.admission import Reservation
from airuntime.control_plane.service import ControlPlane
from airuntime.core import keys
from airuntime.fleet.registry import InstanceDescriptor
from runtime_pod.config import InstanceConfig
from runtime_pod.host import RuntimeHost
from tests.control_plane.support import (
    drain_until_finished,
    fan_pipeline,
    manual_cp,
    running_cp,
    running_host,
    snap,
)

RUNS = 50
STEPS = 100
MAX_RUNS = 4


def max_overlap(intervals: list[tuple[int, int]]) -> int:
    """Most intervals open at once (an end at t closes before a start at t opens)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


RUNTIME_TOKEN = "runtime-token-for-tests"


async def test_pooled_http_runtimes_take_fifty_hundred_step_runs_once_each_with_reservations(
    valkey: Redis,
) -> None:
    # Workers cover every run slot and idle workers do not assist other instances'
    # executions: RuntimeInstance's controller can otherwise launch a run with 0
    # workers when an assist took the last free worker between its capacity check and
    # the launch (pool.run raises ValueError and the run stays "running"; reported).
    config = InstanceConfig(
        provider="http",
        runtime_prefix="runtime-http",
        workers=4 * MAX_RUNS,
        max_local_workers_per_execution=4,
        max_concurrent_runs=MAX_RUNS,
        queue_capacity=100,
        heartbeat_s=0.5,
        assist=False,
    )
    host = RuntimeHost(valkey, config, instances=3, http_port=0, token=RUNTIME_TOKEN)
    # The default tenant's runtime prefix is runtime-instance, not runtime-http: with
    # scale-out enabled (and no scale-out provider here) admission would park runs in
    # ScaleOutRequested once the pool is full instead of leaving them queued.
    cp = manual_cp(valkey, scale_out_enabled=False, runtime_token=RUNTIME_TOKEN)

    reservations = _record_reservations(cp, valkey)
    accepted: Counter[str] = Counter()

    async with running_host(host), running_cp(cp):
        children = {i.instance_id for i in host.instances}
        assert children == {"runtime-http-1", "runtime-http-2", "runtime-http-3"}
        assert host.endpoint.startswith("http://127.0.0.1:")
        for inst in host.instances:  # count what reaches each child's local queue
            real_accept = inst.accept

            async def counting(body: Any, _real: Any = real_accept) -> str:
                accepted[body["shared_run_id"]] += 1
                return str(await _real(body))

            inst.accept = counting  # type: ignore[method-assign,assignment]

        pipeline = fan_pipeline(STEPS, "heavy")
        runs = [await cp.submit(pipeline, snap()) for _ in range(RUNS)]
        bodies = await drain_until_finished(
            cp, {r.shared_run_id: "default" for r in runs}, timeout_s=90
        )

    # Every run: an assigned child runtime identity, completed, all 100 steps.
    assigned = Counter(b["assigned_instance_id"] for b in bodies.values())
    assert set(assigned) == children  # distributed over the pool (not necessarily evenly)
    assert sum(assigned.values()) == RUNS
    for b in bodies.values():
        assert b["run"]["instance_id"] == b["assigned_instance_id"]
        assert b["run"]["status"] == "completed"
        assert b["execution"]["total"] == STEPS and b["execution"]["completed"] == STEPS
    # No duplicate dispatch: one delivery and one RunId per SharedRunId.
    assert sorted(accepted) == sorted(r.shared_run_id for r in runs)
    assert set(accepted.values()) == {1}
    assert len({b["run_id"] for b in bodies.values()}) == RUNS
    assert await valkey.zcard(keys.RunBucket(0).by_tenant("default")) == RUNS
    # The Redis admission reservation store was used for every dispatch.
    assert len(reservations) >= RUNS
    assert all(written for _, written in reservations)
    assert {r.instance_id for r, _ in reservations} <= children
    # No child ever ran more than max_concurrent_runs at once.
    for instance_id, peak in _peak_runs_at_once(bodies).items():
        assert peak <= MAX_RUNS, instance_id


def _record_reservations(cp: ControlPlane, redis: Redis) -> list[tuple[Reservation, bool]]:
    """Every reservation admission takes, and whether Redis held it right then."""
    reservations: list[tuple[Reservation, bool]] = []
    real_reserve = cp.admission._reserve

    async def reserve(d: InstanceDescriptor, slots: int) -> Reservation | None:
        got = await real_reserve(d, slots)
        if got is not None:
            written = await redis.zscore(keys.reservations(d.instance_id), got.reservation_id)
            reservations.append((got, written is not None))
        return got

    cp.admission._reserve = reserve  # type: ignore[method-assign]
    return reservations


def _peak_runs_at_once(bodies: dict[str, dict[str, Any]]) -> dict[str, int]:
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for b in bodies.values():
        run = b["run"]
        spans[run["instance_id"]].append((run["started_at_ms"], run["finished_at_ms"]))
    return {instance_id: max_overlap(intervals) for instance_id, intervals in spans.items()}
