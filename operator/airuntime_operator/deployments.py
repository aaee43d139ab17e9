"""Pure builders of the Kubernetes objects that run one RuntimePool.

Why a module of its own: what a pool *is* on the cluster -- a ServiceAccount and a
Deployment of ``airt runtime`` pods -- is a function of the pool's spec and nothing
else. Keeping it free of I/O makes it testable without a cluster and keeps the
handlers about *when* to apply, not *what*.

Every object carries the recommended ``app.kubernetes.io/*`` labels plus
``airuntime.io/tenant`` and ``airuntime.io/prefix``, and an owner reference to its
RuntimePool (so the garbage collector would also remove it).

``maxConcurrentStepTasks`` deliberately does not appear in the pod template: the
runtime takes it from the tenant settings in Redis (before its first run, then live;
``AIRUNTIME_STEP_SLOTS_FROM_TENANT``), so changing it does not roll the Deployment.
Two objects per pool and nothing else, because every object is an API request per
reconcile: operators before 0.2 also wrote a ConfigMap carrying that start value and
a headless Service nothing resolved (instances advertise their pod IP in the
registry); deleting such a pool still removes them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from airuntime.fleet.instance_settings import InstanceSettings
from airuntime.fleet.tenancy import TenantSettings
from airuntime.k8s.v1alpha1 import (
    LABEL_PREFIX,
    LABEL_TENANT,
    OPERATOR_MANAGED_SETTINGS,
    RUNTIME_POOL,
    RuntimePoolSpec,
)

__all__ = [
    "COMPONENT",
    "CONTAINER_NAME",
    "HTTP_PORT",
    "LABEL_POOL",
    "LABEL_PREFIX",
    "LABEL_TENANT",
    "MANAGED_BY",
    "RUNTIME_COMMAND",
    "TEMPLATE_HASH_ANNOTATION",
    "PoolRef",
    "children",
    "deployment",
    "pod_template",
    "runtime_env",
    "selector_labels",
    "selector_string",
    "service_account",
    "template_hash",
]

MANAGED_BY: Final = "airuntime-operator"
COMPONENT: Final = "runtime"
APP_NAME: Final = "airuntime-runtime"
LABEL_POOL: Final = "airuntime.io/pool"
TEMPLATE_HASH_ANNOTATION: Final = "airuntime.io/pod-template-hash"
CONTAINER_NAME: Final = "runtime"
RUNTIME_COMMAND: Final = ("airt", "runtime")
HTTP_PORT: Final = 8080
RUN_AS: Final = 10001

_DEFAULT_RESOURCES: Final[Mapping[str, Mapping[str, str]]] = {
    "requests": {"cpu": "250m", "memory": "256Mi"},
    "limits": {"memory": "1Gi"},
}


@dataclass(frozen=True)
class PoolRef:
    """Identity of a RuntimePool object: what its children's owner references need."""

    name: str
    namespace: str
    uid: str

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": RUNTIME_POOL.api_version,
            "kind": RUNTIME_POOL.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def selector_labels(spec: RuntimePoolSpec) -> dict[str, str]:
    """The pods' selector: stable for the pool's life (the prefix is immutable)."""
    return {"app.kubernetes.io/name": APP_NAME, LABEL_PREFIX: spec.runtime_prefix}


def selector_string(spec: RuntimePoolSpec) -> str:
    """``selector_labels`` as a label-selector string (``status.selector``)."""
    return ",".join(f"{k}={v}" for k, v in selector_labels(spec).items())


