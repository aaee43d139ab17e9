"""Scale-out: requests for capacity, the providers that create it, and the requeue.

* :mod:`~airuntime.control_plane.scale_out.requests` -- the request record, its store and
  the provider interface;
* :mod:`~airuntime.control_plane.scale_out.local` -- the ``local`` provider (processes);
* :mod:`~airuntime.control_plane.scale_out.kubernetes` -- the ``kubernetes`` provider
  (ScaleOutRequest resources the operator fulfils);
* :mod:`~airuntime.control_plane.scale_out.watcher` -- the watcher and the requeuer.
"""

from airuntime.control_plane.scale_out.local import LocalScaler
from airuntime.control_plane.scale_out.requests import (
    ScaleOutPhase,
    ScaleOutProvider,
    ScaleOutRejected,
    ScaleOutRequest,
    ScaleOutStore,
)
from airuntime.control_plane.scale_out.watcher import FulfilledRunRequeuer, ScaleOutWatcher

__all__ = [
    "FulfilledRunRequeuer",
    "LocalScaler",
    "ScaleOutPhase",
    "ScaleOutProvider",
    "ScaleOutRejected",
    "ScaleOutRequest",
    "ScaleOutStore",
    "ScaleOutWatcher",
]
