"""Typed Python face of the execution Lua scripts.

The state of an execution lives in Redis and changes only through the scripts in
``airuntime/lua``; this module turns their flat replies into dataclasses and their
negative codes into the exceptions of :mod:`airuntime.core.errors`. It holds no state of
its own, so any number of stores in any number of processes may drive one execution.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict, Unpack

from airuntime.core import keys
from airuntime.core.context import ExecutionContextSnapshot
from airuntime.core.errors import OK, ExecutionExists, ExecutionNotFound, ScriptError, error_for
from airuntime.core.execution_layout import LayoutGuard, buckets_for, check_layout
from airuntime.core.redis_client import RedisClient
from airuntime.core.reply_text import reply_text as _s
from airuntime.core.script_batching import ScriptBatcher
from airuntime.core.scripts import ScriptCall, ScriptLibrary, library
from airuntime.core.slots import ensure_transaction_slot
from airuntime.engine.ledger_batches import per_step
from airuntime.engine.pipeline import Plan
from airuntime.engine.status import ExecutionStatus, StepStatus
from airuntime.engine.store_results import (
    Claim,
    ClaimBatch,
    CompletionResult,
    ControlState,
    ExecutionInfo,
    FailOutcome,
    FailResult,
    LedgerEvent,
    PruneResult,
    RecoverResult,
    RenewResult,
    StopResult,
)

DEFAULT_RETENTION_S = 7 * 24 * 3600
EARLY_CANCEL_KEPT = 2
"""controlExecution's code for a cancel kept until its execution is created."""


def _i(value: Any) -> int:
    return int(value)  # int() takes the bytes of a bulk reply ("12") as they are


class CreateOptions(TypedDict, total=False):
    """The options of :meth:`ExecutionStore.create`.

    ``archive_hold_s`` None (the default): archiving off, finalization sets
    ``retention_s`` as the keys' TTL. Otherwise finalization queues the execution on the
    archive outbox and sets this fallback TTL (0: none); the archiver sets
    ``retention_s`` once it has durably archived the execution. ``then_record``:
    ``(type, fields)`` of one more ledger entry appended in the same call, whether the
    execution was created now or existed (as :meth:`ExecutionStore.record_event` would;
    the runtime's ``run_started``)."""

    execution_id: str | None
    context: ExecutionContextSnapshot | None
    inputs: Mapping[str, Any] | None
    retention_s: int
    archive_hold_s: int | None
    then_record: tuple[str, Mapping[str, str]] | None


def _entry(event_type: str, fields: Mapping[str, str]) -> list[str]:
    """A ledger entry of another component as XADD's field, value, ... (with ``type``)."""
    return [x for k, v in {**fields, "type": event_type}.items() for x in (k, v)]


def _create_args(
    eid: str,
    plan: Plan,
    context: ExecutionContextSnapshot | None,
    run_inputs: Mapping[str, Any],
    retention_s: int,
    archive_hold_s: int | None,
    claim: tuple[str, int, int] | None = None,
) -> list[Any]:
    """ARGV of ``createExecution-25.lua``: the execution, who claims the first steps
    (owner, count, lease ms), then seven values per step."""
    args: list[Any] = [
        eid,
        plan.stored(),
        plan.digest,
        plan.pipeline_id,
        plan.failure_policy,
        retention_s,
        context.tenant_id if context else "",
        context.model_dump_json() if context else "",
        json.dumps(run_inputs, separators=(",", ":"), sort_keys=True),
        len(plan.steps),
        "off" if archive_hold_s is None else archive_hold_s,
        *(claim if claim is not None else ("", 0, 0)),
    ]
    for step in plan.steps:
        kind = "i" if step.is_input else ("t" if step.throttle is not None else "")
        args += [
            step.id,
            step.order,
            len(step.deps),
            ",".join(step.children),
            ",".join(step.refs),
            kind,
            step.retry.max_attempts,
        ]
    return args


def _parse_claims(
    execution_id: str, reply: Sequence[Any], start: int, count: int
) -> tuple[list[Claim], int]:
    claims: list[Claim] = []
    i = start
    for _ in range(count):
        step, token, attempt, nrefs = (
            _s(reply[i]),
            _s(reply[i + 1]),
            _i(reply[i + 2]),
            _i(reply[i + 3]),
        )
        i += 4
        outs: dict[str, Any] = {}
        for _ in range(nrefs):
            outs[_s(reply[i])] = json.loads(reply[i + 1])
            i += 2
        claims.append(Claim(execution_id, step, token, attempt, outs))
    return claims, i


