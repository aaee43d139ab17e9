"""How a shared run ends: the runtime's run outcomes, read and applied exactly once.

Why this module exists: a shared run is the control plane's record, the run that
executes it is a runtime's. When the runtime run reaches a terminal status the
runtime appends a :class:`~airuntime.fleet.outcomes.RunOutcome` to its run bucket's
outcome stream (``air:{air}:run-outcomes`` on a standalone server, one stream per run
bucket on a cluster) atomically with the run's terminal record; :class:`OutcomeReader`
(a supervised loop) reads those streams with a consumer group, ends the shared run
(:func:`end_shared_run`: Succeeded / Failed / Cancelled, a compare-and-set, idempotent;
the entries of one read in one transaction, :func:`end_shared_runs`) and only then
acknowledges them -- on a standalone server in that same transaction (the stream is in
the control slot with the shared runs), so ending and acknowledging land together in
one round trip; on a cluster by an XACK after it. After a restart it first re-reads
the entries it had read but not acknowledged, and it takes over entries another
control plane left unacknowledged for a while (XAUTOCLAIM), so a crash between
reading and acknowledging loses nothing.
An outcome that was never written or never seen is the reconciler's
(:mod:`~airuntime.control_plane.reconciler`) to find.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Final

from redis.exceptions import ResponseError

from airuntime.control_plane.shared_runs import (
    SharedRun,
    SharedRunStatus,
    SharedRunStore,
    Transition,
)
from airuntime.core import keys
from airuntime.core.redis_client import RedisClient
from airuntime.core.run_layout import run_buckets_for
from airuntime.core.slots import slots_of
from airuntime.core.supervision import LoopContext
from airuntime.fleet.blocking import unless_unblocked
from airuntime.fleet.outcomes import RunOutcome
from airuntime.fleet.runs import RunRecord, RunStatus

__all__ = ["OUTCOME_GROUP", "OutcomeReader", "end_shared_run", "end_shared_runs", "outcome_of"]

log = logging.getLogger(__name__)

OUTCOME_GROUP: Final = "airuntime-control-plane"
"""The consumer group every control plane reads the outcome streams in (each outcome
is handled by one of them)."""

SHARED_STATUS: Final = {
    RunStatus.COMPLETED: SharedRunStatus.SUCCEEDED,
    RunStatus.FAILED: SharedRunStatus.FAILED,
    RunStatus.CANCELLED: SharedRunStatus.CANCELLED,
}
"""The shared run's terminal status for each terminal status of its runtime run."""


def outcome_of(record: RunRecord) -> RunOutcome | None:
    """The outcome a terminal run record stands for (None while the run goes on)."""
    if not record.status.terminal:
        return None
    return RunOutcome(
        run_id=record.run_id,
        shared_run_id=record.shared_run_id,
        tenant_id=record.tenant_id,
        instance_id=record.instance_id,
        status=record.status,
        execution_id=record.execution_id,
        reason=record.failure_reason,
        finished_at_ms=record.finished_at_ms or record.created_at_ms,
    )


async def end_shared_run(runs: SharedRunStore, outcome: RunOutcome) -> Transition | None:
    """End the outcome's shared run; None when there is nothing to end (no such run, or
    the outcome is not the run's: another tenant, another RunId, a non-terminal status).

    Idempotent: a shared run that already ended stays as it ended (``moved`` False).
    """
    return (await end_shared_runs(runs, [outcome]))[0]


