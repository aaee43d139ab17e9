"""The end-to-end scenario on a real cluster node: the chart's pods run from the built image.

Everything here is real; nothing runs as a local stand-in for a pod:

* the image is built from the repository's Dockerfile by ``scripts/image-build.sh``
  (podman, cached by content hash);
* the cluster is :class:`tests.k8s_env.KubeTestEnv` (etcd, kube-apiserver,
  kube-controller-manager) plus :class:`tests.k8s_node.KubeNode` (kube-scheduler,
  kubelet, containerd + runc, CNI bridge): Deployment -> ReplicaSet -> scheduled Pod ->
  containers started from the image, with the pod spec's command, env (Secret,
  ConfigMap and fieldRef values), user, read-only root filesystem, dropped
  capabilities, volumes and probes enforced by the kubelet and runc;
* Redis is a Valkey of this module on the host, reached by the pods through a virtual
  service IP (there is no kube-proxy: see tests/k8s_node.py).

The scenario, one test per step, in order: ``helm install`` the chart (control plane
and operator pods Ready), ``kubectl apply`` the three example RuntimePools
(``examples/kubernetes/``), submit one run per tenant through the control plane's HTTP
API (no runtime exists: each run takes admission -> ScaleOutRequest -> operator ->
Deployment scale -> a runtime pod from the image -> dispatch -> completion on the
tenant's prefix), idle scale-in removes the runtime pods, ``helm upgrade`` rolls the
chart's pods (and the system still completes a run afterwards), ``helm uninstall``
leaves nothing of the release behind (the CRDs stay, as Helm keeps ``crds/``).
"""

from __future__ import annotations

import base64
import json
import subprocess
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
    BuiltImage,
    built_image,
    check_placement,
    image_unavailable,
    scenario_values,
    submit_and_wait,
    wait_for,
)
from tests.e2e.test_chart import CHART, helm, run_helm  # noqa: F401 - helm is a fixture
from tests.k8s_node import NODE_NAME, REDIS_SERVICE_IP

