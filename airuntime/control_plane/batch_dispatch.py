"""A pump cycle over a batch: claim N queue items, admit and deliver them together.

Why this module exists: one dispatch cycle per run (:meth:`SharedRunDispatcher.dispatch_next`)
costs a dozen Redis round trips per run -- claim, read, admission, reservation, delivery,
confirm, settle, record -- and that per-run cost is what bounded dispatch. A batch cycle
(:func:`dispatch_batch`) pays each of those once per batch:

* **claim** up to N Pending items in one script (``claimSharedRuns-2.lua``), read their
  shared runs in one MGET;
* **admit** per tenant context (runs grouped by the ``tenant_id`` and
  ``tenant_group_id`` of their *stored* snapshots; admission runs with that snapshot
  restored): :meth:`Admission.admit_many` places the group's runs by free capacity and
  reserves each instance's share in one script call per instance, one round trip;
* **deliver** per instance: one ``deliver_many`` carrying that instance's runs;
* **record** in one round trip each: reservations confirmed, items settled Dispatched,
  shared runs moved to Dispatched (one compare-and-set transaction for the batch).

Every rule of the single-run cycle holds per run: a run is marked Dispatched only
after its runtime accepted it; a run whose delivery failed gets its reservation back
and its item back to Pending (counted), the instance a failure mark when it was a
fault; a run cancelled while claimed is cancelled on its runtime; the records are
compare-and-sets from QueuedGlobally. Runs admission found no room for in the batch
go through the single-run decision (:meth:`SharedRunDispatcher.decide`: scale-out,
queue, reject) one at a time; once one of them waits in the queue, the rest of its
tenant context's runs are released back to Pending untried (their failure counts
stay), and the pump skips that tenant for the rest of its cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict

from redis.exceptions import RedisError

from airuntime.control_plane.admission import Assign, Decision
from airuntime.control_plane.dispatch import DispatchResult, SharedRunDispatcher
from airuntime.control_plane.shared_queue import ClaimedItem, QueueItemStatus
from airuntime.control_plane.shared_runs import SharedRun, SharedRunStatus, parse_shared_run
from airuntime.control_plane.suspects import FAULT_REASONS
from airuntime.core import keys
from airuntime.core.context import use_context
from airuntime.fleet.providers import DeliveryError
from airuntime.fleet.registry import InstanceDescriptor
from airuntime.fleet.runs import RunRequest

__all__ = ["dispatch_batch"]

NOT_TRIED = "released untried: no capacity for its tenant in this batch"

Claimed = tuple[ClaimedItem, SharedRun]
Placed = tuple[ClaimedItem, SharedRun, Assign]


async def dispatch_batch(
    d: SharedRunDispatcher,
    count: int,
    *,
    skip_tenants: frozenset[str] = frozenset(),
    target: str | None = None,
) -> list[DispatchResult]:
    """One batch cycle of up to ``count`` runs; one result per claimed item (none: the
    queue had nothing for this pump)."""
    claimed = await d.queue.claim_and_read(d.identity.worker_id, count, skip_tenants, _key)
    if not claimed:
        return []
    left: list[DispatchResult] = []
    groups: dict[tuple[str, str | None], list[Claimed]] = defaultdict(list)
    for item, raw in claimed:
        run = parse_shared_run(raw) if raw else None
        if run is None or run.status is not SharedRunStatus.QUEUED_GLOBALLY:
            left.append(await d.leave(item, run))  # not a dispatch: not observed
            continue
        groups[(run.snapshot.tenant_id, run.snapshot.tenant_group_id)].append((item, run))
    results: list[DispatchResult] = []
    for group in groups.values():
        results.extend(await _dispatch_group(d, group, target))
    if d.observer is not None:
        for result in results:
            d.observer(result)
    return left + results


def _key(shared_run_id: str) -> str:
    return keys.shared_run(shared_run_id)


async def _dispatch_group(
    d: SharedRunDispatcher, group: list[Claimed], target: str | None
) -> list[DispatchResult]:
    """Runs of one tenant context: admitted together, delivered per instance."""
    with use_context(group[0][1].snapshot):
        try:
            assigned = await d.admission.admit_many(len(group), target=target)
        except Exception:  # the single-run decision below settles and reports it
            assigned = []
    placed = [(item, run, a) for (item, run), a in zip(group, assigned, strict=False)]
    by_instance: dict[str, list[Placed]] = defaultdict(list)
    for p in placed:
        by_instance[p[2].instance.instance_id].append(p)
    delivered = await asyncio.gather(
        *(_deliver(d, ps[0][2].instance, ps) for ps in by_instance.values())
    )
    results = [r for rs in delivered for r in rs]
    return results + await _decide_rest(d, group[len(placed) :], target)


async def _decide_rest(
    d: SharedRunDispatcher, rest: list[Claimed], target: str | None
) -> list[DispatchResult]:
    """Runs admission had no room for: the single-run decision, one at a time, until
    one waits in the queue; the others are released untried."""
    results: list[DispatchResult] = []
    for n, (item, run) in enumerate(rest):
        with use_context(run.snapshot):
            result = await d.decide(item, run, target)
        results.append(result)
        if result.requeued:
            untried = rest[n + 1 :]
            await d.queue.release_many([i for i, _ in untried], NOT_TRIED)
            results.extend(
                _refused(r, Decision.QUEUE, result.reason, requeued=True) for _, r in untried
            )
            break
    return results


def _refused(
    run: SharedRun, decision: Decision | None, reason: str, *, requeued: bool
) -> DispatchResult:
    return DispatchResult.refused(run, decision, reason, requeued=requeued)


def _request(run: SharedRun, instance_id: str) -> RunRequest:
    return RunRequest(
        shared_run_id=run.shared_run_id,
        pipeline=run.pipeline,
        inputs=run.inputs,
        snapshot=run.snapshot,
        metadata={**run.metadata, "assigned.runtime.instance.id": instance_id},
    )


async def _deliver(
    d: SharedRunDispatcher, instance: InstanceDescriptor, placed: list[Placed]
) -> list[DispatchResult]:
    """One delivery carrying ``placed`` to ``instance``; then each run's outcome."""
    requests = [_request(run, instance.instance_id) for _, run, _ in placed]
    try:
        with use_context(placed[0][1].snapshot):
            answers = await d.providers(instance).deliver_many(instance, requests)
    except BaseException as exc:
        # Nothing is known to have been accepted: every run goes back to Pending (a run
        # the runtime did accept is found again by its SharedRunId on redelivery).
        with contextlib.suppress(Exception):
            await _put_back(d, placed, f"dispatch to {instance.instance_id} failed: {exc}")
        if isinstance(exc, OSError | RedisError):
            with contextlib.suppress(Exception):
                await d.suspects.failed(instance.instance_id, f"{type(exc).__name__}: {exc}")
        if isinstance(exc, Exception):
            return [_refused(run, Decision.ASSIGN, str(exc), requeued=True) for _, run, _ in placed]
        raise
    ok = [(p, a) for p, a in zip(placed, answers, strict=True) if isinstance(a, str)]
    bad = [(p, a) for p, a in zip(placed, answers, strict=True) if not isinstance(a, str)]
    results = await _failed(d, instance, bad) if bad else []
    return results + (await _accepted(d, instance, ok) if ok else [])


