"""Every refusal of an MCP call as a tool error a model (or a person) can act on.

Why this exists: the operations raise the API's typed refusals (404, 409, 422, 403) and
Redis raises connection errors; an MCP client must see the same facts -- the field and
the value, the run, the state, the role -- and must never see its session crash. A
call while Redis is down is reported as retryable (the API's 503 + ``Retry-After``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from airuntime.control_plane.api.operations import InvalidField
from airuntime.control_plane.rbac import NotAllowed
from airuntime.control_plane.service import ControlPlaneError, PipelineRefused
from airuntime.history.errors import HistoryUnavailable

T = TypeVar("T")

RETRY_AFTER_S: Final = 5
"""What a retryable refusal asks the caller to wait, seconds (as the API's 503)."""

_KIND: Final = {400: "bad request", 403: "forbidden", 404: "not found", 409: "conflict"}


def describe_validation(exc: ValidationError) -> str:
    """``field 'x' = <value>: message`` for each problem of a model's validation."""
    parts = []
    for err in exc.errors(include_url=False):
        field = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        value = repr(err.get("input"))
        if len(value) > 120:
            value = value[:117] + "..."
        parts.append(f"field {field!r} = {value}: {err['msg']}")
    return "invalid arguments: " + "; ".join(parts)


def refusal(exc: Exception) -> ToolError | None:
    """The tool error for an anticipated failure (None: a bug, left to crash the call)."""
    if isinstance(exc, ToolError):
        return exc
    if isinstance(exc, ValidationError):
        return ToolError(describe_validation(exc))
    if isinstance(exc, PipelineRefused):
        problems = "; ".join(f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in exc.problems)
        return ToolError(f"invalid argument 'pipeline': {problems}")
    if isinstance(exc, InvalidField):
        return ToolError(f"invalid argument {exc.field!r}: {exc.detail}")
    if isinstance(exc, ControlPlaneError):
        return ToolError(f"{_KIND.get(exc.status, 'refused')}: {exc}")
    if isinstance(exc, NotAllowed):
        return ToolError(f"permission denied: {exc}")
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return ToolError(
            f"unavailable (retryable): Redis is not available ({type(exc).__name__}); "
            f"retry in {RETRY_AFTER_S} s"
        )
    if isinstance(exc, HistoryUnavailable):
        return ToolError(
            f"unavailable (retryable): the durable history is not available ({exc}); "
            f"retry in {RETRY_AFTER_S} s"
        )
    return None


async def guarded(call: Callable[[], Awaitable[T]]) -> T:
    """Run ``call``; an anticipated failure becomes a :class:`ToolError`."""
    try:
        return await call()
    except Exception as exc:
        mapped = refusal(exc)
        if mapped is None:
            raise
        if mapped is exc:
            raise
        raise mapped from exc
