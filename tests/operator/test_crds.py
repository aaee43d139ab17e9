"""The CRDs: generated from airuntime.k8s.v1alpha1, installed in a real API server, validating.

Every invalid case is rejected by the API server itself (OpenAPI schema or CEL
rule) with the offending field named in the message -- and, for specs, by the
pydantic model that the control plane builds resources with, so Python clients get
the same answer before sending anything.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from airuntime.fleet.tenancy import IsolationMode, TenantSettings
from airuntime.k8s import crdgen
from airuntime.k8s.v1alpha1 import (
    API_GROUP,
    API_VERSION,
    RUNTIME_POOL,
    SCALE_OUT_REQUEST,
    RuntimePoolSpec,
    ScaleOutRequestSpec,
    TenantSettingsSnapshot,
    scale_out_request_manifest,
)
from tests.operator.conftest import CRD_DIR
from tests.operator.k8s import Cluster, api_error_message, pool_spec, request_spec, unique


def test_checked_in_crds_are_the_generator_output() -> None:
    assert crdgen.check_files(CRD_DIR) == [], "run: airt crds generate --out crds/"
    assert sorted(p.name for p in CRD_DIR.glob("*.yaml")) == sorted(crdgen.render_files())


def test_crds_are_established_with_names_and_subresources(k8s: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(k8s)

    pool = ext.read_custom_resource_definition(RUNTIME_POOL.crd_name)
    request = ext.read_custom_resource_definition(SCALE_OUT_REQUEST.crd_name)

    assert pool.spec.names.short_names == ["rp"]
    assert request.spec.names.short_names == ["sor"]
    subresources = pool.spec.versions[0].subresources
    assert subresources is not None and subresources.scale is not None
    scale = subresources.scale
    assert (scale.spec_replicas_path, scale.status_replicas_path, scale.label_selector_path) == (
        ".spec.replicas",
        ".status.readyReplicas",
        ".status.selector",
    )
    assert [c.name for c in pool.spec.versions[0].additional_printer_columns or []] == [
        "Tenant", "Mode", "Prefix", "Ready", "Desired", "Visible", "Status", "Age",
    ]  # fmt: skip
    assert [c.name for c in request.spec.versions[0].additional_printer_columns or []] == [
        "Tenant", "Prefix", "Phase", "Instance", "Age",
    ]  # fmt: skip


def test_valid_pool_is_accepted_and_defaulted(k8s: client.ApiClient, namespace: str) -> None:
    cluster = Cluster(k8s)
    spec = {"tenantId": "acme", "runtimePrefix": unique("acme"), "redis": {"name": "redis"}}

    created = cluster.create_pool(namespace, "pool", spec)

    defaulted = created["spec"]
    assert defaulted["isolationMode"] == "Shared"
    assert defaulted["redis"] == {"name": "redis", "key": "url"}
    assert [defaulted[k] for k in ("minInstances", "maxInstances", "replicas")] == [1, 1, 1]
    assert defaulted["workersPerInstance"] == 10
    assert RuntimePoolSpec.model_validate(defaulted).effective_replicas == 1


def test_valid_scale_out_request_is_accepted(k8s: client.ApiClient, namespace: str) -> None:
    cluster = Cluster(k8s)
    settings = TenantSettings(
        tenant_id="acme", isolation_mode=IsolationMode.DEDICATED, runtime_prefix="acme-rt"
    )
    spec = ScaleOutRequestSpec(
        tenant_id="acme",
        runtime_prefix="acme-rt",
        shared_run_id="run-1",
        tenant_settings=TenantSettingsSnapshot.of(settings),
    )
    manifest = scale_out_request_manifest("sor-1", namespace, spec)

    created = cluster.custom.create_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, SCALE_OUT_REQUEST.plural, manifest
    )
    assert isinstance(created, dict)

    assert created["spec"]["requestedInstances"] == 1
    assert created["spec"]["tenantSettings"]["isolationMode"] == "Dedicated"
    assert (
        TenantSettingsSnapshot.model_validate(created["spec"]["tenantSettings"]).to_settings()
        == settings
    )


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation setting ``path`` (dot-separated) of a spec to ``value``."""

    def mutate(spec: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node = spec
        for key in parents:
            node = node[key]
        node[leaf] = value

    return mutate


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    def mutate(spec: dict[str, Any]) -> None:
        del spec[key]

    return mutate


INVALID_POOLS = [
    pytest.param(_set("isolationMode", "Partial"), "spec.isolationMode", id="bad-isolation-mode"),
    pytest.param(_set("workersPerInstance", 0), "spec.workersPerInstance", id="workers-below-min"),
    pytest.param(_set("maxInstances", 1001), "spec.maxInstances", id="max-instances-above-max"),
    pytest.param(_set("minInstances", -1), "spec.minInstances", id="min-instances-negative"),
    pytest.param(
        _set("idleScaleInDelaySeconds", 86_401),
        "spec.idleScaleInDelaySeconds",
        id="idle-delay-above-max",
    ),
    pytest.param(
        lambda s: s.update(minInstances=3, maxInstances=2),
        "spec.minInstances",
        id="min-greater-than-max-cel",
    ),
    pytest.param(
        lambda s: s.update(workersPerInstance=2, maxLocalWorkersPerExecution=3),
        "spec.maxLocalWorkersPerExecution",
        id="local-workers-above-workers-cel",
    ),
    pytest.param(
        lambda s: s.update(isolationMode="Shared", preferDedicated=True),
        "spec.preferDedicated",
        id="shared-prefers-dedicated-cel",
    ),
    pytest.param(_set("runtimePrefix", "Bad_Prefix"), "spec.runtimePrefix", id="prefix-not-dns"),
    pytest.param(_set("runtimePrefix", "a" * 51), "spec.runtimePrefix", id="prefix-too-long"),
    pytest.param(_set("tenantId", "-acme"), "spec.tenantId", id="tenant-not-dns"),
    pytest.param(_drop("tenantId"), "spec.tenantId", id="missing-tenant"),
    pytest.param(_drop("runtimePrefix"), "spec.runtimePrefix", id="missing-prefix"),
    pytest.param(_drop("redis"), "spec.redis", id="missing-redis-secret"),
    pytest.param(_set("redis", {"key": "url"}), "spec.redis.name", id="missing-redis-name"),
    pytest.param(
        _set("modelTokenBudget", {"tokens": 0}), "spec.modelTokenBudget.tokens", id="budget-zero"
    ),
    pytest.param(
        _set("modelTokenBudget", {"tokens": 10, "window": "week"}),
        "spec.modelTokenBudget.window",
        id="budget-window",
    ),
    pytest.param(
        _set("modelTokenBudget", {"window": "day"}),
        "spec.modelTokenBudget.tokens",
        id="budget-without-tokens",
    ),
    pytest.param(
        _set("env", [{"name": "AIRUNTIME_TENANT_ID", "value": "other"}]),
        "spec.env",
        id="env-overrides-managed-variable",
    ),
    pytest.param(
        _set("env", [{"name": "X", "value": "1", "valueFrom": {"fieldRef": {}}}]),
        "spec.env[0]",
        id="env-value-and-value-from",
    ),
]


@pytest.mark.parametrize(("mutate", "field"), INVALID_POOLS)
def test_invalid_pool_is_rejected_naming_the_field(
    k8s: client.ApiClient,
    namespace: str,
    mutate: Callable[[dict[str, Any]], None],
    field: str,
) -> None:
    spec = pool_spec("acme", "acme-rt")
    mutate(spec)

    with pytest.raises(ApiException) as raised:
        Cluster(k8s).create_pool(namespace, "bad", spec)

    assert raised.value.status == 422
    assert field in api_error_message(raised.value)


@pytest.mark.parametrize(("mutate", "field"), INVALID_POOLS)
def test_pydantic_model_rejects_the_same_pools(
    mutate: Callable[[dict[str, Any]], None], field: str
) -> None:
    spec = copy.deepcopy(pool_spec("acme", "acme-rt"))
    mutate(spec)

    with pytest.raises(ValidationError):
        RuntimePoolSpec.model_validate(spec)


INVALID_REQUESTS = [
    pytest.param(
        _set("requestedInstances", 0), "spec.requestedInstances", id="requested-below-min"
    ),
    pytest.param(
        _set("requestedInstances", 101), "spec.requestedInstances", id="requested-above-max"
    ),
    pytest.param(_drop("sharedRunId"), "spec.sharedRunId", id="missing-shared-run"),
    pytest.param(_drop("tenantId"), "spec.tenantId", id="missing-tenant"),
    pytest.param(_set("runtimePrefix", "UPPER"), "spec.runtimePrefix", id="prefix-not-dns"),
    pytest.param(_set("poolName", "Not_A_Name"), "spec.poolName", id="bad-pool-name"),
    pytest.param(
        _set(
            "tenantSettings",
            TenantSettingsSnapshot.of(TenantSettings(tenant_id="other")).to_wire(),
        ),
        "spec.tenantSettings.tenantId",
        id="snapshot-of-another-tenant-cel",
    ),
]


@pytest.mark.parametrize(("mutate", "field"), INVALID_REQUESTS)
def test_invalid_scale_out_request_is_rejected_naming_the_field(
    k8s: client.ApiClient,
    namespace: str,
    mutate: Callable[[dict[str, Any]], None],
    field: str,
) -> None:
    spec = request_spec("acme", "acme-rt")
    mutate(spec)

    with pytest.raises(ApiException) as raised:
        Cluster(k8s).create_request(namespace, "bad", spec)

    assert raised.value.status == 422
    assert field in api_error_message(raised.value)
    with pytest.raises(ValidationError):
        ScaleOutRequestSpec.model_validate(spec)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("runtimePrefix", "renamed", id="prefix"),
        pytest.param("tenantId", "someone-else", id="tenant"),
    ],
)
def test_pool_identity_is_immutable(
    k8s: client.ApiClient, namespace: str, field: str, value: str
) -> None:
    cluster = Cluster(k8s)
    cluster.create_pool(namespace, "pool", pool_spec("acme", unique("acme")))

    with pytest.raises(ApiException) as raised:
        cluster.patch_pool(namespace, "pool", {"spec": {field: value}})

    assert raised.value.status == 422
    assert f"{field} is immutable" in api_error_message(raised.value)