# A fresh machine may build the image, helm and the Kubernetes binaries first.
pytestmark = [pytest.mark.timeout(3600), pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_POOLS = REPO_ROOT / "examples" / "kubernetes"
RELEASE = "e2e"
NAMESPACE = "airt-e2e"
GROUP, VERSION = "airuntime.io", "v1alpha1"
RUN_DEADLINE = 240.0
RUN_AS = 10001
COMPONENT = "app.kubernetes.io/component"


@dataclass
class Cluster:
    """The running cluster and what the steps observed."""

    env: Any
    node: Any
    api: Any
    image: BuiltImage
    redis_url: str
    helm: str
    tmp: Path
    timings: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    submitted: dict[str, dict[str, Any]] = field(default_factory=dict)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    runtime_pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)

    # -- clients ---------------------------------------------------------------------------

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    @property
    def apps(self) -> Any:
        from kubernetes import client

        return client.AppsV1Api(self.api)

    @property
    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api)

    def helm_cmd(self, *args: str, values: dict[str, Any] | None = None) -> str:
        return run_helm(self.helm, *args, "--kubeconfig", str(self.env.kubeconfig_path),
                        values=values, tmp=self.tmp)  # fmt: skip

    def kubectl(self, *args: str, input_text: str | None = None) -> str:
        argv = [str(self.node.bin_dir / "kubectl"), "--kubeconfig",
                str(self.env.kubeconfig_path), *args]  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True, input=input_text, timeout=120)
        assert proc.returncode == 0, f"{' '.join(argv)}: {proc.stdout}\n{proc.stderr}"
        return proc.stdout

    def pods(self, selector: str = "") -> list[dict[str, Any]]:
        items = self.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
        return [self.api.sanitize_for_serialization(p) for p in items]

    def list_custom(self, plural: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, plural
        )["items"]
        return items

    # -- the containers behind a pod, as the kernel sees them --------------------------------

    def container_process(self, pod: dict[str, Any]) -> dict[str, str]:
        """``/proc`` facts of the pod's first container's main process (found through
        containerd): its uid/gid, effective capabilities and root mount options."""
        (status,) = pod["status"]["containerStatuses"][:1]
        container_id = status["containerID"].removeprefix("containerd://")
        tasks = {
            line.split()[0]: line.split()[1]
            for line in self.node.ctr("tasks", "list").splitlines()[1:]
            if line.strip()
        }
        pid = tasks[container_id]
        proc_status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
        root = [
            line.split()
            for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
            if line.split()[4] == "/"
        ][-1]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return {
            "uid": proc_status["Uid"].split()[0],
            "gid": proc_status["Gid"].split()[0],
            "cap_eff": proc_status["CapEff"].strip(),
            "no_new_privs": proc_status["NoNewPrivs"].strip(),
            "root_options": root[5],
            "cmdline": " ".join(p.decode() for p in cmdline if p),
        }

    def check_hardened(self, pod: dict[str, Any]) -> None:
        """The container of ``pod`` runs from the built image as the chart demands."""
        name = pod["metadata"]["name"]
        (container,) = pod["status"]["containerStatuses"][:1]
        assert container["image"] == self.image.ref, (name, container["image"])
        facts = self.container_process(pod)
        assert (facts["uid"], facts["gid"]) == (str(RUN_AS), str(RUN_AS)), (name, facts)
        assert int(facts["cap_eff"], 16) == 0, (name, facts)
        assert facts["no_new_privs"] == "1", (name, facts)
        assert facts["root_options"].split(",")[0] == "ro", (name, facts)
        assert "/airt " in facts["cmdline"] or facts["cmdline"].endswith("/airt"), (name, facts)

    # -- diagnostics -----------------------------------------------------------------------

    def diagnostics(self) -> str:
        parts = []
        try:
            for pod in self.pods():
                name = pod["metadata"]["name"]
                parts.append(f"--- pod {name}: {json.dumps(pod.get('status'))[:1500]}")
                try:
                    log = self.core.read_namespaced_pod_log(name, NAMESPACE, tail_lines=60)
                    lines = [x for x in log.splitlines() if "succeeded." not in x]
                    parts.append("\n".join(lines)[-4000:])
                except Exception as exc:
                    parts.append(f"<no log: {exc}>")
            events = self.core.list_namespaced_event(NAMESPACE).items
            parts.append("--- events ---")
            parts += [f"{e.involved_object.name}: {e.reason}: {e.message}" for e in events[-40:]]
            for plural in ("scaleoutrequests", "runtimepools"):
                for obj in self.list_custom(plural):
                    parts.append(f"{plural} {obj['metadata']['name']}: {obj.get('status')}")
        except Exception as exc:
            parts.append(f"<cannot list: {exc!r}>")
        parts.append(f"--- kubelet ---\n{self.node.log_tail('kubelet', 3000)}")
        parts.append(f"runs: {json.dumps(self.results or self.submitted, default=str)[:3000]}")
        return "\n".join(parts)


@pytest.fixture(scope="module")
def image() -> BuiltImage:
    from tests.k8s_node import node_unavailable

    reason = image_unavailable() or node_unavailable()
    if reason:
        pytest.skip(f"a real node cannot run here: {reason}")
    started = time.monotonic()
    built = built_image()
    print(f"\nimage {built.ref}: {built.size_bytes / 1e6:.0f} MB "
          f"(build or reuse: {time.monotonic() - started:.1f} s)")  # fmt: skip
    return built


