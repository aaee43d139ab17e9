"""ScaleOutRequest handling: admit and scale, watch for the new instance, collect.

Why this module: a scale-out request is the control plane asking for capacity for
one shared run. The operator answers it in three steps, each recorded in the
request's status so a restarted (or newly elected) operator resumes where the
previous one stopped:

1. **observe** -- find the tenant's pool and make it the request's owner (an
   ``ownerReference``, so deleting the pool garbage-collects its requests: the control
   plane files them, nothing of the release owns them, and they would outlive
   ``helm uninstall``); record which registry instances of the
   prefix exist *before* scaling (the baseline: none of them can fulfil); reject
   when ``current replicas + requestedInstances > maxInstances``; otherwise raise
   the pool's ``spec.replicas`` with an optimistic-locked patch that also records the
   request's uid on the pool (so a retried request never scales twice) -> Observed.
2. **fulfil** -- poll the registry (Redis has no watch) until an instance of the
   prefix that is not in the baseline, not promised to another request, and
   ``capacity.can_accept_run`` appears -> Fulfilled with its id; after
   ``fulfilment_timeout_seconds`` -> Rejected.
3. **collect** -- delete finished requests older than the retention period.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

import kopf
from pydantic import ValidationError

from airuntime.fleet.registry import InstanceStatus
from airuntime.k8s.client import RUNTIME_POOL_KIND, SCALE_OUT_REQUEST_KIND
from airuntime.k8s.conditions import EventReason
from airuntime.k8s.v1alpha1 import RuntimePoolSpec, ScaleOutPhase
from airuntime_operator.context import OperatorContext
from airuntime_operator.kopf_bridge import api_outcomes
from airuntime_operator.pools import parse_spec
from airuntime_operator.status import format_time, now, parse_time

__all__ = [
    "APPLIED_ANNOTATION",
    "TERMINAL_PHASES",
    "collect",
    "fulfil",
    "observe",
]

APPLIED_ANNOTATION: Final = "airuntime.io/applied-scale-outs"
"""On a RuntimePool: JSON list of the uids of the last scale-out requests applied to it."""
_APPLIED_KEPT: Final = 32
TERMINAL_PHASES: Final = frozenset({ScaleOutPhase.FULFILLED.value, ScaleOutPhase.REJECTED.value})


def _reject(body: kopf.Body, patch: kopf.Patch, reason: str, **extra: Any) -> None:
    reason = reason[:4000]  # status.reason is bounded by the CRD schema
    patch.status.update(
        {"phase": ScaleOutPhase.REJECTED.value, "reason": reason,
         "rejectedAt": format_time(now()), **extra}
    )  # fmt: skip
    kopf.warn(body, reason=EventReason.REJECTED, message=reason)


@dataclass(frozen=True)
class _Request:
    """What observing a ScaleOutRequest needs of it."""

    namespace: str
    name: str
    uid: str
    tenant_id: str
    prefix: str
    requested: int
    requested_at: Any
    pool_name: str | None
    shared_run_id: Any
    owner_uids: frozenset[str]

    @classmethod
    def of(cls, body: kopf.Body) -> _Request:
        meta, spec = body.metadata, body.spec
        owners = meta.get("ownerReferences") or []
        return cls(
            owner_uids=frozenset(str(o.get("uid")) for o in owners),
            namespace=str(meta.namespace),
            name=str(meta.name),
            uid=str(meta.uid),
            tenant_id=str(spec["tenantId"]),
            prefix=str(spec["runtimePrefix"]),
            requested=int(spec.get("requestedInstances", 1)),
            requested_at=body.status.get("requestedAt") or meta.get("creationTimestamp"),
            pool_name=spec.get("poolName"),
            shared_run_id=spec.get("sharedRunId"),
        )


class _Rejection(Exception):
    """A precondition of the request does not hold: it is Rejected with ``reason``."""

    def __init__(self, reason: str, **status: Any) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


async def observe(
    ctx: OperatorContext,
    *,
    body: kopf.Body,
    patch: kopf.Patch,
    pools_by_target: Mapping[tuple[str, str, str], Collection[str]],
    retry: int,
) -> None:
    """Step 1: reject, or scale the pool and mark the request Observed."""
    request = _Request.of(body)
    try:
        pool_name = request.pool_name or await _only_pool(ctx, request, pools_by_target, retry)
        pool = await _existing_pool(ctx, request, pool_name, retry)
        pool_spec = _valid_pool_spec(request, pool_name, pool)
        _check_serves(request, pool_name, pool_spec)
        await _owned_by(ctx, request, pool, retry)
        baseline = await _baseline(ctx, request, body.status, pool_name, retry)
        previous, target = await _scale(ctx, request, pool_name, pool, pool_spec, retry)
    except _Rejection as rejection:
        _reject(body, patch, rejection.reason, requestedAt=request.requested_at, **rejection.status)
        return
    patch.status.update(
        {
            "phase": ScaleOutPhase.OBSERVED.value,
            "poolName": pool_name,
            "requestedAt": request.requested_at,
            "observedAt": format_time(now()),
            "previousReplicas": previous,
            "targetReplicas": target,
            "baselineInstanceIds": baseline,
        }
    )
    kopf.info(
        body,
        reason=EventReason.OBSERVED,
        message=f"Scaled RuntimePool {pool_name} from {previous} to {target} replicas for "
        f"shared run {request.shared_run_id}; waiting for a new ready instance of "
        f"{request.prefix}.",
    )


async def _only_pool(
    ctx: OperatorContext,
    request: _Request,
    pools_by_target: Mapping[tuple[str, str, str], Collection[str]],
    retry: int,
) -> str:
    """The one pool of the request's tenant and prefix in its namespace."""
    key = (request.namespace, request.tenant_id, request.prefix)
    candidates = sorted(pools_by_target.get(key, ()))
    if not candidates:
        # The pools' watch stream may not have delivered a pool created just before
        # this request: ask the API server before rejecting.
        candidates = await _find_pools(ctx, request, retry)
    if len(candidates) != 1:
        found = "no RuntimePool" if not candidates else f"{len(candidates)} RuntimePools"
        raise _Rejection(
            f"{found} with tenantId {request.tenant_id} and runtimePrefix {request.prefix} "
            f"in namespace {request.namespace}."
        )
    return candidates[0]


