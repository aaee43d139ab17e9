"""airuntime's Kubernetes operator (kopf): RuntimePools and ScaleOutRequests.

The folder is ``operator/`` in the repository and the import package is
``airuntime_operator`` (``operator`` is a standard-library module). It may import
:mod:`airuntime`; nothing in :mod:`airuntime` imports it, and it never imports the
runtime pod package.

kopf and the Kubernetes client are the ``kubernetes`` extra
(``pip install 'airuntime[kubernetes]'``). Importing this package does not import
them: ``airt`` loads :mod:`airuntime_operator.cli` at start-up to list the
``operator`` command, and must keep working in an install without the extra. The
names below are resolved on first use.

Public surface:

* :class:`OperatorSettings` -- every tunable, documented; ``OperatorSettings.from_env()``.
* :func:`build_registry` -- a kopf registry with all handlers bound to settings
  (what ``python -m airuntime_operator`` runs, and what tests pass to ``KopfRunner``).
* :func:`run` -- run the operator in this thread (peering named ``airuntime`` unless
  standalone).
* :mod:`airuntime_operator.deployments` -- pure builders of a pool's Kubernetes objects.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airuntime_operator.handlers import FINALIZER, build_registry
    from airuntime_operator.runner import run
    from airuntime_operator.settings import OperatorSettings, SettingsError

__all__ = ["FINALIZER", "OperatorSettings", "SettingsError", "build_registry", "run"]

_LAZY = {
    "FINALIZER": "airuntime_operator.handlers",
    "build_registry": "airuntime_operator.handlers",
    "run": "airuntime_operator.runner",
    "OperatorSettings": "airuntime_operator.settings",
    "SettingsError": "airuntime_operator.settings",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'airuntime_operator' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
