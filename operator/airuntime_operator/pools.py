"""RuntimePool reconciliation: children, tenant settings, status, scale-in, cleanup.

Why this module: it holds *what happens* to a pool -- the kopf wiring in
:mod:`airuntime_operator.handlers` only decides *when*. A pool becomes:

* its children (ServiceAccount, Deployment), written with server-side apply, so an
  unchanged spec writes nothing and a changed pod template rolls the Deployment;
* its tenant settings in Redis (:meth:`airuntime.fleet.registry.Registry.put_tenant`);
* a status: desired/ready replicas, the registry's visible instances, conditions.

Deleting a pool (behind kopf's finalizer) removes its children, its tenant settings
and every registry entry with its prefix.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import Any, Final

import kopf
from pydantic import ValidationError

from airuntime.fleet.registry import InstanceDescriptor, InstanceStatus
from airuntime.k8s.client import (
    CONFIG_MAP,
    DEPLOYMENT,
    POD,
    RUNTIME_POOL_KIND,
    SERVICE,
    SERVICE_ACCOUNT,
    ApiError,
    Kind,
)
from airuntime.k8s.conditions import EventReason
from airuntime.k8s.conditions import RuntimePoolConditionReason as Reason
from airuntime.k8s.conditions import RuntimePoolConditionType as ConditionType
from airuntime.k8s.v1alpha1 import RuntimePoolSpec
from airuntime_operator import deployments
from airuntime_operator.context import OperatorContext
from airuntime_operator.kopf_bridge import api_failure
from airuntime_operator.status import find_condition, is_true, with_condition

__all__ = [
    "DELETION_COST_ANNOTATION",
    "DeploymentState",
    "delete_pool",
    "deployment_state",
    "parse_spec",
    "readiness",
    "reconcile_pool",
    "refresh_status",
    "scale_in",
]

DELETION_COST_ANNOTATION: Final = "controller.kubernetes.io/pod-deletion-cost"
_IDLE_POD_DELETION_COST: Final = "-1000"

DeploymentState = Mapping[str, Any]
"""What the operator's Deployment index keeps of a pool's Deployment."""


def parse_spec(spec: Mapping[str, Any]) -> RuntimePoolSpec:
    return RuntimePoolSpec.model_validate(dict(spec))


async def reconcile_pool(
    ctx: OperatorContext,
    *,
    body: kopf.Body,
    patch: kopf.Patch,
    previous: DeploymentState | None,
    retry: int,
) -> None:
    """Apply the pool's children and publish its tenant settings; report in the status."""
    meta = body.metadata
    generation = meta.get("generation")
    conditions: list[dict[str, Any]] = list(body.status.get("conditions") or [])
    try:
        spec = parse_spec(body.spec)
    except ValidationError as exc:
        message = f"Invalid spec: {_validation_text(exc)}"
        _report_failure(body, patch, conditions, Reason.INVALID_SPEC, message, generation)
        # This generation is handled (it cannot succeed): it is no longer a change to
        # handle (persistence.ObservedGenerationDiffBase) until the spec changes again.
        patch.status["observedGeneration"] = generation
        raise kopf.PermanentError(message) from None
    ref = deployments.PoolRef(str(meta.name), str(meta.namespace), str(meta.uid))
    try:
        applied = await _apply_children(ctx, ref, spec)
    except ApiError as exc:
        message = f"Applying the pool's objects failed: {exc.api_message or exc}"
        _report_failure(body, patch, conditions, Reason.APPLY_FAILED, message, generation)
        raise api_failure(exc, retry) from None
    await ctx.registry.put_tenant(spec.tenant_settings())

    patch.status.update(
        {
            "desiredReplicas": spec.effective_replicas,
            "readyReplicas": int((previous or {}).get("readyReplicas") or 0),
            "visibleInstances": len(await ctx.view.by_prefix(spec.runtime_prefix)),
            "observedGeneration": generation,
            "selector": deployments.selector_string(spec),
            "deploymentName": spec.runtime_prefix,
            "conditions": _reconciled(conditions, spec, deployment_state(applied), generation),
        }
    )
    state = deployment_state(applied)
    if previous is None or previous.get("generation") != state["generation"]:
        _inform(
            ctx, body, EventReason.RECONCILED,
            f"{_rollout_summary(spec, previous, state)}; tenant settings of "
            f"{spec.tenant_id} published (maxConcurrentStepTasks="
            f"{spec.max_concurrent_step_tasks}).",
        )  # fmt: skip


