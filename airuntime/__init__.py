"""airuntime: a deterministic runtime for AI workflows.

Pipelines are DAGs of steps whose state lives in Redis (or Valkey) and changes only
through atomic Lua scripts; any number of asyncio workers, in any number of processes,
advance an execution by claiming ready steps with a claim token and completing them.

This module is what pipeline authors import: the ``handler`` decorator and the
``StepContext`` a handler receives, the exceptions a handler raises (``TransientError``,
``StepFailed``, ``StepCancelled``, their base ``HandlerError``), the ``Pipeline``
builder, and the errors airuntime raises (``AirError``, ``PipelineError``). Every
other part of airuntime imports this package first, so the names are loaded on first
use: ``import airuntime`` alone costs almost nothing.
"""

from __future__ import annotations

import importlib

# Not typing.TYPE_CHECKING: importing typing would double the cost of this module.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from airuntime.core.errors import AirError
    from airuntime.engine.handlers import (
        HandlerError,
        StepCancelled,
        StepContext,
        StepFailed,
        TransientError,
        handler,
    )
    from airuntime.engine.pipeline import Pipeline, PipelineError

    __version__: str

__all__ = [
    "AirError",
    "HandlerError",
    "Pipeline",
    "PipelineError",
    "StepCancelled",
    "StepContext",
    "StepFailed",
    "TransientError",
    "__version__",
    "handler",
]

#: Public name -> the module that defines it.
_HOMES = {
    "AirError": "airuntime.core.errors",
    "HandlerError": "airuntime.engine.handlers",
    "Pipeline": "airuntime.engine.pipeline",
    "PipelineError": "airuntime.engine.pipeline",
    "StepCancelled": "airuntime.engine.handlers",
    "StepContext": "airuntime.engine.handlers",
    "StepFailed": "airuntime.engine.handlers",
    "TransientError": "airuntime.engine.handlers",
    "handler": "airuntime.engine.handlers",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = importlib.import_module("airuntime.core.version").installed_version()
    elif name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups do not come here again
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
