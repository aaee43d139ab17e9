"""Prometheus metrics of a runtime host (all its instances), served on ``/metrics``.

Gauges are refreshed from each instance's live state at scrape time (a custom
collector), so they are never stale; counters and histograms are fed by the
instance hooks (step outcomes, slot waits, run state changes).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from runtime_pod.instance import RuntimeInstance


class RuntimeMetrics:
    """One registry per host process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.steps = Counter(
            "airuntime_steps_total",
            "Step attempts by outcome.",
            ["instance", "outcome"],
            registry=self.registry,
        )
        self.step_seconds = Histogram(
            "airuntime_step_duration_seconds",
            "Duration of step attempts.",
            ["instance"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120),
            registry=self.registry,
        )
        self.slot_wait_seconds = Histogram(
            "airuntime_step_slot_wait_seconds",
            "Time a step handler waited for a step slot.",
            ["instance"],
            buckets=(0.0001, 0.001, 0.01, 0.1, 1, 10, 60),
            registry=self.registry,
        )
        self.run_transitions = Counter(
            "airuntime_run_transitions_total",
            "Runs entering a state.",
            ["instance", "state"],
            registry=self.registry,
        )
        self._instances: list[RuntimeInstance] = []
        self.registry.register(_InstanceCollector(self._instances))

    def track(self, instance: RuntimeInstance) -> None:
        self._instances.append(instance)


class _InstanceCollector(Collector):
    def __init__(self, instances: list[RuntimeInstance]) -> None:
        self.instances = instances

    def collect(self) -> Iterable[Metric]:
        return list(self._collect())

    def _collect(self) -> Iterator[Metric]:
        labels = ["instance"]
        workers_active = GaugeMetricFamily(
            "airuntime_workers_active", "Workers in use.", labels=labels
        )
        workers_available = GaugeMetricFamily(
            "airuntime_workers_available", "Workers free for new executions.", labels=labels
        )
        runs_running = GaugeMetricFamily(
            "airuntime_runs_running", "Runs executing here.", labels=labels
        )
        slots_active = GaugeMetricFamily(
            "airuntime_step_slots_active", "Step handlers holding a slot.", labels=labels
        )
        slots_queued = GaugeMetricFamily(
            "airuntime_step_slots_queued", "Step handlers waiting for a slot.", labels=labels
        )
        claims = GaugeMetricFamily(
            "airuntime_claims", "Steps claimed by this instance's pool.", labels=labels
        )
        conflicts = GaugeMetricFamily(
            "airuntime_claim_conflicts",
            "Claims lost to another worker or stale completions.",
            labels=labels,
        )
        recoveries = GaugeMetricFamily(
            "airuntime_lease_recoveries",
            "Expired step leases this instance returned to Ready.",
            labels=labels,
        )
        queue = GaugeMetricFamily(
            "airuntime_queue_depth",
            "Runs accepted and not started (at the last heartbeat).",
            labels=labels,
        )
        for inst in self.instances:
            i = [inst.instance_id]
            if inst.last_capacity is not None:
                queue.add_metric(i, inst.last_capacity.queued_run_count)
            workers_active.add_metric(i, inst.active_workers)
            workers_available.add_metric(i, inst.available_workers)
            runs_running.add_metric(i, inst.running_runs)
            slots_active.add_metric(i, inst.slots.active)
            slots_queued.add_metric(i, inst.slots.queued)
            stats = inst.pool.stats
            claims.add_metric(i, stats.claimed)
            conflicts.add_metric(i, stats.claim_conflicts + stats.stale_rejections)
            recoveries.add_metric(i, stats.recovered)
        yield from (
            queue,
            workers_active,
            workers_available,
            runs_running,
            slots_active,
            slots_queued,
            claims,
            conflicts,
            recoveries,
        )
