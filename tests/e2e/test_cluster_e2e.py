"""The end-to-end scenario on a real API server: the chart's processes, a local kubelet.

The cluster is :class:`tests.k8s_env.KubeTestEnv` (etcd + kube-apiserver on loopback);
Redis is an embedded Valkey of its own. Nothing is faked between the processes:

1. the chart is rendered with ``helm template --include-crds`` (three RuntimePools, one
   per tenant mode, all with 0 replicas and ``minInstances`` 0; API tokens for the three
   tenants; the tenants file; the ``kubernetes`` scale-out provider, the chart's default)
   and every object is applied to the API server, after the Redis Secret the chart
   expects (``airuntime-redis``, key ``url``);
2. the operator and the control plane run as local processes with their Deployments'
   command/args (image entrypoint ``airt``) and env, resolved like the kubelet does
   (Secrets, ConfigMaps and fieldRefs from the API server; mounted tokens/tenants files
   written to disk), with ``KUBECONFIG`` instead of the in-cluster service account and
   free loopback ports instead of fixed container ports;
3. a local kubelet (:class:`tests.e2e.cluster.Kubelet`) keeps ``spec.replicas`` local
   ``airt runtime`` processes per runtime Deployment, started with the operator's pod
   template (pod name and pod IP from fieldRefs), and reports their readiness in the
   Deployment status.

Then one run per tenant is submitted through the control plane's HTTP API
(DirectDispatch). No runtime exists, so each run takes the whole path: admission
RequestScaleOut -> ScaleOutRequest custom resource -> the operator scales the tenant's
RuntimePool -> Deployment replicas -> the kubelet starts a runtime process -> it
registers in Redis -> the operator marks the request Fulfilled -> the control plane
requeues the run -> the pump dispatches it -> the run completes, on the tenant's own
instance (``runtime-instance-*``, ``tenant-a-runtime-*``, ``tenant-b-runtime-*``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.cluster import (
    TENANTS,
    Kubelet,
    LocalContainer,
    PodIdentity,
    apply_manifests,
    check_placement,
    free_port,
    pod_name,
    scenario_values,
    submit_and_wait,
    tail,
    wait_for,
)
from tests.e2e.test_chart import CHART, helm, run_helm  # noqa: F401 - helm is a fixture

# The first run on a machine may build helm and the Kubernetes binaries.
pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

RELEASE = "e2e"
NAMESPACE = "airt-e2e"
GROUP, VERSION = "airuntime.io", "v1alpha1"
RUN_DEADLINE = 120.0


@dataclass
class Stack:
    """Everything the scenario started, and what it observed."""

    env: Any
    api: Any
    redis_url: str
    root: Path
    docs: list[dict[str, Any]] = field(default_factory=list)
    operator: LocalContainer | None = None
    control_plane: LocalContainer | None = None
    kubelet: Kubelet | None = None
    api_url: str = ""
    tokens: dict[str, str] = field(default_factory=dict)
    submitted: dict[str, dict[str, Any]] = field(default_factory=dict)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api)

    def list_custom(self, plural: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.custom().list_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, plural
        )["items"]
        return items

    def diagnostics(self) -> str:
        parts = []
        for name, proc in (("operator", self.operator), ("control plane", self.control_plane)):
            if proc is not None:
                # Without kopf's per-second "Timer 'refresh' succeeded." lines.
                lines = [x for x in proc.log(400_000).splitlines() if "succeeded." not in x]
                parts.append(f"--- {name} log ---\n" + "\n".join(lines)[-6000:])
        if self.kubelet is not None:
            parts.append(f"--- kubelet errors ---\n{self.kubelet.errors[-5:]}")
            parts.append(self.kubelet.logs())
        try:
            for sor in self.list_custom("scaleoutrequests"):
                parts.append(f"ScaleOutRequest {sor['metadata']['name']}: {sor.get('status')}")
            for pool in self.list_custom("runtimepools"):
                parts.append(f"RuntimePool {pool['metadata']['name']}: {pool.get('status')}")
        except Exception as exc:  # the API server may be what failed
            parts.append(f"<cannot list custom objects: {exc!r}>")
        parts.append(f"runs: {json.dumps(self.results or self.submitted, default=str)[:4000]}")
        return "\n".join(parts)


def _workload(docs: list[dict[str, Any]], component: str) -> tuple[dict[str, Any], dict[str, Any]]:
    (deployment,) = [
        d for d in docs
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]  # fmt: skip
    spec = deployment["spec"]["template"]["spec"]
    return deployment, spec


def _start(stack: Stack, component: str, overrides: dict[str, str]) -> LocalContainer:
    deployment, spec = _workload(stack.docs, component)
    pod = PodIdentity(
        pod_name(deployment["metadata"]["name"]), NAMESPACE, spec.get("serviceAccountName", "")
    )
    return LocalContainer(
        pod, spec, spec["containers"][0], api=stack.api, root=stack.root / pod.name,
        overrides={"KUBECONFIG": str(stack.env.kubeconfig_path), **overrides},
    )  # fmt: skip


def _http_ok(url: str, proc: LocalContainer) -> bool:
    if not proc.alive():
        raise AssertionError(f"{proc.name} exited {proc.popen.returncode}:\n{proc.log()}")
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _bring_up(stack: Stack, helm_path: str) -> None:
    from kubernetes import client

    t0 = time.monotonic()
    core = client.CoreV1Api(stack.api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    # The chart's external Redis (redis.external defaults): created before installing.
    core.create_namespaced_secret(
        NAMESPACE,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="airuntime-redis"),
            string_data={"url": stack.redis_url},
        ),
    )
    out = run_helm(
        helm_path, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds",
        values=scenario_values(), tmp=stack.root,
    )  # fmt: skip
    stack.docs = [d for d in yaml.safe_load_all(out) if d]
    apply_manifests(stack.api, stack.docs)
    stack.timings["render and apply the chart"] = time.monotonic() - t0

    t0 = time.monotonic()
    health = free_port()
    stack.operator = _start(
        stack, "operator",
        {"AIRUNTIME_OPERATOR_LIVENESS": f"http://127.0.0.1:{health}/healthz"},
    )  # fmt: skip
    port = free_port()
    stack.control_plane = _start(
        stack, "control-plane",
        {"AIRUNTIME_API_HOST": "127.0.0.1", "AIRUNTIME_API_PORT": str(port)},
    )  # fmt: skip
    stack.api_url = f"http://127.0.0.1:{port}"
    stack.kubelet = Kubelet(stack.api, NAMESPACE, stack.root / "pods")
    stack.kubelet.start()
    operator, control_plane = stack.operator, stack.control_plane
    wait_for(lambda: _http_ok(f"http://127.0.0.1:{health}/healthz", operator),
             timeout=60, what="the operator's liveness endpoint")  # fmt: skip
    wait_for(lambda: _http_ok(f"{stack.api_url}/readyz", control_plane),
             timeout=60, what="the control plane's /readyz")  # fmt: skip

    apps = client.AppsV1Api(stack.api)

    def reconciled() -> bool:
        names = {d.metadata.name: d.spec.replicas for d in
                 apps.list_namespaced_deployment(NAMESPACE).items}  # fmt: skip
        if any(names.get(prefix) != 0 for _, _, prefix in TENANTS.values()):
            return False
        return all(
            "desiredReplicas" in (p.get("status") or {}) for p in stack.list_custom("runtimepools")
        )

    wait_for(reconciled, timeout=60, what="the operator to reconcile the three RuntimePools")
    stack.timings["start operator + control plane, pools reconciled"] = time.monotonic() - t0

    # The API tokens, as a client would get them: from the chart's tokens Secret.
    (secret,) = [d for d in stack.docs if d["kind"] == "Secret"]
    data = core.read_namespaced_secret(secret["metadata"]["name"], NAMESPACE).data
    entries = yaml.safe_load(base64.b64decode(data["tokens.yaml"]))["tokens"]
    stack.tokens = {e["tenant"]: e["token"] for e in entries}


def _run_scenario(stack: Stack) -> None:
    t0 = time.monotonic()
    stack.submitted, stack.results = submit_and_wait(
        stack.api_url, stack.tokens, deadline_s=RUN_DEADLINE
    )
    stack.timings["submit -> all three runs finished"] = time.monotonic() - t0
    missing = sorted(set(TENANTS) - set(stack.results))
    assert not missing, f"runs of {missing} did not finish within {RUN_DEADLINE:g} s"


@pytest.fixture(scope="module")
def private_valkey() -> Iterator[str]:
    """A Valkey of this module alone: the suite's shared ``valkey_url`` server may hold
    other tests' queued runs, Pending scale-out requests and tenant settings, which the
    control plane would pick up."""
    from airuntime.devstack.embedded import EmbeddedServer

    server = EmbeddedServer()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def stack(
    helm: str,  # noqa: F811
    private_valkey: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    from kubernetes import config

    from tests.k8s_env import KubeBinariesUnavailable, KubeTestEnv

    env = KubeTestEnv(with_controller_manager=False)
    try:
        env.bin_dir  # noqa: B018 - resolves (and if needed builds) the binaries
    except KubeBinariesUnavailable as exc:
        pytest.skip(f"Kubernetes test binaries unavailable: {exc}")
    started = time.monotonic()
    with env:
        api = config.new_client_from_config(config_file=str(env.kubeconfig_path))
        stack = Stack(env, api, private_valkey, tmp_path_factory.mktemp("cluster-e2e"))
        stack.timings["API server start"] = env.startup_seconds or 0.0
        try:
            try:
                _bring_up(stack, helm)
                _run_scenario(stack)
            except (Exception, pytest.fail.Exception) as exc:  # also pytest-timeout's
                raise AssertionError(f"{exc}\n{stack.diagnostics()}") from exc
            stack.timings["total"] = time.monotonic() - started
            print("\ncluster e2e timings (s):", {k: round(v, 1) for k, v in stack.timings.items()})
            yield stack
        finally:
            if stack.control_plane is not None:
                stack.control_plane.stop()
            if stack.kubelet is not None:
                stack.kubelet.stop()
            if stack.operator is not None:
                stack.operator.stop()
            api.close()


# -- the scenario's outcome -----------------------------------------------------------------


def test_each_tenant_s_run_completes_on_its_own_runtime(stack: Stack) -> None:
    check_placement(stack.submitted, stack.results)


def test_scale_out_went_through_scale_out_request_resources(stack: Stack) -> None:
    """One ScaleOutRequest per tenant, created by the control plane's ``kubernetes``
    provider and Fulfilled by the operator with the instance the run then went to."""
    import redis

    from airuntime.control_plane.scale_out import ScaleOutRequest
    from airuntime.core import keys

    requests = stack.list_custom("scaleoutrequests")
    by_tenant = {r["spec"]["tenantId"]: r for r in requests}
    assert sorted(by_tenant) == sorted(TENANTS) and len(requests) == len(TENANTS), requests
    client = redis.Redis.from_url(stack.redis_url)
    try:
        for tenant, (_, pool, prefix) in TENANTS.items():
            resource = by_tenant[tenant]
            status = resource["status"]
            instance = stack.results[tenant]["assigned_instance_id"]
            assert resource["spec"]["runtimePrefix"] == prefix
            assert resource["spec"]["sharedRunId"] == stack.submitted[tenant]["shared_run_id"]
            assert status["phase"] == "Fulfilled", status
            assert status["fulfilledRuntimeInstanceId"] == instance, status
            assert (status["poolName"], status["previousReplicas"], status["targetReplicas"]) == (
                pool, 0, 1,
            ), status  # fmt: skip
            assert status["baselineInstanceIds"] == []
            # The control plane's own record of the request: same id, kubernetes provider.
            raw = client.get(keys.scale_out_request(resource["metadata"]["name"]))
            assert raw is not None, f"no Redis record of {resource['metadata']['name']}"
            record = ScaleOutRequest.model_validate_json(raw)
            assert (record.provider, record.phase.value) == ("kubernetes", "Fulfilled")
            assert record.fulfilled_instance_id == instance and record.requeued
    finally:
        client.close()


async def _registry_instances(redis_url: str, prefix: str) -> list[str]:
    from redis.asyncio import Redis

    from airuntime.fleet.registry import Registry

    redis = Redis.from_url(redis_url)
    try:
        return sorted(d.instance_id for d in await Registry(redis).list_by_prefix(prefix))
    finally:
        await redis.aclose()


def test_pools_deployments_and_pods_followed_the_scale_out(stack: Stack) -> None:
    """Each pool was scaled from 0 to 1 replica; the kubelet ran exactly that pod; the
    pool's status shows the Deployment's ready replica and the registry's instance."""
    from kubernetes import client

    apps = client.AppsV1Api(stack.api)
    pools = {p["metadata"]["name"]: p for p in stack.list_custom("runtimepools")}
    assert stack.kubelet is not None
    for tenant, (_, pool_name, prefix) in TENANTS.items():
        pool = pools[pool_name]
        assert pool["spec"]["replicas"] == 1, pool["spec"]
        deployment = apps.read_namespaced_deployment(prefix, NAMESPACE)
        assert deployment.spec.replicas == 1
        # The one pod the kubelet started is the instance the run went to, and the only
        # instance of the prefix in the registry.
        instance = stack.results[tenant]["assigned_instance_id"]
        assert stack.kubelet.started(prefix) == [instance]
        registered = asyncio.run(_registry_instances(stack.redis_url, prefix))
        assert registered == [instance]

        def reported(pool_name: str = pool_name, count: int = len(registered)) -> Any:
            got = stack.custom().get_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, "runtimepools", pool_name
            )
            status: dict[str, Any] = got.get("status") or {}
            ok = status.get("visibleInstances") == count and status.get("readyReplicas") == 1
            return status if ok else None

        # The operator refreshes the status every statusIntervalSeconds (1 s here).
        status = wait_for(reported, timeout=15, what=f"RuntimePool {pool_name}'s status")
        assert status["desiredReplicas"] == 1
    assert stack.kubelet.errors == []