async def end_shared_runs(
    runs: SharedRunStore,
    outcomes: list[RunOutcome],
    *,
    always: Callable[[Any], None] | None = None,
) -> list[Transition | None]:
    """:func:`end_shared_run` of each outcome, all in one transaction. The outcome must
    be the run's as the transaction reads the record (its tenant, its RunId or none
    yet), so a run given to another RunId meanwhile is not ended by a stale outcome.
    ``always(pipe)`` queues more writes of the control slot into that transaction."""
    statuses = [SHARED_STATUS.get(o.status) for o in outcomes]
    foreign: dict[int, SharedRun] = {}

    def decide(i: int, run: SharedRun) -> tuple[SharedRunStatus, dict[str, Any]] | None:
        outcome, status = outcomes[i], statuses[i]
        foreign.pop(i, None)
        if status is None:
            return None
        if run.snapshot.tenant_id != outcome.tenant_id or run.run_id not in (
            None,
            outcome.run_id,
        ):
            foreign[i] = run
            return None
        changes: dict[str, Any] = {"run_id": outcome.run_id, "reason": outcome.reason}
        if outcome.execution_id:
            changes["execution_id"] = outcome.execution_id
        if run.assigned_instance_id is None:
            changes["assigned_instance_id"] = outcome.instance_id
        return status, changes

    ended = await runs.transition_each([o.shared_run_id for o in outcomes], decide, always=always)
    for i, run in foreign.items():
        outcome = outcomes[i]
        log.warning(
            "ignoring outcome of run %s (tenant %s) for shared run %s (tenant %s, run %s)",
            outcome.run_id,
            outcome.tenant_id,
            run.shared_run_id,
            run.snapshot.tenant_id,
            run.run_id,
        )
    return [None if i in foreign or statuses[i] is None else t for i, t in enumerate(ended)]


