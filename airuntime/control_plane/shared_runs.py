"""Shared runs (SharedRunId) and the Redis shared queue of the control plane.

A *shared run* exists from submission, before any runtime is chosen: it persists
the pipeline, the inputs and the ExecutionContextSnapshot, and later the RunId,
ExecutionId and assigned instance. The *shared queue* holds Pending items that
pumps claim (``claimSharedRun-2.lua``, with a claim lease), dispatch, and settle
(``settleSharedRun-2.lua``: Dispatched only after the runtime accepted, else back
to Pending at the head of the queue).

Keys: ``air:srun:<SharedRunId>`` hash (the record), ``air:sruns`` zset (all, by
creation), ``air:sruns:tenant:<t>`` zset; queue keys share the ``{squeue}`` tag:
``air:{squeue}:pending``, ``air:{squeue}:claimed``, ``air:{squeue}:item:<id>``.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.core.context import ExecutionContextSnapshot
from airuntime.core.scripts import ScriptLibrary, library


class SharedRunStatus(StrEnum):
    SUBMITTED = "Submitted"
    QUEUED_GLOBALLY = "QueuedGlobally"
    DISPATCHED = "Dispatched"
    SCALE_OUT_REQUESTED = "ScaleOutRequested"
    REJECTED = "Rejected"
    CANCELLED = "Cancelled"
    FAILED = "Failed"


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

    async def update(self, shared_run_id: str, **changes: Any) -> SharedRun:
        """Read-modify-write under WATCH, retried on conflict."""
        key = keys.shared_run(shared_run_id)
        while True:
            async with self.redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    if raw is None:
                        raise KeyError(f"shared run {shared_run_id} does not exist")
                    run = SharedRun.model_validate_json(raw).model_copy(
                        update={**changes, "updated_at_ms": _now()}
                    )
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.set(key, run.model_dump_json())
                    await pipe.execute()
                    return run
                except Exception as exc:
                    from redis.exceptions import WatchError

                    if isinstance(exc, WatchError):
                        continue
                    raise

    async def list(self, tenant_id: str | None = None, limit: int = 100) -> list[SharedRun]:
        index = keys.shared_runs_by_tenant(tenant_id) if tenant_id else keys.shared_runs()
        ids = await self.redis.zrevrange(index, 0, limit - 1)
        if not ids:
            return []
        raws = await self.redis.mget([keys.shared_run(_s(i)) for i in ids])
        return [SharedRun.model_validate_json(r) for r in raws if r]


@dataclass(frozen=True, slots=True)
class ClaimedItem:
    shared_run_id: str
    token: str
    recovered: int


class SharedQueue:
    """The global queue of shared runs."""

    def __init__(
        self, redis: Redis, scripts: ScriptLibrary | None = None, claim_lease_ms: int = 30_000
    ) -> None:
        self.redis = redis
        self.scripts = scripts or library()
        self.claim_lease_ms = claim_lease_ms
        self._keys = [keys.squeue_pending(), keys.squeue_claimed()]

    async def enqueue(self, shared_run_id: str, tenant_id: str, *, requeue: bool = False) -> bool:
        reply = await self.scripts.call(
            self.redis,
            "enqueueSharedRun",
            self._keys,
            [keys.squeue_item_prefix(), shared_run_id, "1" if requeue else "0", tenant_id],
        )
        return int(reply) == 1

    async def claim_next(
        self, claimer: str, skip_tenants: frozenset[str] = frozenset()
    ) -> ClaimedItem | None:
        """The oldest Pending item not belonging to ``skip_tenants``, claimed for ``claimer``."""
        reply: Any = await self.scripts.call(
            self.redis,
            "claimSharedRun",
            self._keys,
            [keys.squeue_item_prefix(), claimer, self.claim_lease_ms, *sorted(skip_tenants)],
        )
        if not reply:
            return None
        return ClaimedItem(_s(reply[0]), _s(reply[1]), int(reply[2]))

    async def claim(self, claimer: str, shared_run_id: str) -> ClaimedItem | None:
        """Claim one specific Pending item (DirectDispatch)."""
        reply: Any = await self.scripts.call(
            self.redis,
            "claimSharedRunById",
            self._keys,
            [keys.squeue_item_prefix(), claimer, self.claim_lease_ms, shared_run_id],
        )
        if not reply:
            return None
        return ClaimedItem(_s(reply[0]), _s(reply[1]), int(reply[2]))

    async def settle(self, item: ClaimedItem, outcome: str, detail: str = "") -> bool:
        reply = await self.scripts.call(
            self.redis,
            "settleSharedRun",
            self._keys,
            [keys.squeue_item_prefix(), item.shared_run_id, item.token, outcome, detail],
        )
        return int(reply) == 1

    async def cancel(self, shared_run_id: str) -> int:
        return int(
            await self.scripts.call(
                self.redis,
                "cancelSharedRun",
                self._keys,
                [keys.squeue_item_prefix(), shared_run_id],
            )
        )

    async def item(self, shared_run_id: str) -> dict[str, str]:
        raw = await self.redis.hgetall(keys.squeue_item(shared_run_id))
        return {_s(k): _s(v) for k, v in raw.items()}

    async def pending_count(self) -> int:
        return int(await self.redis.zcard(keys.squeue_pending()))

    async def pending_by_tenant(self) -> dict[str, int]:
        ids = await self.redis.zrange(keys.squeue_pending(), 0, -1)
        counts: dict[str, int] = {}
        for srid in ids:
            tenant = await self.redis.hget(keys.squeue_item(_s(srid)), "tenant_id")
            t = _s(tenant) if tenant else "unknown"
            counts[t] = counts.get(t, 0) + 1
        return counts


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)
