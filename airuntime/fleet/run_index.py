"""The run execution index and each runtime instance's local queue, in Redis.

Why this module exists: a run accepted by a runtime instance must survive that
instance (another one adopts it), must be accepted once whatever delivers it how often,
must tell the control plane when it ends, and must not stay in Redis forever. Every
change of a run is therefore one Lua script, so nothing is ever half-written:

* ``acceptRun-5.lua`` -- idempotent by SharedRunId: the existing RunId, or the mapping,
  the record, the index entries and the queue entry, all at once;
* ``startRun-4.lua`` -- the head of a local queue becomes running with its ExecutionId,
  only if it is still queued and still that instance's;
* ``finishRun-7.lua`` -- terminal status, out of the indexes and the queue, the
  :class:`~airuntime.fleet.outcomes.RunOutcome` appended, retention started;
* ``adoptRun-2.lua`` -- ownership moves from a dead (unregistered) instance to a live
  one (compare-and-set).

Keys (the table in :mod:`airuntime.core.keys` names each one's owner): the run hash
``air:{air}:run:<RunId>`` (record + request, so another instance can adopt the run), the
mapping ``air:{air}:shared-run:<SharedRunId>``, the local queue ``air:{air}:instance:<id>:queue``,
the state indexes ``air:{air}:runs:queued|running``, the tenant index
``air:{air}:runs:tenant:<tenant>`` and the retention index ``air:{air}:runs:retention``. Like the
registry, the run index lives in the control slot (``{air}``): each of its scripts
touches one hash slot, so it runs on a Redis Cluster, on one shard.

Retention: a finished run's record and mapping expire after ``retention_s`` (Redis
TTL); its tenant index entry is removed by :meth:`RunIndex.prune`, which every runtime
instance runs periodically and the control plane may call.

Reads by RunId take the caller's tenant: a run of another tenant answers "not
found" (``None``), never its data.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from airuntime.core import keys
from airuntime.core.context import ExecutionContextSnapshot
from airuntime.core.errors import AirError, ScriptError
from airuntime.core.redis_client import RedisClient
from airuntime.core.reply_text import reply_text as _s
from airuntime.core.scripts import ScriptLibrary, library
from airuntime.fleet.outcomes import OUTCOMES_MAXLEN
from airuntime.fleet.runs import RunRecord, RunRequest, RunStatus

__all__ = [
    "DEFAULT_RUN_RETENTION_S",
    "QueueFull",
    "RunIndex",
    "SharedRunConflict",
]

DEFAULT_RUN_RETENTION_S = 7 * 24 * 3600
"""How long a finished run's record stays readable (seconds): 7 days, as executions."""

_MAX_REASON = 2000


class QueueFull(AirError):
    """The instance's local queue holds ``capacity`` runs already; nothing was written."""

    def __init__(self, instance_id: str, capacity: int) -> None:
        super().__init__(f"The queue of {instance_id} is full ({capacity} runs).")
        self.instance_id = instance_id
        self.capacity = capacity


class SharedRunConflict(AirError):
    """A SharedRunId already has a run of another tenant; nothing was written."""


