"""Running the operator: kopf's reactor with this operator's registry and peering.

Why a module of its own: ``python -m airuntime_operator`` (and a future
``airt operator``) only have to turn settings into kopf's ``run`` arguments; the
choice between peering (HA: several replicas, one active) and standalone lives here.
"""

from __future__ import annotations

import random

import kopf

from airuntime_operator.handlers import build_registry
from airuntime_operator.settings import OperatorSettings

__all__ = ["run"]


def run(settings: OperatorSettings) -> None:
    """Run the operator until it is signalled to stop.

    With peering (the default) every replica needs a distinct ``priority``: kopf pauses
    all operators of equal priority. Without one, a random priority is drawn, which
    makes a tie between a handful of replicas vanishingly unlikely.
    """
    kopf.run(
        registry=build_registry(settings),
        clusterwide=settings.clusterwide,
        namespaces=settings.namespaces,
        standalone=settings.standalone or None,
        peering_name=None if settings.standalone else settings.peering_name,
        priority=(
            settings.priority if settings.priority is not None else random.randint(1, 2**31 - 1)
        ),
        liveness_endpoint=settings.liveness_endpoint,
    )