async def _put_back(d: SharedRunDispatcher, placed: list[Placed], why: str) -> None:
    for _, _, a in placed:
        await d.admission.release(a.reservation)
    await d.queue.settle_many([(item, QueueItemStatus.PENDING, why) for item, _, _ in placed])


async def _failed(
    d: SharedRunDispatcher,
    instance: InstanceDescriptor,
    bad: list[tuple[Placed, DeliveryError]],
) -> list[DispatchResult]:
    """Refused or unreachable: reservations back, items back to Pending (counted), a
    failure mark on the instance when it could not be reached."""
    iid = instance.instance_id
    for (_, _, a), _ in bad:
        await d.admission.release(a.reservation)
    await d.queue.settle_many(
        [
            (item, QueueItemStatus.PENDING, f"dispatch to {iid} failed: {e}")
            for (item, _, _), e in bad
        ]
    )
    faults = [e for _, e in bad if e.reason in FAULT_REASONS]
    if faults:
        await d.suspects.failed(iid, f"{type(faults[0]).__name__}: {faults[0]}")
    return [
        DispatchResult.refused(run, Decision.ASSIGN, str(e), requeued=True, instance_id=iid)
        for (_, run, _), e in bad
    ]


async def _accepted(
    d: SharedRunDispatcher, instance: InstanceDescriptor, ok: list[tuple[Placed, str]]
) -> list[DispatchResult]:
    """The runtime accepted these: confirm, settle Dispatched, record Dispatched."""
    iid = instance.instance_id
    # Independent calls (the instance's reservations, the tenants' queue items): one
    # round trip.
    confirms = d.admission.confirm_calls([a.reservation for (_, _, a), _ in ok])
    settles = d.queue.settle_calls(
        [(item, QueueItemStatus.DISPATCHED, iid) for (item, _, _), _ in ok]
    )
    replies = await d.queue.scripts.call_mixed(d.queue.redis, [*confirms, *settles])
    settled = d.queue.settled(replies[len(confirms) :])
    if any(a.reservation.instance_had_failures for (_, _, a), _ in ok):
        await d.suspects.succeeded(iid)
    results: list[DispatchResult] = []
    record: list[tuple[Placed, str]] = []
    for (p, run_id), was_settled in zip(ok, settled, strict=True):
        item, run, admitted = p
        if not was_settled and await d.queue.status(run.shared_run_id, item.tenant_id) is (
            QueueItemStatus.CANCELLED
        ):
            results.append(await d.cancelled_in_flight(run, admitted, run_id))
        else:
            record.append((p, run_id))
    now = int(time.time() * 1000)
    # From QueuedGlobally; a run whose outcome already ended it keeps its end.
    await d.runs.record_dispatched(
        [
            (run.shared_run_id, d.dispatched_changes(iid, run_id, now))
            for (_, run, _), run_id in record
        ]
    )
    for (_, run, _), run_id in record:
        results.append(
            DispatchResult(
                True,
                shared_run_id=run.shared_run_id,
                decision=Decision.ASSIGN,
                tenant_id=run.snapshot.tenant_id,
                instance_id=iid,
                run_id=run_id,
                latency_s=max(0.0, (now - run.created_at_ms) / 1000),
            )
        )
    return results