async def _existing_pool(
    ctx: OperatorContext, request: _Request, pool_name: str, retry: int
) -> dict[str, Any]:
    with api_outcomes(retry):
        pool = await ctx.kube.get(RUNTIME_POOL_KIND, request.namespace, pool_name)
    if pool is None:
        raise _Rejection(f"RuntimePool {request.namespace}/{pool_name} does not exist.")
    return pool


async def _owned_by(
    ctx: OperatorContext, request: _Request, pool: Mapping[str, Any], retry: int
) -> None:
    """Make the pool the request's owner, once: the garbage collector then deletes the
    request with the pool. No ``blockOwnerDeletion``: a request never delays its pool."""
    meta = pool["metadata"]
    if str(meta["uid"]) in request.owner_uids:
        return
    owner = {
        "apiVersion": RUNTIME_POOL_KIND.api_version,
        "kind": RUNTIME_POOL_KIND.kind,
        "name": str(meta["name"]),
        "uid": str(meta["uid"]),
    }
    with api_outcomes(retry):
        await ctx.kube.merge_patch(
            SCALE_OUT_REQUEST_KIND, request.namespace, request.name,
            {"metadata": {"ownerReferences": [owner]}},
        )  # fmt: skip


def _valid_pool_spec(request: _Request, pool_name: str, pool: Mapping[str, Any]) -> RuntimePoolSpec:
    try:
        return parse_spec(pool["spec"])
    except ValidationError as exc:
        raise _Rejection(
            f"RuntimePool {request.namespace}/{pool_name} has an invalid spec: {exc}"
        ) from None


def _check_serves(request: _Request, pool_name: str, spec: RuntimePoolSpec) -> None:
    """The pool must be the request's tenant's, of the request's prefix."""
    if spec.tenant_id != request.tenant_id or spec.runtime_prefix != request.prefix:
        raise _Rejection(
            f"RuntimePool {request.namespace}/{pool_name} serves tenant {spec.tenant_id} prefix "
            f"{spec.runtime_prefix}, not tenant {request.tenant_id} prefix {request.prefix}."
        )


async def _baseline(
    ctx: OperatorContext,
    request: _Request,
    status: Mapping[str, Any],
    pool_name: str,
    retry: int,
) -> list[str]:
    """The registry instances of the prefix before the pool grows (none of them fulfils).

    It is taken, and stored, before the pool grows: an instance that registers between
    the scale and a later snapshot must still count as new.
    """
    stored: list[str] | None = status.get("baselineInstanceIds")
    if stored is not None:
        return stored
    baseline = sorted(d.instance_id for d in await ctx.view.by_prefix(request.prefix, fresh=True))
    with api_outcomes(retry):
        await ctx.kube.merge_patch(
            SCALE_OUT_REQUEST_KIND, request.namespace, request.name,
            {"status": {"phase": ScaleOutPhase.PENDING.value, "requestedAt": request.requested_at,
                        "poolName": pool_name, "baselineInstanceIds": baseline}},
            subresource="status",
        )  # fmt: skip
    return baseline


