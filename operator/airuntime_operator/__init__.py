"""airuntime's Kubernetes operator (kopf): RuntimePools and ScaleOutRequests.

The folder is ``operator/`` in the repository and the import package is
``airuntime_operator`` (``operator`` is a standard-library module). It may import
:mod:`airuntime`; nothing in :mod:`airuntime` imports it, and it never imports the
runtime pod package.

Public surface:

* :class:`OperatorSettings` -- every tunable, documented; ``OperatorSettings.from_env()``.
* :func:`build_registry` -- a kopf registry with all handlers bound to settings
  (what ``python -m airuntime_operator`` runs, and what tests pass to ``KopfRunner``).
* :func:`run` -- run the operator in this thread (peering named ``airuntime`` unless
  standalone).
* :mod:`airuntime_operator.deployments` -- pure builders of a pool's Kubernetes objects.
"""

from airuntime_operator.handlers import FINALIZER, build_registry
from airuntime_operator.runner import run
from airuntime_operator.settings import OperatorSettings, SettingsError

__all__ = ["FINALIZER", "OperatorSettings", "SettingsError", "build_registry", "run"]
