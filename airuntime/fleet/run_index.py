"""The run execution index and each runtime instance's local queue, in Redis.

Why this module exists: a run accepted by a runtime instance must survive that
instance (another one adopts it), must be accepted once whatever delivers it how often,
must tell the control plane when it ends, and must not stay in Redis forever. Every
change of a run is therefore one Lua script, so nothing is ever half-written:

* ``acceptRun-4.lua`` -- idempotent by SharedRunId: the existing RunId, or the mapping,
  the record and the index entries, all at once (``acceptQueuedRun-5.lua`` on a
  standalone server: the same, and the local queue's room and push in that step);
* ``startRun-3.lua`` -- the head of a local queue becomes running with its ExecutionId,
  only if it is still queued and still that instance's;
* ``finishRun-6.lua`` -- terminal status, out of the indexes, the
  :class:`~airuntime.fleet.outcomes.RunOutcome` appended, retention started;
* ``adoptRun-1.lua`` -- ownership moves from a dead (unregistered) instance to a live
  one (compare-and-set).

Keys (the table in :mod:`airuntime.core.keys` names each one's owner): the run hash
``<bucket>:run:<RunId>`` (record + request, so another instance can adopt the run), the
mapping ``<bucket>:shared-run:<SharedRunId>``, the state indexes
``<bucket>:runs:queued|running``, the tenant index ``<bucket>:runs:tenant:<tenant>``, the
retention index ``<bucket>:runs:retention`` and the outcome stream
``<bucket>:run-outcomes``, where ``<bucket>`` is the control slot ``air:{air}`` on a
standalone server and one of :data:`~airuntime.core.keys.CLUSTER_RUN_BUCKETS` slots
``air:{rb:<b>:<n>}`` on a cluster (``b`` = crc32(RunId) % 16; a RunId is drawn in its
SharedRunId's bucket, so every script touches one slot and the run index spreads over
the shards). Readers of the indexes iterate the buckets.

The local queue ``...instance:<id>:queue`` holds runs of every bucket, so it is in its
own slot on a cluster (on a standalone server it is in the control slot with the runs,
and acceptance pushes it in the same script), and each other transition that touches it
is two single-slot steps, as is acceptance on a cluster: the script in the run's bucket,
then the queue push (accept) or removal (start, finish). A crash between them leaves
either a queue entry of a run that is no longer queued there -- the controller drops it
when it reaches it -- or, after acceptance, a queued run in no queue, which its owner's
periodic sweep (:meth:`RunIndex.repair_queue`) pushes. No run is lost; none starts twice
(only ``startRun`` starts one, once).

Retention: a finished run's record and mapping expire after ``retention_s`` (Redis
TTL); its tenant index entry is removed by :meth:`RunIndex.prune`, which every runtime
instance runs periodically and the control plane may call.

Reads by RunId take the caller's tenant: a run of another tenant answers "not
found" (``None``), never its data.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from airuntime.core import keys
from airuntime.core.context import ExecutionContextSnapshot
from airuntime.core.errors import AirError, ScriptError
from airuntime.core.execution_layout import LayoutGuard
from airuntime.core.redis_client import RedisClient, server_ms
from airuntime.core.reply_text import reply_text as _s
from airuntime.core.run_layout import check_run_layout, new_run_id, run_buckets_for
from airuntime.core.script_batching import ScriptBatcher
from airuntime.core.scripts import ScriptCall, ScriptLibrary, library
from airuntime.fleet.outcomes import OUTCOMES_MAXLEN
from airuntime.fleet.runs import RunRecord, RunRequest, RunStatus
from airuntime.fleet.tenancy import TenantSettings, stored_settings

__all__ = [
    "DEFAULT_RUN_RETENTION_S",
    "QueueFull",
    "RunIndex",
    "SharedRunConflict",
]

DEFAULT_RUN_RETENTION_S = 7 * 24 * 3600
"""How long a finished run's record stays readable (seconds): 7 days, as executions."""

REMEMBERED_ACCEPTS = 1024
"""How many accepted runs an index remembers for :meth:`RunIndex.load_queued` (more
than a controller starts at once; a forgotten one is read back). Each entry holds its
run's request (pipeline and inputs), so runs that leave the queue unstarted (cancelled
elsewhere, adopted) must not pile up: the oldest go first past this bound."""

