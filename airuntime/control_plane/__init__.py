"""The control plane: the global queue of shared runs and where each one runs.

Submit, read, cancel and drain (:mod:`~airuntime.control_plane.service`); the shared run
records (:mod:`~airuntime.control_plane.shared_runs`) and what callers see of them
(:mod:`~airuntime.control_plane.run_details`); the shared queue
(:mod:`~airuntime.control_plane.shared_queue`); dispatch-time admission
(:mod:`~airuntime.control_plane.admission`); one dispatch cycle
(:mod:`~airuntime.control_plane.dispatch`) and the pumps that repeat it
(:mod:`~airuntime.control_plane.pump`); scale-out
(:mod:`~airuntime.control_plane.scale_out`); RBAC (:mod:`~airuntime.control_plane.rbac`);
metrics (:mod:`~airuntime.control_plane.metrics`) and the HTTP API
(:mod:`~airuntime.control_plane.api`).

Layer: above :mod:`airuntime.k8s`; never imports a runtime instance or the operator.
"""
