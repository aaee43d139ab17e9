"""The DAG engine: pipelines, their compiled plans, and the workers that run them.

Usable on its own (``airt run``) with no control plane: a pipeline is validated and
compiled (:mod:`~airuntime.engine.pipeline`), written to Redis as an execution
(:mod:`~airuntime.engine.execution_store`, whose state changes only through the Lua
scripts) and advanced by any number of worker pools in any number of processes
(:mod:`~airuntime.engine.worker_pool`; one pool's part in one execution is a
:mod:`~airuntime.engine.participation` of :mod:`~airuntime.engine.step_run` attempts, told
of pause, resume and cancel by its :mod:`~airuntime.engine.control_feed`), under
concurrency leases
(:mod:`~airuntime.engine.concurrency`) and deterministic retry
(:mod:`~airuntime.engine.retry`). The states an execution and its steps go through, and
the changes allowed between them, are named in :mod:`~airuntime.engine.status`. What
tenant pipelines may reach through the built-in ``python`` and ``http`` handlers is
bounded by the platform's settings (:mod:`~airuntime.engine.handlers.settings`).

Layer: above :mod:`airuntime.core`; knows nothing of tenants' fleets or the control plane.
"""
