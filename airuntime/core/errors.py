"""Every exception airuntime raises, in one tree, and the Lua return codes they stand for.

Lower-layer errors (redis, pydantic, yaml) are translated once, at the boundary that
sees them, into one of these; callers catch airuntime errors only::

    AirError
    ├── ConfigError                      bad settings / environment
    ├── PipelineError (ValueError)       invalid pipeline file or object (airuntime.engine.pipeline)
    ├── NonRetryableError                a step attempt failed in a way no retry can fix
    ├── EngineError                      a Lua transition refused the request
    │   ├── ExecutionNotFound            code -1
    │   ├── StepNotFound                 code -2
    │   ├── StaleClaim                   code -3  claim token does not match (late worker)
    │   ├── InvalidTransition            code -4  step not in the state the call requires
    │   ├── ControlBlocked               code -5  execution paused/cancelling/... blocks it
    │   ├── ExecutionTerminal            code -6  execution already finalized
    │   ├── LeaseDenied                  code -7  concurrency scope is full
    │   └── ExecutionExists              code -9  same id, different plan
    │       (-8, "dependencies incomplete", is retired: a step is only ever made Ready
    │       once its dependencies completed, and claims check that status)
    └── ScriptError                      a script broke its contract (wrong key count, ...)

Each :class:`EngineError` subclass carries the negative ``code`` its scripts return and
the ``template`` of its message; :func:`error_for` finds the class by code in a table
built from the classes themselves, so a code has exactly one meaning in one place.
"""

from __future__ import annotations

from typing import ClassVar

#: Return code of a script call that did what was asked (negative codes are errors).
OK = 1


class AirError(Exception):
    """Base class of every airuntime error."""


class ConfigError(AirError):
    """A setting or environment variable has a value airuntime cannot use."""


class ScriptError(AirError):
    """A Lua script was called against its contract or returned something unexpected."""


class NonRetryableError(AirError):
    """Raised by a handler (or the worker pool) when retrying the step cannot help."""


_BY_CODE: dict[int, type[EngineError]] = {}


class EngineError(AirError):
    """A Lua transition refused the request; ``code`` is the script's return code.

    The message is ``template`` filled with ``eid`` (execution id), ``step`` (step id)
    and ``detail`` (what the script returned beside the code, e.g. a status)."""

    code: ClassVar[int] = 0
    template: ClassVar[str] = "Engine error {code} for execution {eid}."

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        if "code" not in cls.__dict__:
            return  # a refinement of an error that already has its code
        other = _BY_CODE.setdefault(cls.code, cls)
        if other is not cls:
            raise TypeError(f"{cls.__name__} and {other.__name__} both claim code {cls.code}")

    def __init__(self, message: str, *, execution_id: str = "", step_id: str = "") -> None:
        super().__init__(message)
        self.execution_id = execution_id
        self.step_id = step_id


class ExecutionNotFound(EngineError):
    code = -1
    template = "Execution {eid} does not exist."


class StepNotFound(EngineError):
    code = -2
    template = "Step {step!r} does not exist in execution {eid}."


class StaleClaim(EngineError):
    code = -3
    template = (
        "Step {step!r} of execution {eid} is no longer owned by this claim token "
        "(the claim expired and was recovered, or another worker owns it)."
    )


class InvalidTransition(EngineError):
    code = -4
    template = "Step {step!r} of execution {eid} is not in a state that allows this."


class ControlBlocked(EngineError):
    code = -5
    template = "Execution {eid} is {detail}; new claims are blocked."


class ExecutionTerminal(EngineError):
    code = -6
    template = "Execution {eid} is already finalized ({detail})."


class LeaseDenied(EngineError):
    code = -7
    template = "Concurrency scope {detail!r} is full."


class ExecutionExists(EngineError):
    code = -9
    template = "Execution {eid} already exists with a different plan."


def engine_errors() -> dict[int, type[EngineError]]:
    """Negative script return code -> the error class that carries it."""
    return dict(_BY_CODE)


def error_for(
    code: int, *, execution_id: str = "", step_id: str = "", detail: str = ""
) -> EngineError:
    """Map a negative script return code to its typed exception (message names the ids)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return EngineError(f"Unknown engine error code {code} for execution {execution_id}.")
    message = cls.template.format(eid=execution_id, step=step_id, detail=detail)
    return cls(message, execution_id=execution_id, step_id=step_id)
