"""The execution context snapshot: who a run belongs to, carried on every hop.

``ExecutionContextSnapshot.tenant_id`` is the durable tenant boundary: it is
persisted on the shared run, on the runtime run request, on the execution, and is
what every visibility check compares. ``context_key`` and metadata are kept for
correlation and diagnostics and never partition anything.

The *current* context of a task lives in a ``ContextVar`` so a dispatcher can
restore a run's snapshot before admission and restore (or clear) the previous
context afterwards, also when admission or dispatch fails (:func:`use_context`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

_TENANT_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


class ExecutionContextSnapshot(BaseModel):
    """Durable identity of a run: tenant, group, user, project, namespaces.

    ``current_namespace`` is the namespace the run acts in; ``namespaces`` are the
    namespaces (or resource names) it may touch. Neither partitions anything: only
    ``tenant_id`` does.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant_id: str = Field(pattern=_TENANT_PATTERN, description="Durable tenant boundary.")
    tenant_group_id: str | None = Field(default=None, pattern=_TENANT_PATTERN)
    user_id: str | None = Field(default=None, max_length=200)
    project: str | None = Field(default=None, max_length=200)
    context_key: str | None = Field(
        default=None, max_length=200, description="RBAC correlation key; never a partition key."
    )
    current_namespace: str | None = Field(default=None, max_length=253)
    namespaces: tuple[str, ...] = Field(default=(), max_length=64)

    @field_validator("namespaces")
    @classmethod
    def _no_empty_namespace(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for ns in value:
            if not ns.strip():
                raise ValueError("namespaces must not contain empty names")
        return value


DEFAULT_TENANT = "default"

_current: ContextVar[ExecutionContextSnapshot | None] = ContextVar(
    "airuntime_execution_context", default=None
)


def current_context() -> ExecutionContextSnapshot | None:
    """The snapshot restored for the running task, if any."""
    return _current.get()


@contextlib.contextmanager
def use_context(snapshot: ExecutionContextSnapshot | None) -> Iterator[None]:
    """Make ``snapshot`` current for the block; the previous context (or none) comes back
    afterwards, whether the block returns or raises."""
    token = _current.set(snapshot)
    try:
        yield
    finally:
        _current.reset(token)
