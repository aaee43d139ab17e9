"""RuntimePool reconciliation: children, tenant settings, status, scale-in, cleanup.

Why this module: it holds *what happens* to a pool -- the kopf wiring in
:mod:`airuntime_operator.handlers` only decides *when*. A pool becomes:

* its children (ServiceAccount, live-settings ConfigMap, headless Service,
  Deployment), written with server-side apply, so an unchanged spec writes nothing
  and a changed pod template rolls the Deployment;
* its tenant settings in Redis (:meth:`airuntime.fleet.registry.Registry.put_tenant`);
* a status: desired/ready replicas, the registry's visible instances, conditions.

Deleting a pool (behind kopf's finalizer) removes its children, its tenant settings
and every registry entry with its prefix.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
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
from airuntime.k8s.v1alpha1 import RuntimePoolSpec
from airuntime_operator import deployments
from airuntime_operator.context import OperatorContext
from airuntime_operator.kopf_bridge import api_failure
from airuntime_operator.status import with_condition

__all__ = [
    "DELETION_COST_ANNOTATION",
    "DeploymentState",
    "delete_pool",
    "parse_spec",
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
    meta, status = body.metadata, body.status
    generation = meta.get("generation")
    conditions: list[dict[str, Any]] = list(status.get("conditions") or [])
    try:
        spec = parse_spec(body.spec)
    except ValidationError as exc:
        message = f"Invalid spec: {_validation_text(exc)}"
        patch.status["conditions"] = with_condition(
            conditions, type_="Reconciled", status=False, reason="InvalidSpec",
            message=message, generation=generation,
        )  # fmt: skip
        kopf.warn(body, reason="InvalidSpec", message=message)
        raise kopf.PermanentError(message) from None

    ref = deployments.PoolRef(str(meta.name), str(meta.namespace), str(meta.uid))
    image = spec.image or ctx.settings.runtime_image
    objects = deployments.children(ref, spec, image=image, extra_labels=ctx.settings.extra_labels)
    new_hash = objects[-1]["metadata"]["annotations"][deployments.TEMPLATE_HASH_ANNOTATION]
    try:
        for obj in objects:
            await ctx.kube.apply(obj)
    except ApiError as exc:
        message = f"Applying the pool's objects failed: {exc.api_message or exc}"
        patch.status["conditions"] = with_condition(
            conditions, type_="Reconciled", status=False, reason="ApplyFailed",
            message=message, generation=generation,
        )  # fmt: skip
        kopf.warn(body, reason="ApplyFailed", message=message)
        raise api_failure(exc, retry) from None

    settings = spec.tenant_settings()
    await ctx.registry.put_tenant(settings)

    replicas = spec.effective_replicas
    conditions = with_condition(
        conditions, type_="Reconciled", status=True, reason="Applied",
        message=f"Deployment {spec.runtime_prefix} has {replicas} desired replicas.",
        generation=generation,
    )  # fmt: skip
    conditions = with_condition(
        conditions, type_="TenantSettingsPublished", status=True, reason="Published",
        message=f"Tenant settings of {spec.tenant_id} are in Redis.", generation=generation,
    )  # fmt: skip
    patch.status["desiredReplicas"] = replicas
    patch.status["readyReplicas"] = int((previous or {}).get("readyReplicas") or 0)
    patch.status["visibleInstances"] = len(await ctx.view.by_prefix(spec.runtime_prefix))
    patch.status["observedGeneration"] = generation
    patch.status["selector"] = deployments.selector_string(spec)
    patch.status["deploymentName"] = spec.runtime_prefix
    patch.status["conditions"] = conditions

    old_hash = (previous or {}).get("templateHash")
    if previous is None:
        what = f"created Deployment {spec.runtime_prefix} with {replicas} replicas"
    elif old_hash != new_hash:
        what = f"rolling out a new pod template on Deployment {spec.runtime_prefix}"
    else:
        what = f"Deployment {spec.runtime_prefix} unchanged apart from replicas={replicas}"
    kopf.info(
        body,
        reason="Reconciled",
        message=f"{what}; tenant settings of {spec.tenant_id} published "
        f"(maxConcurrentStepTasks={spec.max_concurrent_step_tasks}).",
    )


async def refresh_status(
    ctx: OperatorContext,
    *,
    body: kopf.Body,
    patch: kopf.Patch,
    deployment: DeploymentState | None,
) -> list[InstanceDescriptor]:
    """Copy the Deployment's ready replicas and the registry's instance count into the
    status, when they changed. Returns the pool's registry instances."""
    prefix = str(body.spec.get("runtimePrefix", ""))
    instances = await ctx.view.by_prefix(prefix)
    ready = int((deployment or {}).get("readyReplicas") or 0)
    status = body.status
    if status.get("readyReplicas") != ready:
        patch.status["readyReplicas"] = ready
    if status.get("visibleInstances") != len(instances):
        patch.status["visibleInstances"] = len(instances)
    return instances


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
    delay = spec.idle_scale_in_delay_seconds
    moment = time.monotonic()
    previously = ctx.idle_since.get(spec.runtime_prefix, {})
    idle_since: dict[str, float] = {}  # instances gone from the registry are forgotten
    idle: list[tuple[float, InstanceDescriptor]] = []
    for descriptor in instances:
        capacity = descriptor.capacity
        busy = (
            descriptor.status is not InstanceStatus.READY
            or capacity.active_run_count > 0
            or capacity.active_worker_count > 0
        )
        if busy:
            continue
        since = idle_since[descriptor.instance_id] = previously.get(descriptor.instance_id, moment)
        if moment - since >= delay:
            idle.append((since, descriptor))
    ctx.idle_since[spec.runtime_prefix] = idle_since
    removable = min(len(idle), spec.effective_replicas - spec.min_instances)
    if not ctx.settings.scale_in or delay == 0 or removable <= 0:
        return 0

    namespace = str(body.metadata.namespace)
    victims: list[str] = []
    for _, descriptor in sorted(idle, key=lambda pair: pair[0])[:removable]:
        try:
            await ctx.kube.merge_patch(
                POD, namespace, descriptor.instance_id,
                {"metadata": {"annotations": {DELETION_COST_ANNOTATION: _IDLE_POD_DELETION_COST}}},
            )  # fmt: skip
        except ApiError as exc:
            if exc.not_found:
                continue  # registered, but not a pod of this namespace
            raise
        victims.append(descriptor.instance_id)
    if not victims:
        return 0
    target = spec.effective_replicas - len(victims)
    try:
        await ctx.kube.merge_patch(
            RUNTIME_POOL_KIND, namespace, str(body.metadata.name),
            {
                "metadata": {"resourceVersion": body.metadata.get("resourceVersion")},
                "spec": {"replicas": target},
            },
        )  # fmt: skip
    except ApiError as exc:
        if exc.conflict:
            return 0  # the pool changed meanwhile; decide again on the next tick
        raise
    for instance_id in victims:
        idle_since.pop(instance_id, None)
    kopf.info(
        body,
        reason="ScaledIn",
        message=f"Scaled in from {spec.effective_replicas} to {target} replicas: "
        f"{', '.join(victims)} idle for at least {delay}s.",
    )
    return len(victims)


async def delete_pool(ctx: OperatorContext, *, body: kopf.Body) -> None:
    """Remove the pool's children, its tenant settings and its registry entries."""
    meta = body.metadata
    namespace, uid = str(meta.namespace), str(meta.uid)
    prefix = str(body.spec.get("runtimePrefix", ""))
    tenant_id = str(body.spec.get("tenantId", ""))
    removed: list[str] = []
    if prefix:
        live_settings = f"{prefix}-live-settings"
        for kind, name in (
            (DEPLOYMENT, prefix),
            (SERVICE, prefix),
            (SERVICE_ACCOUNT, prefix),
            (CONFIG_MAP, live_settings),
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
    kopf.info(
        body,
        reason="Deleted",
        message=f"Removed {', '.join(removed) or 'no objects'}; "
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
