"""Shared runs: what the control plane knows of a run from submission on.

A *shared run* (SharedRunId) exists from submission, before any runtime is chosen:
it persists the pipeline, the inputs and the ExecutionContextSnapshot, and later the
RunId and the assigned instance. Its status moves only along
:data:`SHARED_RUN_TRANSITIONS`; where it waits meanwhile is the shared queue
(:mod:`~airuntime.control_plane.shared_queue`).

Keys: ``air:srun:<SharedRunId>`` (the record, JSON), ``air:sruns`` zset (all, by
creation), ``air:sruns:tenant:<t>`` zset.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis

from airuntime.control_plane.json_records import update_record
from airuntime.core import keys
from airuntime.core.context import ExecutionContextSnapshot

log = logging.getLogger(__name__)


class SharedRunStatus(StrEnum):
    SUBMITTED = "Submitted"
    QUEUED_GLOBALLY = "QueuedGlobally"
    DISPATCHED = "Dispatched"
    SCALE_OUT_REQUESTED = "ScaleOutRequested"
    REJECTED = "Rejected"
    CANCELLED = "Cancelled"
    FAILED = "Failed"

    def can_become(self, status: SharedRunStatus) -> bool:
        """Whether a shared run may move from this status to ``status`` (recording the
        same status again is always allowed)."""
        return status == self or status in SHARED_RUN_TRANSITIONS[self]


SHARED_RUN_TRANSITIONS: Final[Mapping[SharedRunStatus, frozenset[SharedRunStatus]]] = {
    # submit persists the run, then queues it (a cancel may come first).
    SharedRunStatus.SUBMITTED: frozenset(
        {SharedRunStatus.QUEUED_GLOBALLY, SharedRunStatus.CANCELLED}
    ),
    # Dispatch-time admission decides (Dispatched only once the runtime accepted);
    # cancel may land at any point before.
    SharedRunStatus.QUEUED_GLOBALLY: frozenset(
        {
            SharedRunStatus.DISPATCHED,
            SharedRunStatus.SCALE_OUT_REQUESTED,
            SharedRunStatus.REJECTED,
            SharedRunStatus.CANCELLED,
        }
    ),
    # The requeuer puts the run back once the scale-out request is finished.
    SharedRunStatus.SCALE_OUT_REQUESTED: frozenset(
        {SharedRunStatus.QUEUED_GLOBALLY, SharedRunStatus.CANCELLED}
    ),
    SharedRunStatus.REJECTED: frozenset({SharedRunStatus.CANCELLED}),
    # Cancelling a Dispatched run cancels its runtime run; the shared run stays Dispatched.
    SharedRunStatus.DISPATCHED: frozenset(),
    SharedRunStatus.CANCELLED: frozenset(),
    # Nothing assigns Failed yet.
    SharedRunStatus.FAILED: frozenset(),
}
"""Which status a shared run may move to from each status."""


class SharedRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    shared_run_id: str
    status: SharedRunStatus
    pipeline_id: str
    pipeline: dict[str, Any]
    inputs: dict[str, Any] = Field(default_factory=dict)
    snapshot: ExecutionContextSnapshot
    metadata: dict[str, str] = Field(default_factory=dict)
    created_at_ms: int
    updated_at_ms: int
    assigned_instance_id: str | None = None
    run_id: str | None = None
    execution_id: str | None = None
    reason: str | None = None
    scale_out_request_id: str | None = None
    pump_runtime_instance_id: str | None = None
    pump_worker_id: str | None = None
    dispatched_at_ms: int | None = None


def _now() -> int:
    return int(time.time() * 1000)


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class SharedRunStore:
    """Shared run records (one JSON document per run; tenant index)."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    @staticmethod
    def new_id() -> str:
        return f"sr-{uuid.uuid4().hex}"

    async def create(self, run: SharedRun) -> None:
        """Persist a new run and index it (all runs, and its tenant's runs)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(keys.shared_run(run.shared_run_id), run.model_dump_json())
        pipe.zadd(keys.shared_runs(), {run.shared_run_id: run.created_at_ms})
        pipe.zadd(
            keys.shared_runs_by_tenant(run.snapshot.tenant_id),
            {run.shared_run_id: run.created_at_ms},
        )
        await pipe.execute()

    async def get(self, shared_run_id: str) -> SharedRun | None:
        raw = await self.redis.get(keys.shared_run(shared_run_id))
        return SharedRun.model_validate_json(raw) if raw else None

    async def get_for_tenant(self, shared_run_id: str, tenant_id: str) -> SharedRun | None:
        run = await self.get(shared_run_id)
        return run if run is not None and run.snapshot.tenant_id == tenant_id else None

    async def require(self, shared_run_id: str) -> SharedRun:
        run = await self.get(shared_run_id)
        if run is None:
            raise KeyError(f"shared run {shared_run_id} does not exist")
        return run

    async def update(self, shared_run_id: str, **changes: Any) -> SharedRun:
        """Read-modify-write under WATCH, retried on conflict.

        A status change that :data:`SHARED_RUN_TRANSITIONS` does not allow is still
        written (the callers decide), but logged: it means two writers raced."""
        updated = await update_record(
            self.redis,
            keys.shared_run(shared_run_id),
            SharedRun,
            lambda run: run.model_copy(update={**changes, "updated_at_ms": _now()}),
        )
        if updated is None:
            raise KeyError(f"shared run {shared_run_id} does not exist")
        before, run = updated
        if not before.status.can_become(run.status):
            log.warning(
                "shared run %s moved %s -> %s, not an allowed transition",
                shared_run_id,
                before.status,
                run.status,
            )
        return run

    async def list(self, tenant_id: str | None = None, limit: int = 100) -> list[SharedRun]:
        index = keys.shared_runs_by_tenant(tenant_id) if tenant_id else keys.shared_runs()
        ids = await self.redis.zrevrange(index, 0, limit - 1)
        if not ids:
            return []
        raws = await self.redis.mget([keys.shared_run(_s(i)) for i in ids])
        return [SharedRun.model_validate_json(r) for r in raws if r]
