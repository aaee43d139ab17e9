"""One run's material, from hot Redis or from the durable archive, in one shape.

Why this exists: a run is read through several views (details, ledger, trace, report,
replay) and it must read the same before and after retention removes its hot keys.
Every view is computed from a :class:`RunMaterial` only, and this module is the one
place that knows where the material lives: the shared run in ``air:{air}:srun:<SRID>`` or in
``history_shared_runs``; the execution's plan, inputs, context, step states and
terminal snapshot in its ``air:{e:E}:*`` keys or in ``history_executions``; its ledger
in ``air:{e:E}:events`` or in ``history_events``. The archive holds exactly what Redis
held (the archiver's contract), so a view that only looks at the material answers
identically from either source -- by construction, not by care in each view.

Only fields both sources have are in the material: the runtime's run record (which
expires on its own schedule and is not archived) is used to find a running
execution's id, never shown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from airuntime.control_plane.shared_runs import SharedRun, SharedRunStore
from airuntime.core.execution_layout import execution_keys_for
from airuntime.core.redis_client import RedisClient
from airuntime.core.reply_text import reply_text as _s
from airuntime.core.slots import ensure_transaction_slot
from airuntime.engine.pipeline import plan_json_of
from airuntime.fleet.run_index import RunIndex
from airuntime.history.records import ArchivedExecution
from airuntime.history.store import HistoryStore

__all__ = ["ExecutionMaterial", "MaterialLoader", "RunMaterial", "Source"]


def _hash(raw: Any) -> dict[str, str]:
    return {_s(k): _s(v) for k, v in (raw or {}).items()}


class Source(StrEnum):
    """Where a part of the material was read (never shown in a view)."""

    HOT = "hot"
    ARCHIVE = "archive"


@dataclass(frozen=True, slots=True)
class ExecutionMaterial:
    """An execution as the views see it.

    ``steps`` has the terminal snapshot's per-step shape (status, attempts, output,
    error, worker, claimed_at_ms, finished_at_ms): the snapshot's own once the
    execution is terminal, built the same way from the live hashes before."""

    execution_id: str
    tenant_id: str
    pipeline_id: str
    status: str
    created_at_ms: int
    started_at_ms: int | None
    finished_at_ms: int | None
    counts: dict[str, int]
    plan: dict[str, Any]
    inputs: dict[str, Any]
    context: dict[str, Any]
    steps: dict[str, dict[str, Any]]
    snapshot: dict[str, Any] | None
    source: Source

    @property
    def terminal(self) -> bool:
        return self.snapshot is not None

    def step_ids(self) -> list[str]:
        """The ids of ``steps`` in plan order (a dependency before its dependents, as the
        author wrote them), not the order a hash or a snapshot happens to hold them in;
        an id the plan does not list (none should be) comes after, by name."""
        listed = self.plan.get("steps")
        order: dict[str, int] = {}
        for spec in listed if isinstance(listed, list) else ():
            if isinstance(spec, dict) and spec.get("id") is not None:
                order.setdefault(str(spec["id"]), len(order))
        return sorted(self.steps, key=lambda sid: (order.get(sid, len(order)), sid))


@dataclass(frozen=True, slots=True)
class RunMaterial:
    """A shared run and, once it has one, its execution."""

    run: SharedRun
    execution: ExecutionMaterial | None
    source: Source
    """Where the shared run was read."""

    @property
    def tenant_id(self) -> str:
        return self.run.snapshot.tenant_id


_COUNTS = ("total", "completed", "failed", "skipped", "cancelled")


def _from_snapshot(
    execution_id: str, snap: dict[str, Any], plan: dict[str, Any], source: Source, **io: Any
) -> ExecutionMaterial:
    return ExecutionMaterial(
        execution_id=execution_id,
        tenant_id=str(snap.get("tenant_id", "")),
        pipeline_id=str(snap.get("pipeline_id", "")),
        status=str(snap.get("status", "")),
        created_at_ms=int(snap.get("created_at_ms") or 0),
        started_at_ms=snap.get("started_at_ms"),
        finished_at_ms=snap.get("finished_at_ms"),
        counts={k: int(v) for k, v in dict(snap.get("counts") or {}).items()},
        plan=plan,
        inputs=io["inputs"],
        context=io["context"],
        steps={k: dict(v) for k, v in dict(snap.get("steps") or {}).items()},
        snapshot=snap,
        source=source,
    )


def _live_steps(h: dict[str, dict[str, str]]) -> dict[str, dict[str, Any]]:
    """The terminal snapshot's per-step shape (``finalize.lua`` writeSnapshot), from
    the live hashes of a running execution."""
    steps: dict[str, dict[str, Any]] = {}
    for step, status in h["status"].items():
        view: dict[str, Any] = {"status": status, "attempts": int(h["attempt"].get(step, "1"))}
        if step in h["out"]:
            view["output"] = json.loads(h["out"][step])
        if step in h["err"]:
            view["error"] = h["err"][step]
        if step in h["owner"]:
            view["worker"] = h["owner"][step]
        for key, name in (("c:", "claimed_at_ms"), ("f:", "finished_at_ms")):
            if key + step in h["times"]:
                view[name] = int(h["times"][key + step])
        steps[step] = view
    return steps


def _opt_int(value: str | None) -> int | None:
    return int(value) if value else None


class MaterialLoader:
    """Loads :class:`RunMaterial` from Redis, falling back to the archive part by part."""

    def __init__(self, redis: RedisClient, history: HistoryStore | None) -> None:
        self.redis = redis
        self.history = history
        self.runs = SharedRunStore(redis)
        self.run_index = RunIndex(redis)

    async def load(self, shared_run_id: str, tenant_id: str | None) -> RunMaterial | None:
        """The run's material, or None when it is unknown or another tenant's."""
        loaded = await self.shared_run(shared_run_id, tenant_id)
        if loaded is None:
            return None
        run, source = loaded
        execution_id = await self.execution_id(run)
        execution = None
        if execution_id is not None:
            # Only an ended run's execution can be archived: a running one that Redis
            # does not hold yet (the runtime recorded its id, not yet the execution) is
            # simply not there, and a history that is down must not fail that read.
            archived = source is Source.ARCHIVE or run.status.terminal
            execution = await self.execution(
                execution_id, run.snapshot.tenant_id, archive_fallback=archived
            )
        return RunMaterial(run, execution, source)

    async def shared_run(
        self, shared_run_id: str, tenant_id: str | None
    ) -> tuple[SharedRun, Source] | None:
        hot = (
            await self.runs.get(shared_run_id)
            if tenant_id is None
            else await self.runs.get_for_tenant(shared_run_id, tenant_id)
        )
        if hot is not None:
            return hot, Source.HOT
        if self.history is None:
            return None
        archived = await self.history.get_shared_run(shared_run_id, tenant_id)
        if archived is None:
            return None
        return SharedRun.model_validate(archived.run), Source.ARCHIVE

    async def execution_id(self, run: SharedRun) -> str | None:
        """The shared run's execution: recorded on it once it ended, found through the
        runtime's run record while it runs."""
        if run.execution_id:
            return run.execution_id
        if not run.run_id:
            return None
        record = await self.run_index.get_for_tenant(run.run_id, run.snapshot.tenant_id)
        return record.execution_id if record is not None else None

    async def execution(
        self, execution_id: str, tenant_id: str, *, archive_fallback: bool = True
    ) -> ExecutionMaterial | None:
        hot = await self._hot_execution(execution_id, tenant_id)
        if hot is not None or self.history is None or not archive_fallback:
            return hot
        archived = await self.history.get_execution(execution_id, tenant_id)
        return None if archived is None else self._archived(archived)

    @staticmethod
    def _archived(a: ArchivedExecution) -> ExecutionMaterial:
        return _from_snapshot(
            a.execution_id, a.snapshot, a.plan, Source.ARCHIVE, inputs=a.inputs, context=a.context
        )

    async def _hot_execution(self, execution_id: str, tenant_id: str) -> ExecutionMaterial | None:
        ek = execution_keys_for(self.redis, execution_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hgetall(ek.meta)
        pipe.get(ek.plan)
        pipe.get(ek.snapshot)
        ensure_transaction_slot("hot execution", pipe)
        meta_raw, plan_raw, snap_raw = await pipe.execute()
        meta = _hash(meta_raw)
        if not meta or plan_raw is None or meta.get("tenant_id", "") != tenant_id:
            return None
        plan = json.loads(plan_json_of(plan_raw))
        inputs = json.loads(meta["inputs"]) if meta.get("inputs") else {}
        context = json.loads(meta["context"]) if meta.get("context") else {}
        if snap_raw is not None:
            snap = json.loads(snap_raw)
            return _from_snapshot(
                execution_id, snap, plan, Source.HOT, inputs=inputs, context=context
            )
        # Running: the step records are built from the live hashes, read together with
        # the snapshot (finalization writes it and deletes the hashes in one step).
        names = ("status", "attempt", "out", "err", "owner", "times")
        pipe = self.redis.pipeline(transaction=True)
        for name in names:
            pipe.hgetall(ek.key(name))
        pipe.get(ek.snapshot)
        ensure_transaction_slot("live step hashes", pipe)
        *hashes, snap_raw = await pipe.execute()
        if snap_raw is not None:
            # Finalized in between: the working hashes are gone, the snapshot holds them.
            return _from_snapshot(
                execution_id,
                json.loads(snap_raw),
                plan,
                Source.HOT,
                inputs=inputs,
                context=context,
            )
        h = {name: _hash(raw) for name, raw in zip(names, hashes, strict=True)}
        return ExecutionMaterial(
            execution_id=execution_id,
            tenant_id=tenant_id,
            pipeline_id=meta.get("pipeline_id", ""),
            status=meta.get("status", ""),
            created_at_ms=int(meta.get("created_at", "0")),
            started_at_ms=_opt_int(meta.get("started_at")),
            finished_at_ms=None,
            counts={k: int(meta.get(k, "0")) for k in _COUNTS},
            plan=plan,
            inputs=inputs,
            context=context,
            steps=_live_steps(h),
            snapshot=None,
            source=Source.HOT,
        )