def _labels(
    ref: PoolRef, spec: RuntimePoolSpec, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    return {
        **(extra or {}),
        **selector_labels(spec),
        "app.kubernetes.io/instance": spec.runtime_prefix,
        "app.kubernetes.io/component": COMPONENT,
        "app.kubernetes.io/part-of": "airuntime",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_TENANT: spec.tenant_id,
        LABEL_POOL: ref.name,
    }


def _metadata(
    ref: PoolRef, spec: RuntimePoolSpec, name: str, extra_labels: Mapping[str, str] | None
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": ref.namespace,
        "labels": _labels(ref, spec, extra_labels),
        "ownerReferences": [ref.owner_reference()],
    }


def _bool(value: bool) -> str:
    return "true" if value else "false"


def runtime_env(
    spec: RuntimePoolSpec, platform_env: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """The runtime container's environment: the pool's settings, its extra env, then the
    platform's (runtime token, handler policy), which replaces a pool entry of the same
    name: a pool author cannot widen what the platform allows."""
    settings: TenantSettings = spec.tenant_settings()
    sources: dict[str, dict[str, Any]] = {
        "redis_url": {
            "valueFrom": {"secretKeyRef": {"name": spec.redis.name, "key": spec.redis.key}}
        },
        "tenant_id": {"value": settings.tenant_id},
        "tenant_group_id": {"value": settings.tenant_group_id or ""},
        "isolation_mode": {"value": settings.isolation_mode.value},
        "prefer_dedicated": {"value": _bool(settings.prefer_dedicated)},
        "allow_shared_fallback": {"value": _bool(settings.allow_shared_fallback)},
        "runtime_prefix": {"value": settings.runtime_prefix},
        "instance_id": {
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}
        },
        "workers": {"value": str(settings.workers_per_instance)},
        "max_concurrent_runs": {"value": str(settings.max_concurrent_runs)},
        "queue_capacity": {"value": str(settings.queue_capacity)},
        "max_local_workers_per_execution": {"value": str(settings.max_local_workers_per_execution)},
        # No start value in the pod: it reads the pool's limit from the tenant settings
        # the operator publishes before its first run, and follows them live.
        "step_slots_from_tenant": {"value": "true"},
        "http_port": {"value": str(HTTP_PORT)},
        "http_host": {"value": "0.0.0.0"},
        # Listen on every interface, advertise the pod IP in the registry.
        "advertise_host": {
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}
        },
    }
    # The variable names come from the runtime's settings model, in the managed order.
    env = [
        {"name": InstanceSettings.env_var(field), **sources[field]}
        for field in OPERATOR_MANAGED_SETTINGS
    ]
    platform = {e["name"] for e in platform_env}
    extra = [e.to_wire() for e in spec.env if e.name not in platform]
    return env + extra + [dict(e) for e in platform_env]


def _probe(path: str, *, period: int, initial_delay: int = 0) -> dict[str, Any]:
    probe: dict[str, Any] = {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 2,
        "failureThreshold": 3,
    }
    if initial_delay:
        probe["initialDelaySeconds"] = initial_delay
    return probe


def pod_template(
    ref: PoolRef,
    spec: RuntimePoolSpec,
    *,
    image: str,
    extra_labels: Mapping[str, str] | None = None,
    platform_env: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The runtime pods' template: ``airt runtime``, probes, a hardened security context."""
    resources = spec.resources.to_wire() if spec.resources is not None else _DEFAULT_RESOURCES
    return {
        "metadata": {"labels": _labels(ref, spec, extra_labels)},
        "spec": {
            "serviceAccountName": spec.runtime_prefix,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 60,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": RUN_AS,
                "runAsGroup": RUN_AS,
                "fsGroup": RUN_AS,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": CONTAINER_NAME,
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": list(RUNTIME_COMMAND),
                    "env": runtime_env(spec, platform_env),
                    "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}],
                    "readinessProbe": _probe("/readyz", period=5),
                    "livenessProbe": _probe("/healthz", period=10, initial_delay=10),
                    "resources": dict(resources),
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "runAsNonRoot": True,
                        "privileged": False,
                        "capabilities": {"drop": ["ALL"]},
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}],
        },
    }


def template_hash(template: Mapping[str, Any]) -> str:
    """A short, stable digest of a pod template (changes exactly when a rollout is due)."""
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
    return digest[:16]


def deployment(
    ref: PoolRef,
    spec: RuntimePoolSpec,
    *,
    image: str,
    extra_labels: Mapping[str, str] | None = None,
    platform_env: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The pool's Deployment, named after its runtime prefix, with clamped replicas."""
    template = pod_template(
        ref, spec, image=image, extra_labels=extra_labels, platform_env=platform_env
    )
    metadata = _metadata(ref, spec, spec.runtime_prefix, extra_labels)
    metadata["annotations"] = {TEMPLATE_HASH_ANNOTATION: template_hash(template)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": spec.effective_replicas,
            "selector": {"matchLabels": selector_labels(spec)},
            "revisionHistoryLimit": 5,
            # A runtime pod holds runs: never take one away before its successor is ready.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": template,
        },
    }


def service_account(
    ref: PoolRef, spec: RuntimePoolSpec, *, extra_labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The runtime pods' identity; they need no Kubernetes API access, so no token."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(ref, spec, spec.runtime_prefix, extra_labels),
        "automountServiceAccountToken": False,
    }


def children(
    ref: PoolRef,
    spec: RuntimePoolSpec,
    *,
    image: str,
    extra_labels: Mapping[str, str] | None = None,
    platform_env: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Every object of the pool, in apply order (the Deployment last)."""
    return [
        service_account(ref, spec, extra_labels=extra_labels),
        deployment(ref, spec, image=image, extra_labels=extra_labels, platform_env=platform_env),
    ]