async def _scale(
    ctx: OperatorContext,
    request: _Request,
    pool_name: str,
    pool: Mapping[str, Any],
    spec: RuntimePoolSpec,
    retry: int,
) -> tuple[int, int]:
    """Raise the pool's replicas by the requested instances, once per request, within
    ``maxInstances``; returns the replicas before and after."""
    annotations = pool["metadata"].get("annotations") or {}
    applied: list[str] = json.loads(annotations.get(APPLIED_ANNOTATION) or "[]")
    current = spec.effective_replicas
    if request.uid in applied:  # a retry after the scale already happened
        return max(current - request.requested, 0), current
    target = current + request.requested
    if target > spec.max_instances:
        raise _Rejection(
            f"RuntimePool {request.namespace}/{pool_name} has {current} replicas: {current} + "
            f"{request.requested} requested = {target} exceeds maxInstances {spec.max_instances}.",
            poolName=pool_name,
        )
    # 409 Conflict: the pool changed since it was read (another request, an HPA, a
    # user); kopf retries this handler with backoff and a fresh read.
    with api_outcomes(retry):
        await ctx.kube.merge_patch(
            RUNTIME_POOL_KIND, request.namespace, pool_name,
            {
                "metadata": {
                    "resourceVersion": pool["metadata"]["resourceVersion"],
                    "annotations": {
                        APPLIED_ANNOTATION: json.dumps([*applied, request.uid][-_APPLIED_KEPT:])
                    },
                },
                "spec": {"replicas": target},
            },
        )  # fmt: skip
    return current, target


async def fulfil(
    ctx: OperatorContext,
    *,
    body: kopf.Body,
    patch: kopf.Patch,
    promised: Collection[str],
) -> bool:
    """Step 2: mark the request Fulfilled once a new, ready instance of its prefix is
    visible; Rejected when that takes longer than the fulfilment timeout."""
    spec, status = body.spec, body.status
    prefix = str(spec["runtimePrefix"])
    baseline = set(status.get("baselineInstanceIds") or ())
    taken = set(promised) | {i for i, u in ctx.claimed_instances.items() if u != body.metadata.uid}
    for descriptor in await ctx.view.by_prefix(prefix):
        if (
            descriptor.instance_id in baseline
            or descriptor.instance_id in taken
            or descriptor.status is not InstanceStatus.READY
            or not descriptor.capacity.can_accept_run
        ):
            continue
        ctx.claimed_instances[descriptor.instance_id] = str(body.metadata.uid)
        patch.status.update(
            {
                "phase": ScaleOutPhase.FULFILLED.value,
                "fulfilledRuntimeInstanceId": descriptor.instance_id,
                "fulfilledAt": format_time(now()),
            }
        )
        kopf.info(
            body,
            reason=EventReason.FULFILLED,
            message=f"Runtime instance {descriptor.instance_id} of {prefix} can accept "
            f"shared run {spec.get('sharedRunId')}.",
        )
        return True
    observed_at = parse_time(status.get("observedAt"))
    timeout = ctx.settings.fulfilment_timeout_seconds
    if observed_at is not None and now() - observed_at > timedelta(seconds=timeout):
        _reject(
            body, patch,
            f"No new ready runtime instance of {prefix} within {timeout:g}s after scaling "
            f"RuntimePool {status.get('poolName')}.",
        )  # fmt: skip
    return False


async def collect(ctx: OperatorContext, *, body: kopf.Body, logger: kopf.Logger) -> bool:
    """Step 3: delete the request when it finished more than the retention period ago."""
    status = body.status
    finished = parse_time(status.get("fulfilledAt") or status.get("rejectedAt"))
    if finished is None:
        return False
    if now() - finished < timedelta(seconds=ctx.settings.retention_seconds):
        return False
    meta = body.metadata
    deleted = await ctx.kube.delete(SCALE_OUT_REQUEST_KIND, str(meta.namespace), str(meta.name))
    for instance_id, uid in list(ctx.claimed_instances.items()):
        if uid == meta.uid:
            del ctx.claimed_instances[instance_id]
    logger.info(
        f"Deleted {status.get('phase')} scale-out request {meta.namespace}/{meta.name}: "
        f"finished at {status.get('fulfilledAt') or status.get('rejectedAt')}, "
        f"retention {ctx.settings.retention_seconds:g}s."
    )
    return deleted


async def _find_pools(ctx: OperatorContext, request: _Request, retry: int) -> list[str]:
    with api_outcomes(retry):
        pools = await ctx.kube.list(RUNTIME_POOL_KIND, request.namespace)
    return sorted(
        str(p["metadata"]["name"])
        for p in pools
        if p.get("spec", {}).get("tenantId") == request.tenant_id
        and p.get("spec", {}).get("runtimePrefix") == request.prefix
    )
