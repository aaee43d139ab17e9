"""Shared runs: what the control plane knows of a run from submission to its end.

A *shared run* (SharedRunId) exists from submission, before any runtime is chosen:
it persists the pipeline, the inputs and the ExecutionContextSnapshot, and later the
RunId, the assigned instance and how the run ended. Its status moves only along
:data:`SHARED_RUN_TRANSITIONS`, and every status change is a compare-and-set
(:meth:`SharedRunStore.transition`: WATCH on the record, the table checked against
the record as it is when the write lands), so a move that lost a race -- a cancel that
landed between submit's create and its queueing, or between the requeuer's read and
its write -- is refused instead of written over the winner. Where a run waits
meanwhile is the shared queue (:mod:`~airuntime.control_plane.shared_queue`).

Keys, all in the control slot (``{air}``): ``air:{air}:srun:<SharedRunId>`` (the
record, JSON), ``air:{air}:sruns`` zset (all, by creation), ``air:{air}:sruns:tenant:<t>``
zset, ``air:{air}:sruns:open`` zset (not terminal: the reconciler's work list) with
``air:{air}:sruns:open:tenant`` (hash: each open run's tenant) and
``air:{air}:sruns:finished`` zset (terminal, by finish time: retention's work list);
the indexes change in the same transaction as the record. A submitted run is created
QueuedGlobally in one script (:meth:`SharedRunStore.create_queued`); its queue item
lives in its tenant's queue slot, so the submitter enqueues it right after (see
``submitSharedRun-7.lua`` for what a cancel or a crash in between does).
"""

from __future__ import annotations

import builtins
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from airuntime.control_plane.json_records import update_record, update_records
from airuntime.control_plane.submit_idempotency import SubmitIdempotency
from airuntime.core import keys
from airuntime.core.context import ExecutionContextSnapshot
from airuntime.core.parsed_records import ParsedRecords
from airuntime.core.redis_client import RedisClient
from airuntime.core.reply_text import reply_text as _s
from airuntime.core.scripts import ScriptCall, library
from airuntime.core.slots import ensure_transaction_slot
from airuntime.fleet.registry import Registry

log = logging.getLogger(__name__)

SHARED_RUN_ID_PATTERN: Final = r"^sr-[0-9a-f]{32}$"
"""What :meth:`SharedRunStore.new_id` makes; the API refuses any other path id (422)."""


class SharedRunStatus(StrEnum):
    SUBMITTED = "Submitted"
    QUEUED_GLOBALLY = "QueuedGlobally"
    DISPATCHED = "Dispatched"
    SCALE_OUT_REQUESTED = "ScaleOutRequested"
    REJECTED = "Rejected"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"

    def can_become(self, status: SharedRunStatus) -> bool:
        """Whether a shared run may move from this status to ``status`` (recording the
        same status again is always allowed)."""
        return status == self or status in SHARED_RUN_TRANSITIONS[self]

    @property
    def terminal(self) -> bool:
        """The run has ended: nothing dispatches it any more (Rejected may still be
        cancelled, which changes nothing but its status)."""
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES: Final = frozenset(
    {
        SharedRunStatus.SUCCEEDED,
        SharedRunStatus.FAILED,
        SharedRunStatus.CANCELLED,
        SharedRunStatus.REJECTED,
    }
)

_ENDED: Final = frozenset({SharedRunStatus.SUCCEEDED, SharedRunStatus.FAILED})

SHARED_RUN_TRANSITIONS: Final[Mapping[SharedRunStatus, frozenset[SharedRunStatus]]] = {
    # submit persists the run, then queues it (a cancel may come first).
    SharedRunStatus.SUBMITTED: frozenset(
        {SharedRunStatus.QUEUED_GLOBALLY, SharedRunStatus.CANCELLED}
    ),
    # Dispatch-time admission decides (Dispatched only once the runtime accepted);
    # cancel may land at any point before. The runtime's outcome may overtake the
    # pump's record of the dispatch (a run that finished before the pump wrote
    # Dispatched): it ends the run from here.
    SharedRunStatus.QUEUED_GLOBALLY: frozenset(
        {
            SharedRunStatus.DISPATCHED,
            SharedRunStatus.SCALE_OUT_REQUESTED,
            SharedRunStatus.REJECTED,
            SharedRunStatus.CANCELLED,
            *_ENDED,
        }
    ),
    # The requeuer puts the run back once the scale-out request is finished.
    SharedRunStatus.SCALE_OUT_REQUESTED: frozenset(
        {SharedRunStatus.QUEUED_GLOBALLY, SharedRunStatus.CANCELLED}
    ),
    SharedRunStatus.REJECTED: frozenset({SharedRunStatus.CANCELLED}),
    # The runtime run's outcome ends it (a cancel cancels the runtime run first).
    SharedRunStatus.DISPATCHED: frozenset({SharedRunStatus.CANCELLED, *_ENDED}),
    SharedRunStatus.SUCCEEDED: frozenset(),
    SharedRunStatus.FAILED: frozenset(),
    SharedRunStatus.CANCELLED: frozenset(),
}
"""Which status a shared run may move to from each status."""


