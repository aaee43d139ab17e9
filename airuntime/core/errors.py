"""Every exception airuntime raises, in one tree, and the Lua error-code table.

Lower-layer errors (redis, pydantic, yaml) are translated once, at the boundary that
sees them, into one of these; callers catch airuntime errors only::

    AirError
    ├── ConfigError                      bad settings / environment
    ├── PipelineError (ValueError)       invalid pipeline file or object (airuntime.engine.pipeline)
    ├── EngineError                      a Lua transition refused the request
    │   ├── ExecutionNotFound            code -1
    │   ├── StepNotFound                 code -2
    │   ├── StaleClaim                   code -3  claim token does not match (late worker)
    │   ├── InvalidTransition            code -4  step not in the state the call requires
    │   ├── ControlBlocked               code -5  execution paused/cancelling/... blocks it
    │   ├── ExecutionTerminal            code -6  execution already finalized
    │   ├── LeaseDenied                  code -7  concurrency scope is full
    │   ├── DependenciesIncomplete       code -8
    │   └── ExecutionExists              code -9  same id, different plan
    └── ScriptError                      a script broke its contract (wrong key count, ...)
"""

from __future__ import annotations

from enum import IntEnum


class AirError(Exception):
    """Base class of every airuntime error."""


class ConfigError(AirError):
    """A setting or environment variable has a value airuntime cannot use."""


class ScriptError(AirError):
    """A Lua script was called against its contract or returned something unexpected."""


class EngineError(AirError):
    """A Lua transition refused the request; ``code`` is the script's return code."""

    code: int = 0

    def __init__(self, message: str, *, execution_id: str = "", step_id: str = "") -> None:
        super().__init__(message)
        self.execution_id = execution_id
        self.step_id = step_id


class ExecutionNotFound(EngineError):
    code = -1


class StepNotFound(EngineError):
    code = -2


class StaleClaim(EngineError):
    code = -3


class InvalidTransition(EngineError):
    code = -4


class ControlBlocked(EngineError):
    code = -5


class ExecutionTerminal(EngineError):
    code = -6


class LeaseDenied(EngineError):
    code = -7


class DependenciesIncomplete(EngineError):
    code = -8


class ExecutionExists(EngineError):
    code = -9


class Code(IntEnum):
    """Return codes shared by every Lua script (see each script's header)."""

    OK = 1
    EXECUTION_NOT_FOUND = -1
    STEP_NOT_FOUND = -2
    STALE_CLAIM = -3
    INVALID_TRANSITION = -4
    CONTROL_BLOCKED = -5
    EXECUTION_TERMINAL = -6
    LEASE_DENIED = -7
    DEPENDENCIES_INCOMPLETE = -8
    EXECUTION_EXISTS = -9


_BY_CODE: dict[int, tuple[type[EngineError], str]] = {
    -1: (ExecutionNotFound, "Execution {eid} does not exist."),
    -2: (StepNotFound, "Step {step!r} does not exist in execution {eid}."),
    -3: (
        StaleClaim,
        "Step {step!r} of execution {eid} is no longer owned by this claim token "
        "(the claim expired and was recovered, or another worker owns it).",
    ),
    -4: (InvalidTransition, "Step {step!r} of execution {eid} is not in a state that allows this."),
    -5: (ControlBlocked, "Execution {eid} is {detail}; new claims are blocked."),
    -6: (ExecutionTerminal, "Execution {eid} is already finalized ({detail})."),
    -7: (LeaseDenied, "Concurrency scope {detail!r} is full."),
    -8: (DependenciesIncomplete, "Step {step!r} of execution {eid} has unfinished dependencies."),
    -9: (ExecutionExists, "Execution {eid} already exists with a different plan."),
}


def error_for(
    code: int, *, execution_id: str = "", step_id: str = "", detail: str = ""
) -> EngineError:
    """Map a negative script return code to its typed exception (message names the ids)."""
    try:
        cls, template = _BY_CODE[code]
    except KeyError:
        return EngineError(f"Unknown engine error code {code} for execution {execution_id}.")
    message = template.format(eid=execution_id, step=step_id, detail=detail)
    return cls(message, execution_id=execution_id, step_id=step_id)