def _claim_batch(execution_id: str, reply: Sequence[Any]) -> ClaimBatch:
    """claimSteps' reply (also createExecution's after its code) as a batch."""
    status = ExecutionStatus(_s(reply[0]))
    wake, n, throttled = _i(reply[1]), _i(reply[2]), _i(reply[3])
    claims, _ = _parse_claims(execution_id, reply, 5, n)
    return ClaimBatch(status, wake, throttled, claims, recovered=_i(reply[4]))


def _control_state(status: Any, control: Any) -> ControlState | None:
    """The meta fields ``status`` and ``control`` as a state (None: no execution)."""
    if status is None:
        return None
    return ControlState(
        ExecutionStatus(_s(status)), control is not None and _s(control) == "cancel"
    )


def merged_inputs(plan: Plan, inputs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The inputs an execution of ``plan`` runs with: the plan's defaults, overridden by
    the run's ``inputs`` (what :meth:`ExecutionStore.create` stores)."""
    return {**plan.inputs, **(inputs or {})}


class ExecutionStore:
    """Create, claim, complete, fail, control and read executions in Redis."""

    def __init__(self, redis: RedisClient, scripts: ScriptLibrary | None = None) -> None:
        self.redis = redis
        self.scripts = scripts or library()
        self.calls = ScriptBatcher(redis, self.scripts)
        """The store's script calls, those of concurrent executions sent together."""
        self.buckets = buckets_for(redis)
        """Execution buckets of the layout (1 standalone; :mod:`airuntime.core.keys`)."""
        self._layout = LayoutGuard(lambda: check_layout(redis))

    def keys_of(self, execution_id: str) -> keys.ExecutionKeys:
        """The keys of ``execution_id`` in this store's layout."""
        return keys.execution_keys(execution_id, self.buckets)

    async def _call(self, name: str, execution_id: str, args: Sequence[Any]) -> Any:
        script_keys = keys.script_keys(execution_id, self.buckets, self.scripts[name].num_keys)
        reply = await self.calls.call(name, script_keys, args)
        if (
            isinstance(reply, list)
            and reply
            and isinstance(reply[0], int)
            and reply[0] == ExecutionNotFound.code
        ):
            raise error_for(ExecutionNotFound.code, execution_id=execution_id)
        return reply

    # -- lifecycle -----------------------------------------------------------------

    async def create(self, plan: Plan, **options: Unpack[CreateOptions]) -> str:
        """Write a new execution (idempotent for the same id and plan) and return its id
        (the options: :class:`CreateOptions`)."""
        eid, _ = await self.create_and_claim(plan, None, **options)
        return eid

    async def create_and_claim(
        self,
        plan: Plan,
        claim: tuple[str, int, int] | None,
        **options: Unpack[CreateOptions],
    ) -> tuple[str, ClaimBatch | None]:
        """:meth:`create`, and when ``claim`` = ``(owner, count, lease_ms)`` is given, up
        to ``count`` of the first ready steps claimed for ``owner`` in the same call (as
        :meth:`claim` would): the batch, or None when the execution existed already
        (nothing claimed)."""
        eid = options.get("execution_id") or f"ex-{uuid.uuid4().hex}"
        args = _create_args(
            eid,
            plan,
            options.get("context"),
            merged_inputs(plan, options.get("inputs")),
            options.get("retention_s", DEFAULT_RETENTION_S),
            options.get("archive_hold_s"),
            claim,
        )
        then_record = options.get("then_record")
        if then_record is not None:
            args += _entry(*then_record)
        await self._layout.ensure()
        reply = await self._call("createExecution", eid, args)
        if reply[0] == ExecutionExists.code:
            raise error_for(ExecutionExists.code, execution_id=eid)
        if _i(reply[0]) != 1:
            return eid, None
        return eid, _claim_batch(eid, reply[1:])

    async def claim(
        self, execution_id: str, owner: str, count: int, lease_ms: int, move_limit: int = 256
    ) -> ClaimBatch:
        reply = await self._call("claimSteps", execution_id, [owner, count, lease_ms, move_limit])
        return _claim_batch(execution_id, reply)

    async def claim_step(
        self, execution_id: str, owner: str, step_id: str, lease_ms: int, lease_holder: str = ""
    ) -> Claim:
        reply = await self._call(
            "claimStep", execution_id, [owner, step_id, lease_ms, lease_holder]
        )
        code = _i(reply[0])
        if code < 0:
            detail = _s(reply[1]) if len(reply) > 1 else ""
            raise error_for(code, execution_id=execution_id, step_id=step_id, detail=detail)
        claims, _ = _parse_claims(execution_id, [step_id, *reply[1:]], 0, 1)
        return claims[0]

    async def complete(
        self,
        execution_id: str,
        owner: str,
        items: Sequence[tuple[str, str, str, str]],
        *,
        claim_next: int = 0,
        lease_ms: int = 30_000,
    ) -> CompletionResult:
        """Complete ``(step, token, worker, output_json)`` items; optionally claim up to
        ``claim_next`` more steps for ``owner`` in the same round trip."""
        args: list[Any] = [owner, claim_next, lease_ms]
        for step, token, worker, output in items:
            args += [step, token, worker, output]
        reply = await self._call("completeSteps", execution_id, args)
        n = _i(reply[2])
        codes = [_i(c) for c in reply[3 : 3 + n]]
        throttled, claimed = _i(reply[3 + n]), _i(reply[4 + n])
        claims, _ = _parse_claims(execution_id, reply, 5 + n, claimed)
        return CompletionResult(
            ExecutionStatus(_s(reply[0])), _i(reply[1]), codes, throttled, claims
        )

    async def fail(
        self,
        execution_id: str,
        worker: str,
        step_id: str,
        token: str,
        error: str,
        *,
        retryable: bool = True,
        delay_ms: int = 0,
    ) -> FailResult:
        reply = await self._call(
            "failStep",
            execution_id,
            [
                worker,
                step_id,
                token,
                error[:4000],
                "1" if retryable else "0",
                max(0, int(delay_ms)),
            ],
        )
        if isinstance(reply[0], int) and reply[0] < 0:
            raise error_for(_i(reply[0]), execution_id=execution_id, step_id=step_id)
        try:
            outcome = FailOutcome(_s(reply[1]))
        except ValueError:
            raise ScriptError(f"failStep returned unknown outcome {_s(reply[1])!r}") from None
        return FailResult(ExecutionStatus(_s(reply[0])), outcome, _i(reply[2]), _i(reply[3]))

    async def stop(
        self, execution_id: str, items: Sequence[tuple[str, str, str]], reason: str = "cancel"
    ) -> StopResult:
        """Record ``(step, token, worker)`` steps this worker stopped because the execution
        is being cancelled; the last one finalizes it Cancelled."""
        args: list[Any] = [reason]
        for step, token, worker in items:
            args += [step, token, worker]
        reply = await self._call("stopSteps", execution_id, args)
        if isinstance(reply[0], int) and reply[0] < 0:
            raise error_for(_i(reply[0]), execution_id=execution_id, detail=_s(reply[1]))
        n = _i(reply[1])
        return StopResult(ExecutionStatus(_s(reply[0])), [_i(c) for c in reply[2 : 2 + n]])

    async def renew(
        self, execution_id: str, lease_ms: int, items: Sequence[tuple[str, str]]
    ) -> RenewResult:
        """Extend the leases of ``(step, token)`` claims by ``lease_ms`` from now."""
        args: list[Any] = [lease_ms]
        for step, token in items:
            args += [step, token]
        reply = await self._call("renewClaims", execution_id, args)
        return RenewResult(ExecutionStatus(_s(reply[0])), [_i(c) == OK for c in reply[1:]])

    async def recover(self, execution_id: str, limit: int = 1000) -> RecoverResult:
        reply = await self._call("recoverStale", execution_id, [limit])
        return RecoverResult(
            ExecutionStatus(_s(reply[0])), _i(reply[1]), _i(reply[2]), _i(reply[3])
        )

    async def _control(
        self, execution_id: str, action: str, actor: str, early: bool = False
    ) -> ExecutionStatus:
        reply = await self._call(
            "controlExecution",
            execution_id,
            [action, actor, keys.control_channel(), execution_id if early else ""],
        )
        code = _i(reply[0])
        if code == EARLY_CANCEL_KEPT:
            return ExecutionStatus.CANCELLING
        if code < 0:
            raise error_for(code, execution_id=execution_id, detail=_s(reply[1]))
        return ExecutionStatus(_s(reply[1]))

    async def pause(self, execution_id: str, actor: str = "") -> ExecutionStatus:
        return await self._control(execution_id, "pause", actor)

    async def resume(self, execution_id: str, actor: str = "") -> ExecutionStatus:
        return await self._control(execution_id, "resume", actor)

    async def cancel(self, execution_id: str, actor: str = "") -> ExecutionStatus:
        return await self._control(execution_id, "cancel", actor)

    async def cancel_announced(self, execution_id: str, actor: str = "") -> ExecutionStatus:
        """Cancel an execution whose id a run record already names. The record names it
        from the run's start on, a moment before the runtime creates it: a cancel in
        that window is kept (Cancelling) and the execution is created cancelled
        (controlExecution-25.lua), so it is never lost. Callers pass only ids read from
        a record the tenant may see (an unknown id would be kept for a day)."""
        return await self._control(execution_id, "cancel", actor, early=True)

    async def provide_input(
        self, execution_id: str, step_id: str, value: Any, actor: str = ""
    ) -> ExecutionStatus:
        reply = await self._call(
            "provideInput", execution_id, [step_id, json.dumps(value, separators=(",", ":")), actor]
        )
        code = _i(reply[0])
        if code < 0:
            detail = _s(reply[1]) if len(reply) > 1 else ""
            raise error_for(code, execution_id=execution_id, step_id=step_id, detail=detail)
        return ExecutionStatus(_s(reply[1]))

    async def finalize(self, execution_id: str) -> ExecutionStatus | None:
        """Finalize if terminal (idempotent); the terminal status, or None if still active."""
        reply = await self._call("finalizeExecution", execution_id, [])
        if _i(reply[0]) == OK:
            return ExecutionStatus(_s(reply[1]))
        return None

    async def record_event(
        self, execution_id: str, event_type: str, fields: Mapping[str, str]
    ) -> bool:
        """Append an entry of another component (the runtime's ``run_started``, its
        step-slot evidence) to the execution's ledger; False when the execution's ledger
        is gone (retention): a ledger is never recreated without its TTL."""
        call = self.event_call(execution_id, event_type, fields)
        added = await self.scripts.call(self.redis, call.name, call.keys, call.args)
        return bool(added)

    def event_call(
        self, execution_id: str, event_type: str, fields: Mapping[str, str]
    ) -> ScriptCall:
        """The :meth:`record_event` call, for a caller that sends it with others
        (:meth:`ScriptLibrary.call_in_order`); its reply is 0, 1 or 2 (recordEvent-3.lua)."""
        ek = self.keys_of(execution_id)
        # After the archive, the script queues the execution again (recordEvent-3.lua).
        return ScriptCall(
            "recordEvent",
            [ek.events, ek.meta, ek.bucket.outbox],
            [execution_id, *_entry(event_type, fields)],
        )

    async def prune_index(self, *, batch: int = 500) -> PruneResult:
        """One pass over the execution indexes, ``batch`` entries per round trip: remove
        from ``air:executions`` every execution whose keys have expired (retention ran
        out), and from ``air:executions:active`` every execution that is gone or already
        finalized (finalization removes it itself; this catches entries written before
        it did). Both indexes are written atomically with the execution, so an entry
        without its execution is never one being created. Safe to run from any number of
        processes at once; the control plane's retention loop owns calling it."""
        examined = unlisted = deactivated = 0
        for bucket in keys.execution_buckets(self.buckets):
            seen_l, gone_l = await self._prune(bucket.executions, batch, active=False)
            seen_a, gone_a = await self._prune(bucket.active, batch, active=True)
            examined, unlisted = examined + seen_l + seen_a, unlisted + gone_l
            deactivated += gone_a
        return PruneResult(examined, unlisted, deactivated)

    async def _prune(self, index: str, batch: int, *, active: bool) -> tuple[int, int]:
        """(examined, removed) for one index; ZSCAN returns every member present for the
        whole pass at least once, whatever is removed meanwhile."""
        examined = removed = 0
        ids: list[str] = []
        async for member, _ in self.redis.zscan_iter(index, count=batch):
            ids.append(_s(member))
            if len(ids) >= batch:
                removed += await self._prune_batch(index, ids, active)
                examined, ids = examined + len(ids), []
        if ids:
            removed += await self._prune_batch(index, ids, active)
            examined += len(ids)
        return examined, removed

    async def _prune_batch(self, index: str, ids: list[str], active: bool) -> int:
        pipe = self.redis.pipeline(transaction=False)
        for eid in ids:
            pipe.hmget(self.keys_of(eid).meta, ["execution_id", "terminal"])
        rows = await pipe.execute()
        gone = [
            eid
            for eid, (present, terminal) in zip(ids, rows, strict=True)
            if present is None or (active and terminal)
        ]
        if not gone:
            return 0
        return int(await self.redis.zrem(index, *gone))

    # -- reads ---------------------------------------------------------------------

    async def info(self, execution_id: str) -> ExecutionInfo:
        raw = await self.redis.hgetall(self.keys_of(execution_id).meta)
        if not raw:
            raise ExecutionNotFound(
                f"Execution {execution_id} does not exist.", execution_id=execution_id
            )
        m = {_s(k): _s(v) for k, v in raw.items()}
        ctx = (
            ExecutionContextSnapshot.model_validate_json(m["context"]) if m.get("context") else None
        )
        return ExecutionInfo(
            execution_id=execution_id,
            pipeline_id=m.get("pipeline_id", ""),
            status=ExecutionStatus(m["status"]),
            tenant_id=m.get("tenant_id", ""),
            total=int(m.get("total", 0)),
            done=int(m.get("done", 0)),
            completed=int(m.get("completed", 0)),
            failed=int(m.get("failed", 0)),
            skipped=int(m.get("skipped", 0)),
            cancelled=int(m.get("cancelled", 0)),
            running=int(m.get("running", 0)),
            created_at_ms=int(m.get("created_at", 0)),
            finished_at_ms=int(m["finished_at"]) if m.get("finished_at") else None,
            context=ctx,
        )

    async def control_state(self, execution_id: str) -> ControlState:
        """One read of the execution's status and control field."""
        status, control = await self.redis.hmget(
            self.keys_of(execution_id).meta, ["status", "control"]
        )
        state = _control_state(status, control)
        if state is None:
            raise ExecutionNotFound(
                f"Execution {execution_id} does not exist.", execution_id=execution_id
            )
        return state

    async def control_states(self, execution_ids: Sequence[str]) -> dict[str, ControlState]:
        """:meth:`control_state` of many executions in one round trip (a pipeline); an
        execution that does not exist is left out."""
        pipe = self.redis.pipeline(transaction=False)
        for eid in execution_ids:
            pipe.hmget(self.keys_of(eid).meta, ["status", "control"])
        states = [_control_state(*fields) for fields in await pipe.execute()]
        return {
            eid: state
            for eid, state in zip(execution_ids, states, strict=True)
            if state is not None
        }

    async def throttled_ready(self, execution_id: str, count: int) -> list[str]:
        """Up to ``count`` ready throttled steps, in plan order (they are claimed one by
        one with :meth:`claim_step` once admission lets them through)."""
        key = self.keys_of(execution_id).ready_throttled
        raw = await self.redis.zrange(key, 0, count - 1)
        return [_s(m) for m in raw]

    async def step_states(self, execution_id: str) -> dict[str, StepStatus]:
        """Each step's status: from the live status hash, or from the snapshot once the
        execution is finalized (finalization deletes the working hashes). Both are read
        in one transaction, so a finalization in between cannot leave neither."""
        ek = self.keys_of(execution_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hgetall(ek.status)
        pipe.get(ek.snapshot)
        ensure_transaction_slot("step states", pipe)
        raw, snapshot = await pipe.execute()
        if snapshot is not None:
            steps = json.loads(snapshot).get("steps", {})
            return {step: StepStatus(rec["status"]) for step, rec in steps.items()}
        return {_s(k): StepStatus(_s(v)) for k, v in raw.items()}

    async def load_plan(self, execution_id: str) -> Plan:
        raw = await self.redis.get(self.keys_of(execution_id).plan)
        if raw is None:
            raise ExecutionNotFound(
                f"Execution {execution_id} does not exist.", execution_id=execution_id
            )
        return Plan.from_json(raw)  # text or compressed (Plan.stored)

    async def run_inputs(self, execution_id: str) -> dict[str, Any]:
        raw = await self.redis.hget(self.keys_of(execution_id).meta, "inputs")
        return dict(json.loads(raw)) if raw else {}

    async def snapshot(self, execution_id: str) -> dict[str, Any] | None:
        """The terminal snapshot written at finalization, or None while active."""
        raw = await self.redis.get(self.keys_of(execution_id).snapshot)
        return dict(json.loads(raw)) if raw else None

    async def events(
        self, execution_id: str, after: str = "-", count: int | None = None
    ) -> list[LedgerEvent]:
        """The ledger's entries from ``after`` (a stream id, ``(`` for exclusive), each
        batch entry read per step (:func:`~airuntime.engine.ledger_batches.per_step`:
        its steps' views share its id); ``count`` counts stream entries."""
        raw: Any = await self.redis.xrange(
            self.keys_of(execution_id).events, min=after, count=count
        )
        out: list[LedgerEvent] = []
        for eid, fields in raw:
            f = {_s(k): _s(v) for k, v in fields.items()}
            entry_id = _s(eid)
            for kind, view in per_step(f.get("type", ""), f):
                out.append(LedgerEvent(entry_id, kind, view))
        return out
