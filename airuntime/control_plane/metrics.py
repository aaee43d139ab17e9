"""Prometheus metrics of the control plane.

Counters and histograms are fed as things happen: the dispatcher's observer
(admission decisions, dispatch latency, pump cycles, reservations), the supervisor's
error hook (``airuntime_loop_errors_total{loop}``: a background loop failed and is
being restarted) and the scale-out watcher's failure hook
(``airuntime_scale_out_failures_total``). Gauges that live in Redis (queue depth, runs
waiting for dispatch and the oldest one's age per tenant, the Ready instances each
tenant may use, scale-out requests by phase, suspect instances) and the loops' health
are refreshed right before each scrape by :meth:`ControlPlaneMetrics.refresh`. The
chart's dashboard and alerting rules (``helm/airuntime``) query these names;
``tests/observability`` evaluates them on a real Prometheus.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from airuntime.control_plane.dispatch import DispatchResult
from airuntime.control_plane.scale_out import ScaleOutPhase, ScaleOutRequest
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.shared_queue import QueueItemStatus
from airuntime.core import keys
from airuntime.fleet.registry import InstanceDescriptor, InstanceStatus

_WAITING = frozenset(
    {QueueItemStatus.PENDING, QueueItemStatus.CLAIMED, QueueItemStatus.SCALE_OUT_REQUESTED}
)
"""Queue-item statuses of a run not dispatched yet (and not ended)."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class ControlPlaneMetrics:
    """The metrics of one control plane; building it wires its hooks."""

    def __init__(self, control_plane: ControlPlane) -> None:
        self.control_plane = cp = control_plane
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._archive_metrics(r)
        self._tenant_metrics(r)
        self.queue_depth = Gauge(
            "airuntime_shared_queue_depth", "Pending shared-queue items.", ["tenant"], registry=r
        )
        self.dispatch_latency = Histogram(
            "airuntime_dispatch_latency_seconds",
            "Submit-to-dispatch time of dispatched runs.",
            buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120, 600),
            registry=r,
        )
        self.decisions = Counter(
            "airuntime_admission_decisions_total",
            "Admission decisions.",
            ["decision", "tenant"],
            registry=r,
        )
        self.reservations = Counter(
            "airuntime_admission_reservations_total",
            "Run-slot reservations taken for dispatch.",
            registry=r,
        )
        self.dispatch_failures = Counter(
            "airuntime_dispatch_failures_total",
            "Dispatch attempts that did not dispatch.",
            ["reason"],
            registry=r,
        )
        self.pump_cycles = Counter(
            "airuntime_pump_cycles_total", "Dispatch cycles run by pumps.", registry=r
        )
        self.scale_out_requests = Gauge(
            "airuntime_scale_out_requests", "Scale-out requests by phase.", ["phase"], registry=r
        )
        self.scale_out_failures = Counter(
            "airuntime_scale_out_failures_total",
            "Scale-out attempts the provider refused or failed (each backs the prefix off).",
            ["tenant", "prefix"],
            registry=r,
        )
        self.loop_errors = Counter(
            "airuntime_loop_errors_total",
            "Failures of a background loop (each one restarts it with backoff).",
            ["loop"],
            registry=r,
        )
        self.loop_healthy = Gauge(
            "airuntime_loop_healthy", "1 while a background loop works.", ["loop"], registry=r
        )
        self.suspect_instances = Gauge(
            "airuntime_suspect_instances",
            "Registered runtime instances admission skips because they could not be reached.",
            registry=r,
        )
        self._wire(cp)

    def _wire(self, cp: ControlPlane) -> None:
        previous_observer = cp.dispatcher.observer
        if previous_observer is None:
            cp.dispatcher.observer = self.observe
        else:

            def both(result: DispatchResult) -> None:
                previous_observer(result)
                self.observe(result)

            cp.dispatcher.observer = both
        cp.supervisor.on_error = lambda loop, _exc: self.loop_errors.labels(loop).inc()
        if cp.watcher is not None:
            cp.watcher.on_failure = self.scale_out_failed

    def observe(self, result: DispatchResult) -> None:
        if result.empty:
            return
        self.pump_cycles.inc()
        if result.decision is not None:
            self.decisions.labels(result.decision.value, result.tenant_id or "").inc()
        if result.success:
            self.reservations.inc()
            self.dispatch_latency.observe(result.latency_s)
        else:
            self.dispatch_failures.labels(
                result.decision.value if result.decision else "error"
            ).inc()

    def scale_out_failed(self, request: ScaleOutRequest, error: str) -> None:
        self.scale_out_failures.labels(request.tenant_id, request.runtime_prefix).inc()

    async def refresh(self) -> None:
        cp = self.control_plane
        await self._refresh_archive()
        for name, health in cp.supervisor.loops.items():
            self.loop_errors.labels(name)  # every loop has a series, 0 until it fails
            self.loop_healthy.labels(name).set(1 if health.healthy else 0)
        self.queue_depth.clear()
        for tenant, n in (await cp.queue.pending_by_tenant()).items():
            self.queue_depth.labels(tenant).set(n)
        waiting = await self._refresh_waiting()
        counts = {p: 0 for p in ScaleOutPhase}
        for req in await cp.scale_outs.list():
            counts[req.phase] += 1
        for phase, n in counts.items():
            self.scale_out_requests.labels(phase.value).set(n)
        descriptors = await cp.registry.list_all()
        suspect, _ = await cp.suspects.state([d.instance_id for d in descriptors])
        self.suspect_instances.set(len(suspect))
        await self._refresh_ready_instances(descriptors, waiting)

    async def _refresh_waiting(self) -> set[str]:
        """Runs waiting for dispatch per tenant; returns their tenants.

        Read from the open-runs index (score: creation time) and each run's queue item
        (status, tenant), not from the queue alone: a run whose scale-out is in flight
        has left the queue (ScaleOutRequested) but still waits. Small fields only, one
        pipelined round trip, whatever the pipelines' size.
        """
        redis = self.control_plane.redis
        raw: Any = await redis.zrange(keys.shared_runs_open(), 0, -1, withscores=True)
        listed: list[tuple[Any, float]] = list(raw)
        owners: list[Any] = []
        if listed:
            owners = await redis.hmget(keys.shared_runs_open_tenants(), [i for i, _ in listed])
        open_runs = [
            (_text(srid), created, _text(t))
            for (srid, created), t in zip(listed, owners, strict=True)
            if t is not None
        ]
        pipe = redis.pipeline(transaction=False)
        for srid, _, tenant in open_runs:
            pipe.hmget(keys.squeue_item(tenant, srid), "status", "tenant_id")
        items = await pipe.execute() if open_runs else []
        now_ms = time.time() * 1000
        count: dict[str, int] = {}
        oldest: dict[str, float] = {}
        for (_, created_ms, _), (status, tenant_raw) in zip(open_runs, items, strict=True):
            if status is None or _text(status) not in _WAITING or tenant_raw is None:
                continue
            tenant = _text(tenant_raw)
            count[tenant] = count.get(tenant, 0) + 1
            oldest[tenant] = max(oldest.get(tenant, 0.0), (now_ms - created_ms) / 1000)
        self.waiting.clear()
        self.waiting_age.clear()
        for tenant, n in count.items():
            self.waiting.labels(tenant).set(n)
            self.waiting_age.labels(tenant).set(max(0.0, oldest[tenant]))
        return set(count)

    async def _refresh_ready_instances(
        self, descriptors: list[InstanceDescriptor], queued_tenants: set[str]
    ) -> None:
        """Per tenant, the Ready instances admission could choose from (the same
        visibility rules), so "queued runs and nothing to run them on" is one query."""
        registry = self.control_plane.registry
        ready = [d for d in descriptors if d.status is InstanceStatus.READY]
        self.ready_instances.clear()
        for tenant_id in sorted(set(await registry.tenant_ids()) | queued_tenants):
            tenant = await registry.tenant(tenant_id)
            self.ready_instances.labels(tenant_id).set(sum(d.visible_to(tenant) for d in ready))

    def _tenant_metrics(self, r: CollectorRegistry) -> None:
        self.waiting = Gauge(
            "airuntime_runs_waiting",
            "Shared runs submitted and not dispatched yet (QueuedGlobally or ScaleOutRequested).",
            ["tenant"],
            registry=r,
        )
        self.waiting_age = Gauge(
            "airuntime_runs_waiting_oldest_age_seconds",
            "Time since submission of the tenant's oldest run waiting for dispatch.",
            ["tenant"],
            registry=r,
        )
        self.ready_instances = Gauge(
            "airuntime_tenant_ready_instances",
            "Ready runtime instances the tenant may use (configured tenants and tenants "
            "with queued runs).",
            ["tenant"],
            registry=r,
        )

    def _archive_metrics(self, r: CollectorRegistry) -> None:
        self.archive_backlog = Gauge(
            "airuntime_archive_backlog",
            "Finished executions and shared runs not yet in the durable history.",
            ["kind"],
            registry=r,
        )
        self.archive_errors = Counter(
            "airuntime_archive_errors_total",
            "Archive passes that failed (the history unavailable, ...).",
            ["kind"],
            registry=r,
        )
        self._archive_errors_seen = {"execution": 0, "shared_run": 0}

    async def _refresh_archive(self) -> None:
        cp = self.control_plane
        if cp.archiver is None or cp.run_archiver is None:
            return
        for kind, backlog, errors in (
            ("execution", await cp.archiver.backlog(), cp.archiver.stats.errors),
            ("shared_run", await cp.run_archiver.backlog(), cp.run_archiver.stats.errors),
        ):
            self.archive_backlog.labels(kind).set(backlog)
            self.archive_errors.labels(kind).inc(errors - self._archive_errors_seen[kind])
            self._archive_errors_seen[kind] = errors
