"""The words of airuntime's resource statuses and events: condition types, condition
reasons, event reasons.

Why this exists: ``kubectl describe``, alerts and the tests match these strings, and
three parties write them -- the operator (RuntimePool conditions, its events), the
control plane (``ScaleOutFailed`` events) and the CRD generator (the printer column of
``Ready``). They are part of the ``airuntime.io/v1alpha1`` contract
(:mod:`airuntime.k8s.v1alpha1` has the resources themselves).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["EventReason", "RuntimePoolConditionReason", "RuntimePoolConditionType"]


class RuntimePoolConditionType(StrEnum):
    """The conditions of a RuntimePool's status (``status.conditions[].type``)."""

    RECONCILED = "Reconciled"
    """The pool's objects (ServiceAccount, Deployment) are applied for the spec of
    ``observedGeneration``."""
    TENANT_SETTINGS_PUBLISHED = "TenantSettingsPublished"
    """The pool's tenant settings are in Redis, where admission and the runtimes read them."""
    READY = "Ready"
    """The pool serves its tenant: reconciled, tenant settings published, and its
    Deployment has the desired replicas available."""


class RuntimePoolConditionReason(StrEnum):
    """Why a RuntimePool condition has its status (``status.conditions[].reason``)."""

    APPLIED = "Applied"
    """Reconciled is True."""
    INVALID_SPEC = "InvalidSpec"
    """Reconciled (and so Ready) is False: the spec breaks a rule of the model."""
    APPLY_FAILED = "ApplyFailed"
    """Reconciled (and so Ready) is False: the API server refused an object of the pool."""
    PUBLISHED = "Published"
    """TenantSettingsPublished is True."""
    NOT_RECONCILED = "NotReconciled"
    """Ready is False: the operator has not reconciled the pool yet."""
    TENANT_SETTINGS_NOT_PUBLISHED = "TenantSettingsNotPublished"
    """Ready is False: the tenant settings are not in Redis."""
    DEPLOYMENT_NOT_FOUND = "DeploymentNotFound"
    """Ready is False: the pool's Deployment does not exist."""
    REPLICAS_UNAVAILABLE = "ReplicasUnavailable"
    """Ready is False: fewer replicas are available than desired."""
    REPLICAS_AVAILABLE = "ReplicasAvailable"
    """Ready is True."""


class EventReason(StrEnum):
    """Reasons of the Kubernetes events posted about airuntime's resources (by the
    operator, and ``ScaleOutFailed`` by the control plane)."""

    RECONCILED = "Reconciled"
    """A RuntimePool's objects were applied and its tenant settings published."""
    INVALID_SPEC = "InvalidSpec"
    """A RuntimePool's spec breaks a rule of the model (warning)."""
    APPLY_FAILED = "ApplyFailed"
    """The API server refused an object of a RuntimePool (warning)."""
    TENANT_SETTINGS_RESTORED = "TenantSettingsRestored"
    """A reconciled RuntimePool's tenant settings were gone from Redis (it lost its
    data) and were published again (warning)."""
    SCALED_IN = "ScaledIn"
    """Idle runtime pods of a RuntimePool were removed."""
    DELETED = "Deleted"
    """A deleted RuntimePool's objects, tenant settings and registry entries were removed."""
    OBSERVED = "Observed"
    """A ScaleOutRequest's pool was scaled."""
    FULFILLED = "Fulfilled"
    """A new runtime instance can accept a ScaleOutRequest's run."""
    REJECTED = "Rejected"
    """A ScaleOutRequest was refused or timed out (warning)."""
    SCALE_OUT_FAILED = "ScaleOutFailed"
    """The control plane's attempt at a ScaleOutRequest failed; it backs off before the
    next one for the prefix (warning, posted by the control plane)."""