@pytest.fixture(scope="module")
def cluster(
    image: BuiltImage,
    helm: str,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    from kubernetes import config

    from airuntime.devstack.embedded import EmbeddedServer
    from tests.k8s_env import KubeBinariesUnavailable, KubeTestEnv
    from tests.k8s_node import KubeNode, node_binaries

    env = KubeTestEnv(
        with_controller_manager=True,
        service_account_admission=True,
        # Logs and exec through the kubelet at the node's InternalIP (no node DNS name).
        extra_apiserver_args=["--kubelet-preferred-address-types=InternalIP"],
    )
    try:
        env.bin_dir  # noqa: B018 - resolves (and if needed builds) the binaries
    except KubeBinariesUnavailable as exc:
        pytest.skip(f"Kubernetes test binaries unavailable: {exc}")
    started = time.monotonic()
    bin_dir = node_binaries()
    build_s = time.monotonic() - started
    # Pods reach this Valkey through the node's virtual Redis IP (DNAT to loopback), so
    # not from 127.0.0.1: protected mode off, still bound to loopback only.
    redis = EmbeddedServer(extra_args=("--protected-mode", "no"))
    redis.start()
    try:
        with env:
            port = int(redis.url.rsplit(":", 1)[1].split("/")[0])
            with KubeNode(env, images=[image.archive], bin_dir=bin_dir, redis_port=port) as node:
                api = config.new_client_from_config(config_file=str(env.kubeconfig_path))
                cluster = Cluster(env, node, api, image, redis.url, helm,
                                  tmp_path_factory.mktemp("cluster-e2e"))  # fmt: skip
                cluster.timings["node binaries (build or reuse)"] = build_s
                cluster.timings["API server start"] = env.startup_seconds or 0.0
                cluster.timings.update(node.timings)
                try:
                    yield cluster
                finally:
                    cluster.timings["total"] = time.monotonic() - started
                    print("\ncluster e2e timings (s):",
                          {k: round(v, 1) for k, v in cluster.timings.items()})  # fmt: skip
                    api.close()
    finally:
        redis.stop()


@pytest.fixture
def step(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """One step of the scenario: skipped once an earlier step failed (that failure is
    the one to read), and timed."""
    if cluster.failed:
        pytest.skip(f"an earlier step failed: {cluster.failed[0]}")
    started = time.monotonic()
    yield cluster
    cluster.timings[request.node.name.removeprefix("test_")] = time.monotonic() - started


def _guard(cluster: Cluster, name: str, body: Any) -> None:
    """Run a step's body; on failure, record it and attach the cluster's state."""
    try:
        body()
    except (Exception, pytest.fail.Exception) as exc:
        cluster.failed.append(name)
        raise AssertionError(f"{exc}\n{cluster.diagnostics()}") from exc


def _values(cluster: Cluster, **extra: Any) -> dict[str, Any]:
    values = scenario_values(with_pools=False)
    values["image"] = {
        "repository": cluster.image.repository, "tag": cluster.image.tag, "pullPolicy": "Never",
    }  # fmt: skip
    for key, value in extra.items():
        values[key] = {**values.get(key, {}), **value}
    return values


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return pod["status"].get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def _chart_pods(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """component -> its one Ready pod (control-plane, operator), or {} while rolling."""
    found: dict[str, list[dict[str, Any]]] = {}
    for pod in cluster.pods(f"app.kubernetes.io/instance={RELEASE}"):
        if pod["metadata"].get("deletionTimestamp"):
            return {}
        found.setdefault(pod["metadata"]["labels"][COMPONENT], []).append(pod)
    if sorted(found) != ["control-plane", "operator"]:
        return {}
    if any(len(pods) != 1 or not _ready(pods[0]) for pods in found.values()):
        return {}
    return {component: pods[0] for component, pods in found.items()}


def _api_url(cluster: Cluster) -> str:
    pod = _chart_pods(cluster)["control-plane"]
    return f"http://{pod['status']['podIP']}:8780"


# -- the steps, in order ----------------------------------------------------------------------


def test_helm_install_runs_the_chart_pods_from_the_image(step: Cluster) -> None:
    cluster = step

    def body() -> None:
        from kubernetes import client

        core = cluster.core
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        # The chart's external Redis (redis.external defaults), created before installing:
        # the node's virtual Redis IP.
        core.create_namespaced_secret(NAMESPACE, client.V1Secret(
            metadata=client.V1ObjectMeta(name="airuntime-redis"),
            string_data={"url": f"redis://{REDIS_SERVICE_IP}:6379/0"},
        ))  # fmt: skip
        cluster.helm_cmd("install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                         "--wait", "--timeout", "5m", values=_values(cluster))  # fmt: skip
        pods = wait_for(lambda: _chart_pods(cluster), timeout=60, what="the chart's pods")
        for pod in pods.values():
            cluster.check_hardened(pod)
            owner = pod["metadata"]["ownerReferences"][0]
            assert owner["kind"] == "ReplicaSet", owner  # made by the Deployment controller
            assert pod["spec"]["nodeName"] == NODE_NAME  # bound by the scheduler
        url = _api_url(cluster)
        assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200
        # The API tokens, as a client gets them: from the chart's tokens Secret.
        secret = core.read_namespaced_secret(f"{RELEASE}-airuntime-tokens", NAMESPACE)
        entries = yaml.safe_load(base64.b64decode(secret.data["tokens.yaml"]))["tokens"]
        cluster.tokens = {e["tenant"]: e["token"] for e in entries}

    _guard(cluster, "install", body)


def test_example_runtime_pools_are_applied_and_reconciled(step: Cluster) -> None:
    cluster = step

    def body() -> None:
        cluster.kubectl("apply", "--namespace", NAMESPACE, "-f", str(EXAMPLE_POOLS))

        def reconciled() -> bool:
            pools = cluster.list_custom("runtimepools")
            return len(pools) == 3 and all(
                "desiredReplicas" in (p.get("status") or {}) for p in pools
            )

        wait_for(reconciled, timeout=120, what="the operator to reconcile the example pools")
        items = cluster.apps.list_namespaced_deployment(NAMESPACE).items
        deployments = {d.metadata.name: d.spec.replicas for d in items}
        for _, _, prefix in TENANTS.values():
            assert deployments.get(prefix) == 0, deployments

    _guard(cluster, "pools", body)


def test_runs_scale_out_to_pods_from_the_image_and_complete_on_their_prefix(
    step: Cluster,
) -> None:
    cluster = step

    def body() -> None:
        cluster.submitted, cluster.results = submit_and_wait(
            _api_url(cluster), cluster.tokens, deadline_s=RUN_DEADLINE
        )
        missing = sorted(set(TENANTS) - set(cluster.results))
        assert not missing, f"runs of {missing} did not finish within {RUN_DEADLINE:g} s"
        check_placement(cluster.submitted, cluster.results)
        requests = {r["spec"]["tenantId"]: r for r in cluster.list_custom("scaleoutrequests")}

        def runtime_pods_ready() -> dict[str, dict[str, Any]]:
            # The run may complete before the kubelet's first readiness probe (period 5 s):
            # the control plane dispatches as soon as the runtime registers in Redis.
            pods = {p["metadata"]["name"]: p for p in cluster.pods(f"{COMPONENT}=runtime")}
            instances = [cluster.results[t]["assigned_instance_id"] for t in TENANTS]
            ok = all(i in pods and _ready(pods[i]) for i in instances)
            return pods if ok else {}

        pods = wait_for(runtime_pods_ready, timeout=60, what="the runtime pods to be Ready")
        for tenant, (_, pool, prefix) in TENANTS.items():
            instance = cluster.results[tenant]["assigned_instance_id"]
            status = requests[tenant]["status"]
            assert status["phase"] == "Fulfilled", status
            assert status["fulfilledRuntimeInstanceId"] == instance, status
            assert status["poolName"] == pool, status
            # The instance is a real pod of the pool's Deployment, started from the image.
            pod = pods[instance]
            assert pod["metadata"]["labels"]["airuntime.io/prefix"] == prefix
            assert pod["metadata"]["ownerReferences"][0]["name"].startswith(f"{prefix}-")
            cluster.check_hardened(pod)
            cluster.runtime_pods[tenant] = pod

    _guard(cluster, "runs", body)


def test_idle_runtime_pods_are_scaled_in(step: Cluster) -> None:
    """The runs are done: with a short idle delay the operator scales every pool back to
    ``minInstances`` (0), and the ReplicaSets delete the pods."""
    cluster = step

    def body() -> None:
        for _, pool, _ in TENANTS.values():
            cluster.custom.patch_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, "runtimepools", pool,
                {"spec": {"idleScaleInDelaySeconds": 2}},
            )  # fmt: skip

        def scaled_in() -> bool:
            pools = cluster.list_custom("runtimepools")
            return all(p["spec"]["replicas"] == 0 for p in pools) and not cluster.pods(
                "app.kubernetes.io/component=runtime"
            )

        wait_for(scaled_in, timeout=120, what="idle scale-in to remove the runtime pods")
        events = cluster.core.list_namespaced_event(NAMESPACE).items
        scaled = {e.involved_object.name for e in events if e.reason == "ScaledIn"}
        assert scaled == {pool for _, pool, _ in TENANTS.values()}, scaled

    _guard(cluster, "scale-in", body)


def test_helm_upgrade_rolls_the_chart_pods(step: Cluster) -> None:
    cluster = step

    def body() -> None:
        before = {c: p["metadata"]["name"] for c, p in _chart_pods(cluster).items()}
        values = _values(
            cluster,
            controlPlane={"podAnnotations": {"e2e/rollout": "2"}},
            operator={"podAnnotations": {"e2e/rollout": "2"}},
        )
        cluster.helm_cmd("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE,
                         "--wait", "--timeout", "5m", values=values)  # fmt: skip

        def rolled() -> dict[str, dict[str, Any]]:
            pods = _chart_pods(cluster)
            if not pods or any(pods[c]["metadata"]["name"] == before[c] for c in before):
                return {}
            return pods

        after = wait_for(rolled, timeout=180, what="new control-plane and operator pods")
        for pod in after.values():
            assert pod["metadata"]["annotations"]["e2e/rollout"] == "2"
            cluster.check_hardened(pod)
        # The rolled system still scales out and completes a run.
        tokens = {"tenant-a": cluster.tokens["tenant-a"]}
        _, finished = submit_and_wait(_api_url(cluster), tokens, deadline_s=RUN_DEADLINE)
        assert finished["tenant-a"]["run"]["status"] == "completed", finished
        assert finished["tenant-a"]["assigned_instance_id"].startswith("tenant-a-runtime-")

    _guard(cluster, "upgrade", body)


def test_helm_uninstall_leaves_nothing_behind(step: Cluster) -> None:
    cluster = step

    def body() -> None:
        from kubernetes import client

        # The README's procedure: RuntimePools carry the operator's finalizer, delete them
        # while it runs; ScaleOutRequests are runtime records of the control plane (not
        # objects of the release), kept by the operator for retentionSeconds: delete them
        # too, or they outlive the release.
        cluster.kubectl("delete", "--namespace", NAMESPACE, "-f", str(EXAMPLE_POOLS),
                        "--wait", "--timeout=120s")  # fmt: skip
        cluster.kubectl("delete", "--namespace", NAMESPACE, "scaleoutrequests", "--all",
                        "--wait", "--timeout=120s")  # fmt: skip
        cluster.helm_cmd("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait",
                         "--timeout", "5m")  # fmt: skip
        rbac = client.RbacAuthorizationV1Api(cluster.api)

        def leftovers() -> list[str]:
            found = [f"Pod/{p['metadata']['name']}" for p in cluster.pods()]
            lists = {
                "Deployment": cluster.apps.list_namespaced_deployment,
                "ReplicaSet": cluster.apps.list_namespaced_replica_set,
                "Service": cluster.core.list_namespaced_service,
                "Secret": cluster.core.list_namespaced_secret,
                "ConfigMap": cluster.core.list_namespaced_config_map,
                "ServiceAccount": cluster.core.list_namespaced_service_account,
                "Role": rbac.list_namespaced_role,
                "RoleBinding": rbac.list_namespaced_role_binding,
            }
            for kind, list_fn in lists.items():
                found += [f"{kind}/{o.metadata.name}" for o in list_fn(NAMESPACE).items]
            for plural in ("runtimepools", "scaleoutrequests"):
                found += [f"{plural}/{o['metadata']['name']}" for o in cluster.list_custom(plural)]
            selector = f"app.kubernetes.io/instance={RELEASE}"
            cluster_roles = rbac.list_cluster_role(label_selector=selector).items
            found += [f"ClusterRole/{o.metadata.name}" for o in cluster_roles]
            bindings = rbac.list_cluster_role_binding(label_selector=selector).items
            found += [f"ClusterRoleBinding/{o.metadata.name}" for o in bindings]
            # What the test and the cluster itself made, not the release.
            ours = {"Secret/airuntime-redis", "ConfigMap/kube-root-ca.crt",
                    "ServiceAccount/default"}  # fmt: skip
            # Containers still running on the node (sandboxes included).
            tasks = cluster.node.ctr("tasks", "list", "--quiet").split()
            found += [f"container/{t}" for t in tasks]
            return sorted(set(found) - ours)

        remaining: list[str] = []

        def clean() -> bool:
            nonlocal remaining
            remaining = leftovers()
            return not remaining

        try:
            wait_for(clean, timeout=120, what="the release's objects and containers to be gone")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {remaining}") from exc

    _guard(cluster, "uninstall", body)
