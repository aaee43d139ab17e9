"""The control plane: the global queue of shared runs and where each one runs.

Submit (:mod:`~airuntime.control_plane.service`), the shared run store and shared queue
(:mod:`~airuntime.control_plane.shared_runs`), dispatch-time admission
(:mod:`~airuntime.control_plane.admission`), the dispatcher and pumps
(:mod:`~airuntime.control_plane.dispatch`), scale-out
(:mod:`~airuntime.control_plane.scale_out`), RBAC (:mod:`~airuntime.control_plane.rbac`),
metrics and the HTTP API.

Layer: above :mod:`airuntime.k8s`; never imports a runtime instance or the operator.
"""
