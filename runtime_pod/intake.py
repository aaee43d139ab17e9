"""What a runtime instance checks before a run enters its local queue.

Why this module exists: a run reaches an instance by a local call, through its Redis
inbox or through the HTTP intake, and pipeline authors are untrusted tenants. Every
path ends in :func:`accept_runs` (:func:`accept_run` is its one-run form), so every
path refuses the same way, before anything is written:

* ``invalid`` -- the request does not validate (no ExecutionContextSnapshot, ...), or
  its pipeline does not compile with the registered handlers **and the tenant's
  allowlist** (``TenantSettings.allowed_handlers``; the message names the step and
  the handler);
* ``not_visible`` -- the snapshot's tenant may not use this instance
  (:func:`airuntime.fleet.tenancy.is_visible`, with the tenant's settings from the
  registry: a tenant-A run posted straight to tenant B's Dedicated runtime);
* ``conflict`` -- the SharedRunId already has a run of another tenant;
* ``stopping`` / ``paused`` / ``queue_full``.

A SharedRunId delivered again (to this or any instance) returns the RunId it already
has, whatever the instance's state: the SharedRunId is claimed by one script
(``acceptRun-4.lua``; the queue push follows).

:func:`accept_runs` is the batch form a pump's delivery uses (one call carrying N
runs): the same checks per run, each tenant's settings, every SharedRunId's existing
RunId and (on a cluster) the queue's length read in one round trip, each distinct pipeline compiled
once per batch, and every acceptance script sent in one round trip.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from airuntime.core import keys
from airuntime.core.errors import AirError
from airuntime.core.reply_text import reply_text
from airuntime.core.validation import format_validation_error
from airuntime.engine.pipeline import PipelineError
from airuntime.fleet.run_index import QueueFull, SharedRunConflict
from airuntime.fleet.runs import RunRequest
from airuntime.fleet.tenancy import TenantSettings, stored_settings

if TYPE_CHECKING:
    from runtime_pod.instance import RuntimeInstance

__all__ = ["REFUSAL_HTTP_STATUS", "RunRefused", "accept_run", "accept_runs", "parse_request"]


class RunRefused(AirError):
    """The instance will not take the run; ``reason`` is a short machine-readable code."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


REFUSAL_HTTP_STATUS: dict[str, int] = {"invalid": 400, "not_visible": 403}
"""HTTP status of a refusal by reason; any other reason is 409 (the instance's state)."""


def parse_request(request: RunRequest | dict[str, Any]) -> RunRequest:
    """A validated request; ``invalid`` naming the offending field otherwise."""
    if isinstance(request, RunRequest):
        return request
    try:
        return RunRequest.model_validate(request)
    except ValidationError as exc:
        problem = format_validation_error(exc, with_value=False)
        raise RunRefused(f"run request {problem}", reason="invalid") from None


async def accept_run(inst: RuntimeInstance, raw: RunRequest | dict[str, Any]) -> tuple[str, bool]:
    """Check ``raw`` against ``inst`` and queue it; (RunId, created). Raises the
    :class:`RunRefused` :func:`accept_runs` would answer for it."""
    [answer] = await accept_runs(inst, [raw])
    if isinstance(answer, RunRefused):
        raise answer
    return answer


Accepted = tuple[str, bool] | RunRefused
"""What :func:`accept_runs` answers per request: (RunId, created), or the refusal."""


async def accept_runs(
    inst: RuntimeInstance, raws: list[RunRequest | dict[str, Any]]
) -> list[Accepted]:
    """:func:`accept_run` for a batch: one answer per request, in order."""
    out: list[Accepted | None] = [None] * len(raws)
    parsed: list[tuple[int, RunRequest]] = []
    for i, raw in enumerate(raws):
        try:
            parsed.append((i, parse_request(raw)))
        except RunRefused as exc:
            out[i] = exc
    if not parsed:
        return [a for a in out if a is not None]
    tenants, existing, queued = await _read_batch(inst, [r for _, r in parsed])
    owners = await inst.index.tenants_of([e for e in existing if e is not None])
    owner_of = dict(zip([e for e in existing if e is not None], owners, strict=True))
    new: list[tuple[int, RunRequest]] = []
    compiled: dict[str, RunRefused | None] = {}
    for (i, request), run_id in zip(parsed, existing, strict=True):
        tenant = tenants[request.snapshot.tenant_id]
        try:
            _check_visible(inst, tenant)
            if run_id is not None:
                out[i] = (_same_tenant(request, run_id, owner_of.get(run_id)), False)
                continue
            _check_open(inst)
            _check_compiles(inst, request, tenant, compiled)
        except RunRefused as exc:
            out[i] = exc
            continue
        new.append((i, request))
    answers = await inst.index.accept_many(
        inst.instance_id,
        [r for _, r in new],
        queue_capacity=inst.config.queue_capacity,
        queued=queued,
    )
    for (i, _), answer in zip(new, answers, strict=True):
        if isinstance(answer, QueueFull):
            out[i] = RunRefused(str(answer), reason="queue_full")
        elif isinstance(answer, SharedRunConflict):
            out[i] = RunRefused(str(answer), reason="conflict")
        else:
            out[i] = answer
    return [a for a in out if a is not None]


