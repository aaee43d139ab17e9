"""The run execution index and each runtime instance's local queue, in Redis.

Keys (also listed in :mod:`airuntime.core.keys`):

* ``air:run:<RunId>`` hash: the :class:`~airuntime.fleet.runs.RunRecord` fields, plus the
  request (pipeline + inputs) so another instance can adopt the run.
* ``air:shared-run:<SharedRunId>`` string: the RunId created for that shared run
  (``SET NX``: delivering the same SharedRunId twice creates one RunId).
* ``air:instance:<id>:queue`` list: RunIds accepted by that instance and not started.
* ``air:runs:queued`` / ``air:runs:running`` zsets: RunIds by state, for adoption.
* ``air:runs:tenant:<tenant>`` zset: a tenant's RunIds (listing under a tenant).

Reads by RunId take the caller's tenant: a run of another tenant answers "not
found" (``None``), never its data. Ownership changes (adoption of a dead instance's
runs) are compare-and-set on the run hash (``adoptRun-1.lua``).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.core.context import ExecutionContextSnapshot
from airuntime.core.scripts import ScriptLibrary, library
from airuntime.fleet.runs import RunRecord, RunRequest, RunStatus


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _now() -> int:
    return int(time.time() * 1000)


class RunIndex:
    """Run records, idempotent acceptance and per-instance local queues."""

    def __init__(self, redis: Redis, scripts: ScriptLibrary | None = None) -> None:
        self.redis = redis
        self.scripts = scripts or library()

    async def accept(self, instance_id: str, request: RunRequest) -> tuple[str, bool]:
        """Record ``request`` as queued on ``instance_id``; return (RunId, created).

        Idempotent by SharedRunId: a second delivery returns the first RunId. A crash
        between reserving the RunId and writing the record is repaired by the next
        delivery of the same SharedRunId.
        """
        run_id = f"run-{uuid.uuid4().hex}"
        reserved = await self.redis.set(
            keys.shared_run_to_run(request.shared_run_id), run_id, nx=True
        )
        if not reserved:
            existing = _s(await self.redis.get(keys.shared_run_to_run(request.shared_run_id)))
            if await self.redis.exists(keys.run(existing)):
                return existing, False
            run_id = existing  # reserved by a delivery that died before writing: finish it
        now = _now()
        snap = request.snapshot
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(
            keys.run(run_id),
            mapping={
                "run_id": run_id,
                "shared_run_id": request.shared_run_id,
                "instance_id": instance_id,
                "tenant_id": snap.tenant_id,
                "tenant_group_id": snap.tenant_group_id or "",
                "status": RunStatus.QUEUED.value,
                "created_at_ms": now,
                "snapshot": snap.model_dump_json(),
                "metadata": json.dumps(request.metadata),
                "request": request.model_dump_json(),
            },
        )
        pipe.zadd(keys.runs_by_tenant(snap.tenant_id), {run_id: now})
        pipe.zadd(keys.runs_in_state(RunStatus.QUEUED), {run_id: now})
        pipe.rpush(keys.instance_queue(instance_id), run_id)
        await pipe.execute()
        return run_id, True

    async def queue_length(self, instance_id: str) -> int:
        return int(await self.redis.llen(keys.instance_queue(instance_id)))

    async def pop_queued(self, instance_id: str) -> str | None:
        raw = await self.redis.lpop(keys.instance_queue(instance_id))
        return _s(raw) if raw is not None else None

    async def push_front(self, instance_id: str, run_id: str) -> None:
        """Give a popped run back to the head of the queue (it could not start yet)."""
        await self.redis.lpush(keys.instance_queue(instance_id), run_id)

    async def mark_running(self, run_id: str, execution_id: str) -> None:
        now = _now()
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(
            keys.run(run_id),
            mapping={
                "status": RunStatus.RUNNING.value,
                "execution_id": execution_id,
                "started_at_ms": now,
            },
        )
        pipe.zrem(keys.runs_in_state(RunStatus.QUEUED), run_id)
        pipe.zadd(keys.runs_in_state(RunStatus.RUNNING), {run_id: now})
        await pipe.execute()

    async def mark_finished(
        self, run_id: str, status: RunStatus, reason: str | None = None
    ) -> None:
        pipe = self.redis.pipeline(transaction=True)
        mapping: dict[Any, Any] = {"status": status.value, "finished_at_ms": _now()}
        if reason:
            mapping["failure_reason"] = reason[:2000]
        pipe.hset(keys.run(run_id), mapping=mapping)
        pipe.zrem(keys.runs_in_state(RunStatus.QUEUED), run_id)
        pipe.zrem(keys.runs_in_state(RunStatus.RUNNING), run_id)
        await pipe.execute()

    async def set_metadata(self, run_id: str, values: dict[str, str]) -> None:
        raw = await self.redis.hget(keys.run(run_id), "metadata")
        merged = {**(json.loads(raw) if raw else {}), **values}
        await self.redis.hset(keys.run(run_id), "metadata", json.dumps(merged, sort_keys=True))

    async def remove_queued(self, instance_id: str, run_id: str) -> bool:
        return int(await self.redis.lrem(keys.instance_queue(instance_id), 1, run_id)) > 0

    # -- reads -------------------------------------------------------------------------

    async def _load(self, run_id: str) -> tuple[RunRecord, RunRequest] | None:
        raw = await self.redis.hgetall(keys.run(run_id))
        if not raw:
            return None
        m = {_s(k): _s(v) for k, v in raw.items()}
        record = RunRecord(
            run_id=m["run_id"],
            shared_run_id=m["shared_run_id"],
            instance_id=m["instance_id"],
            tenant_id=m["tenant_id"],
            tenant_group_id=m.get("tenant_group_id") or None,
            status=RunStatus(m["status"]),
            execution_id=m.get("execution_id") or None,
            failure_reason=m.get("failure_reason") or None,
            created_at_ms=int(m["created_at_ms"]),
            started_at_ms=int(m["started_at_ms"]) if m.get("started_at_ms") else None,
            finished_at_ms=int(m["finished_at_ms"]) if m.get("finished_at_ms") else None,
            snapshot=ExecutionContextSnapshot.model_validate_json(m["snapshot"]),
            metadata=json.loads(m.get("metadata") or "{}"),
        )
        return record, RunRequest.model_validate_json(m["request"])

    async def get_for_tenant(self, run_id: str, tenant_id: str) -> RunRecord | None:
        """The record of ``run_id`` if it belongs to ``tenant_id``; None otherwise."""
        loaded = await self._load(run_id)
        if loaded is None or loaded[0].tenant_id != tenant_id:
            return None
        return loaded[0]

    async def get_unchecked(self, run_id: str) -> tuple[RunRecord, RunRequest] | None:
        """Record and request without a tenant check (the owning instance, adoption)."""
        return await self._load(run_id)

    async def run_for_shared(self, shared_run_id: str) -> str | None:
        raw = await self.redis.get(keys.shared_run_to_run(shared_run_id))
        return _s(raw) if raw is not None else None

    async def list_for_tenant(self, tenant_id: str, limit: int = 100) -> list[RunRecord]:
        ids = await self.redis.zrevrange(keys.runs_by_tenant(tenant_id), 0, limit - 1)
        out = []
        for rid in ids:
            rec = await self.get_for_tenant(_s(rid), tenant_id)
            if rec is not None:
                out.append(rec)
        return out

    async def in_state(self, status: RunStatus, limit: int = 1000) -> list[str]:
        return [_s(r) for r in await self.redis.zrange(keys.runs_in_state(status), 0, limit - 1)]

    async def adopt(self, run_id: str, dead_instance: str, new_instance: str) -> bool:
        """Compare-and-set ownership from a dead instance to ``new_instance``."""
        reply = await self.scripts.call(
            self.redis, "adoptRun", [keys.run(run_id)], [dead_instance, new_instance, _now()]
        )
        return int(reply) == 1
