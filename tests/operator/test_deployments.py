"""The pure builders of a pool's objects (no cluster needed)."""

from __future__ import annotations

from typing import Any

import pytest

from airuntime.k8s.v1alpha1 import OPERATOR_MANAGED_ENV, RuntimePoolSpec
from airuntime_operator import deployments
from airuntime_operator.deployments import PoolRef
from tests.operator.k8s import pool_spec

REF = PoolRef(name="pool", namespace="tenants", uid="0000-1111")


def _spec(**overrides: Any) -> RuntimePoolSpec:
    return RuntimePoolSpec.model_validate(pool_spec("acme", "acme-rt", **overrides))


def _env(spec: RuntimePoolSpec) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in deployments.runtime_env(spec)}


def test_env_carries_every_pool_setting() -> None:
    spec = _spec(env=[{"name": "LOG_LEVEL", "value": "debug"}])

    env = _env(spec)

    managed = [e for e in OPERATOR_MANAGED_ENV if e != "AIRUNTIME_MAX_CONCURRENT_STEP_TASKS"]
    assert list(env)[: len(managed)] == managed  # the pod takes that one from the tenant
    assert env["AIRUNTIME_REDIS_URL"] == {
        "secretKeyRef": {"name": "redis-credentials", "key": "url"}
    }
    assert env["AIRUNTIME_INSTANCE_ID"] == {
        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}
    }
    assert env["AIRUNTIME_TENANT_ID"] == "acme"
    assert env["AIRUNTIME_ISOLATION_MODE"] == "Dedicated"
    assert env["AIRUNTIME_ALLOW_SHARED_FALLBACK"] == "false"  # Dedicated default
    assert env["AIRUNTIME_RUNTIME_PREFIX"] == "acme-rt"
    assert env["AIRUNTIME_WORKERS"] == "8"
    assert env["AIRUNTIME_MAX_CONCURRENT_RUNS"] == "4"
    assert env["AIRUNTIME_QUEUE_CAPACITY"] == "50"
    assert env["AIRUNTIME_MAX_LOCAL_WORKERS_PER_EXECUTION"] == "2"
    assert env["AIRUNTIME_HTTP_PORT"] == "8080"
    assert env["LOG_LEVEL"] == "debug"


def test_pod_runs_airt_runtime_hardened_with_probes() -> None:
    template = deployments.pod_template(REF, _spec(), image="img:1")

    pod = template["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["airt", "runtime"]
    assert container["image"] == "img:1"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize(
    ("replicas", "expected"),
    [
        pytest.param(0, 1, id="below-min-clamped-up"),
        pytest.param(2, 2, id="within-bounds"),
        pytest.param(9, 3, id="above-max-clamped-down"),
    ],
)
def test_deployment_replicas_are_clamped(replicas: int, expected: int) -> None:
    spec = _spec(replicas=replicas, minInstances=1, maxInstances=3)

    assert deployments.deployment(REF, spec, image="img")["spec"]["replicas"] == expected


def test_live_setting_does_not_change_the_pod_template() -> None:
    before = deployments.deployment(REF, _spec(maxConcurrentStepTasks=1), image="img")
    after = deployments.deployment(REF, _spec(maxConcurrentStepTasks=50), image="img")

    assert before["spec"]["template"] == after["spec"]["template"]
    assert before["metadata"]["annotations"] == after["metadata"]["annotations"]
    env = {e["name"]: e for e in before["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AIRUNTIME_STEP_SLOTS_FROM_TENANT"] == {
        "name": "AIRUNTIME_STEP_SLOTS_FROM_TENANT",
        "value": "true",
    }
    assert "AIRUNTIME_MAX_CONCURRENT_STEP_TASKS" not in env


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"workersPerInstance": 9}, id="workers"),
        pytest.param({"env": [{"name": "X", "value": "1"}]}, id="extra-env"),
        pytest.param({"resources": {"limits": {"memory": "2Gi"}}}, id="resources"),
    ],
)
def test_other_settings_change_the_template_hash(change: dict[str, Any]) -> None:
    before = deployments.deployment(REF, _spec(), image="img")
    after = deployments.deployment(REF, _spec(**change), image="img")

    key = deployments.TEMPLATE_HASH_ANNOTATION
    assert before["metadata"]["annotations"][key] != after["metadata"]["annotations"][key]


