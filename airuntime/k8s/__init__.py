"""airuntime on Kubernetes, below the control plane and beside the operator.

* :mod:`~airuntime.k8s.v1alpha1` -- the contract: the ``airuntime.io/v1alpha1``
  resources (RuntimePool, ScaleOutRequest), their phases, conditions and event reasons,
  shared by the control plane (which files ScaleOutRequests) and the operator (which
  reconciles both);
* :mod:`~airuntime.k8s.crdgen` -- the CRDs generated from that contract
  (``airt crds generate|check``);
* :mod:`~airuntime.k8s.client` -- the one asyncio client of the API server, used by
  the control plane's ``kubernetes`` scale-out provider and by the operator; the only
  module that needs the ``kubernetes`` extra.

Layer: above :mod:`airuntime.fleet`; below the control plane.
"""
