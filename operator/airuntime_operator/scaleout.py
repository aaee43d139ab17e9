"""ScaleOutRequest handling: admit and scale, watch for the new instance, collect.

Why this module: a scale-out request is the control plane asking for capacity for
one shared run. The operator answers it in three steps, each recorded in the
request's status so a restarted (or newly elected) operator resumes where the
previous one stopped:

1. **observe** -- find the tenant's pool; record which registry instances of the
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
from datetime import timedelta
from typing import Any, Final

import kopf
from pydantic import ValidationError

from airuntime.fleet.registry import InstanceStatus
from airuntime.k8s.client import RUNTIME_POOL_KIND, SCALE_OUT_REQUEST_KIND, ApiError
from airuntime.k8s.v1alpha1 import EventReason, ScaleOutPhase
from airuntime_operator.context import OperatorContext
from airuntime_operator.kopf_bridge import api_failure
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


async def observe(
    ctx: OperatorContext,
    *,
    body: kopf.Body,
    patch: kopf.Patch,
    pools_by_target: Mapping[tuple[str, str, str], Collection[str]],
    retry: int,
) -> None:
    """Step 1: reject, or scale the pool and mark the request Observed."""
    meta, spec, status = body.metadata, body.spec, body.status
    namespace, uid = str(meta.namespace), str(meta.uid)
    tenant_id, prefix = str(spec["tenantId"]), str(spec["runtimePrefix"])
    requested = int(spec.get("requestedInstances", 1))
    requested_at = status.get("requestedAt") or meta.get("creationTimestamp")

    pool_name = spec.get("poolName")
    if pool_name is None:
        candidates = sorted(pools_by_target.get((namespace, tenant_id, prefix), ()))
        if not candidates:
            # The pools' watch stream may not have delivered a pool created just before
            # this request: ask the API server before rejecting.
            candidates = await _find_pools(ctx, namespace, tenant_id, prefix, retry)
        if len(candidates) != 1:
            found = "no RuntimePool" if not candidates else f"{len(candidates)} RuntimePools"
            _reject(
                body, patch,
                f"{found} with tenantId {tenant_id} and runtimePrefix {prefix} "
                f"in namespace {namespace}.",
                requestedAt=requested_at,
            )  # fmt: skip
            return
        pool_name = candidates[0]
    pool = await _get_pool(ctx, namespace, str(pool_name), retry)
    if pool is None:
        _reject(body, patch, f"RuntimePool {namespace}/{pool_name} does not exist.",
                requestedAt=requested_at)  # fmt: skip
        return
    try:
        pool_spec = parse_spec(pool["spec"])
    except ValidationError as exc:
        _reject(body, patch, f"RuntimePool {namespace}/{pool_name} has an invalid spec: {exc}",
                requestedAt=requested_at)  # fmt: skip
        return
    if pool_spec.tenant_id != tenant_id or pool_spec.runtime_prefix != prefix:
        _reject(
            body, patch,
            f"RuntimePool {namespace}/{pool_name} serves tenant {pool_spec.tenant_id} prefix "
            f"{pool_spec.runtime_prefix}, not tenant {tenant_id} prefix {prefix}.",
            requestedAt=requested_at,
        )  # fmt: skip
        return

    # The baseline is taken, and stored, before the pool grows: an instance that
    # registers between the scale and a later snapshot must still count as new.
    baseline: list[str] | None = status.get("baselineInstanceIds")
    if baseline is None:
        baseline = sorted(d.instance_id for d in await ctx.view.by_prefix(prefix, fresh=True))
        await _patch_status(
            ctx, namespace, str(meta.name), retry,
            {"phase": ScaleOutPhase.PENDING.value, "requestedAt": requested_at,
             "poolName": pool_name, "baselineInstanceIds": baseline},
        )  # fmt: skip

    annotations = pool["metadata"].get("annotations") or {}
    applied: list[str] = json.loads(annotations.get(APPLIED_ANNOTATION) or "[]")
    current = pool_spec.effective_replicas
    if uid in applied:  # a retry after the scale already happened
        previous, target = max(current - requested, 0), current
    else:
        previous, target = current, current + requested
        if target > pool_spec.max_instances:
            _reject(
                body, patch,
                f"RuntimePool {namespace}/{pool_name} has {current} replicas: {current} + "
                f"{requested} requested = {target} exceeds maxInstances {pool_spec.max_instances}.",
                requestedAt=requested_at, poolName=pool_name,
            )  # fmt: skip
            return
        new_applied = [*applied, uid][-_APPLIED_KEPT:]
        try:
            await ctx.kube.merge_patch(
                RUNTIME_POOL_KIND, namespace, str(pool_name),
                {
                    "metadata": {
                        "resourceVersion": pool["metadata"]["resourceVersion"],
                        "annotations": {APPLIED_ANNOTATION: json.dumps(new_applied)},
                    },
                    "spec": {"replicas": target},
                },
            )  # fmt: skip
        except ApiError as exc:
            # 409 Conflict: the pool changed since it was read (another request, an
            # HPA, a user); kopf retries this handler with backoff and a fresh read.
            raise api_failure(exc, retry) from None

    patch.status.update(
        {
            "phase": ScaleOutPhase.OBSERVED.value,
            "poolName": pool_name,
            "requestedAt": requested_at,
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
        f"shared run {spec.get('sharedRunId')}; waiting for a new ready instance of {prefix}.",
    )


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


async def _find_pools(
    ctx: OperatorContext, namespace: str, tenant_id: str, prefix: str, retry: int
) -> list[str]:
    try:
        pools = await ctx.kube.list(RUNTIME_POOL_KIND, namespace)
    except ApiError as exc:
        raise api_failure(exc, retry) from None
    return sorted(
        str(p["metadata"]["name"])
        for p in pools
        if p.get("spec", {}).get("tenantId") == tenant_id
        and p.get("spec", {}).get("runtimePrefix") == prefix
    )


async def _get_pool(
    ctx: OperatorContext, namespace: str, name: str, retry: int
) -> dict[str, Any] | None:
    try:
        return await ctx.kube.get(RUNTIME_POOL_KIND, namespace, name)
    except ApiError as exc:
        raise api_failure(exc, retry) from None


async def _patch_status(
    ctx: OperatorContext, namespace: str, name: str, retry: int, status: Mapping[str, Any]
) -> None:
    try:
        await ctx.kube.merge_patch(
            SCALE_OUT_REQUEST_KIND, namespace, name, {"status": dict(status)}, subresource="status"
        )
    except ApiError as exc:
        raise api_failure(exc, retry) from None