class OutcomeReader:
    """Reads the run-outcome stream in the control planes' consumer group."""

    def __init__(
        self,
        redis: RedisClient,
        runs: SharedRunStore,
        consumer: str,
        *,
        block_ms: int = 1_000,
        batch: int = 100,
        claim_idle_ms: int = 60_000,
    ) -> None:
        """``redis`` must have a socket timeout longer than ``block_ms``."""
        self.redis = redis
        self.runs = runs
        self.consumer = consumer
        self.block_ms = block_ms
        self.batch = batch
        self.claim_idle_ms = claim_idle_ms
        self.handled = 0
        self.streams = [b.outcomes for b in keys.run_buckets(run_buckets_for(redis))]
        self._ack_with_end = {
            stream: len(slots_of([stream, keys.shared_run("-")])) == 1 for stream in self.streams
        }
        """Per stream, whether its XACK can go in the transaction that ends the runs
        (the stream shares the shared runs' slot: a standalone server)."""
        self._take_over_due: dict[str, float] = {}
        """Per stream, the loop time of the next look for abandoned entries."""

    async def run(self, ctx: LoopContext) -> None:
        await self.ensure_group()
        await self.read_pending()
        ctx.ok()
        if len(self.streams) == 1:
            await self._follow(self.streams[0], ctx)
        # A cluster: one stream per run bucket, each in its own slot (no single read
        # covers them), so each is followed by its own blocking reader; an outcome is
        # seen as soon as it is written, and an idle reader costs one read per stream
        # per ``block_ms``. One failing reader stops the others; the supervisor restarts.
        try:
            async with asyncio.TaskGroup() as group:
                for stream in self.streams:
                    group.create_task(self._follow(stream, ctx))
        except* Exception as failed:
            raise failed.exceptions[0] from None

    async def _follow(self, stream: str, ctx: LoopContext) -> None:
        """One stream, forever: entries abandoned by another consumer, then new ones."""
        while True:
            await self._take_over_when_due(stream)
            await self._read(stream, self.block_ms)
            ctx.ok()

    async def _take_over_when_due(self, stream: str) -> None:
        """:meth:`_take_over` at most four times per ``claim_idle_ms``, not before every
        read: an entry becomes abandoned only after that long unacknowledged, so
        looking more often finds nothing new, and each look is a round trip (it was one
        in two of the reader's round trips under a steady trickle of outcomes). An
        abandoned entry is taken over at most a quarter of the idle time late."""
        now = asyncio.get_running_loop().time()
        if now < self._take_over_due.get(stream, 0.0):
            return
        await self._take_over(stream)
        self._take_over_due[stream] = now + self.claim_idle_ms / 4000

    async def ensure_group(self) -> None:
        """Create the group (from the stream's start) on every bucket's stream unless it
        exists; after a Redis that lost its data the group is gone, and this is how a
        restart recreates it."""
        for stream in self.streams:
            try:
                await self.redis.xgroup_create(stream, OUTCOME_GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def read_pending(self) -> int:
        """Handle the entries this consumer read earlier and did not acknowledge."""
        total = 0
        for stream in self.streams:
            while True:
                reply = await self.redis.xreadgroup(
                    OUTCOME_GROUP, self.consumer, {stream: "0"}, count=self.batch
                )
                entries = _entries(reply)
                if not entries:
                    break
                total += await self._handle(stream, entries)
        return total

    async def read_new(self) -> int:
        """One pass over the new entries of every bucket's stream: a blocking read of
        the one stream of a standalone server, a non-blocking read of each on a cluster
        (:meth:`run` follows each stream with its own blocking reader instead)."""
        if len(self.streams) == 1:
            return await self._read(self.streams[0], self.block_ms)
        total = 0
        for stream in self.streams:
            total += await self._read(stream, None)
        return total

    async def _read(self, stream: str, block_ms: int | None) -> int:
        reply = await unless_unblocked(
            lambda: self.redis.xreadgroup(
                OUTCOME_GROUP, self.consumer, {stream: ">"}, count=self.batch, block=block_ms
            ),
            f"outcome read on {stream}",
        )
        return await self._handle(stream, _entries(reply))

    async def take_over_abandoned(self) -> int:
        """Claim entries another consumer read but left unacknowledged for too long."""
        total = 0
        for stream in self.streams:
            total += await self._take_over(stream)
        return total

    async def _take_over(self, stream: str) -> int:
        reply: Any = await self.redis.xautoclaim(
            stream,
            OUTCOME_GROUP,
            self.consumer,
            min_idle_time=self.claim_idle_ms,
            start_id="0-0",
            count=self.batch,
        )
        entries = [(i, f) for i, f in reply[1]] if reply else []
        return await self._handle(stream, entries)

    async def _handle(self, stream: str, entries: list[tuple[Any, Any]]) -> int:
        """End the runs of the entries read together in one transaction, then
        acknowledge them all (one XACK): an entry is acknowledged only after its run
        was ended, and a failure before that leaves every one of them to be read again.
        Where the stream shares the shared runs' slot the XACK is queued in the ending
        transaction itself (both land or neither)."""
        if not entries:
            return 0
        ids = [entry_id for entry_id, _ in entries]

        def ack(pipe: Any) -> None:
            pipe.xack(stream, OUTCOME_GROUP, *ids)

        acked = False
        outcomes: list[RunOutcome] = []
        for entry_id, fields in entries:
            if not fields:  # an entry trimmed away while pending has no fields: just ack it
                continue
            try:
                outcomes.append(RunOutcome.from_fields(fields))
            except ValueError as exc:  # a malformed outcome: never retried forever
                log.warning("dropping run outcome %s: %s", entry_id, exc)
        if outcomes:
            with_ack = self._ack_with_end[stream]
            try:
                await end_shared_runs(self.runs, outcomes, always=ack if with_ack else None)
                acked = with_ack
            except ValueError:  # a malformed record: one by one, dropping only its outcome
                for outcome in outcomes:
                    try:
                        await end_shared_run(self.runs, outcome)
                    except ValueError as exc:  # never retried forever
                        log.warning("dropping run outcome of %s: %s", outcome.run_id, exc)
        if not acked:
            await self.redis.xack(stream, OUTCOME_GROUP, *ids)
        self.handled += len(entries)
        return len(entries)


def _entries(reply: Any) -> list[tuple[Any, Any]]:
    """The (id, fields) pairs of an XREADGROUP reply (RESP2 list or RESP3 dict)."""
    if not reply:
        return []
    streams = reply.items() if isinstance(reply, dict) else reply
    return [(i, f) for _, messages in streams for i, f in messages]
