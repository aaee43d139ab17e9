"""The DAG engine: pipelines, their compiled plans, and the workers that run them.

Usable on its own (``airt run``) with no control plane: a pipeline is validated and
compiled (:mod:`~airuntime.engine.pipeline`), written to Redis as an execution
(:mod:`~airuntime.engine.execution_store`, whose state changes only through the Lua
scripts) and advanced by any number of worker pools in any number of processes
(:mod:`~airuntime.engine.worker_pool`), under concurrency leases
(:mod:`~airuntime.engine.concurrency`) and deterministic retry
(:mod:`~airuntime.engine.retry`). The states an execution and its steps go through, and
the changes allowed between them, are named in :mod:`~airuntime.engine.status`.

Layer: above :mod:`airuntime.core`; knows nothing of tenants' fleets or the control plane.
"""
