"""kopf wiring: which handler runs on which event, with which kopf settings.

Why this module: kopf registers handlers with decorators; doing that inside
:func:`build_registry` (instead of at import time, on kopf's global registry) gives
each operator -- the real one, or one started by a test with ``KopfRunner`` -- its
own registry and its own :class:`~airuntime_operator.context.OperatorContext`
built from explicit :class:`~airuntime_operator.settings.OperatorSettings`.

Handlers are thin: they translate kopf's arguments and delegate to
:mod:`~airuntime_operator.pools` and :mod:`~airuntime_operator.scaleout`.

=====================  ==========================================================
RuntimePool            create/update/resume -> reconcile (children, tenant
                       settings, status); timer -> ready/visible status and idle
                       scale-in; delete (finalizer) -> cleanup
ScaleOutRequest        create -> observe (reject, or scale the pool); timer while
                       Observed -> fulfil; timer while finished -> garbage-collect
Deployment (managed)   index -> ready replicas and template hash per pool
=====================  ==========================================================
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Collection, Mapping
from typing import Any, Final

import kopf

from airuntime.k8s.client import ApiError, Kind
from airuntime.k8s.v1alpha1 import (
    API_GROUP,
    API_VERSION,
    RUNTIME_POOL,
    SCALE_OUT_REQUEST,
    ScaleOutPhase,
)
from airuntime_operator import deployments, pools, scaleout
from airuntime_operator.context import OperatorContext
from airuntime_operator.kopf_bridge import api_outcomes, connection_info
from airuntime_operator.persistence import ObservedGenerationDiffBase, ProgressAnnotations
from airuntime_operator.settings import OperatorSettings

__all__ = ["FINALIZER", "build_registry", "configure_kopf"]

FINALIZER: Final = "airuntime.io/finalizer"
_ANNOTATION_PREFIX: Final = "airuntime.io"
_CLUSTER_PEERING: Final = Kind("kopf.dev/v1", "ClusterKopfPeering", "clusterkopfpeerings", False)
_NAMESPACED_PEERING: Final = Kind("kopf.dev/v1", "KopfPeering", "kopfpeerings")
_BACKOFF: Final = 5.0
"""Seconds before kopf retries a handler that failed unexpectedly (e.g. Redis down);
API failures choose their own delay (:func:`airuntime_operator.kopf_bridge.retry_delay`)."""
_MANAGED: Final = {"app.kubernetes.io/managed-by": deployments.MANAGED_BY}

_POOLS: Final = (API_GROUP, API_VERSION, RUNTIME_POOL.plural)
_REQUESTS: Final = (API_GROUP, API_VERSION, SCALE_OUT_REQUEST.plural)
_DEPLOYMENTS: Final = ("apps", "v1", "deployments")


def _index(kwargs: Mapping[str, Any], name: str) -> Mapping[Any, Collection[Any]]:
    """The kopf index ``name`` (indexes reach handlers as keyword arguments)."""
    index: Mapping[Any, Collection[Any]] = kwargs[name]
    return index


def _first(index: Mapping[Any, Collection[Any]], key: Any) -> Any:
    return next(iter(index.get(key, ())), None)


def configure_kopf(kopf_settings: kopf.OperatorSettings, settings: OperatorSettings) -> None:
    """kopf's own settings for this operator (called from the startup handler)."""
    kopf_settings.persistence.finalizer = FINALIZER
    # Nothing of kopf's in the status schema; and nothing written beyond our own status
    # patch when a handler succeeds first time: a pool's handled spec is its
    # status.observedGeneration, progress (of retries only) lives in annotations.
    kopf_settings.persistence.progress_storage = ProgressAnnotations(prefix=_ANNOTATION_PREFIX)
    kopf_settings.persistence.diffbase_storage = ObservedGenerationDiffBase(
        observed=[RUNTIME_POOL.kind],
        annotated=[SCALE_OUT_REQUEST.kind],
        prefix=_ANNOTATION_PREFIX,
        key="last-handled-configuration",
    )
    kopf_settings.posting.level = logging.INFO
    kopf_settings.posting.reporting_component = settings.field_manager
    kopf_settings.posting.reporting_instance = socket.gethostname()
    kopf_settings.posting.event_name_prefix = "airuntime-"
    # Watches are restarted by the client every few minutes instead of waiting for the
    # server, so that a silently broken connection cannot stall the operator for long.
    kopf_settings.watching.server_timeout = 300
    kopf_settings.watching.client_timeout = 330
    kopf_settings.networking.request_timeout = 60
    # A timer busy with Redis or the API when its resource is deleted finishes within
    # milliseconds; without these, kopf re-checks it only after a minute, holding the
    # finalizer (and the deletion) that long.
    kopf_settings.background.instant_exit_timeout = 0.1
    kopf_settings.background.cancellation_polling = 2.0


