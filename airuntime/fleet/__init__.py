"""What runtime instances and the control plane share about the fleet of runtimes.

Tenant settings and the visibility rules (:mod:`~airuntime.fleet.tenancy`), the instance
registry with capacity descriptors (:mod:`~airuntime.fleet.registry`), run requests and
the tenant-aware run index (:mod:`~airuntime.fleet.runs`, :mod:`~airuntime.fleet.run_index`),
the outcome a finished run leaves for the control plane (:mod:`~airuntime.fleet.outcomes`),
the providers that deliver a run to an instance (:mod:`~airuntime.fleet.providers`, with
:mod:`~airuntime.fleet.blocking` for blocking Redis reads), the runtime's settings
(:mod:`~airuntime.fleet.instance_settings`), and control-plane discovery
(:mod:`~airuntime.fleet.discovery`).

Layer: above :mod:`airuntime.engine`.
"""