def test_every_object_is_labelled_and_owned_by_the_pool() -> None:
    objects = deployments.children(REF, _spec(), image="img")

    assert [o["kind"] for o in objects] == ["ServiceAccount", "Deployment"]
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["airuntime.io/tenant"] == "acme"
        assert labels["airuntime.io/prefix"] == "acme-rt"
        assert labels["app.kubernetes.io/managed-by"] == "airuntime-operator"
        assert obj["metadata"]["ownerReferences"] == [REF.owner_reference()]


PLATFORM = {
    "AIRUNTIME_REDIS_URL": "redis://valkey:6379/0",
    "AIRUNTIME_OPERATOR_RUNTIME_TOKEN_SECRET": "rel-airuntime-runtime-token",
    "AIRUNTIME_OPERATOR_RUNTIME_TOKEN_KEY": "token",
    "AIRUNTIME_OPERATOR_SECRETS_KEYS_SECRET": "rel-airuntime-secrets-keys",
    "AIRUNTIME_PYTHON_HANDLER_MODULES": "mycompany.tools",
    "AIRUNTIME_HTTP_HANDLER_DENY_CIDRS": "203.0.113.0/24",
}


def test_runtime_pods_get_the_platforms_token_and_handler_policy_over_the_pools() -> None:
    from airuntime_operator import OperatorSettings

    platform_env = OperatorSettings.from_env(PLATFORM).runtime_platform_env()
    spec = _spec(
        env=[
            {"name": "AIRUNTIME_PYTHON_HANDLER_MODULES", "value": "tests.chaos"},
            {"name": "AIRUNTIME_HTTP_HANDLER_ALLOW", "value": "0.0.0.0/0"},
            {"name": "AIRUNTIME_SECRETS_KEYS", "value": "pool-chosen-key-" + "x" * 32},
            {"name": "LOG_LEVEL", "value": "debug"},
        ]
    )
    template = deployments.pod_template(REF, spec, image="img", platform_env=platform_env)
    env = template["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert len(names) == len(set(names)), f"duplicate variables: {names}"
    by_name = {e["name"]: e.get("value", e.get("valueFrom")) for e in env}
    assert by_name["AIRUNTIME_RUNTIME_TOKEN"] == {
        "secretKeyRef": {"name": "rel-airuntime-runtime-token", "key": "token"}
    }
    assert by_name["AIRUNTIME_SECRETS_KEYS"] == {
        "secretKeyRef": {"name": "rel-airuntime-secrets-keys", "key": "keys"}
    }, "the platform's keys, not the pool's"
    assert by_name["AIRUNTIME_PYTHON_HANDLER_MODULES"] == "mycompany.tools"
    assert by_name["AIRUNTIME_HTTP_HANDLER_DENY_CIDRS"] == "203.0.113.0/24"
    assert by_name["AIRUNTIME_HTTP_HANDLER_ALLOW"] == "", "the pool may not widen egress"
    assert by_name["LOG_LEVEL"] == "debug"


def test_runtime_pods_get_the_model_providers_and_only_their_keys() -> None:
    """The providers reach every runtime pod as the platform wrote them; with a keys
    Secret, each variable a provider names comes from it (optional: a missing entry
    leaves that provider's steps failing with a message, not the pod unable to start),
    over what the pool says; nothing else of the Secret is passed on."""
    from airuntime_operator import OperatorSettings

    providers = (
        '{"gpt": {"base_url": "https://api.openai.com/v1", "api_key_env": "OPENAI_API_KEY"},'
        ' "claude": {"api": "anthropic", "base_url": "https://api.anthropic.com",'
        ' "api_key_env": "ANTHROPIC_API_KEY"},'
        ' "local": {"base_url": "http://vllm.models:8000/v1"}}'
    )
    environ = {
        **PLATFORM,
        "AIRUNTIME_MODEL_PROVIDERS": providers,
        "AIRUNTIME_OPERATOR_MODEL_KEYS_SECRET": "model-keys",
    }
    platform_env = OperatorSettings.from_env(environ).runtime_platform_env()
    spec = _spec(env=[{"name": "OPENAI_API_KEY", "value": "sk-the-pool-authors"}])
    env = {
        e["name"]: e.get("value", e.get("valueFrom"))
        for e in deployments.runtime_env(spec, platform_env)
    }
    assert env["AIRUNTIME_MODEL_PROVIDERS"] == providers
    for variable in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        ref = {"name": "model-keys", "key": variable, "optional": True}
        assert env[variable] == {"secretKeyRef": ref}
    keys = [name for name in env if name.endswith("_KEY") and name != "AIRUNTIME_RUNTIME_TOKEN"]
    assert sorted(keys) == ["ANTHROPIC_API_KEY", "OPENAI_API_KEY"]
    without = OperatorSettings.from_env({**environ, "AIRUNTIME_OPERATOR_MODEL_KEYS_SECRET": ""})
    names = {e["name"] for e in without.runtime_platform_env()}
    assert "AIRUNTIME_MODEL_PROVIDERS" in names and "OPENAI_API_KEY" not in names


def test_without_a_token_secret_the_pool_keeps_its_own_token_variable() -> None:
    from airuntime_operator import OperatorSettings

    settings = OperatorSettings.from_env({"AIRUNTIME_REDIS_URL": "redis://valkey:6379/0"})
    ref = {"secretKeyRef": {"name": "mine", "key": "t"}}
    spec = _spec(env=[{"name": "AIRUNTIME_RUNTIME_TOKEN", "valueFrom": ref}])
    env = {
        e["name"]: e.get("value", e.get("valueFrom"))
        for e in deployments.runtime_env(spec, settings.runtime_platform_env())
    }
    assert env["AIRUNTIME_RUNTIME_TOKEN"] == ref
    assert env["AIRUNTIME_PYTHON_HANDLER_MODULES"] == "", "no python step unless the platform says"


def test_changing_the_platform_policy_rolls_the_pods() -> None:
    from airuntime_operator import OperatorSettings

    before = OperatorSettings.from_env(PLATFORM).runtime_platform_env()
    after = OperatorSettings.from_env(
        {**PLATFORM, "AIRUNTIME_PYTHON_HANDLER_MODULES": "mycompany"}
    ).runtime_platform_env()
    hashes = {
        deployments.deployment(REF, _spec(), image="img", platform_env=env)["metadata"][
            "annotations"
        ][deployments.TEMPLATE_HASH_ANNOTATION]
        for env in (before, after)
    }
    assert len(hashes) == 2


@pytest.mark.parametrize("value", ["1", "true", "", None])
def test_runtime_pods_of_a_cluster_platform_get_the_cluster_variable(value: str | None) -> None:
    """``AIRUNTIME_REDIS_CLUSTER`` on the operator (the chart's ``redis.cluster``) reaches
    every runtime Deployment; without it no pod gets the variable."""
    from airuntime_operator import OperatorSettings

    environ = {"AIRUNTIME_REDIS_URL": "redis://valkey-0:6379"}
    if value is not None:
        environ["AIRUNTIME_REDIS_CLUSTER"] = value
    settings = OperatorSettings.from_env(environ)
    platform_env = settings.runtime_platform_env()
    deployment = deployments.deployment(REF, _spec(), image="img", platform_env=platform_env)
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    expected = "1" if value in ("1", "true") else None
    assert env.get("AIRUNTIME_REDIS_CLUSTER") == expected, env


def test_a_malformed_cluster_variable_is_refused_naming_it() -> None:
    from airuntime_operator import OperatorSettings
    from airuntime_operator.settings import SettingsError

    with pytest.raises(SettingsError, match="AIRUNTIME_REDIS_CLUSTER"):
        OperatorSettings.from_env(
            {"AIRUNTIME_REDIS_URL": "redis://v:6379", "AIRUNTIME_REDIS_CLUSTER": "maybe"}
        )
