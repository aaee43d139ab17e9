"""Prometheus metrics of the control plane.

Counters and histograms are fed by the dispatcher's observer (admission decisions,
dispatch latency, pump cycles, reservations); gauges that live in Redis (queue depth
per tenant, scale-out requests by state, instances) are refreshed right before each
scrape by :meth:`ControlPlaneMetrics.refresh`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from airuntime.control_plane.dispatch import DispatchResult
from airuntime.control_plane.scale_out import ScaleOutPhase, ScaleOutStore
from airuntime.control_plane.shared_queue import SharedQueue


class ControlPlaneMetrics:
    def __init__(self, queue: SharedQueue, scale_outs: ScaleOutStore) -> None:
        self.queue = queue
        self.scale_outs = scale_outs
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
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

    async def refresh(self) -> None:
        self.queue_depth.clear()
        for tenant, n in (await self.queue.pending_by_tenant()).items():
            self.queue_depth.labels(tenant).set(n)
        counts = {p: 0 for p in ScaleOutPhase}
        for req in await self.scale_outs.list():
            counts[req.phase] += 1
        for phase, n in counts.items():
            self.scale_out_requests.labels(phase.value).set(n)