_MAX_REASON = 2000


@dataclass(frozen=True)
class StartedBatch:
    """What :meth:`RunIndex.start_batch` did and read."""

    started: list[bool]
    """Per start: the run was queued there and is running now."""
    tenants: dict[str, TenantSettings]
    """The settings of the tenants asked for (the Shared defaults where none are stored)."""


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
        self.calls = ScriptBatcher(redis, self.scripts)
        """Finishes of concurrent runs, sent together (:mod:`airuntime.core.script_batching`)."""
        self.retention_s = retention_s
        self.buckets = run_buckets_for(redis)
        self._layout = LayoutGuard(lambda: check_run_layout(redis))
        self._fresh: OrderedDict[str, tuple[RunRecord, RunRequest]] = OrderedDict()
        """Runs this index accepted into a queue and nobody loaded yet, as the acceptance
        wrote them (at most :data:`REMEMBERED_ACCEPTS`, oldest dropped first; a run
        cancelled or dropped from the queue through this index is forgotten at once): what
        :meth:`load_queued` hands the controller without reading the records back."""

    def run_key(self, run_id: str) -> str:
        """The record of ``run_id`` in this client's layout."""
        return keys.run(run_id, self.buckets)

    def queue_key(self, instance_id: str) -> str:
        """The local queue of ``instance_id`` in this client's layout."""
        return keys.instance_queue(instance_id, self.buckets)

    def outcome_streams(self) -> list[str]:
        """The outcome stream of every bucket (one on a standalone server)."""
        return [b.outcomes for b in keys.run_buckets(self.buckets)]

    # -- writes ------------------------------------------------------------------------

    async def _check_layout(self) -> None:
        await self._layout.ensure()

    async def accept(
        self, instance_id: str, request: RunRequest, *, queue_capacity: int = 2**31
    ) -> tuple[str, bool]:
        """Queue ``request`` on ``instance_id``; return (RunId, created).

        Idempotent by SharedRunId: every delivery after the first, to any instance,
        returns the first RunId and writes nothing. Raises :class:`QueueFull` when the
        local queue already holds ``queue_capacity`` runs (read by the script itself on a
        standalone server; on a cluster just before the script, so concurrent accepts
        on one instance may overshoot it by the accepts in flight),
        :class:`SharedRunConflict` when the SharedRunId's run belongs to another tenant.
        """
        answer = (await self._accept_all(instance_id, [request], queue_capacity))[0]
        if isinstance(answer, QueueFull | SharedRunConflict):
            raise answer
        return answer

    async def accept_many(
        self,
        instance_id: str,
        requests: list[RunRequest],
        *,
        queue_capacity: int = 2**31,
        queued: int | None = None,
    ) -> list[tuple[str, bool] | QueueFull | SharedRunConflict]:
        """:meth:`accept` for a batch delivered to one instance, in one round trip per
        step (each run still accepted atomically on its own, in order; the created
        ones are pushed to the queue in that order); one answer per request.
        ``queued``: the local queue's length, if the caller just read it (with the
        batch's other reads); otherwise it is read here."""
        return await self._accept_all(instance_id, requests, queue_capacity, queued)

    async def _accept_all(
        self,
        instance_id: str,
        requests: list[RunRequest],
        capacity: int,
        queued: int | None = None,
    ) -> list[tuple[str, bool] | QueueFull | SharedRunConflict]:
        if not requests:
            return []
        await self._check_layout()
        queue = self.queue_key(instance_id)
        if self.buckets == 1:
            # The queue shares the runs' slot: each script reads the room and pushes
            # the run it created, at once (acceptQueuedRun-5).
            calls = [self._accept_call(instance_id, r, capacity, queue=queue) for r in requests]
            replies = await self.scripts.call_many(self.redis, "acceptQueuedRun", calls)
        else:
            # The queue is in another slot than the runs: its room is read first (a
            # batch takes room in order), the created runs are pushed after their scripts.
            if queued is None:
                queued = int(await self.redis.llen(queue))
            room = capacity - queued
            calls = [
                self._accept_call(instance_id, r, "1" if i < room else "0")
                for i, r in enumerate(requests)
            ]
            replies = await self.scripts.call_many(self.redis, "acceptRun", calls)
            created = [_s(r[1]) for r in replies if not isinstance(r, Exception) and int(r[0]) == 1]
            if created:
                await self.redis.rpush(queue, *created)
        out: list[tuple[str, bool] | QueueFull | SharedRunConflict] = []
        for request, reply in zip(requests, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            try:
                out.append(await self._accepted(instance_id, request, capacity, reply))
            except (QueueFull, SharedRunConflict) as exc:
                out.append(exc)
        return out

    def _accept_call(
        self, instance_id: str, request: RunRequest, room: str | int, *, queue: str | None = None
    ) -> tuple[list[str], list[str | int]]:
        """Keys and arguments of acceptRun (``room``: '1' or '0'), or, with the local
        ``queue`` (same slot), of acceptQueuedRun (``room``: the queue's capacity)."""
        snap = request.snapshot
        candidate = new_run_id(request.shared_run_id, self.buckets)
        bucket = keys.run_bucket_of(candidate, self.buckets)
        return (
            [
                bucket.shared_run_to_run(request.shared_run_id),
                bucket.run(candidate),
                bucket.by_tenant(snap.tenant_id),
                bucket.in_state(RunStatus.QUEUED),
                *([queue] if queue is not None else []),
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
                room,
            ],
        )

    async def create_unqueued(self, instance_id: str, request: RunRequest) -> str | None:
        """Only the first step of :meth:`accept` (the record, the mapping, the indexes;
        not the queue push): what a caller that dies between the two leaves behind.
        For tests of :meth:`repair_queue`; the RunId, or None if the SharedRunId had one."""
        await self._check_layout()
        reply: Any = await self.scripts.call(
            self.redis, "acceptRun", *self._accept_call(instance_id, request, "1")
        )
        return _s(reply[1]) if int(reply[0]) == 1 else None

    async def _accepted(
        self, instance_id: str, request: RunRequest, queue_capacity: int, reply: Any
    ) -> tuple[str, bool]:
        snap = request.snapshot
        code = int(reply[0])
        if code == 1:
            run_id = _s(reply[1])
            self._remember(instance_id, request, run_id, int(reply[2]))
            return run_id, True
        if code == 2:
            raise QueueFull(instance_id, queue_capacity)
        if code != 0:
            raise ScriptError(f"acceptRun returned {reply!r}")
        existing = _s(reply[1])
        owner = await self.redis.hget(self.run_key(existing), "tenant_id")
        if owner is not None and _s(owner) != snap.tenant_id:
            raise SharedRunConflict(
                f"SharedRunId {request.shared_run_id} already has a run of another tenant; "
                f"refused for tenant {snap.tenant_id}."
            )
        return existing, False

    def _remember(
        self, instance_id: str, request: RunRequest, run_id: str, created_at_ms: int
    ) -> None:
        """Keep the record the acceptance script just wrote (same fields, same values)."""
        snap = request.snapshot
        record = RunRecord(
            run_id=run_id,
            shared_run_id=request.shared_run_id,
            instance_id=instance_id,
            tenant_id=snap.tenant_id,
            tenant_group_id=snap.tenant_group_id or None,
            status=RunStatus.QUEUED,
            created_at_ms=created_at_ms,
            snapshot=snap,
            metadata=dict(request.metadata),
        )
        self._fresh[run_id] = (record, request)
        if len(self._fresh) > REMEMBERED_ACCEPTS:
            self._fresh.popitem(last=False)

    async def start_many(
        self,
        instance_id: str,
        starts: list[tuple[str, str]],
        metadata: list[dict[str, str]] | None = None,
    ) -> list[bool]:
        """:meth:`start` of many ``(run_id, execution_id)`` in one round trip (each run
        started atomically on its own), then out of the local queue; one answer per
        run. ``metadata``: per start, entries merged into the record's metadata by the
        start itself (a run not started gets none)."""
        return (await self.start_batch(instance_id, starts, metadata)).started

    async def start_batch(
        self,
        instance_id: str,
        starts: list[tuple[str, str]],
        metadata: list[dict[str, str]] | None = None,
        tenant_ids: Iterable[str] = (),
    ) -> StartedBatch:
        """:meth:`start_many`, also reading the settings of ``tenant_ids`` (the runs'
        tenants, for their start) with it: on a standalone server the start scripts,
        the queue removals and the read are one round trip, in that order."""
        tenants = sorted(set(tenant_ids))
        if not starts:
            return StartedBatch([], {})
        extra = metadata if metadata is not None else [{}] * len(starts)
        calls = []
        for (run_id, execution_id), more in zip(starts, extra, strict=True):
            bucket = keys.run_bucket_of(run_id, self.buckets)
            calls.append(
                ScriptCall(
                    "startRun",
                    [
                        bucket.run(run_id),
                        bucket.in_state(RunStatus.QUEUED),
                        bucket.in_state(RunStatus.RUNNING),
                    ],
                    [run_id, instance_id, execution_id, json.dumps(more) if more else ""],
                )
            )
        # Started or not, each leaves the queue (see startRun) after its start; a crash
        # in between leaves entries of runs that are not queued, which the controller
        # drops.
        queue = self.queue_key(instance_id)
        then: list[list[str | int]] = [["LREM", queue, 0, run_id] for run_id, _ in starts]
        if tenants:
            then.append(["MGET", *(keys.tenant_settings(t) for t in tenants)])
        replies = await self.scripts.call_in_order(self.redis, calls, then)
        settings: dict[str, TenantSettings] = {}
        if tenants:
            raws = replies[-1]
            settings = {t: stored_settings(t, raw) for t, raw in zip(tenants, raws, strict=True)}
        return StartedBatch([int(r[0]) == 1 for r in replies[: len(calls)]], settings)

    async def start(self, instance_id: str, run_id: str, execution_id: str) -> bool:
        """Start ``run_id`` on ``instance_id`` with ``execution_id``; False when it is no
        longer queued there (it only left the queue)."""
        return (await self.start_many(instance_id, [(run_id, execution_id)]))[0]

    async def finish(
        self,
        record: RunRecord,
        status: RunStatus,
        *,
        reason: str | None = None,
        execution_id: str | None = None,
        step_slots: dict[str, int] | None = None,
        only_if: RunStatus | None = None,
        after: Sequence[ScriptCall] = (),
    ) -> bool:
        """Mark the run terminal and append its RunOutcome, in one step (then a run that
        was queued leaves its queue); False when it was already terminal (or not in
        ``only_if``): then nothing changed. ``after``: script calls that must run before
        the finish (the runtime's evidence for the ledger), sent with it in one round trip
        where the server keeps the order (:meth:`ScriptLibrary.call_in_order`)."""
        if not status.terminal:
            raise ValueError(f"finish needs a terminal status, got {status.value}")
        bucket = keys.run_bucket_of(record.run_id, self.buckets)
        finish = ScriptCall(
            "finishRun",
            [
                bucket.run(record.run_id),
                bucket.in_state(RunStatus.QUEUED),
                bucket.in_state(RunStatus.RUNNING),
                bucket.outcomes,
                bucket.shared_run_to_run(record.shared_run_id),
                bucket.retention,
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
        replies = await self.calls.call_in_order([*after, finish])
        reply: Any = replies[-1]
        if int(reply[0]) != 1:
            return False
        if _s(reply[2]) == RunStatus.QUEUED.value:
            await self.remove_queued(record.instance_id, record.run_id)
        return True

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
        self._fresh.pop(record.run_id, None)
        return await self.finish(
            record, RunStatus.CANCELLED, reason=reason, only_if=RunStatus.QUEUED
        )

    async def set_metadata(self, run_id: str, values: dict[str, str]) -> None:
        raw = await self.redis.hget(self.run_key(run_id), "metadata")
        if raw is None:
            return  # gone (retention): never recreate a record without its TTL
        merged = {**json.loads(raw), **values}
        await self.redis.hset(self.run_key(run_id), "metadata", json.dumps(merged, sort_keys=True))

    async def remove_queued(self, instance_id: str, run_id: str) -> bool:
        self._fresh.pop(run_id, None)
        return int(await self.redis.lrem(self.queue_key(instance_id), 0, run_id)) > 0

    async def requeue(self, instance_id: str, run_id: str) -> None:
        """Put an adopted queued run at the end of ``instance_id``'s queue."""
        await self.redis.rpush(self.queue_key(instance_id), run_id)

    async def adopt(
        self, run_id: str, dead_instance: str, new_instance: str, status: RunStatus
    ) -> bool:
        """Compare-and-set ownership from a dead instance to ``new_instance`` of a run
        the caller saw in ``status`` (queued or running); refused while
        ``dead_instance`` is registered (checked just before: the descriptor is in
        another slot than the run on a cluster, see adoptRun) and when the run's status
        changed since (its owner came back and started it)."""
        if await self.redis.exists(keys.instance(dead_instance)):
            return False
        reply = await self.scripts.call(
            self.redis,
            "adoptRun",
            [self.run_key(run_id)],
            [dead_instance, new_instance, int(time.time() * 1000), status.value],
        )
        return int(reply) == 1

    async def repair_queue(
        self, instance_id: str, own_queued: list[str], *, min_age_ms: int
    ) -> list[str]:
        """Push the runs of ``own_queued`` (runs this instance owns, read as queued from
        the indexes before this call) that are missing from its queue and were accepted
        (or adopted) at least ``min_age_ms`` ago by Redis time: what a crash between
        acceptance's two steps (or an adoption's) leaves behind. Returns them.

        A run is queued in its bucket just before it is pushed, so a young run missing
        here is most likely being accepted right now: the age keeps the sweep from
        pushing it a second time. A duplicate entry would still be harmless (the first
        start removes every entry of a run, the controller drops an entry of a run that
        is not queued); a run lost for good waits ``min_age_ms`` at most one sweep more."""
        if not own_queued:
            return []
        queued = {_s(r) for r in await self.redis.lrange(self.queue_key(instance_id), 0, -1)}
        missing = [r for r in own_queued if r not in queued]
        if not missing:
            return []
        oldest_ms = await server_ms(self.redis) - min_age_ms
        pipe = self.redis.pipeline(transaction=False)
        for run_id in missing:
            pipe.hmget(
                self.run_key(run_id), "status", "instance_id", "created_at_ms", "adopted_at_ms"
            )
        lost = [
            run_id
            for run_id, (status, owner, created, adopted) in zip(
                missing, await pipe.execute(), strict=True
            )
            if status is not None
            and _s(status) == RunStatus.QUEUED.value
            and owner is not None
            and _s(owner) == instance_id
            and max(int(created or 0), int(adopted or 0)) <= oldest_ms
        ]
        if lost:
            await self.redis.rpush(self.queue_key(instance_id), *lost)
        return lost

    async def prune(self, *, limit: int = 1000) -> int:
        """The retention sweep: remove the tenant index entries (and what is left of the
        records) of runs whose retention has passed, by Redis time, in every bucket
        (up to ``limit`` per bucket); how many."""
        now_ms = await server_ms(self.redis)
        pipe = self.redis.pipeline(transaction=False)
        buckets = keys.run_buckets(self.buckets)
        for bucket in buckets:
            pipe.zrangebyscore(bucket.retention, "-inf", now_ms, start=0, num=limit)
        dues = await pipe.execute()
        pipe = self.redis.pipeline(transaction=False)
        total = 0
        for bucket, due in zip(buckets, dues, strict=True):
            for member in map(_s, due):
                tenant_id, _, run_id = member.partition(":")
                pipe.zrem(bucket.by_tenant(tenant_id), run_id)
                pipe.execute_command("UNLINK", bucket.run(run_id))  # cluster pipelines: one key
                pipe.zrem(bucket.retention, member)
            total += len(due)
        if total:
            await pipe.execute()
        return total

    # -- reads -------------------------------------------------------------------------

    async def queue_length(self, instance_id: str) -> int:
        return int(await self.redis.llen(self.queue_key(instance_id)))

    async def queue_head(self, instance_id: str, count: int) -> list[str]:
        """The first ``count`` runs of ``instance_id``'s queue, left in place."""
        if count < 1:
            return []
        return [_s(r) for r in await self.redis.lrange(self.queue_key(instance_id), 0, count - 1)]

    async def head_of_queue(self, instance_id: str) -> str | None:
        """The next run of ``instance_id``'s queue, left in place (:meth:`start` takes it)."""
        raw = await self.redis.lindex(self.queue_key(instance_id), 0)
        return _s(raw) if raw is not None else None

    async def _load(self, run_id: str) -> tuple[RunRecord, RunRequest] | None:
        return _parse(await self.redis.hgetall(self.run_key(run_id)))

    async def load_many(
        self, run_ids: list[str]
    ) -> list[tuple[RunRecord, RunRequest] | ValueError | None]:
        """Record and request of each run (None: gone; the ValueError of a corrupt
        record), in one round trip; no tenant check (the owning instance)."""
        pipe = self.redis.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hgetall(self.run_key(run_id))
        out: list[tuple[RunRecord, RunRequest] | ValueError | None] = []
        for raw in await pipe.execute():
            try:
                out.append(_parse(raw))
            except ValueError as exc:
                out.append(exc)
        return out

    async def load_queued(
        self, run_ids: list[str]
    ) -> list[tuple[RunRecord, RunRequest] | ValueError | None]:
        """:meth:`load_many` for the controller starting these queued runs: a run this
        index accepted itself comes from memory, as the acceptance wrote it (a round
        trip fewer for a run that arrives alone), the others are read. A remembered
        record may be stale -- the run cancelled or adopted elsewhere since -- which is
        safe for a start: ``startRun`` reads the status and the owner itself and refuses
        a run that is no longer queued on this instance (it only leaves the queue)."""
        found = [self._fresh.pop(run_id, None) for run_id in run_ids]
        missing = [run_id for run_id, hit in zip(run_ids, found, strict=True) if hit is None]
        if not missing:
            return list(found)
        loaded = iter(await self.load_many(missing))
        return [hit if hit is not None else next(loaded) for hit in found]

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
        raw = await self.redis.get(keys.shared_run_to_run(shared_run_id, self.buckets))
        return _s(raw) if raw is not None else None

    async def runs_for_shared(self, shared_run_ids: list[str]) -> list[str | None]:
        """:meth:`run_for_shared` for many SharedRunIds in one round trip."""
        if not shared_run_ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for srid in shared_run_ids:
            pipe.get(keys.shared_run_to_run(srid, self.buckets))
        return [_s(r) if r is not None else None for r in await pipe.execute()]

    async def owners(self, run_ids: list[str]) -> list[tuple[str | None, str | None]]:
        """(status, instance id) of each run (Nones: no record), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hmget(self.run_key(run_id), "status", "instance_id")
        return [
            (_s(st) if st is not None else None, _s(iid) if iid is not None else None)
            for st, iid in await pipe.execute()
        ]

    async def tenants_of(self, run_ids: list[str]) -> list[str | None]:
        """The tenant of each run (None: no record), in one round trip (none for no
        runs: every accept of new runs asks for the owners of none)."""
        if not run_ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hget(self.run_key(run_id), "tenant_id")
        return [_s(r) if r is not None else None for r in await pipe.execute()]

    async def list_for_tenant(self, tenant_id: str, limit: int = 100) -> list[RunRecord]:
        """A tenant's newest ``limit`` runs, newest first (merged over the buckets)."""
        ids = await self._merged([b.by_tenant(tenant_id) for b in self._buckets()], limit, True)
        out = []
        for rid in ids:
            rec = await self.get_for_tenant(rid, tenant_id)
            if rec is not None:
                out.append(rec)
        return out

    async def in_state(self, status: RunStatus, limit: int = 1000) -> list[str]:
        """The oldest ``limit`` runs in ``status`` (queued / running), over the buckets."""
        return await self._merged([b.in_state(status) for b in self._buckets()], limit, False)

    def _buckets(self) -> list[keys.RunBucket]:
        return keys.run_buckets(self.buckets)

    async def _merged(self, zsets: list[str], limit: int, newest: bool) -> list[str]:
        """The first ``limit`` members of several zsets by score (one round trip)."""
        if limit < 1:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for key in zsets:
            if newest:
                pipe.zrevrange(key, 0, limit - 1, withscores=True)
            else:
                pipe.zrange(key, 0, limit - 1, withscores=True)
        pairs = [(float(score), _s(m)) for reply in await pipe.execute() for m, score in reply]
        pairs.sort(key=lambda p: -p[0] if newest else p[0])
        return [m for _, m in pairs[:limit]]


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