class SharedRun(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

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
    finished_at_ms: int | None = None
    """When the run reached a terminal status (retention counts from here)."""
    replay_of: str | None = None
    """The SharedRunId this run replays (``POST /v1/runs/{id}/replay``), if any."""


_PARSED: Final = ParsedRecords(SharedRun)


def parse_shared_run(raw: bytes | str) -> SharedRun:
    """The shared run stored as ``raw``; the text a read returned before (the usual
    case: each step of a run reads what the step before wrote) is not parsed again."""
    return _PARSED.parse(raw)


@dataclass(frozen=True, slots=True)
class Transition:
    """What :meth:`SharedRunStore.transition` did: ``run`` is the record as it is now."""

    run: SharedRun
    moved: bool
    """Whether the status changed. False when the table did not allow the move from the
    record's current status (a concurrent writer won) or the caller's ``expect`` did
    not hold -- nothing written -- and when the run already had ``status`` (the
    changes were recorded, the status stayed)."""


def _now() -> int:
    return int(time.time() * 1000)


def _moved(
    run: SharedRun,
    status: SharedRunStatus,
    expect: frozenset[SharedRunStatus] | None,
    changes: dict[str, Any],
) -> SharedRun | None:
    """``run`` moved to ``status`` with ``changes``; None when the table (or ``expect``)
    does not allow the move from its current status."""
    if not run.status.can_become(status) or (expect is not None and run.status not in expect):
        return None
    now = _now()
    extra: dict[str, Any] = {"status": status, "updated_at_ms": now}
    if status.terminal and run.finished_at_ms is None:
        extra["finished_at_ms"] = now
    return run.model_copy(update={**changes, **extra})


def _index_terminal(pipe: Any, changed: list[tuple[SharedRun, SharedRun]]) -> None:
    """Index upkeep in the same transaction: the runs that ended leave the open index
    for the finished one and the archive outbox (four commands for them all)."""
    ended = {
        a.shared_run_id: a.finished_at_ms or a.updated_at_ms
        for _, a in changed
        if a.status.terminal
    }
    if ended:
        pipe.zrem(keys.shared_runs_open(), *ended)
        pipe.hdel(keys.shared_runs_open_tenants(), *ended)
        pipe.zadd(keys.shared_runs_finished(), ended)
        pipe.zadd(keys.shared_run_archive_outbox(), ended, nx=True)


SETTINGS_CHANGED = -2
"""``submitSharedRun``: the tenant's settings are no longer those the pipeline was
compiled against; nothing was written."""
IDEMPOTENT_REPLAY = -3
"""``submitSharedRun``: the idempotency key was used already (the reply is ``[-3,
"<SharedRunId> <fingerprint>"]``); nothing was written."""


def check_created(run: SharedRun, reply: Any) -> None:
    """Raise unless ``submitSharedRun`` created ``run`` (1), or this very call did
    before its reply was lost (0)."""
    code = int(reply)
    if code == SETTINGS_CHANGED:
        raise ValueError(
            f"shared run {run.shared_run_id} not created: tenant "
            f"{run.snapshot.tenant_id!r}'s settings changed since they were read"
        )
    if code < 0:
        raise ValueError(f"shared run {run.shared_run_id} exists already")


class SharedRunStore:
    """Shared run records (one JSON document per run; tenant, open and finished indexes)."""

    def __init__(self, redis: RedisClient) -> None:
        self.redis = redis

    @staticmethod
    def new_id() -> str:
        return f"sr-{uuid.uuid4().hex}"

    async def create(self, run: SharedRun) -> None:
        """Persist a new run and index it (all runs, its tenant's runs, open runs)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(keys.shared_run(run.shared_run_id), run.model_dump_json())
        pipe.zadd(keys.shared_runs(), {run.shared_run_id: run.created_at_ms})
        pipe.zadd(
            keys.shared_runs_by_tenant(run.snapshot.tenant_id),
            {run.shared_run_id: run.created_at_ms},
        )
        pipe.zadd(keys.shared_runs_open(), {run.shared_run_id: run.created_at_ms})
        pipe.hset(keys.shared_runs_open_tenants(), run.shared_run_id, run.snapshot.tenant_id)
        ensure_transaction_slot("SharedRunStore.create", pipe)
        await pipe.execute()

    async def create_queued(self, run: SharedRun) -> None:
        """Persist a new QueuedGlobally run and index it, in one script
        (``submitSharedRun-7.lua``), against its tenant's settings as they are now; the
        caller then enqueues its item
        (:meth:`SharedQueue.enqueue <airuntime.control_plane.shared_queue.SharedQueue.enqueue>`)."""
        _, text = await Registry(self.redis).tenant_with_text(run.snapshot.tenant_id)
        call = self.create_call(run, text)
        reply = await library().call(self.redis, call.name, call.keys, call.args)
        check_created(run, reply)

    @staticmethod
    def create_call(
        run: SharedRun, settings_text: bytes, idempotency: SubmitIdempotency | None = None
    ) -> ScriptCall:
        """The script call of :meth:`create_queued`, for a caller that sends it with
        others; :func:`check_created` judges its reply. ``settings_text``: the tenant's
        settings the run's pipeline was compiled against, as stored (``b""``: none
        stored); the script creates nothing when they changed since
        (:data:`SETTINGS_CHANGED`). ``idempotency``: the key it sets with the record,
        or, when the key was used already, creates nothing and answers
        (:data:`IDEMPOTENT_REPLAY`, the stored value)."""
        if run.status is not SharedRunStatus.QUEUED_GLOBALLY:
            raise ValueError(f"create_queued needs a QueuedGlobally run, got {run.status}")
        tenant_id = run.snapshot.tenant_id
        return ScriptCall(
            "submitSharedRun",
            [
                keys.shared_run(run.shared_run_id),
                keys.shared_runs(),
                keys.shared_runs_by_tenant(tenant_id),
                keys.shared_runs_open(),
                keys.shared_runs_open_tenants(),
                keys.tenant_settings(tenant_id),
                # Without a key, KEYS[7] is a key of the slot the script never touches.
                idempotency.key if idempotency else keys.shared_runs(),
            ],
            [
                run.shared_run_id,
                run.model_dump_json(),
                run.created_at_ms,
                tenant_id,
                settings_text,
                idempotency.value(run.shared_run_id) if idempotency else "",
                idempotency.ttl_ms if idempotency else 0,
            ],
        )

    async def get(self, shared_run_id: str) -> SharedRun | None:
        raw = await self.redis.get(keys.shared_run(shared_run_id))
        return parse_shared_run(raw) if raw else None

    async def get_many(self, shared_run_ids: list[str]) -> list[SharedRun]:
        if not shared_run_ids:
            return []
        raws = await self.redis.mget([keys.shared_run(i) for i in shared_run_ids])
        return [parse_shared_run(r) for r in raws if r]

    async def get_for_tenant(self, shared_run_id: str, tenant_id: str) -> SharedRun | None:
        run = await self.get(shared_run_id)
        return run if run is not None and run.snapshot.tenant_id == tenant_id else None

    async def require(self, shared_run_id: str) -> SharedRun:
        run = await self.get(shared_run_id)
        if run is None:
            raise KeyError(f"shared run {shared_run_id} does not exist")
        return run

    async def update(self, shared_run_id: str, **changes: Any) -> SharedRun:
        """Change fields other than the status (read-modify-write under WATCH)."""
        if "status" in changes:
            raise ValueError("a status change goes through transition()")
        updated = await update_record(
            self.redis,
            keys.shared_run(shared_run_id),
            SharedRun,
            lambda run: run.model_copy(update={**changes, "updated_at_ms": _now()}),
            records=_PARSED,
        )
        if updated is None:
            raise KeyError(f"shared run {shared_run_id} does not exist")
        return updated[1]

    async def transition(
        self,
        shared_run_id: str,
        status: SharedRunStatus,
        *,
        expect: frozenset[SharedRunStatus] | None = None,
        **changes: Any,
    ) -> Transition:
        """Compare-and-set: move the run to ``status`` with ``changes`` only if
        :data:`SHARED_RUN_TRANSITIONS` allows it from the status the record has when
        the write lands (and, with ``expect``, that status is one of those).

        Moving to a terminal status also moves the run from the open index to the
        finished one, in the same transaction. KeyError when the run does not exist.
        With the status it already has, only ``changes`` are recorded (``moved`` False).
        """
        refused: list[SharedRun] = []

        def apply(run: SharedRun) -> SharedRun | None:
            refused.clear()
            moved = _moved(run, status, expect, changes)
            if moved is None:
                refused.append(run)
            return moved

        key = keys.shared_run(shared_run_id)
        updated = await update_record(
            self.redis, key, SharedRun, apply, also=_index_terminal, records=_PARSED
        )
        if updated is not None:
            before, after = updated
            return Transition(after, moved=before.status is not after.status)
        if refused:
            current = refused[0]
            if current.status is not status:
                log.info(
                    "shared run %s stays %s: not moved to %s (a concurrent change won)",
                    shared_run_id,
                    current.status,
                    status,
                )
            return Transition(current, moved=False)
        raise KeyError(f"shared run {shared_run_id} does not exist")

    async def transition_many(
        self,
        moves: builtins.list[tuple[str, dict[str, Any]]],
        status: SharedRunStatus,
        *,
        expect: frozenset[SharedRunStatus] | None = None,
    ) -> builtins.list[Transition | None]:
        """:meth:`transition` of many runs to ``status`` (each with its own changes) in
        one transaction; None for a run that does not exist."""
        return await self._update_many(
            [srid for srid, _ in moves],
            lambda i, run: _moved(run, status, expect, moves[i][1]),
        )

    async def record_dispatched(
        self, moves: builtins.list[tuple[str, dict[str, Any]]]
    ) -> builtins.list[Transition | None]:
        """Record that a runtime accepted these runs, in one transaction: a run still
        QueuedGlobally moves to Dispatched with its changes (``run_id``, the instance,
        the pump's identity); a run whose runtime already reported its end (the outcome
        reader can win the race with the pump) keeps its terminal status and reason but
        gains the dispatch fields, so the record says who dispatched it whichever write
        landed first. Any other status (cancelled while queued, another RunId) is left
        as it is. None for a run that does not exist."""

        def apply(i: int, run: SharedRun) -> SharedRun | None:
            changes = moves[i][1]
            if run.status is SharedRunStatus.QUEUED_GLOBALLY:
                return _moved(run, SharedRunStatus.DISPATCHED, None, changes)
            if run.status.terminal and run.run_id == changes.get("run_id"):
                kept = {k: v for k, v in changes.items() if k != "reason"}
                return run.model_copy(update={**kept, "updated_at_ms": _now()})
            return None

        return await self._update_many([srid for srid, _ in moves], apply)

    async def transition_each(
        self,
        ids: builtins.list[str],
        decide: Callable[[int, SharedRun], tuple[SharedRunStatus, dict[str, Any]] | None],
        *,
        always: Callable[[Any], None] | None = None,
    ) -> builtins.list[Transition | None]:
        """Many runs, each to the status and changes ``decide(i, record)`` picks from the
        record as the transaction reads it (None: leave it), in one transaction and as
        the table allows (:meth:`transition`); None for a run that does not exist.
        ``decide`` may be called again for a record when a concurrent write retried
        the transaction. ``always(pipe)`` queues further writes of the control slot
        into the same transaction (see :func:`~.json_records.update_records`)."""

        def apply(i: int, run: SharedRun) -> SharedRun | None:
            decided = decide(i, run)
            return None if decided is None else _moved(run, decided[0], None, decided[1])

        return await self._update_many(ids, apply, always)

    async def _update_many(
        self,
        ids: builtins.list[str],
        apply: Callable[[int, SharedRun], SharedRun | None],
        always: Callable[[Any], None] | None = None,
    ) -> builtins.list[Transition | None]:
        """``apply(i, record)`` to the records of ``ids`` in one transaction (index
        upkeep included); each run's :class:`Transition`, None where it does not exist."""
        records = await update_records(
            self.redis,
            [keys.shared_run(srid) for srid in ids],
            SharedRun,
            apply,
            also=_index_terminal,
            records=_PARSED,
            always=always,
        )
        missing = [srid for srid, pair in zip(ids, records, strict=True) if pair is None]
        current = {r.shared_run_id: r for r in await self.get_many(missing)}
        out: builtins.list[Transition | None] = []
        for srid, pair in zip(ids, records, strict=True):
            if pair is not None:
                out.append(Transition(pair[1], moved=pair[0].status is not pair[1].status))
            else:
                run = current.get(srid)
                out.append(None if run is None else Transition(run, moved=False))
        return out

    async def list(self, tenant_id: str | None = None, limit: int = 100) -> list[SharedRun]:
        index = keys.shared_runs_by_tenant(tenant_id) if tenant_id else keys.shared_runs()
        ids = await self.redis.zrevrange(index, 0, limit - 1)
        return await self.get_many([_s(i) for i in ids])

    async def open_ids(
        self, start: int, count: int, *, created_before_ms: int | None = None
    ) -> builtins.list[str]:
        """A page of the open index, oldest first; with ``created_before_ms``, only the
        runs created at or before it (the index's score is the creation time)."""
        if created_before_ms is None:
            ids = await self.redis.zrange(keys.shared_runs_open(), start, start + count - 1)
        else:
            ids = await self.redis.zrangebyscore(
                keys.shared_runs_open(), "-inf", created_before_ms, start=start, num=count
            )
        return [_s(i) for i in ids]

    async def finished_before(self, cutoff_ms: int, start: int, count: int) -> builtins.list[str]:
        """A page of the terminal runs that finished at or before ``cutoff_ms``, oldest first."""
        ids = await self.redis.zrangebyscore(
            keys.shared_runs_finished(), "-inf", cutoff_ms, start=start, num=count
        )
        return [_s(i) for i in ids]