def test_runtime_processes_ran_the_operator_s_pod_template(stack: Stack) -> None:
    """Each runtime process got the pool's settings through the pod template's env."""
    assert stack.kubelet is not None
    by_name = {p.name: p for p in stack.kubelet.history}
    for tenant, (mode, _, prefix) in TENANTS.items():
        pod = by_name[stack.results[tenant]["assigned_instance_id"]]
        assert pod.argv[1:] == ["runtime"] and Path(pod.argv[0]).name == "airt"
        assert pod.env["AIRUNTIME_INSTANCE_ID"] == pod.name
        assert pod.env["AIRUNTIME_RUNTIME_PREFIX"] == prefix
        assert pod.env["AIRUNTIME_TENANT_ID"] == tenant
        assert pod.env["AIRUNTIME_ISOLATION_MODE"] == mode
        assert pod.env["AIRUNTIME_REDIS_URL"] == stack.redis_url  # from the Secret
        assert pod.env["AIRUNTIME_ADVERTISE_HOST"] == "127.0.0.1"  # status.podIP
        assert pod.env["AIRUNTIME_MAX_CONCURRENT_STEP_TASKS"] == "0"  # from the ConfigMap
        assert pod.alive(), tail(pod.log_path)


def test_local_pods_start_like_the_image() -> None:
    """The local containers get the final image's entrypoint and ENV (no cluster needed)."""
    import shlex

    from tests.e2e.cluster import IMAGE_ENTRYPOINT, IMAGE_ENV
    from tests.e2e.test_chart import dockerfile_stages

    stages, _ = dockerfile_stages()
    final = stages[-1]
    env = dict(
        item.split("=", 1) for word, args in final if word == "ENV" for item in shlex.split(args)
    )
    (entrypoint,) = [json.loads(args) for word, args in final if word == "ENTRYPOINT"]
    assert tuple(entrypoint) == IMAGE_ENTRYPOINT
    assert env == IMAGE_ENV