def test_scale_out_request_spec_is_immutable(k8s: client.ApiClient, namespace: str) -> None:
    cluster = Cluster(k8s)
    cluster.create_request(namespace, "sor", request_spec("acme", "acme-rt"))

    with pytest.raises(ApiException) as raised:
        cluster.custom.patch_namespaced_custom_object(
            API_GROUP, API_VERSION, namespace, SCALE_OUT_REQUEST.plural, "sor",
            {"spec": {"requestedInstances": 2}}, _content_type="application/merge-patch+json",
        )  # fmt: skip

    assert raised.value.status == 422
    assert "spec is immutable" in api_error_message(raised.value)


def test_bad_status_phase_is_rejected(k8s: client.ApiClient, namespace: str) -> None:
    cluster = Cluster(k8s)
    cluster.create_request(namespace, "sor", request_spec("acme", "acme-rt"))

    with pytest.raises(ApiException) as raised:
        cluster.custom.patch_namespaced_custom_object_status(
            API_GROUP, API_VERSION, namespace, SCALE_OUT_REQUEST.plural, "sor",
            {"status": {"phase": "Done"}}, _content_type="application/merge-patch+json",
        )  # fmt: skip

    assert raised.value.status == 422
    message = api_error_message(raised.value)  # status errors are relative to .status
    assert 'phase: Unsupported value: "Done"' in message