def build_registry(settings: OperatorSettings) -> kopf.OperatorRegistry:
    """A kopf registry with every handler of the operator, bound to ``settings``."""
    registry = kopf.OperatorRegistry()
    ctx = OperatorContext(settings)
    _register_lifecycle(registry, ctx)
    _register_indexes(registry)
    _register_pool_handlers(registry, ctx)
    _register_request_handlers(registry, ctx)
    return registry


def _register_lifecycle(registry: kopf.OperatorRegistry, ctx: OperatorContext) -> None:
    """Open the shared context at start-up, close it at exit, log kopf in with it."""

    @kopf.on.startup(id="open_context", registry=registry)
    async def open_context(settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> None:
        configure_kopf(settings, ctx.settings)
        await ctx.open()
        if not settings.peering.standalone:
            await _ensure_peering_objects(ctx, settings.peering.name, logger)

    @kopf.on.cleanup(id="close_context", registry=registry)
    async def close_context(**_: Any) -> None:
        await ctx.close()

    @kopf.on.login(id="login", registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(ctx.kube)


def _register_indexes(registry: kopf.OperatorRegistry) -> None:
    """What handlers look up without asking the API server: pools by (namespace, tenant,
    prefix), the pools' Deployments, the instances fulfilled requests were promised."""

    @kopf.index(*_POOLS, id="pools_by_target", registry=registry)
    async def pools_by_target(
        namespace: str | None, name: str | None, spec: kopf.Spec, **_: Any
    ) -> dict[tuple[str, str, str], str]:
        key = (str(namespace), str(spec.get("tenantId")), str(spec.get("runtimePrefix")))
        return {key: str(name)}

    @kopf.index(*_DEPLOYMENTS, id="pool_deployments", labels=_MANAGED, registry=registry)
    async def pool_deployments(
        namespace: str | None, name: str | None, body: kopf.Body, **_: Any
    ) -> dict[tuple[str, str], dict[str, Any]]:
        return {(str(namespace), str(name)): pools.deployment_state(body)}

    @kopf.index(
        *_REQUESTS,
        id="promised_instances",
        when=lambda status, **_: status.get("phase") == ScaleOutPhase.FULFILLED.value,
        registry=registry,
    )
    async def promised_instances(spec: kopf.Spec, status: kopf.Status, **_: Any) -> dict[str, str]:
        return {str(spec.get("runtimePrefix")): str(status.get("fulfilledRuntimeInstanceId"))}


def _pool_deployment(body: kopf.Body, kwargs: Mapping[str, Any]) -> pools.DeploymentState | None:
    """The indexed state of the pool's Deployment (named after its runtime prefix)."""
    key = (str(body.metadata.namespace), str(body.spec.get("runtimePrefix")))
    state: pools.DeploymentState | None = _first(_index(kwargs, "pool_deployments"), key)
    return state


def _register_pool_handlers(registry: kopf.OperatorRegistry, ctx: OperatorContext) -> None:
    """RuntimePool: reconcile on every spec change, refresh status and scale in on a
    timer, clean up behind the finalizer."""
    interval = ctx.settings.status_interval_seconds

    @kopf.on.resume(*_POOLS, id="reconcile", backoff=_BACKOFF, registry=registry)
    @kopf.on.create(*_POOLS, id="reconcile", backoff=_BACKOFF, registry=registry)
    # A spec change is an update: the generation differs from status.observedGeneration.
    @kopf.on.update(*_POOLS, id="reconcile", backoff=_BACKOFF, registry=registry)
    async def reconcile_pool(body: kopf.Body, patch: kopf.Patch, retry: int, **kwargs: Any) -> None:
        previous = _pool_deployment(body, kwargs)
        await pools.reconcile_pool(ctx, body=body, patch=patch, previous=previous, retry=retry)

    # The first refresh comes one interval after the pool appears: reconcile has
    # written a fresh status by then, and an unchanged status is never patched.
    @kopf.timer(
        *_POOLS, id="refresh", interval=interval, backoff=interval, initial_delay=interval,
        registry=registry,
    )  # fmt: skip
    async def refresh_pool(body: kopf.Body, patch: kopf.Patch, **kwargs: Any) -> None:
        deployment = _pool_deployment(body, kwargs)
        instances = await pools.refresh_status(ctx, body=body, patch=patch, deployment=deployment)
        if ctx.settings.scale_in:
            await pools.scale_in(ctx, body=body, instances=instances)

    @kopf.on.delete(*_POOLS, id="cleanup", backoff=_BACKOFF, registry=registry)
    async def delete_pool(body: kopf.Body, retry: int, **_: Any) -> None:
        with api_outcomes(retry):
            await pools.delete_pool(ctx, body=body)


def _register_request_handlers(registry: kopf.OperatorRegistry, ctx: OperatorContext) -> None:
    """ScaleOutRequest: observe on creation, then fulfil and collect on timers."""
    poll, gc = ctx.settings.fulfilment_poll_seconds, ctx.settings.gc_interval_seconds

    @kopf.on.create(*_REQUESTS, id="observe", backoff=_BACKOFF, registry=registry)
    async def observe_request(
        body: kopf.Body, patch: kopf.Patch, retry: int, **kwargs: Any
    ) -> None:
        await scaleout.observe(
            ctx, body=body, patch=patch, pools_by_target=_index(kwargs, "pools_by_target"),
            retry=retry,
        )  # fmt: skip

    @kopf.timer(
        *_REQUESTS, id="fulfil", interval=poll, backoff=poll,
        when=lambda status, **_: status.get("phase") == ScaleOutPhase.OBSERVED.value,
        registry=registry,
    )  # fmt: skip
    async def fulfil_request(body: kopf.Body, patch: kopf.Patch, **kwargs: Any) -> None:
        promised = _index(kwargs, "promised_instances").get(str(body.spec.get("runtimePrefix")), ())
        await scaleout.fulfil(ctx, body=body, patch=patch, promised=list(promised))

    @kopf.timer(
        *_REQUESTS, id="collect", interval=gc, backoff=gc,
        when=lambda status, **_: status.get("phase") in scaleout.TERMINAL_PHASES,
        registry=registry,
    )  # fmt: skip
    async def collect_request(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
        await scaleout.collect(ctx, body=body, logger=logger)


async def _ensure_peering_objects(ctx: OperatorContext, name: str, logger: kopf.Logger) -> None:
    """Create the peering object(s) kopf's peering needs, when they are missing.

    kopf only *uses* a peering object; without it an operator with mandatory peering
    waits forever. Namespace patterns (globs) cannot be created and are skipped.
    """
    targets: list[tuple[Kind, str | None]]
    if ctx.settings.clusterwide:
        targets = [(_CLUSTER_PEERING, None)]
    else:
        targets = [
            (_NAMESPACED_PEERING, ns)
            for ns in ctx.settings.namespaces
            if not any(c in ns for c in "*?[]!")
        ]
    for kind, namespace in targets:
        metadata: dict[str, Any] = {"name": name}
        if namespace is not None:
            metadata["namespace"] = namespace
        try:
            await ctx.kube.create(
                kind, namespace, {"apiVersion": kind.api_version, "kind": kind.kind,
                                  "metadata": metadata},
            )  # fmt: skip
            logger.info(f"Created the {kind.kind} {name!r} for the operator's peering.")
        except ApiError as exc:
            if exc.already_exists:
                continue
            logger.error(f"Cannot create the {kind.kind} {name!r}: {exc}")