def _inform(ctx: OperatorContext, body: kopf.Body, reason: EventReason, message: str) -> None:
    """An informational event on the pool, unless the operator's settings turn them off."""
    if ctx.settings.pool_events:
        kopf.info(body, reason=reason, message=message)


async def _apply_children(
    ctx: OperatorContext, ref: deployments.PoolRef, spec: RuntimePoolSpec
) -> dict[str, Any]:
    """Server-side apply of every object of the pool; returns the applied Deployment."""
    settings = ctx.settings
    *dependencies, deployment = deployments.children(
        ref,
        spec,
        image=spec.image or settings.runtime_image,
        extra_labels=settings.extra_labels,
        platform_env=settings.runtime_platform_env(),
    )
    # What the pods refer to (the ServiceAccount) first, then the Deployment: its
    # first pod never waits for a missing ServiceAccount.
    await _gather_all(ctx.kube.apply(obj) for obj in dependencies)
    return await ctx.kube.apply(deployment)


async def _gather_all(requests: Iterable[Awaitable[Any]]) -> None:
    """Await every request; the first failure is raised once all have finished."""
    outcomes = await asyncio.gather(*requests, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


def _report_failure(
    body: kopf.Body,
    patch: kopf.Patch,
    conditions: Sequence[Mapping[str, Any]],
    reason: Reason,
    message: str,
    generation: int | None,
) -> None:
    """Reconciled and Ready turn False with ``reason``; a warning event says why."""
    conditions = with_condition(
        conditions, type_=ConditionType.RECONCILED, status=False, reason=reason,
        message=message, generation=generation,
    )  # fmt: skip
    prefix = str(body.spec.get("runtimePrefix", ""))
    patch.status["conditions"] = _with_readiness(conditions, 0, None, prefix, generation)
    kopf.warn(body, reason=EventReason(reason), message=message)  # same name as the reason


def _reconciled(
    conditions: Sequence[Mapping[str, Any]],
    spec: RuntimePoolSpec,
    deployment: DeploymentState,
    generation: int | None,
) -> list[dict[str, Any]]:
    """The conditions of a pool whose objects are applied and tenant settings published."""
    replicas = spec.effective_replicas
    updated = with_condition(
        conditions, type_=ConditionType.RECONCILED, status=True, reason=Reason.APPLIED,
        message=f"Deployment {spec.runtime_prefix} has {replicas} desired replicas.",
        generation=generation,
    )  # fmt: skip
    updated = with_condition(
        updated, type_=ConditionType.TENANT_SETTINGS_PUBLISHED, status=True,
        reason=Reason.PUBLISHED, message=f"Tenant settings of {spec.tenant_id} are in Redis.",
        generation=generation,
    )  # fmt: skip
    return _with_readiness(updated, replicas, deployment, spec.runtime_prefix, generation)


def _rollout_summary(
    spec: RuntimePoolSpec, previous: DeploymentState | None, applied: DeploymentState
) -> str:
    """What applying the spec did to the Deployment, for the Reconciled event."""
    name, replicas = spec.runtime_prefix, spec.effective_replicas
    if previous is None:
        return f"created Deployment {name} with {replicas} replicas"
    if previous.get("templateHash") != applied.get("templateHash"):
        return f"rolling out a new pod template on Deployment {name}"
    return f"Deployment {name} unchanged apart from replicas={replicas}"


def deployment_state(deployment: Mapping[str, Any]) -> dict[str, Any]:
    """What the operator keeps of a pool's Deployment (its index, the status, Ready)."""
    status = deployment.get("status") or {}
    annotations = (deployment.get("metadata") or {}).get("annotations") or {}
    return {
        "generation": (deployment.get("metadata") or {}).get("generation"),
        "readyReplicas": status.get("readyReplicas", 0),
        "availableReplicas": status.get("availableReplicas", 0),
        "replicas": status.get("replicas", 0),
        "templateHash": annotations.get(deployments.TEMPLATE_HASH_ANNOTATION),
    }


def readiness(
    conditions: Sequence[Mapping[str, Any]],
    *,
    desired: int,
    deployment: DeploymentState | None,
    name: str,
) -> tuple[bool, str, str]:
    """The pool's Ready condition (status, reason, message): True when it is reconciled,
    its tenant settings are published and Deployment ``name`` has ``desired`` replicas
    available; otherwise False with the first thing missing."""
    reconciled = find_condition(conditions, ConditionType.RECONCILED)
    if not is_true(reconciled):
        if reconciled is None:
            return False, Reason.NOT_RECONCILED, "The operator has not reconciled the pool yet."
        return False, str(reconciled["reason"]), f"Not reconciled: {reconciled.get('message')}"
    if not is_true(find_condition(conditions, ConditionType.TENANT_SETTINGS_PUBLISHED)):
        return False, Reason.TENANT_SETTINGS_NOT_PUBLISHED, "The tenant settings are not in Redis."
    if deployment is None:
        return False, Reason.DEPLOYMENT_NOT_FOUND, f"Deployment {name} does not exist."
    available = int(deployment.get("availableReplicas") or 0)
    counts = f"{available}/{desired} replicas of Deployment {name} are available"
    if available < desired:
        return False, Reason.REPLICAS_UNAVAILABLE, f"{counts}."
    return True, Reason.REPLICAS_AVAILABLE, f"{counts}; the tenant settings are published."


def _with_readiness(
    conditions: Sequence[Mapping[str, Any]],
    desired: int,
    deployment: DeploymentState | None,
    name: str,
    generation: int | None,
) -> list[dict[str, Any]]:
    ready, reason, message = readiness(
        conditions, desired=desired, deployment=deployment, name=name
    )
    return with_condition(
        conditions, type_=ConditionType.READY, status=ready, reason=reason, message=message,
        generation=generation,
    )  # fmt: skip


async def refresh_status(
    ctx: OperatorContext,
    *,
    body: kopf.Body,
    patch: kopf.Patch,
    deployment: DeploymentState | None,
) -> list[InstanceDescriptor]:
    """Copy the Deployment's ready replicas and the registry's instance count into the
    status, and re-evaluate Ready, when they changed. Returns the pool's registry
    instances."""
    prefix = str(body.spec.get("runtimePrefix", ""))
    instances = await ctx.view.by_prefix(prefix)
    status = body.status
    if find_condition(status.get("conditions"), ConditionType.RECONCILED) is None:
        return instances  # not reconciled yet: the reconcile writes the first status
    ready = int((deployment or {}).get("readyReplicas") or 0)
    if status.get("readyReplicas") != ready:
        patch.status["readyReplicas"] = ready
    if status.get("visibleInstances") != len(instances):
        patch.status["visibleInstances"] = len(instances)
    await _refresh_readiness(ctx, body, patch, deployment)
    await _restore_tenant_settings(ctx, body)
    return instances


async def _restore_tenant_settings(ctx: OperatorContext, body: kopf.Body) -> None:
    """Publish a reconciled pool's tenant settings again if Redis has none for its
    tenant: a Redis that lost its data (the chart's Valkey keeps none across a
    restart) would otherwise leave the tenant Shared, with the default handlers, until
    the pool's spec changed or the operator restarted. Settings that are there (this
    pool's, or changed since through the API) are left as they are. Only for a pool
    whose last reconcile published them; not for one being deleted (its cleanup
    removes them)."""
    reconciled = find_condition(body.status.get("conditions"), ConditionType.RECONCILED)
    if body.metadata.get("deletionTimestamp") or not is_true(reconciled):
        return
    try:
        spec = parse_spec(body.spec)
    except ValidationError:
        return  # the reconcile reported it; nothing was published for it
    if await ctx.registry.put_tenant_if_absent(spec.tenant_settings()):
        kopf.warn(
            body,
            reason=EventReason.TENANT_SETTINGS_RESTORED,
            message=f"The tenant settings of {spec.tenant_id} were gone from Redis "
            "(it lost its data?): published them again.",
        )


async def _refresh_readiness(
    ctx: OperatorContext, body: kopf.Body, patch: kopf.Patch, deployment: DeploymentState | None
) -> None:
    """Re-evaluate Ready from the indexed Deployment; patch the conditions if it changed.

    Before the first reconcile there is nothing to say (reconcile sets Ready). A
    Deployment the index has not seen is read from the API server before it counts as
    missing: the index can lag behind the apply that created it.
    """
    status = body.status
    conditions = list(status.get("conditions") or [])
    reconciled = find_condition(conditions, ConditionType.RECONCILED)
    if reconciled is None:
        return
    prefix = str(body.spec.get("runtimePrefix", ""))
    if deployment is None and is_true(reconciled):
        found = await ctx.kube.get(DEPLOYMENT, str(body.metadata.namespace), prefix)
        deployment = None if found is None else deployment_state(found)
    desired = int(status.get("desiredReplicas") or 0)
    generation = status.get("observedGeneration")
    updated = _with_readiness(conditions, desired, deployment, prefix, generation)
    before, after = (find_condition(c, ConditionType.READY) for c in (conditions, updated))
    if _differs(before, after):
        patch.status["conditions"] = updated


def _differs(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> bool:
    """Whether a condition changed in more than its transition time."""
    keys = ("status", "reason", "message", "observedGeneration")
    return before is None or after is None or any(before.get(k) != after.get(k) for k in keys)


async def scale_in(
    ctx: OperatorContext,
    *,
    body: kopf.Body,
    instances: Sequence[InstanceDescriptor],
) -> int:
    """Remove pods that stayed idle for the pool's ``idleScaleInDelaySeconds``.

    The idle pods get a low ``pod-deletion-cost`` first, so that the ReplicaSet
    controller deletes exactly them when the replicas drop; never below
    ``minInstances``. Returns the number of pods removed.
    """
    try:
        spec = parse_spec(body.spec)
    except ValidationError:
        return 0
    idle = _idle_for_the_delay(ctx, spec, instances)
    removable = min(len(idle), spec.effective_replicas - spec.min_instances)
    if not ctx.settings.scale_in or spec.idle_scale_in_delay_seconds == 0 or removable <= 0:
        return 0
    victims = await _lower_deletion_cost(ctx, str(body.metadata.namespace), idle[:removable])
    if not victims:
        return 0
    target = spec.effective_replicas - len(victims)
    if not await _lower_replicas(ctx, body, target):
        return 0
    for instance_id in victims:
        ctx.idle_since[spec.runtime_prefix].pop(instance_id, None)
    _inform(
        ctx,
        body,
        EventReason.SCALED_IN,
        f"Scaled in from {spec.effective_replicas} to {target} replicas: "
        f"{', '.join(victims)} idle for at least {spec.idle_scale_in_delay_seconds}s.",
    )
    return len(victims)


def _idle_for_the_delay(
    ctx: OperatorContext, spec: RuntimePoolSpec, instances: Sequence[InstanceDescriptor]
) -> list[str]:
    """The pool's instances idle for at least the scale-in delay, longest idle first.

    Remembers when each instance was first seen idle; one that is busy again, or gone
    from the registry, is forgotten.
    """
    moment = time.monotonic()
    previously = ctx.idle_since.get(spec.runtime_prefix, {})
    idle_since: dict[str, float] = {}
    idle: list[tuple[float, str]] = []
    for descriptor in instances:
        if not _is_idle(descriptor):
            continue
        instance_id = descriptor.instance_id
        since = idle_since[instance_id] = previously.get(instance_id, moment)
        if moment - since >= spec.idle_scale_in_delay_seconds:
            idle.append((since, instance_id))
    ctx.idle_since[spec.runtime_prefix] = idle_since
    return [instance_id for _, instance_id in sorted(idle, key=lambda pair: pair[0])]


def _is_idle(descriptor: InstanceDescriptor) -> bool:
    capacity = descriptor.capacity
    return (
        descriptor.status is InstanceStatus.READY
        and capacity.active_run_count == 0
        and capacity.active_worker_count == 0
    )


async def _lower_deletion_cost(
    ctx: OperatorContext, namespace: str, instance_ids: Sequence[str]
) -> list[str]:
    """Mark the pods of ``instance_ids`` as the ReplicaSet's first to delete; returns
    those marked (an instance with no pod in the namespace is skipped)."""
    marked: list[str] = []
    for instance_id in instance_ids:
        try:
            await ctx.kube.merge_patch(
                POD, namespace, instance_id,
                {"metadata": {"annotations": {DELETION_COST_ANNOTATION: _IDLE_POD_DELETION_COST}}},
            )  # fmt: skip
        except ApiError as exc:
            if exc.not_found:
                continue  # registered, but not a pod of this namespace
            raise
        marked.append(instance_id)
    return marked


async def _lower_replicas(ctx: OperatorContext, body: kopf.Body, target: int) -> bool:
    """Set the pool's ``spec.replicas`` to ``target`` unless the pool changed since it
    was read (then ``False``: decide again on the next tick)."""
    try:
        await ctx.kube.merge_patch(
            RUNTIME_POOL_KIND, str(body.metadata.namespace), str(body.metadata.name),
            {
                "metadata": {"resourceVersion": body.metadata.get("resourceVersion")},
                "spec": {"replicas": target},
            },
        )  # fmt: skip
    except ApiError as exc:
        if exc.conflict:
            return False
        raise
    return True


async def delete_pool(ctx: OperatorContext, *, body: kopf.Body) -> None:
    """Remove the pool's children, its tenant settings and its registry entries."""
    meta = body.metadata
    namespace, uid = str(meta.namespace), str(meta.uid)
    prefix = str(body.spec.get("runtimePrefix", ""))
    tenant_id = str(body.spec.get("tenantId", ""))
    removed: list[str] = []
    if prefix:
        for kind, name in (
            (DEPLOYMENT, prefix),
            (SERVICE_ACCOUNT, prefix),
            # What operators before 0.2 also made for a pool (now two objects only).
            (SERVICE, prefix),
            (CONFIG_MAP, f"{prefix}-live-settings"),
        ):
            if await _delete_owned(ctx, kind, namespace, name, uid):
                removed.append(f"{kind.kind} {name}")

    dropped_tenant = False
    if tenant_id and tenant_id in await ctx.registry.tenant_ids():
        stored = await ctx.registry.tenant(tenant_id)
        if stored.runtime_prefix == prefix:  # not another pool's settings
            await ctx.registry.delete_tenant(tenant_id)
            dropped_tenant = True
    ctx.idle_since.pop(prefix, None)
    instances = await ctx.view.by_prefix(prefix, fresh=True) if prefix else []
    for descriptor in instances:
        await ctx.registry.unregister(descriptor.instance_id)
    _inform(
        ctx,
        body,
        EventReason.DELETED,
        f"Removed {', '.join(removed) or 'no objects'}; "
        f"tenant settings {'removed' if dropped_tenant else 'kept'}; "
        f"{len(instances)} registry entries of prefix {prefix} removed.",
    )


async def _delete_owned(
    ctx: OperatorContext, kind: Kind, namespace: str, name: str, owner_uid: str
) -> bool:
    """Delete ``name`` when this pool owns it (never another pool's object)."""
    obj = await ctx.kube.get(kind, namespace, name)
    if obj is None:
        return False
    owners = obj.get("metadata", {}).get("ownerReferences") or []
    if not any(ref.get("uid") == owner_uid for ref in owners):
        return False
    return await ctx.kube.delete(kind, namespace, name)


def _validation_text(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {err['msg']}" for err in exc.errors()
    )