async def _read_batch(
    inst: RuntimeInstance, requests: list[RunRequest]
) -> tuple[dict[str, TenantSettings], list[str | None], int | None]:
    """What a batch's checks read, in one round trip: each tenant's settings, the RunId
    each SharedRunId already has (None: none yet) and, on a cluster, the local queue's
    length (the room :meth:`~airuntime.fleet.run_index.RunIndex.accept_many` gives
    out; on a standalone server the acceptance script reads it itself: None)."""
    tenant_ids = sorted({r.snapshot.tenant_id for r in requests})
    pipe = inst.redis.pipeline(transaction=False)
    for tid in tenant_ids:
        pipe.get(keys.tenant_settings(tid))
    for r in requests:
        pipe.get(keys.shared_run_to_run(r.shared_run_id, inst.index.buckets))
    on_cluster = inst.index.buckets > 1
    if on_cluster:
        pipe.llen(inst.index.queue_key(inst.instance_id))
    replies = await pipe.execute()
    n = len(tenant_ids)
    tenants = {
        tid: stored_settings(tid, raw) for tid, raw in zip(tenant_ids, replies[:n], strict=True)
    }
    found = replies[n : n + len(requests)]
    existing = [None if raw is None else reply_text(raw) for raw in found]
    return tenants, existing, int(replies[-1]) if on_cluster else None


def _same_tenant(request: RunRequest, run_id: str, owner: str | None) -> str:
    if owner is not None and owner != request.snapshot.tenant_id:
        raise RunRefused(
            f"SharedRunId {request.shared_run_id} already has a run of another tenant; "
            f"refused for tenant {request.snapshot.tenant_id}.",
            reason="conflict",
        )
    return run_id


def _check_open(inst: RuntimeInstance) -> None:
    if inst.stopping:
        raise RunRefused(
            f"Runtime instance {inst.instance_id} is shutting down.", reason="stopping"
        )
    if inst.paused:
        raise RunRefused(f"The queue of {inst.instance_id} is paused.", reason="paused")


def _check_compiles(
    inst: RuntimeInstance,
    request: RunRequest,
    tenant: TenantSettings,
    seen: dict[str, RunRefused | None],
) -> None:
    """Refuse a pipeline that does not compile for the tenant; ``seen`` remembers the
    verdict per (tenant, pipeline document) within one batch."""
    key = tenant.tenant_id + "\0" + json.dumps(request.pipeline, sort_keys=True, default=str)
    if key not in seen:
        try:
            inst.plans.compile(
                request.pipeline,
                allowed_handlers=tenant.allowed_handlers,
                allowed_model_providers=tenant.allowed_model_providers,
            )
            seen[key] = None
        except PipelineError as exc:
            seen[key] = RunRefused(f"run request pipeline: {exc}", reason="invalid")
    refusal = seen[key]
    if refusal is not None:
        raise RunRefused(str(refusal), reason=refusal.reason)


def _check_visible(inst: RuntimeInstance, tenant: TenantSettings) -> None:
    if inst.may_serve(tenant):
        return
    cfg = inst.config
    owner = " and ".join(
        part
        for part in (
            f"tenant {cfg.tenant_id}" if cfg.tenant_id else "",
            f"group {cfg.tenant_group_id}" if cfg.tenant_group_id else "",
        )
        if part
    )
    what = f"a {cfg.isolation_mode.value} runtime" + (f" of {owner}" if owner else "")
    raise RunRefused(
        f"Tenant {tenant.tenant_id} ({tenant.isolation_mode.value}) may not use runtime "
        f"instance {inst.instance_id} ({what}).",
        reason="not_visible",
    )