class RunIndex:
    """Run records, idempotent acceptance and per-instance local queues."""

    def __init__(
        self,
        redis: RedisClient,
        scripts: ScriptLibrary | None = None,
        *,
        retention_s: int = DEFAULT_RUN_RETENTION_S,
    ) -> None:
        if retention_s < 1:
            raise ValueError(f"retention_s must be >= 1, got {retention_s}")
        self.redis = redis
        self.scripts = scripts or library()
        self.retention_s = retention_s

    # -- writes ------------------------------------------------------------------------

    async def accept(
        self, instance_id: str, request: RunRequest, *, queue_capacity: int = 2**31
    ) -> tuple[str, bool]:
        """Queue ``request`` on ``instance_id`` in one step; return (RunId, created).

        Idempotent by SharedRunId: every delivery after the first, to any instance,
        returns the first RunId and writes nothing. Raises :class:`QueueFull` when the
        local queue already holds ``queue_capacity`` runs, :class:`SharedRunConflict`
        when the SharedRunId's run belongs to another tenant.
        """
        call = self._accept_call(instance_id, request, queue_capacity)
        reply: Any = await self.scripts.call(self.redis, "acceptRun", *call)
        return await self._accepted(instance_id, request, queue_capacity, reply)

    async def accept_many(
        self, instance_id: str, requests: list[RunRequest], *, queue_capacity: int = 2**31
    ) -> list[tuple[str, bool] | QueueFull | SharedRunConflict]:
        """:meth:`accept` for a batch delivered to one instance, in one round trip (each
        run still accepted atomically on its own, in order); one answer per request."""
        calls = [self._accept_call(instance_id, r, queue_capacity) for r in requests]
        replies = await self.scripts.call_many(self.redis, "acceptRun", calls)
        out: list[tuple[str, bool] | QueueFull | SharedRunConflict] = []
        for request, reply in zip(requests, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            try:
                out.append(await self._accepted(instance_id, request, queue_capacity, reply))
            except (QueueFull, SharedRunConflict) as exc:
                out.append(exc)
        return out

    @staticmethod
    def _accept_call(
        instance_id: str, request: RunRequest, queue_capacity: int
    ) -> tuple[list[str], list[str | int]]:
        snap = request.snapshot
        candidate = f"run-{uuid.uuid4().hex}"
        return (
            [
                keys.shared_run_to_run(request.shared_run_id),
                keys.run(candidate),
                keys.runs_by_tenant(snap.tenant_id),
                keys.runs_in_state(RunStatus.QUEUED),
                keys.instance_queue(instance_id),
            ],
            [
                candidate,
                request.shared_run_id,
                instance_id,
                snap.tenant_id,
                snap.tenant_group_id or "",
                snap.model_dump_json(),
                json.dumps(request.metadata),
                request.model_dump_json(),
                queue_capacity,
            ],
        )

    async def _accepted(
        self, instance_id: str, request: RunRequest, queue_capacity: int, reply: Any
    ) -> tuple[str, bool]:
        snap = request.snapshot
        code = int(reply[0])
        if code == 1:
            return _s(reply[1]), True
        if code == 2:
            raise QueueFull(instance_id, queue_capacity)
        if code != 0:
            raise ScriptError(f"acceptRun returned {reply!r}")
        existing = _s(reply[1])
        owner = await self.redis.hget(keys.run(existing), "tenant_id")
        if owner is not None and _s(owner) != snap.tenant_id:
            raise SharedRunConflict(
                f"SharedRunId {request.shared_run_id} already has a run of another tenant; "
                f"refused for tenant {snap.tenant_id}."
            )
        return existing, False

    async def start_many(self, instance_id: str, starts: list[tuple[str, str]]) -> list[bool]:
        """:meth:`start` of many ``(run_id, execution_id)`` in one round trip (each run
        started atomically on its own); one answer per run."""
        replies = await self.scripts.call_many(
            self.redis, "startRun", [self._start_call(instance_id, r, e) for r, e in starts]
        )
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return [int(reply[0]) == 1 for reply in replies]

    @staticmethod
    def _start_call(
        instance_id: str, run_id: str, execution_id: str
    ) -> tuple[list[str], list[str]]:
        return (
            [
                keys.run(run_id),
                keys.instance_queue(instance_id),
                keys.runs_in_state(RunStatus.QUEUED),
                keys.runs_in_state(RunStatus.RUNNING),
            ],
            [run_id, instance_id, execution_id],
        )

    async def start(self, instance_id: str, run_id: str, execution_id: str) -> bool:
        """Start ``run_id`` on ``instance_id`` with ``execution_id``; False when it is no
        longer queued there (it only left the queue)."""
        reply: Any = await self.scripts.call(
            self.redis,
            "startRun",
            [
                keys.run(run_id),
                keys.instance_queue(instance_id),
                keys.runs_in_state(RunStatus.QUEUED),
                keys.runs_in_state(RunStatus.RUNNING),
            ],
            [run_id, instance_id, execution_id],
        )
        return int(reply[0]) == 1

    async def finish(
        self,
        record: RunRecord,
        status: RunStatus,
        *,
        reason: str | None = None,
        execution_id: str | None = None,
        step_slots: dict[str, int] | None = None,
        only_if: RunStatus | None = None,
    ) -> bool:
        """Mark the run terminal and append its RunOutcome, in one step; False when it
        was already terminal (or not in ``only_if``): then nothing changed."""
        if not status.terminal:
            raise ValueError(f"finish needs a terminal status, got {status.value}")
        reply: Any = await self.scripts.call(
            self.redis,
            "finishRun",
            [
                keys.run(record.run_id),
                keys.runs_in_state(RunStatus.QUEUED),
                keys.runs_in_state(RunStatus.RUNNING),
                keys.run_outcomes(),
                keys.shared_run_to_run(record.shared_run_id),
                keys.runs_retention(),
                keys.instance_queue(record.instance_id),
            ],
            [
                record.run_id,
                status.value,
                (reason or "")[:_MAX_REASON],
                execution_id or "",
                json.dumps(step_slots, sort_keys=True) if step_slots is not None else "",
                self.retention_s,
                OUTCOMES_MAXLEN,
                only_if.value if only_if is not None else "",
            ],
        )
        return int(reply[0]) == 1

    async def mark_finished(
        self, run_id: str, status: RunStatus, reason: str | None = None
    ) -> bool:
        """:meth:`finish` by RunId (the record is read first); False if it is gone."""
        loaded = await self._load(run_id)
        if loaded is None:
            return False
        return await self.finish(loaded[0], status, reason=reason)

    async def cancel_queued(self, record: RunRecord, reason: str) -> bool:
        """Cancel a run that has not started: True if it was still queued (it left its
        queue, Cancelled, with its outcome); False if it started or ended meanwhile."""
        return await self.finish(
            record, RunStatus.CANCELLED, reason=reason, only_if=RunStatus.QUEUED
        )

    async def set_metadata(self, run_id: str, values: dict[str, str]) -> None:
        raw = await self.redis.hget(keys.run(run_id), "metadata")
        if raw is None:
            return  # gone (retention): never recreate a record without its TTL
        merged = {**json.loads(raw), **values}
        await self.redis.hset(keys.run(run_id), "metadata", json.dumps(merged, sort_keys=True))

    async def remove_queued(self, instance_id: str, run_id: str) -> bool:
        return int(await self.redis.lrem(keys.instance_queue(instance_id), 1, run_id)) > 0

    async def requeue(self, instance_id: str, run_id: str) -> None:
        """Put an adopted queued run at the end of ``instance_id``'s queue."""
        await self.redis.rpush(keys.instance_queue(instance_id), run_id)

    async def adopt(self, run_id: str, dead_instance: str, new_instance: str) -> bool:
        """Compare-and-set ownership from a dead instance to ``new_instance``; refused
        while ``dead_instance`` is registered."""
        reply = await self.scripts.call(
            self.redis,
            "adoptRun",
            [keys.run(run_id), keys.instance(dead_instance)],
            [dead_instance, new_instance, int(time.time() * 1000)],
        )
        return int(reply) == 1

    async def prune(self, *, limit: int = 1000) -> int:
        """The retention sweep: remove the tenant index entries (and what is left of the
        records) of runs whose retention has passed, by Redis time; how many."""
        seconds, micros = await self.redis.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        due = await self.redis.zrangebyscore(
            keys.runs_retention(), "-inf", now_ms, start=0, num=limit
        )
        if not due:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for member in map(_s, due):
            tenant_id, _, run_id = member.partition(":")
            pipe.zrem(keys.runs_by_tenant(tenant_id), run_id)
            pipe.unlink(keys.run(run_id))
            pipe.zrem(keys.runs_retention(), member)
        await pipe.execute()
        return len(due)

    # -- reads -------------------------------------------------------------------------

    async def queue_length(self, instance_id: str) -> int:
        return int(await self.redis.llen(keys.instance_queue(instance_id)))

    async def queue_head(self, instance_id: str, count: int) -> list[str]:
        """The first ``count`` runs of ``instance_id``'s queue, left in place."""
        if count < 1:
            return []
        return [
            _s(r) for r in await self.redis.lrange(keys.instance_queue(instance_id), 0, count - 1)
        ]

    async def head_of_queue(self, instance_id: str) -> str | None:
        """The next run of ``instance_id``'s queue, left in place (:meth:`start` takes it)."""
        raw = await self.redis.lindex(keys.instance_queue(instance_id), 0)
        return _s(raw) if raw is not None else None

    async def _load(self, run_id: str) -> tuple[RunRecord, RunRequest] | None:
        return _parse(await self.redis.hgetall(keys.run(run_id)))

    async def load_many(
        self, run_ids: list[str]
    ) -> list[tuple[RunRecord, RunRequest] | ValueError | None]:
        """Record and request of each run (None: gone; the ValueError of a corrupt
        record), in one round trip; no tenant check (the owning instance)."""
        pipe = self.redis.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hgetall(keys.run(run_id))
        out: list[tuple[RunRecord, RunRequest] | ValueError | None] = []
        for raw in await pipe.execute():
            try:
                out.append(_parse(raw))
            except ValueError as exc:
                out.append(exc)
        return out

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

    async def runs_for_shared(self, shared_run_ids: list[str]) -> list[str | None]:
        """:meth:`run_for_shared` for many SharedRunIds in one call."""
        if not shared_run_ids:
            return []
        raws = await self.redis.mget([keys.shared_run_to_run(i) for i in shared_run_ids])
        return [_s(r) if r is not None else None for r in raws]

    async def owners(self, run_ids: list[str]) -> list[tuple[str | None, str | None]]:
        """(status, instance id) of each run (Nones: no record), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hmget(keys.run(run_id), "status", "instance_id")
        return [
            (_s(st) if st is not None else None, _s(iid) if iid is not None else None)
            for st, iid in await pipe.execute()
        ]

    async def tenants_of(self, run_ids: list[str]) -> list[str | None]:
        """The tenant of each run (None: no record), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hget(keys.run(run_id), "tenant_id")
        return [_s(r) if r is not None else None for r in await pipe.execute()]

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


def _parse(raw: dict[Any, Any]) -> tuple[RunRecord, RunRequest] | None:
    """A run hash as (record, request); None when empty, ValueError when corrupt."""
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
        step_slots=json.loads(m["step_slots"]) if m.get("step_slots") else None,
    )
    return record, RunRequest.model_validate_json(m["request"])
