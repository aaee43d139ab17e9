"""Prometheus metrics of a runtime host (all its instances), served on ``/metrics``.

Gauges are refreshed from each instance's live state at scrape time (a custom
collector), so they are never stale; counters and histograms are fed by the
instance hooks (step outcomes, slot waits, run state changes, loop failures); the model
calls' counters are read from the process's totals at scrape time too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from airuntime.engine.handlers.model_usage import totals

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
        self.loop_errors = Counter(
            "airuntime_loop_errors_total",
            "Failures of an instance's background loops (each restarted with backoff), and "
            "Redis failures its participations waited out (loop=participation).",
            ["instance", "loop"],
            registry=self.registry,
        )
        self._instances: list[RuntimeInstance] = []
        self.registry.register(_InstanceCollector(self._instances))
        self.registry.register(_ModelUsageCollector())

    def track(self, instance: RuntimeInstance) -> None:
        self._instances.append(instance)


class _InstanceCollector(Collector):
    def __init__(self, instances: list[RuntimeInstance]) -> None:
        self.instances = instances

    def collect(self) -> Iterable[Metric]:
        return list(self._collect())

    def _collect(self) -> Iterator[Metric]:
        for name, documentation, value in _GAUGES:
            family = GaugeMetricFamily(name, documentation, labels=["instance"])
            for inst in self.instances:
                current = value(inst)
                if current is not None:
                    family.add_metric([inst.instance_id], current)
            yield family


class _ModelUsageCollector(Collector):
    """The process's model calls and tokens (:mod:`airuntime.engine.handlers.model_usage`),
    by tenant, provider and model (as the provider reported it; ``-`` for failed calls)."""

    def collect(self) -> Iterable[Metric]:
        usage = totals()
        families = (
            (
                "airuntime_model_calls_total",
                "Model calls of model steps by outcome (ok, retried: retryable failure, failed, "
                "refused: over the tenant's token budget).",
                "outcome",
                usage.calls,
            ),
            (
                "airuntime_model_tokens_total",
                "Tokens of model calls as the provider counted them (direction: input, output).",
                "direction",
                usage.tokens,
            ),
        )
        for name, documentation, last_label, counts in families:
            family = CounterMetricFamily(
                name, documentation, labels=["tenant", "provider", "model", last_label]
            )
            for labels, count in sorted(counts.items()):
                family.add_metric(list(labels), count)
            yield family


def _queued(inst: RuntimeInstance) -> float | None:
    return None if inst.last_capacity is None else inst.last_capacity.queued_run_count


_GAUGES: tuple[tuple[str, str, Callable[[RuntimeInstance], float | None]], ...] = (
    ("airuntime_queue_depth", "Runs accepted and not started (at the last heartbeat).", _queued),
    ("airuntime_workers_active", "Workers in use.", lambda i: i.active_workers),
    (
        "airuntime_workers_available",
        "Workers free for new executions.",
        lambda i: i.available_workers,
    ),
    ("airuntime_runs_running", "Runs executing here.", lambda i: i.running_runs),
    ("airuntime_step_slots_active", "Step handlers holding a slot.", lambda i: i.slots.active),
    ("airuntime_step_slots_queued", "Step handlers waiting for a slot.", lambda i: i.slots.queued),
    ("airuntime_claims", "Steps claimed by this instance's pool.", lambda i: i.pool.stats.claimed),
    (
        "airuntime_claim_conflicts",
        "Claims lost to another worker, and completions refused as stale or as late (the "
        "execution had ended).",
        lambda i: (
            i.pool.stats.claim_conflicts + i.pool.stats.stale_rejections + i.pool.stats.late_reports
        ),
    ),
    (
        "airuntime_lease_recoveries",
        "Expired step leases this instance returned to Ready.",
        lambda i: i.pool.stats.recovered,
    ),
)
"""Gauges read from each instance at scrape time: name, help, value (None: not yet known)."""
