"""The Kubernetes contract: the ``airuntime.io/v1alpha1`` resources, shared by the
control plane (which files ScaleOutRequests) and the operator (which reconciles them).

Layer: above :mod:`airuntime.fleet`; below the control plane.
"""
