"""The Helm chart (``helm/airuntime``), the Dockerfile and ``kind-config.yaml``.

The chart is rendered by a real ``helm`` (v3, built once from the Go module proxy by
``scripts/helm-binary.sh`` and cached; skipped, with the reason, only when that build
fails) with three sets of values: the defaults, ``everything`` (ServiceMonitor,
dashboard, in-cluster Valkey, two RuntimePools) and ``namespaced`` (an operator serving
two namespaces). The rendered YAML is parsed and checked for what the chart promises:
hardened pods, least-privilege RBAC that still covers what kopf and the operator do,
the Redis URL only through a secretKeyRef, RuntimePools from values, a dashboard that
shows every metric the processes export, CRDs identical to the repository's ``crds/``,
and a documented ``values.yaml``.

Where the chart must agree with the code, the code is asked: the env vars the chart
sets are read back through ``airt control-plane``'s options and
``OperatorSettings.from_env``; the RuntimePools are validated by the pydantic model
the CRD is generated from; the ServiceMonitor's selector is matched against the
Service the operator builds for a pool.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shlex
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from airuntime.devstack.embedded import SERVER_TUNING
from tests.polling import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "helm" / "airuntime"
HELM_SCRIPT = REPO_ROOT / "scripts" / "helm-binary.sh"
RELEASE = "rel"
NAMESPACE = "airt"
RUN_AS = 10001

# A cold cache builds helm from source (about two minutes on two cores).
pytestmark = pytest.mark.timeout(1800)

Doc = dict[str, Any]

EVERYTHING: Doc = {
    "imagePullSecrets": [{"name": "regcred"}],
    "redis": {"valkey": {"enabled": True, "maxmemory": "400mb"}},
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "dashboard": {"enabled": True, "annotations": {"grafana_folder": "airuntime"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
    },
    "auth": {
        "tokens": [
            {"token": "dev-tenant-a-token", "user": "alice", "tenant": "tenant-a",
             "roles": ["operator"]},
        ]
    },
    "runtimePools": [
        {
            "name": "shared",
            "spec": {"tenantId": "default", "runtimePrefix": "runtime-instance",
                     "maxInstances": 2},
        },
        {
            "name": "tenant-a",
            "labels": {"team": "a"},
            "spec": {
                "tenantId": "tenant-a",
                "runtimePrefix": "tenant-a-runtime",
                "isolationMode": "Dedicated",
                "preferDedicated": True,
                "minInstances": 1,
                "maxInstances": 3,
                "maxConcurrentStepTasks": 8,
                "redis": {"name": "tenant-a-redis", "key": "redis-url"},
            },
        },
    ],
}  # fmt: skip

NAMESPACED: Doc = {
    "operator": {"watchNamespaces": ["team-a", "team-b"], "replicas": 2},
    "controlPlane": {"scaleOutProvider": "none", "tenants": []},
    "auth": {"existingSecret": "my-tokens", "existingSecretKey": "tokens"},
    "redis": {"external": {"secretName": "shared-redis", "key": "redis-url"}},
}

VALUE_SETS = {"defaults": None, "everything": EVERYTHING, "namespaced": NAMESPACED}


# -- helm ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def helm() -> str:
    """Path of the pinned helm binary (built on first use, then cached)."""
    try:
        proc = subprocess.run(
            ["bash", str(HELM_SCRIPT)], capture_output=True, text=True, timeout=1700
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"{HELM_SCRIPT.name} did not build helm within 1700 s")
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not Path(lines[-1]).is_file():
        pytest.skip(
            f"helm could not be built by scripts/helm-binary.sh (exit {proc.returncode}): "
            f"{proc.stderr.strip()[-1500:]}"
        )
    return lines[-1]


def run_helm(helm: str, *args: str, values: Doc | None = None, tmp: Path) -> str:
    argv = [helm, *args]
    if values is not None:
        digest = hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:12]
        path = tmp / f"values-{digest}.yaml"
        path.write_text(yaml.safe_dump(values))
        argv += ["--values", str(path)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{shlex.join(argv)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def render_fails(helm: str, tmp: Path, values: Doc) -> str:
    """``helm template`` with ``values``, which must fail: its stderr (the reason)."""
    path = tmp / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    argv = [helm, "template", RELEASE, str(CHART), "--values", str(path)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, f"{shlex.join(argv)} rendered:\n{proc.stdout[:2000]}"
    return proc.stderr


@pytest.fixture(scope="session")
def render(
    helm: str, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[Doc | None], list[Doc]]:
    """``render(values)``: the objects ``helm template`` renders with those values."""
    tmp = tmp_path_factory.mktemp("helm")
    cache: dict[str, list[Doc]] = {}

    def _render(values: Doc | None) -> list[Doc]:
        key = json.dumps(values, sort_keys=True)
        if key not in cache:
            out = run_helm(
                helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                values=values, tmp=tmp,
            )  # fmt: skip
            cache[key] = [d for d in yaml.safe_load_all(out) if d]
        return cache[key]

    return _render


@pytest.fixture(params=list(VALUE_SETS), ids=[f"values={k}" for k in VALUE_SETS])
def rendered(
    request: pytest.FixtureRequest, render: Callable[[Doc | None], list[Doc]]
) -> list[Doc]:
    return render(VALUE_SETS[request.param])


def objects(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in objects(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def workloads(docs: list[Doc]) -> Iterator[tuple[Doc, Doc, Doc]]:
    """(workload, pod spec, container) for every container of every pod template."""
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            pod = doc["spec"]["template"]["spec"]
            for container in pod.get("initContainers", []) + pod["containers"]:
                yield doc, pod, container


def env_of(container: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in container.get("env", [])}


def component(doc: Doc) -> str | None:
    labels: dict[str, str] = doc["metadata"].get("labels") or {}
    return labels.get("app.kubernetes.io/component")


# -- lint and render ------------------------------------------------------------------------


@pytest.mark.parametrize("values", list(VALUE_SETS), ids=[f"values={k}" for k in VALUE_SETS])
def test_helm_lint_is_clean(helm: str, values: str, tmp_path: Path) -> None:
    out = run_helm(helm, "lint", "--strict", str(CHART), values=VALUE_SETS[values], tmp=tmp_path)
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


def test_defaults_render_the_control_plane_and_the_operator(
    render: Callable[..., list[Doc]],
) -> None:
    docs = render(None)
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == [
        "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "NetworkPolicy",
        "Role", "RoleBinding", "Secret", "Service", "ServiceAccount",
    ]  # fmt: skip
    deployments = sorted(d["metadata"]["name"] for d in objects(docs, "Deployment"))
    assert deployments == ["rel-airuntime-control-plane", "rel-airuntime-operator"]
    assert not objects(docs, "ServiceMonitor") and not objects(docs, "RuntimePool")
    assert not objects(docs, "PodMonitor")
    for doc in docs:
        assert doc["metadata"].get("namespace") in (None, NAMESPACE)


def test_everything_renders_valkey_monitoring_and_pools(render: Callable[..., list[Doc]]) -> None:
    docs = render(EVERYTHING)
    one(docs, "Deployment", "rel-airuntime-valkey")
    one(docs, "Service", "rel-airuntime-valkey")
    one(docs, "Secret", "rel-airuntime-redis")
    one(docs, "ServiceMonitor", "rel-airuntime")
    one(docs, "PodMonitor", "rel-airuntime-runtime")
    one(docs, "ConfigMap", "rel-airuntime-dashboard")
    rules = one(docs, "PrometheusRule", "rel-airuntime")
    assert rules["metadata"]["labels"]["release"] == "prometheus"
    assert len(objects(docs, "RuntimePool")) == 2


def test_one_object_per_template_file() -> None:
    """KubeRay style: each template renders one kind of object (a range may repeat it)."""
    for path in sorted((CHART / "templates").glob("*.yaml")):
        kinds = set(re.findall(r"^kind: (\w+)", path.read_text(), flags=re.MULTILINE))
        assert len(kinds) == 1, f"{path.name} renders {sorted(kinds) or 'nothing'}"


# -- pods -----------------------------------------------------------------------------------


def test_every_container_is_hardened(rendered: list[Doc]) -> None:
    checked = 0
    for workload, pod, container in workloads(rendered):
        where = f"{workload['metadata']['name']}/{container['name']}"
        psc, csc = pod.get("securityContext", {}), container.get("securityContext", {})
        assert psc.get("runAsNonRoot") is True, where
        assert psc.get("runAsUser") == RUN_AS and psc.get("fsGroup") == RUN_AS, where
        assert psc.get("seccompProfile") == {"type": "RuntimeDefault"}, where
        assert csc.get("runAsNonRoot") is True and csc.get("runAsUser") == RUN_AS, where
        assert csc.get("allowPrivilegeEscalation") is False, where
        assert csc.get("readOnlyRootFilesystem") is True, where
        assert csc.get("privileged") is False, where
        assert csc.get("capabilities") == {"drop": ["ALL"]}, where
        assert csc.get("seccompProfile") == {"type": "RuntimeDefault"}, where
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        assert "emptyDir" in volumes[mounts["/tmp"]], f"{where}: /tmp is not an emptyDir"
        assert container.get("resources", {}).get("requests"), f"{where}: no resource requests"
        checked += 1
    assert checked >= 2


def test_every_container_has_probes(rendered: list[Doc]) -> None:
    for workload, _, container in workloads(rendered):
        where = f"{workload['metadata']['name']}/{container['name']}"
        assert container.get("livenessProbe"), f"{where}: no liveness probe"
        assert container.get("readinessProbe"), f"{where}: no readiness probe"
        if component(workload) == "control-plane":
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
            assert container["livenessProbe"]["httpGet"]["port"] == "http"
        if component(workload) == "operator":
            # kopf serves one endpoint, the one AIRUNTIME_OPERATOR_LIVENESS names.
            liveness = env_of(container)["AIRUNTIME_OPERATOR_LIVENESS"]["value"]
            port = {p["name"]: p["containerPort"] for p in container["ports"]}["health"]
            assert liveness == f"http://0.0.0.0:{port}/healthz"
            for probe in ("livenessProbe", "readinessProbe"):
                assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_processes_are_chosen_by_the_command(rendered: list[Doc]) -> None:
    """The image's entrypoint is ``airt``: each process is chosen by its subcommand."""
    for workload, _, container in workloads(rendered):
        if component(workload) == "control-plane":
            assert "command" not in container
            assert container["args"] == ["control-plane"]
        if component(workload) == "operator":
            assert not container.get("command")
            assert container["args"] == ["operator"]


def test_only_the_operator_and_a_kubernetes_scale_out_mount_an_api_token(
    rendered: list[Doc],
) -> None:
    for workload, pod, _ in workloads(rendered):
        name = workload["metadata"]["name"]
        mounted = pod.get("automountServiceAccountToken")
        if component(workload) == "operator":
            assert mounted is True, name
        elif component(workload) == "control-plane":
            env = env_of(pod["containers"][0])
            provider = env["AIRUNTIME_SCALE_OUT_PROVIDER"]["value"]
            assert mounted is (provider == "kubernetes"), name
        else:
            assert mounted is False, name


# -- Redis ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "secret", "key"),
    [
        pytest.param(None, "airuntime-redis", "url", id="external-default"),
        pytest.param(EVERYTHING, "rel-airuntime-redis", "url", id="in-cluster-valkey"),
        pytest.param(NAMESPACED, "shared-redis", "redis-url", id="external-named"),
    ],
)
def test_redis_url_reaches_every_pod_through_a_secret(
    render: Callable[..., list[Doc]], values: Doc | None, secret: str, key: str
) -> None:
    docs = render(values)
    users = 0
    for workload, _, container in workloads(docs):
        if component(workload) == "valkey":
            assert "AIRUNTIME_REDIS_URL" not in env_of(container)
            continue
        env = env_of(container)["AIRUNTIME_REDIS_URL"]
        assert "value" not in env, "the Redis URL must never be a literal"
        assert env["valueFrom"] == {"secretKeyRef": {"name": secret, "key": key}}
        users += 1
    assert users == 2
    rendered_text = yaml.safe_dump_all(docs)
    assert "redis://" not in rendered_text, "a Redis URL appears in clear text"


def test_in_cluster_valkey_secret_points_at_the_valkey_service(
    render: Callable[..., list[Doc]],
) -> None:
    docs = render(EVERYTHING)
    data = one(docs, "Secret", "rel-airuntime-redis")["data"]
    password = base64.b64decode(data["password"]).decode()
    url = base64.b64decode(data["url"]).decode()
    service = one(docs, "Service", "rel-airuntime-valkey")
    port = service["spec"]["ports"][0]["port"]
    assert len(password) >= 32
    assert url == f"redis://:{password}@rel-airuntime-valkey.{NAMESPACE}.svc:{port}/0"
    valkey = one(docs, "Deployment", "rel-airuntime-valkey")["spec"]["template"]["spec"]
    container = valkey["containers"][0]
    assert "--requirepass" in container["args"]
    args = container["args"]
    # The embedded server's tuning, by default (values.yaml says the same numbers).
    for name, value in SERVER_TUNING:
        assert args[args.index(f"--{name}") + 1] == value, name
    assert env_of(container)["VALKEY_PASSWORD"]["valueFrom"] == {
        "secretKeyRef": {"name": "rel-airuntime-redis", "key": "password"}
    }
    assert container["image"] == "valkey/valkey:8"
    selector = service["spec"]["selector"]
    pod_labels = one(docs, "Deployment", "rel-airuntime-valkey")["spec"]["template"]["metadata"]
    assert selector.items() <= pod_labels["labels"].items(), selector


def _valkey_pod(docs: list[Doc]) -> tuple[Doc, Doc]:
    """The in-cluster Valkey's pod spec and its one container."""
    pod = one(docs, "Deployment", "rel-airuntime-valkey")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    return pod, container


def _arg(container: Doc, name: str) -> str:
    args: list[str] = container["args"]
    return args[args.index(name) + 1]


def test_in_cluster_valkey_keeps_its_data_on_a_claim_by_default(
    render: Callable[..., list[Doc]],
) -> None:
    docs = render(EVERYTHING)
    claim = one(docs, "PersistentVolumeClaim", "rel-airuntime-valkey")
    assert claim["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert "storageClassName" not in claim["spec"]  # the cluster's default class
    pod, container = _valkey_pod(docs)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "rel-airuntime-valkey"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["data"] == _arg(container, "--dir")  # the append-only file is on the claim
    assert _arg(container, "--appendonly") == "yes"
    assert _arg(container, "--appendfsync") == "everysec"
    assert pod["securityContext"]["fsGroup"] == RUN_AS  # the claim is writable by Valkey


def test_valkey_persistence_can_be_off_or_an_existing_claim(
    render: Callable[..., list[Doc]],
) -> None:
    def with_persistence(persistence: Doc) -> list[Doc]:
        return render({"redis": {"valkey": {"enabled": True, "persistence": persistence}}})

    off = with_persistence({"enabled": False})
    assert objects(off, "PersistentVolumeClaim") == []
    pod, container = _valkey_pod(off)
    assert {v["name"]: v for v in pod["volumes"]}["data"]["emptyDir"] == {"sizeLimit": "1Gi"}
    assert _arg(container, "--appendonly") == "no" and "--appendfsync" not in container["args"]

    existing = with_persistence({"existingClaim": "valkey-data"})
    assert objects(existing, "PersistentVolumeClaim") == []
    pod, _ = _valkey_pod(existing)
    claim = {v["name"]: v for v in pod["volumes"]}["data"]["persistentVolumeClaim"]
    assert claim == {"claimName": "valkey-data"}

    chosen = with_persistence(
        {"storageClassName": "fast", "size": "10Gi", "keepOnUninstall": False}
    )
    claim = one(chosen, "PersistentVolumeClaim", "rel-airuntime-valkey")
    assert claim["spec"]["storageClassName"] == "fast"
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert "annotations" not in claim["metadata"]


def test_an_unknown_appendfsync_fails_to_render_naming_it(helm: str, tmp_path: Path) -> None:
    persistence = {"appendfsync": "no"}
    stderr = render_fails(
        helm, tmp_path, {"redis": {"valkey": {"enabled": True, "persistence": persistence}}}
    )
    assert 'redis.valkey.persistence.appendfsync must be everysec or always, not "no"' in stderr


def test_the_rendered_valkey_loses_nothing_it_acknowledged_when_killed(
    render: Callable[..., list[Doc]], tmp_path: Path
) -> None:
    """The chart's own Valkey arguments, run by a real server on this machine (its data
    directory and password swapped for the test's): every write it answered is there
    again after ``kill -9`` and a restart -- the pod's process dying, not the node."""
    import os
    import signal
    import socket

    import redis

    from airuntime.devstack.embedded import default_executable

    _, container = _valkey_pod(render(EVERYTHING))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    swaps = {
        "valkey-server": default_executable(),
        "$(VALKEY_PASSWORD)": "test-password",
        _arg(container, "--dir"): str(tmp_path),
        _arg(container, "--port"): str(port),
    }
    argv = [swaps.get(a, a) for a in container["args"]] + ["--bind", "127.0.0.1"]

    def started() -> tuple[subprocess.Popen[bytes], redis.Redis]:
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=port, password="test-password", decode_responses=True)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.exceptions.RedisError:  # refused, or still loading the file
                return False

        wait_until(answers, within=30, what="Valkey answers PING")
        return server, client

    server, client = started()
    try:
        for batch in range(20):
            pipe = client.pipeline(transaction=False)
            for i in range(batch * 100, batch * 100 + 100):
                pipe.set(f"run:{i}", f"queued-{i}")
            pipe.hset("runs", str(batch), str(batch))
            pipe.xadd("ledger", {"batch": str(batch)})
            assert all(pipe.execute())  # answered: acknowledged
    finally:
        os.kill(server.pid, signal.SIGKILL)  # at once, no shutdown, no save
        server.wait(timeout=30)
        client.close()
    assert server.returncode == -signal.SIGKILL

    server, client = started()
    try:
        assert client.dbsize() == 2_000 + 2
        assert client.mget([f"run:{i}" for i in range(2_000)]) == [
            f"queued-{i}" for i in range(2_000)
        ]
        assert client.hlen("runs") == 20 and client.xlen("ledger") == 20
        assert client.config_get("appendonly") == {"appendonly": "yes"}
    finally:
        server.terminate()
        server.wait(timeout=30)
        client.close()


# -- RuntimePools -------------------------------------------------------------------------------


def test_runtime_pools_are_rendered_from_values(render: Callable[..., list[Doc]]) -> None:
    from airuntime.k8s.v1alpha1 import RUNTIME_POOL, RuntimePoolSpec

    pools = {p["metadata"]["name"]: p for p in objects(render(EVERYTHING), "RuntimePool")}
    assert sorted(pools) == ["shared", "tenant-a"]
    for declared in EVERYTHING["runtimePools"]:
        pool = pools[declared["name"]]
        assert pool["apiVersion"] == RUNTIME_POOL.api_version
        assert pool["metadata"]["namespace"] == NAMESPACE
        assert declared.get("labels", {}).items() <= pool["metadata"]["labels"].items()
        expected = {"redis": {"name": "rel-airuntime-redis", "key": "url"}, **declared["spec"]}
        assert pool["spec"] == expected
        RuntimePoolSpec.model_validate(pool["spec"])  # what the CRD was generated from


@pytest.mark.parametrize(
    ("pool", "message"),
    [
        pytest.param({"spec": {"tenantId": "t", "runtimePrefix": "t"}}, "runtimePools[0].name",
                     id="no-name"),
        pytest.param({"name": "p", "spec": {"runtimePrefix": "t"}}, "spec.tenantId",
                     id="no-tenant"),
        pytest.param({"name": "p", "spec": {"tenantId": "t"}}, "spec.runtimePrefix",
                     id="no-prefix"),
    ],
)  # fmt: skip
def test_incomplete_runtime_pools_fail_to_render(
    helm: str, tmp_path: Path, pool: Doc, message: str
) -> None:
    stderr = render_fails(helm, tmp_path, {"runtimePools": [pool]})
    assert message in stderr


# -- RBAC -------------------------------------------------------------------------------------


def rbac_rules(docs: list[Doc], comp: str) -> list[Doc]:
    rules: list[Doc] = []
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "Role") and component(doc) == comp:
            rules.extend(doc["rules"])
    return rules


def allows(rules: list[Doc], group: str, resource: str, verb: str) -> bool:
    return any(
        group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules
    )


def test_rbac_names_every_verb_and_resource(rendered: list[Doc]) -> None:
    roles = [d for d in rendered if d["kind"] in ("ClusterRole", "Role")]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"{role['metadata']['name']}: {field} has '*'"
            assert "resourceNames" not in rule or rule["resourceNames"]
            assert "nonResourceURLs" not in rule


# (apiGroup, resource, verb): what kopf and the operator's own requests need.
OPERATOR_NEEDS = [
    # kopf: resource and namespace discovery at run time, events, handled resources.
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
    ("", "events", "create"),
    ("airuntime.io", "runtimepools", "list"),
    ("airuntime.io", "runtimepools", "watch"),
    ("airuntime.io", "runtimepools", "patch"),
    ("airuntime.io", "runtimepools/status", "patch"),
    # scaling a pool through /scale grants nothing beyond patching spec.replicas.
    ("airuntime.io", "runtimepools/scale", "get"),
    ("airuntime.io", "runtimepools/scale", "patch"),
    ("airuntime.io", "runtimepools/finalizers", "update"),
    ("airuntime.io", "scaleoutrequests", "list"),
    ("airuntime.io", "scaleoutrequests", "watch"),
    ("airuntime.io", "scaleoutrequests", "patch"),
    ("airuntime.io", "scaleoutrequests", "delete"),
    ("airuntime.io", "scaleoutrequests/status", "patch"),
    ("airuntime.io", "scaleoutrequests/finalizers", "update"),
    # the pool's children: server-side apply (create + patch), read, delete; kopf index.
    *[("apps", "deployments", v) for v in ("get", "list", "watch", "create", "patch", "delete")],
    *[("", "serviceaccounts", v) for v in ("get", "create", "patch", "delete")],
    # a pool made by an operator before 0.2 also had a ConfigMap and a Service.
    *[("", r, v) for r in ("services", "configmaps") for v in ("get", "delete")],
    # scale-in: pod-deletion-cost on idle pods.
    ("", "pods", "list"),
    ("", "pods", "patch"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("group", "resource", "verb"), OPERATOR_NEEDS, ids=[f"{v} {r}" for _, r, v in OPERATOR_NEEDS]
)
def test_operator_rbac_covers_kopf_and_the_operator(
    render: Callable[..., list[Doc]], group: str, resource: str, verb: str
) -> None:
    for values in (None, NAMESPACED):
        rules = rbac_rules(render(values), "operator")
        assert allows(rules, group, resource, verb), f"operator cannot {verb} {resource}"


def test_operator_peering_rbac_follows_its_scope(render: Callable[..., list[Doc]]) -> None:
    clusterwide = rbac_rules(render(None), "operator")
    namespaced = rbac_rules(render(NAMESPACED), "operator")
    for verb in ("get", "list", "watch", "patch", "create"):
        assert allows(clusterwide, "kopf.dev", "clusterkopfpeerings", verb)
        assert allows(namespaced, "kopf.dev", "kopfpeerings", verb)
    assert not any("kopfpeerings" in r["resources"] for r in clusterwide)
    assert not any("clusterkopfpeerings" in r["resources"] for r in namespaced)
    standalone = rbac_rules(render({"operator": {"standalone": True}}), "operator")
    assert not any("kopf.dev" in r["apiGroups"] for r in standalone)


def test_operator_rbac_grants_nothing_else(rendered: list[Doc]) -> None:
    """Least privilege: no Secrets, no RBAC objects, no pods/exec, no deletion of pods."""
    rules = rbac_rules(rendered, "operator")
    granted = {
        (g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
        for v in rule["verbs"]
    }  # fmt: skip
    assert not any(r in ("secrets", "pods/exec", "roles", "rolebindings") for _, r, _ in granted)
    assert ("", "pods", "delete") not in granted
    assert not any(g == "rbac.authorization.k8s.io" for g, _, _ in granted)
    needed = set(OPERATOR_NEEDS)
    extra = sorted(
        f"{v} {g or 'core'}/{r}"
        for g, r, v in granted - needed
        if not (g == "kopf.dev" or (v == "get" and (g, r, "patch") in needed))
    )
    # Only read access to what the operator patches anyway, and kopf's peering, beyond
    # the list above.
    assert extra == [], extra


def test_operator_bindings_follow_watch_namespaces(render: Callable[..., list[Doc]]) -> None:
    clusterwide = render(None)
    names = {d["metadata"]["name"] for d in objects(clusterwide, "ClusterRoleBinding")}
    assert names == {"rel-airuntime-operator", "rel-airuntime-operator-cluster"}
    assert not [d for d in objects(clusterwide, "RoleBinding") if component(d) == "operator"]

    namespaced = render(NAMESPACED)
    names = {d["metadata"]["name"] for d in objects(namespaced, "ClusterRoleBinding")}
    assert names == {"rel-airuntime-operator-cluster"}
    bindings = [d for d in objects(namespaced, "RoleBinding") if component(d) == "operator"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings + objects(namespaced, "ClusterRoleBinding"):
        one(namespaced, binding["roleRef"]["kind"], binding["roleRef"]["name"])
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "rel-airuntime-operator", "namespace": NAMESPACE}
        ]
    operator = one(namespaced, "Deployment", "rel-airuntime-operator")
    env = env_of(operator["spec"]["template"]["spec"]["containers"][0])
    assert env["AIRUNTIME_OPERATOR_NAMESPACES"]["value"] == "team-a,team-b"


def test_control_plane_may_only_create_and_read_scale_out_requests(
    render: Callable[..., list[Doc]],
) -> None:
    docs = render(None)
    role = one(docs, "Role", "rel-airuntime-control-plane")
    assert role["rules"] == [
        {"apiGroups": ["airuntime.io"], "resources": ["scaleoutrequests"],
         "verbs": ["create", "get", "list", "watch"]}
    ]  # fmt: skip
    binding = one(docs, "RoleBinding", "rel-airuntime-control-plane")
    assert binding["subjects"][0]["name"] == "rel-airuntime-control-plane"
    without = render(NAMESPACED)  # scaleOutProvider: none
    assert not [
        d for d in without if d["kind"] in ("Role", "RoleBinding") and component(d) != "operator"
    ]


# -- the chart and the code agree -------------------------------------------------------------


def _literal_env(container: Doc) -> dict[str, str]:
    return {n: e["value"] for n, e in env_of(container).items() if "value" in e}


def test_control_plane_env_is_read_by_airt_control_plane(rendered: list[Doc]) -> None:
    from airuntime.control_plane.settings import ControlPlaneServerSettings as Settings
    from airuntime.core.log_output import LogSettings
    from airuntime.engine.handlers.settings import HandlerSettings
    from airuntime.engine.secret_sealing import SECRETS_KEYS_ENV

    # airt control-plane reads the variables of its settings model (options override them).
    read = {Settings.env_var(field) for field in Settings.model_fields}
    read.add("AIRUNTIME_HOME")  # read by the shared core, not an option
    read.add("AIRUNTIME_REDIS_CLUSTER")  # read by the shared Redis client (redis.cluster)
    read.add(SECRETS_KEYS_ENV)  # read at start by every command (engine.secret_sealing)
    read |= {HandlerSettings.env_var(field) for field in HandlerSettings.model_fields}
    read |= {LogSettings.env_var(field) for field in LogSettings.model_fields}  # its log
    (cp,) = [c for w, _, c in workloads(rendered) if component(w) == "control-plane"]
    LogSettings.model_validate(  # the values the chart writes are ones the process takes
        {f: _literal_env(cp)[LogSettings.env_var(f)] for f in LogSettings.model_fields}
    )
    unknown = sorted(set(env_of(cp)) - read)
    assert unknown == [], f"the chart sets variables airt control-plane does not read: {unknown}"
    env = env_of(cp)
    mounts = {m["mountPath"] for m in cp["volumeMounts"]}
    assert Path(env["AIRUNTIME_TOKENS_FILE"]["value"]).parent.as_posix() in mounts
    if "AIRUNTIME_TENANTS_FILE" in env:
        assert Path(env["AIRUNTIME_TENANTS_FILE"]["value"]).parent.as_posix() in mounts


def test_operator_env_is_read_by_operator_settings(rendered: list[Doc]) -> None:
    from airuntime_operator import OperatorSettings

    (op,) = [c for w, _, c in workloads(rendered) if component(w) == "operator"]
    env = {**_literal_env(op), "AIRUNTIME_REDIS_URL": "redis://valkey:6379/0"}
    settings = OperatorSettings.from_env(env)
    assert settings.liveness_endpoint == "http://0.0.0.0:8080/healthz"
    assert settings.peering_name == "airuntime" and settings.standalone is False
    assert settings.runtime_image == "ghcr.io/airuntime/airuntime:0.1.0"
    assert settings.status_interval_seconds == 10 and settings.retention_seconds == 3600
    assert settings.scale_in is True
    assert settings.runtime_token_secret == "rel-airuntime-runtime-token"
    assert settings.runtime_token_key == "token"
    for name in env:
        if name.startswith("AIRUNTIME_OPERATOR_") and name != "AIRUNTIME_OPERATOR_LOG_LEVEL":
            source = (REPO_ROOT / "operator" / "airuntime_operator" / "settings.py").read_text()
            suffix = name.removeprefix("AIRUNTIME_OPERATOR_")
            assert f'"{suffix}"' in source, f"OperatorSettings does not read {name}"


def test_tenants_file_is_valid_for_the_control_plane(render: Callable[..., list[Doc]]) -> None:
    from airuntime.devstack.local_stack import TenantsFile

    data = one(render(None), "ConfigMap", "rel-airuntime-tenants")["data"]["tenants.yaml"]
    tenants = TenantsFile.model_validate(yaml.safe_load(data)).tenants
    assert [t.tenant_id for t in tenants] == ["default"]


@pytest.mark.parametrize("values", [None, EVERYTHING], ids=["generated", "from-values"])
def test_tokens_file_is_valid_for_the_control_plane(
    render: Callable[..., list[Doc]], values: Doc | None, tmp_path: Path
) -> None:
    from airuntime.control_plane.rbac import Authenticator

    secret = one(render(values), "Secret", "rel-airuntime-tokens")
    path = tmp_path / "tokens.yaml"
    path.write_bytes(base64.b64decode(secret["data"]["tokens.yaml"]))
    entries = yaml.safe_load(path.read_text())["tokens"]
    auth = Authenticator.from_file(path)
    principal = auth.authenticate(entries[0]["token"])
    assert principal is not None
    if values is None:
        assert secret["metadata"]["annotations"]["airuntime.io/generated-token"] == "true"
        assert (principal.tenant_id, principal.user) == ("default", "admin")
        assert len(entries[0]["token"]) == 40
    else:
        assert (principal.tenant_id, principal.user) == ("tenant-a", "alice")


def test_existing_tokens_secret_is_mounted_not_rendered(render: Callable[..., list[Doc]]) -> None:
    docs = render(NAMESPACED)
    assert not [d for d in objects(docs, "Secret") if d["metadata"]["name"].endswith("tokens")]
    cp = one(docs, "Deployment", "rel-airuntime-control-plane")["spec"]["template"]["spec"]
    (tokens,) = [v for v in cp["volumes"] if v["name"] == "tokens"]
    assert tokens["secret"]["secretName"] == "my-tokens"
    assert tokens["secret"]["items"] == [{"key": "tokens", "path": "tokens.yaml"}]
    assert "AIRUNTIME_TENANTS_FILE" not in env_of(cp["containers"][0])


# -- monitoring -------------------------------------------------------------------------------


def test_service_monitor_scrapes_the_control_plane_and_runtime_pods(
    render: Callable[..., list[Doc]],
) -> None:
    from airuntime.k8s.v1alpha1 import RuntimePoolSpec
    from airuntime_operator import deployments

    docs = render(EVERYTHING)
    monitor = one(docs, "ServiceMonitor", "rel-airuntime")
    pods = one(docs, "PodMonitor", "rel-airuntime-runtime")
    for m in (monitor, pods):
        assert m["metadata"]["labels"]["release"] == "prometheus"
        assert NAMESPACE in m["spec"]["namespaceSelector"]["matchNames"]
    ((endpoint,), (pod_endpoint,)) = (
        monitor["spec"]["endpoints"],
        pods["spec"]["podMetricsEndpoints"],
    )
    for e in (endpoint, pod_endpoint):
        assert (e["port"], e["path"]) == ("http", "/metrics")
        assert e["honorLabels"] is True  # a runtime's `instance` is its instance id
    assert [r["targetLabel"] for r in pod_endpoint["relabelings"]] == ["pod", "runtime_tenant"]

    def selected(selector: dict[str, Any], labels: dict[str, str]) -> bool:
        if not selector.get("matchLabels", {}).items() <= labels.items():
            return False
        for expr in selector.get("matchExpressions", []):
            assert expr["operator"] == "In"
            if labels.get(expr["key"]) not in expr["values"]:
                return False
        return True

    control_plane = one(docs, "Service", "rel-airuntime-control-plane")
    assert selected(monitor["spec"]["selector"], control_plane["metadata"]["labels"])
    assert "http" in [p["name"] for p in control_plane["spec"]["ports"]]
    valkey = one(docs, "Service", "rel-airuntime-valkey")["metadata"]["labels"]
    assert not selected(monitor["spec"]["selector"], valkey)

    # The pods the operator runs for a pool (no Service of their own): their template's
    # labels and named port are what the PodMonitor selects and scrapes.
    pool = EVERYTHING["runtimePools"][1]
    spec = RuntimePoolSpec.model_validate(pool["spec"])
    ref = deployments.PoolRef(name=pool["name"], namespace=NAMESPACE, uid="uid-1")
    template = deployments.pod_template(ref, spec, image="img")
    assert selected(pods["spec"]["selector"], template["metadata"]["labels"])
    assert not selected(monitor["spec"]["selector"], template["metadata"]["labels"])
    (container,) = template["spec"]["containers"]
    assert "http" in [p["name"] for p in container["ports"]]


# -- trust: runtime token, handler policy, network policies ------------------------------------

TRUST: Doc = {
    **EVERYTHING,
    "pythonHandlerModules": ["mycompany.tools", "mycompany.more"],
    "httpHandlerDenyCidrs": ["203.0.113.0/24"],
    "httpHandlerAllow": ["api.internal"],
}


def _pod_labels(docs: list[Doc], comp: str) -> dict[str, str]:
    (workload,) = [w for w in objects(docs, "Deployment") if component(w) == comp]
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def _runtime_pod_labels(pool: Doc) -> dict[str, str]:
    """The labels of the pods the operator creates for a RuntimePool the chart rendered."""
    from airuntime.k8s.v1alpha1 import RuntimePoolSpec
    from airuntime_operator import deployments

    spec = RuntimePoolSpec.model_validate(pool["spec"])
    ref = deployments.PoolRef(name=pool["metadata"]["name"], namespace=NAMESPACE, uid="uid-1")
    labels: dict[str, str] = deployments.pod_template(ref, spec, image="img")["metadata"]["labels"]
    return labels


def _admits(peer: Doc, namespace: str, labels: dict[str, str]) -> bool:
    """Whether a NetworkPolicy peer of a policy in ``NAMESPACE`` (matchLabels selectors
    only) admits a pod with ``labels`` in ``namespace``."""
    ns_selector = peer.get("namespaceSelector")
    if ns_selector is None:
        if namespace != NAMESPACE:
            return False
    else:
        assert set(ns_selector) <= {"matchLabels"}, ns_selector
        wanted = ns_selector.get("matchLabels", {})
        if not wanted.items() <= {"kubernetes.io/metadata.name": namespace}.items():
            return False
    pod_selector = peer.get("podSelector", {})
    assert set(pod_selector) <= {"matchLabels"}, pod_selector
    return bool(pod_selector.get("matchLabels", {}).items() <= labels.items())


def test_runtime_token_and_handler_policy_reach_control_plane_and_operator(
    render: Callable[..., list[Doc]],
) -> None:
    docs = render(TRUST)
    (cp,) = [c for w, _, c in workloads(docs) if component(w) == "control-plane"]
    (op,) = [c for w, _, c in workloads(docs) if component(w) == "operator"]
    token = env_of(cp)["AIRUNTIME_RUNTIME_TOKEN"]
    assert token == {
        "name": "AIRUNTIME_RUNTIME_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "rel-airuntime-runtime-token", "key": "token"}},
    }
    secret = one(docs, "Secret", "rel-airuntime-runtime-token")
    assert len(base64.b64decode(secret["data"]["token"])) == 48
    for container in (cp, op):
        env = _literal_env(container)
        assert env["AIRUNTIME_PYTHON_HANDLER_MODULES"] == "mycompany.tools,mycompany.more"
        assert env["AIRUNTIME_HTTP_HANDLER_DENY_CIDRS"] == "203.0.113.0/24"
        assert env["AIRUNTIME_HTTP_HANDLER_ALLOW"] == "api.internal"
    assert _literal_env(op)["AIRUNTIME_OPERATOR_RUNTIME_TOKEN_SECRET"] == (
        "rel-airuntime-runtime-token"
    )
    assert "runtime-token" not in yaml.safe_dump(env_of(op)).replace(
        "rel-airuntime-runtime-token", ""
    ), "the operator names the Secret, it never holds the token"


def test_model_providers_reach_control_plane_and_operator_and_the_keys_only_runtimes(
    render: Callable[..., list[Doc]],
) -> None:
    """``modelProviders`` is one JSON variable on the control plane and the operator, as
    the processes read it; the operator, given ``modelKeysSecret``, hands runtime pods a
    reference per key variable; the control plane never gets a key."""
    from airuntime.engine.handlers.settings import HandlerSettings
    from airuntime_operator import OperatorSettings

    providers = {
        "openai": {
            "base_url": "https://api.openai.com/v1",
            "api_key_env": "OPENAI_API_KEY",
            "models": ["gpt-4o-mini"],
        },
        "local": {"base_url": "http://vllm.models.svc:8000/v1", "timeout_s": 300},
    }
    docs = render({"modelProviders": providers, "modelKeysSecret": "model-keys"})
    (cp,) = [c for w, _, c in workloads(docs) if component(w) == "control-plane"]
    (op,) = [c for w, _, c in workloads(docs) if component(w) == "operator"]
    for container in (cp, op):
        value = _literal_env(container)["AIRUNTIME_MODEL_PROVIDERS"]
        assert json.loads(value) == providers
        read = HandlerSettings.model_validate({"model_providers": value}).model_providers
        assert read["openai"].models == ("gpt-4o-mini",) and read["local"].timeout_s == 300
    assert "OPENAI_API_KEY" not in env_of(cp)
    literal = _literal_env(op)
    assert literal["AIRUNTIME_OPERATOR_MODEL_KEYS_SECRET"] == "model-keys"
    literal["AIRUNTIME_REDIS_URL"] = "redis://valkey:6379/0"  # a secretKeyRef in the chart
    runtime_env = {e["name"]: e for e in OperatorSettings.from_env(literal).runtime_platform_env()}
    assert runtime_env["OPENAI_API_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "model-keys", "key": "OPENAI_API_KEY", "optional": True}
    }
    plain = render(None)
    (cp,) = [c for w, _, c in workloads(plain) if component(w) == "control-plane"]
    assert _literal_env(cp)["AIRUNTIME_MODEL_PROVIDERS"] == ""


def test_an_existing_runtime_token_secret_is_used_not_rendered(
    render: Callable[..., list[Doc]],
) -> None:
    docs = render({"runtimeToken": {"existingSecret": "rt", "existingSecretKey": "bearer"}})
    names = sorted(d["metadata"]["name"] for d in objects(docs, "Secret"))
    assert names == ["rel-airuntime-secrets-keys", "rel-airuntime-tokens"], names
    (cp,) = [c for w, _, c in workloads(docs) if component(w) == "control-plane"]
    ref = env_of(cp)["AIRUNTIME_RUNTIME_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "rt", "key": "bearer"}


def test_the_secrets_keys_reach_the_control_plane_and_through_the_operator_the_runtimes(
    render: Callable[..., list[Doc]], helm: str, tmp_path: Path
) -> None:
    """One random key generated (kept across upgrades by lookup); the control plane reads
    it through a secretKeyRef, the operator only names the Secret for runtime pods; an
    existing Secret is used instead; a short key does not render."""
    from airuntime.engine.secret_sealing import parse_keys

    docs = render(None)
    secret = one(docs, "Secret", "rel-airuntime-secrets-keys")
    (key,) = parse_keys(base64.b64decode(secret["data"]["keys"]).decode())
    assert len(key) == 48
    (cp,) = [c for w, _, c in workloads(docs) if component(w) == "control-plane"]
    (op,) = [c for w, _, c in workloads(docs) if component(w) == "operator"]
    assert env_of(cp)["AIRUNTIME_SECRETS_KEYS"]["valueFrom"] == {
        "secretKeyRef": {"name": "rel-airuntime-secrets-keys", "key": "keys"}
    }
    literal = _literal_env(op)
    assert literal["AIRUNTIME_OPERATOR_SECRETS_KEYS_SECRET"] == "rel-airuntime-secrets-keys"
    assert literal["AIRUNTIME_OPERATOR_SECRETS_KEYS_KEY"] == "keys"
    assert "AIRUNTIME_SECRETS_KEYS" not in env_of(op), "the operator never holds a key"
    mine = render({"secretsKeys": {"existingSecret": "sk", "existingSecretKey": "k"}})
    assert not [d for d in objects(mine, "Secret") if "secrets-keys" in d["metadata"]["name"]]
    (cp,) = [c for w, _, c in workloads(mine) if component(w) == "control-plane"]
    assert env_of(cp)["AIRUNTIME_SECRETS_KEYS"]["valueFrom"]["secretKeyRef"] == {
        "name": "sk", "key": "k"
    }  # fmt: skip
    short = render_fails(helm, tmp_path, {"secretsKeys": {"value": "x" * 40 + ",short"}})
    assert "at least 32 characters" in short


def test_the_history_dsn_reaches_the_control_plane_through_a_secret(
    render: Callable[..., list[Doc]],
) -> None:
    dsn = "postgresql://airuntime:s3cret@postgres:5432/airuntime"
    docs = render({"history": {"dsn": dsn}})
    secret = one(docs, "Secret", "rel-airuntime-history")
    assert base64.b64decode(secret["data"]["dsn"]).decode() == dsn
    (cp,) = [c for w, _, c in workloads(docs) if component(w) == "control-plane"]
    env = env_of(cp)
    assert env["AIRUNTIME_HISTORY_DSN"]["valueFrom"]["secretKeyRef"] == {
        "name": "rel-airuntime-history",
        "key": "dsn",
    }
    assert env["AIRUNTIME_HISTORY_AUTO_MIGRATE"]["value"] == "true"
    assert "s3cret" not in yaml.safe_dump([d for d in docs if d["kind"] != "Secret"])
    # An existing Secret is referenced, not rendered; no DSN: no variable (SQLite on /tmp).
    existing = render({"history": {"existingSecret": "pg", "existingSecretKey": "url"}})
    assert not [d for d in objects(existing, "Secret") if "history" in d["metadata"]["name"]]
    (cp,) = [c for w, _, c in workloads(existing) if component(w) == "control-plane"]
    assert env_of(cp)["AIRUNTIME_HISTORY_DSN"]["valueFrom"]["secretKeyRef"] == {
        "name": "pg",
        "key": "url",
    }
    (cp,) = [c for w, _, c in workloads(render(None)) if component(w) == "control-plane"]
    assert "AIRUNTIME_HISTORY_DSN" not in env_of(cp)


def test_runtime_pods_get_the_history_dsn_through_the_operator_for_large_outputs(
    render: Callable[..., list[Doc]],
) -> None:
    """The operator names the history Secret (never holds the DSN) and passes it to
    every runtime pod as a secretKeyRef; a SQLite history (the control plane's own
    file) or ``runtimeOffload: false`` passes nothing."""
    from airuntime_operator import OperatorSettings

    dsn = "postgresql://airuntime:s3cret@postgres:5432/airuntime"
    cases = [
        ({"dsn": dsn}, {"name": "rel-airuntime-history", "key": "dsn"}),
        ({"existingSecret": "pg", "existingSecretKey": "url"}, {"name": "pg", "key": "url"}),
        ({"dsn": "sqlite:////data/history.db"}, None),
        ({"dsn": dsn, "runtimeOffload": False}, None),
        ({}, None),
    ]
    for history, expected in cases:
        docs = render({"history": history})
        (op,) = [c for w, _, c in workloads(docs) if component(w) == "operator"]
        env = {**_literal_env(op), "AIRUNTIME_REDIS_URL": "redis://valkey:6379/0"}
        assert "s3cret" not in yaml.safe_dump(env_of(op)), "the operator never holds the DSN"
        runtime_env = {
            e["name"]: e.get("valueFrom")
            for e in OperatorSettings.from_env(env).runtime_platform_env()
        }
        if expected is None:
            assert "AIRUNTIME_HISTORY_DSN" not in runtime_env, history
        else:
            assert runtime_env["AIRUNTIME_HISTORY_DSN"] == {"secretKeyRef": expected}, history


def test_redis_cluster_sets_the_cluster_env_on_every_process_and_runtime_pod(
    render: Callable[..., list[Doc]],
) -> None:
    from airuntime.core.redis_client import CLUSTER_ENV
    from airuntime_operator import OperatorSettings

    cluster = {"redis": {"cluster": True, "external": {"secretName": "vc", "key": "url"}}}
    for values, expected in ((None, None), (cluster, "1")):
        docs = render(values)
        seen = {component(w): env_of(c).get(CLUSTER_ENV) for w, _, c in workloads(docs)}
        assert set(seen) >= {"control-plane", "operator"}, seen
        for name in ("control-plane", "operator"):
            got = seen[name]
            assert (got["value"] if got else None) == expected, (values, name, got)
        (op,) = [c for w, _, c in workloads(docs) if component(w) == "operator"]
        env = {**_literal_env(op), "AIRUNTIME_REDIS_URL": "redis://valkey:6379/0"}
        settings = OperatorSettings.from_env(env)
        assert settings.redis_cluster is (expected == "1")
        runtime_env = {e["name"]: e.get("value") for e in settings.runtime_platform_env()}
        assert runtime_env.get(CLUSTER_ENV) == expected, (values, runtime_env)


def test_the_log_format_and_level_reach_every_process_and_runtime_pod(
    render: Callable[..., list[Doc]],
) -> None:
    from airuntime.core.log_output import LogFormat
    from airuntime_operator import OperatorSettings

    json_debug = {"logging": {"level": "debug", "format": "json"}}
    for values, level, fmt in ((None, "INFO", "text"), (json_debug, "DEBUG", "json")):
        docs = render(values)
        for name in ("control-plane", "operator"):
            (container,) = [c for w, _, c in workloads(docs) if component(w) == name]
            env = _literal_env(container)
            assert (env["AIRUNTIME_LOG_LEVEL"], env["AIRUNTIME_LOG_FORMAT"]) == (level, fmt), name
        (op,) = [c for w, _, c in workloads(docs) if component(w) == "operator"]
        settings = OperatorSettings.from_env(
            {**_literal_env(op), "AIRUNTIME_REDIS_URL": "redis://valkey:6379/0"}
        )
        assert settings.log_format is LogFormat(fmt)  # the operator's own log
        assert settings.log_level == "INFO"  # operator.logLevel, its own
        runtime_env = {e["name"]: e.get("value") for e in settings.runtime_platform_env()}
        assert runtime_env["AIRUNTIME_LOG_LEVEL"] == level, runtime_env
        assert runtime_env["AIRUNTIME_LOG_FORMAT"] == fmt, runtime_env


@pytest.mark.parametrize(
    ("logging", "message"),
    [
        ({"format": "xml"}, 'logging.format must be text or json, not "xml"'),
        ({"level": "loud"}, 'logging.level must be DEBUG, INFO, WARNING or ERROR, not "loud"'),
    ],
)
def test_an_unknown_log_format_or_level_fails_to_render_naming_it(
    helm: str, tmp_path: Path, logging: Doc, message: str
) -> None:
    stderr = render_fails(helm, tmp_path, {"logging": logging})
    assert message in stderr


def test_a_history_dsn_of_another_database_fails_to_render_without_its_password(
    helm: str, tmp_path: Path
) -> None:
    stderr = render_fails(helm, tmp_path, {"history": {"dsn": "mysql://u:hunter22@db/x"}})
    assert "history.dsn must start with postgresql://" in stderr
    assert "hunter22" not in stderr


def test_runtime_pods_admit_only_the_control_plane_and_the_scraper(
    render: Callable[..., list[Doc]],
) -> None:
    from airuntime_operator import deployments

    docs = render(TRUST)
    policy = one(docs, "NetworkPolicy", "rel-airuntime-runtime")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    pools = objects(docs, "RuntimePool")
    assert len(pools) == 2
    for pool in pools:
        assert selector.items() <= _runtime_pod_labels(pool).items()
    for comp in ("control-plane", "operator", "valkey"):
        assert not selector.items() <= _pod_labels(docs, comp).items()
    intake, metrics = policy["spec"]["ingress"]
    for rule in (intake, metrics):
        assert rule["ports"] == [{"port": deployments.HTTP_PORT, "protocol": "TCP"}]
    control_plane = _pod_labels(docs, "control-plane")
    assert any(_admits(p, NAMESPACE, control_plane) for p in intake["from"])
    assert not any(_admits(p, "elsewhere", control_plane) for p in intake["from"])
    for comp in ("operator", "valkey"):
        assert not any(_admits(p, NAMESPACE, _pod_labels(docs, comp)) for p in intake["from"])
    assert metrics["from"] == [
        {
            "namespaceSelector": {},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
    ]
    # Without the ServiceMonitor nobody but the control plane reaches the runtimes.
    (only,) = one(render(None), "NetworkPolicy", "rel-airuntime-runtime")["spec"]["ingress"]
    assert only == intake


def test_valkey_admits_only_this_releases_pods(render: Callable[..., list[Doc]]) -> None:
    docs = render(TRUST)
    policy = one(docs, "NetworkPolicy", "rel-airuntime-valkey")
    valkey = one(docs, "Deployment", "rel-airuntime-valkey")
    assert (
        policy["spec"]["podSelector"]["matchLabels"].items() <= _pod_labels(docs, "valkey").items()
    )
    (rule,) = policy["spec"]["ingress"]
    (port,) = valkey["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert rule["ports"] == [{"port": port["containerPort"], "protocol": "TCP"}]
    admitted = [
        _pod_labels(docs, "control-plane"),
        _pod_labels(docs, "operator"),
        *(_runtime_pod_labels(pool) for pool in objects(docs, "RuntimePool")),
    ]
    for labels in admitted:
        assert any(_admits(peer, NAMESPACE, labels) for peer in rule["from"]), labels
    other_release = {**_pod_labels(docs, "control-plane"), "app.kubernetes.io/instance": "other"}
    for labels, namespace in [
        ({"app": "anything"}, NAMESPACE),
        (other_release, NAMESPACE),
        (_pod_labels(docs, "control-plane"), "elsewhere"),
        (_runtime_pod_labels(objects(docs, "RuntimePool")[0]), "elsewhere"),
    ]:
        assert not any(_admits(peer, namespace, labels) for peer in rule["from"]), labels


def test_network_policies_follow_the_operators_namespaces_and_the_toggle(
    render: Callable[..., list[Doc]],
) -> None:
    policies = objects(render(NAMESPACED), "NetworkPolicy")
    assert sorted(p["metadata"]["namespace"] for p in policies) == [NAMESPACE, "team-a", "team-b"]
    for policy in policies:
        (peer,) = policy["spec"]["ingress"][0]["from"]
        assert peer["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": NAMESPACE
        }
    assert objects(render({**TRUST, "networkPolicy": {"enabled": False}}), "NetworkPolicy") == []


# Every metric the dashboard must show (control plane and runtime pods).
DASHBOARD_METRICS = [
    "airuntime_shared_queue_depth",
    "airuntime_dispatch_latency_seconds",
    "airuntime_admission_decisions_total",
    "airuntime_scale_out_requests",
    "airuntime_workers_active",
    "airuntime_workers_available",
    "airuntime_runs_running",
    "airuntime_queue_depth",
    "airuntime_steps_total",
    "airuntime_lease_recoveries",
    "airuntime_step_slot_wait_seconds",
    "airuntime_runs_waiting",
    "airuntime_runs_waiting_oldest_age_seconds",
    "airuntime_tenant_ready_instances",
    "airuntime_scale_out_failures_total",
    "airuntime_dispatch_failures_total",
    "airuntime_loop_errors_total",
    "airuntime_loop_healthy",
    "airuntime_archive_backlog",
    "airuntime_archive_errors_total",
]


@pytest.fixture(scope="module")
def dashboard(render: Callable[..., list[Doc]]) -> Doc:
    configmap = one(render(EVERYTHING), "ConfigMap", "rel-airuntime-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "airuntime"}
    (text,) = configmap["data"].values()
    board: Doc = json.loads(text)
    return board


def dashboard_exprs(board: Doc) -> list[str]:
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


@pytest.mark.parametrize("metric", DASHBOARD_METRICS)
def test_dashboard_shows_metric(dashboard: Doc, metric: str) -> None:
    pattern = re.compile(rf"\b{metric}(_bucket|_sum|_count)?\b")
    assert any(pattern.search(e) for e in dashboard_exprs(dashboard)), metric


def test_dashboard_panels_are_well_formed(dashboard: Doc) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] and dashboard["title"]
    titles = {p["title"] for p in dashboard["panels"]}
    for wanted in (
        "Shared queue depth per tenant", "Dispatch latency", "Admission decisions",
        "Scale-out requests", "Instances and capacity", "Steps per second", "Retries",
        "Lease recoveries", "Step-slot waits",
    ):  # fmt: skip
        assert wanted in titles
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"] and all(t["expr"] for t in panel["targets"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
    for expr in dashboard_exprs(dashboard):
        assert expr.count("(") == expr.count(")"), expr
        if "histogram_quantile" in expr:
            assert "_bucket[" in expr and "by (le)" in expr, expr


def test_dashboard_metrics_exist_in_the_code() -> None:
    """Every airuntime_* name the dashboard queries is registered by some process."""
    board = json.loads((CHART / "dashboards" / "airuntime.json").read_text())
    source = "".join(
        p.read_text() for d in ("airuntime", "runtime_pod") for p in (REPO_ROOT / d).rglob("*.py")
    )
    for expr in dashboard_exprs(board):
        for name in re.findall(r"airuntime_[a-z_]+", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert f'"{base}"' in source, f"{name} is not exported by airuntime"


# -- CRDs ------------------------------------------------------------------------------------


def test_chart_crds_are_the_repository_crds_unchanged() -> None:
    top = {p.name: p.read_bytes() for p in (REPO_ROOT / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert top, "no CRDs in crds/"
    assert sorted(chart) == sorted(top), "helm/airuntime/crds/ and crds/ list different files"
    drifted = sorted(name for name in top if chart[name] != top[name])
    assert drifted == [], f"re-copy crds/ into helm/airuntime/crds/: {drifted} differ"


# -- values.yaml documentation --------------------------------------------------------------

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-/]+|\"[^\"]+\"):(?P<rest>\s.*|)$")


def value_docs(text: str) -> tuple[dict[str, bool], set[str]]:
    """``({leaf path: documented}, every key path)`` of a values file, helm-docs style.

    A key is documented when the comment block right above it (no blank line between)
    starts a ``# --`` description. A leaf is a key whose value is a scalar, a flow
    collection, a list or a block scalar; its children are not keys of their own. A
    documented map is one value (as helm-docs renders it), so its leaves are covered.
    """
    lines = text.splitlines()
    leaves: dict[str, bool] = {}
    paths: set[str] = set()
    stack: list[tuple[int, str, bool]] = []
    comments: list[str] = []
    skip_deeper_than: int | None = None

    def next_content(i: int) -> str | None:
        for later in lines[i + 1 :]:
            if later.strip() and not later.strip().startswith("#"):
                return later
        return None

    for i, line in enumerate(lines):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if skip_deeper_than is not None:
            inside = indent > skip_deeper_than or (
                indent == skip_deeper_than and stripped.startswith("- ")
            )
            if stripped.startswith("#") and indent <= skip_deeper_than:
                comments.append(stripped)  # the next key's description
                continue
            if not stripped:
                comments = []
                continue
            if stripped.startswith("#") or inside:
                continue
            skip_deeper_than = None
        if not stripped:
            comments = []
            continue
        if stripped.startswith("#"):
            comments.append(stripped)
            continue
        match = _KEY.match(line)
        assert match, f"values.yaml:{i + 1}: not a key: {line!r}"
        documented = any(c.startswith("# --") for c in comments)
        comments = []
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([*(k for _, k, _ in stack), match["key"]])
        paths.add(path)
        rest = match["rest"].split(" #")[0].strip()
        inherited = any(d for _, _, d in stack)
        following = next_content(i)
        if rest and rest[0] in "|>":
            skip_deeper_than = indent
            leaves[path] = documented or inherited
        elif rest:
            leaves[path] = documented or inherited
        elif following is not None and following.strip().startswith("- "):
            skip_deeper_than = indent
            leaves[path] = documented or inherited
        elif following is not None and len(following) - len(following.lstrip(" ")) > indent:
            stack.append((indent, match["key"], documented))
        else:
            leaves[path] = documented or inherited
    return leaves, paths


def yaml_key_paths(node: Any, prefix: str = "") -> set[str]:
    paths: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}{key}"
            paths.add(path)
            paths |= yaml_key_paths(value, path + ".")
    return paths


def test_every_value_is_documented() -> None:
    text = (CHART / "values.yaml").read_text()
    leaves, paths = value_docs(text)
    # The line parser saw exactly the keys YAML sees (outside lists).
    assert paths == yaml_key_paths(yaml.safe_load(text))
    assert len(leaves) > 50
    missing = sorted(path for path, documented in leaves.items() if not documented)
    assert missing == [], f"values without a '# --' comment: {missing}"


def test_the_documentation_check_finds_undocumented_values() -> None:
    text = (
        "# -- documented\na: 1\n"
        "b: 2\n"
        "# -- a documented map\nc:\n  d: 1\n"
        "e:\n  # -- documented\n  f: []\n  g:\n    - 1\n"
        "# -- documented\n\nh: x\n"
    )
    leaves, _ = value_docs(text)
    assert leaves == {"a": True, "b": False, "c.d": True, "e.f": True, "e.g": False, "h": False}


# -- Dockerfile and kind ----------------------------------------------------------------------


def dockerfile_stages() -> tuple[list[list[tuple[str, str]]], dict[str, str]]:
    """Instructions of each stage (continuations joined, comments dropped), and the
    ARG defaults declared before the first FROM."""
    text = (REPO_ROOT / "Dockerfile").read_text()
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    stages: list[list[tuple[str, str]]] = []
    global_args: dict[str, str] = {}
    for instruction in logical:
        word, _, args = instruction.partition(" ")
        word = word.upper()
        if word == "FROM":
            stages.append([])
        if not stages:
            if word == "ARG" and "=" in args:
                name, _, default = args.strip().partition("=")
                global_args[name] = default
            continue
        stages[-1].append((word, args.strip()))
    return stages, global_args


def test_dockerfile_installs_in_a_builder_then_a_slim_non_root_image() -> None:
    from airuntime_operator import deployments

    stages, args = dockerfile_stages()
    assert len(stages) >= 2, "the Dockerfile is not multi-stage"

    def image(stage: list[tuple[str, str]]) -> tuple[str, str]:
        base, _, alias = stage[0][1].partition(" AS ")
        for name, value in args.items():
            base = base.replace(f"${{{name}}}", value).replace(f"${name}", value)
        return base.strip(), alias.strip()

    builder, final = stages[0], stages[-1]
    assert image(builder)[1] == "builder"
    assert any(w == "RUN" and "pip install" in a for w, a in builder)
    assert image(final) == ("python:3.11-slim", "")

    # The final stage copies the builder's virtualenv (keyed by content) and installs
    # nothing from the network.
    copies = [a for w, a in final if w == "COPY"]
    assert any(a.startswith("--from=builder ") for a in copies), "no copy from the builder"
    runs = " ".join(a for w, a in final if w == "RUN")
    assert "pip install" not in runs
    for compiler in ("build-essential", "gcc", "g++", "clang", "apt-get install"):
        assert compiler not in runs, f"the final stage installs {compiler}"

    users = [a for w, a in final if w == "USER"]
    assert users, "the final image runs as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit(), "USER must be numeric for runAsNonRoot to verify it"
    assert int(uid) == RUN_AS == deployments.RUN_AS
    (entrypoint,) = [json.loads(a) for w, a in final if w == "ENTRYPOINT"]
    assert entrypoint == ["airt"]
    exposed = {p for w, a in final if w == "EXPOSE" for p in a.split()}
    assert {"8780", str(deployments.HTTP_PORT)} <= exposed
    assert not any(w == "HEALTHCHECK" for stage in stages for w, _ in stage)


def test_dockerfile_copies_every_package_and_dockerignore_lets_it_through() -> None:
    import tomllib

    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    package_dirs = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    stages, _ = dockerfile_stages()
    copied = {
        source.rstrip("/")
        for word, args in stages[0]
        if word == "COPY" and "--from" not in args
        for source in args.split()[:-1]
    }

    def covered(path: str, sources: set[str]) -> bool:
        return any(path == src or path.startswith(src + "/") for src in sources)

    for needed in package_dirs | {"pyproject.toml", "README.md"}:
        assert covered(needed, copied), (needed, copied)
    ignore = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "*", ".dockerignore should be an allow-list"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    readme = pyproject["project"]["readme"]
    for needed in package_dirs | {"pyproject.toml", readme}:
        assert covered(needed, allowed), (needed, allowed)


def test_kind_config_exposes_the_control_plane_api() -> None:
    config = yaml.safe_load((REPO_ROOT / "kind-config.yaml").read_text())
    assert (config["kind"], config["apiVersion"]) == ("Cluster", "kind.x-k8s.io/v1alpha4")
    (node,) = config["nodes"]
    assert node["role"] == "control-plane"
    mappings = {m["containerPort"]: m["hostPort"] for m in node["extraPortMappings"]}
    assert mappings.get(30780) == 8780


# -- the chart on a real API server ----------------------------------------------------------
#
# `helm install` into a real kube-apiserver (tests/k8s_env.py; no kubelet, so no pod runs):
# the API server validates every object (RuntimePools against the CRD's schema and CEL
# rules), `lookup` keeps generated secrets across upgrades, SubjectAccessReviews check
# the ServiceAccounts' permissions, and the operator runs as its own ServiceAccount.

INSTALLED: Doc = {
    **{k: v for k, v in EVERYTHING.items() if k != "auth"},  # a generated admin token
    "operator": {"statusIntervalSeconds": 1},
    "pythonHandlerModules": ["mycompany.tools"],
}

# Stand-ins for the Prometheus Operator's CRDs, so that the ServiceMonitor, the
# PodMonitor and the PrometheusRule can be created.
SERVICE_MONITOR_CRD: Doc = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {"kind": "ServiceMonitor", "plural": "servicemonitors"},
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "schema": {"openAPIV3Schema": {
                "type": "object", "x-kubernetes-preserve-unknown-fields": True,
            }},
        }],
    },
}  # fmt: skip


def _stand_in_crd(kind: str, plural: str) -> Doc:
    crd: Doc = json.loads(json.dumps(SERVICE_MONITOR_CRD))
    crd["metadata"]["name"] = f"{plural}.monitoring.coreos.com"
    crd["spec"]["names"] = {"kind": kind, "plural": plural}
    return crd


PROMETHEUS_RULE_CRD = _stand_in_crd("PrometheusRule", "prometheusrules")
POD_MONITOR_CRD = _stand_in_crd("PodMonitor", "podmonitors")


def wait_for(predicate: Callable[[], Any], *, timeout: float, what: str) -> Any:
    return wait_until(predicate, within=timeout, what=what, interval=0.2)


class Installed:
    """A release of the chart on a throw-away API server."""

    def __init__(self, env: Any, helm: str, tmp: Path) -> None:
        from kubernetes import config

        self.env = env
        self.helm = helm
        self.tmp = tmp
        self.api = config.new_client_from_config(config_file=str(env.kubeconfig_path))

    def run_helm(self, *args: str, values: Doc | None = None) -> str:
        return run_helm(
            self.helm, *args, "--kubeconfig", str(self.env.kubeconfig_path),
            values=values, tmp=self.tmp,
        )  # fmt: skip

    def secret(self, name: str) -> dict[str, str]:
        from kubernetes import client

        data = client.CoreV1Api(self.api).read_namespaced_secret(name, NAMESPACE).data
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    def can(self, service_account: str, verb: str, resource: str, group: str = "",
            namespace: str | None = NAMESPACE) -> bool:  # fmt: skip
        from kubernetes import client

        sub, _, subresource = resource.partition("/")
        review = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=f"system:serviceaccount:{NAMESPACE}:{service_account}",
                groups=["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
                resource_attributes=client.V1ResourceAttributes(
                    group=group, resource=sub, subresource=subresource or None, verb=verb,
                    namespace=namespace,
                ),
            )
        )  # fmt: skip
        answer = client.AuthorizationV1Api(self.api).create_subject_access_review(review)
        return bool(answer.status.allowed)

    def service_account_kubeconfig(self, name: str) -> Path:
        from kubernetes import client

        token = client.CoreV1Api(self.api).create_namespaced_service_account_token(
            name, NAMESPACE, client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
            ),
        ).status.token  # fmt: skip
        admin = json.loads(self.env.kubeconfig_path.read_text())
        admin["users"] = [{"name": name, "user": {"token": token}}]
        admin["contexts"][0]["context"]["user"] = name
        path = self.tmp / f"kubeconfig-{name}"
        path.write_text(json.dumps(admin))
        return path


@pytest.fixture(scope="module")
def installed(helm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    from kubernetes import client

    from tests.k8s_env import KubeBinariesUnavailable, KubeTestEnv

    env = KubeTestEnv(with_controller_manager=False)
    try:
        env.bin_dir  # noqa: B018 - resolves (and if needed builds) the binaries
    except KubeBinariesUnavailable as exc:
        pytest.skip(f"Kubernetes test binaries unavailable: {exc}")
    with env:
        release = Installed(env, helm, tmp_path_factory.mktemp("installed"))
        try:
            ext = client.ApiextensionsV1Api(release.api)
            ext.create_custom_resource_definition(SERVICE_MONITOR_CRD)
            ext.create_custom_resource_definition(PROMETHEUS_RULE_CRD)
            ext.create_custom_resource_definition(POD_MONITOR_CRD)
            client.CoreV1Api(release.api).create_namespace(
                client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE))
            )
            release.run_helm(
                "install", RELEASE, str(CHART), "--namespace", NAMESPACE, values=INSTALLED
            )
            yield release
        finally:
            release.api.close()


def test_chart_installs_on_a_real_api_server(installed: Installed) -> None:
    from kubernetes import client

    status = installed.run_helm("status", RELEASE, "--namespace", NAMESPACE)
    assert "STATUS: deployed" in status
    custom = client.CustomObjectsApi(installed.api)
    pools = custom.list_namespaced_custom_object(
        "airuntime.io", "v1alpha1", NAMESPACE, "runtimepools"
    )["items"]
    declared = {p["name"]: p["spec"] for p in INSTALLED["runtimePools"]}
    assert {p["metadata"]["name"] for p in pools} == set(declared)
    for pool in pools:
        assert declared[pool["metadata"]["name"]].items() <= pool["spec"].items()
    monitors = custom.list_namespaced_custom_object(
        "monitoring.coreos.com", "v1", NAMESPACE, "servicemonitors"
    )["items"]
    assert [m["metadata"]["name"] for m in monitors] == ["rel-airuntime"]
    pod_monitors = custom.list_namespaced_custom_object(
        "monitoring.coreos.com", "v1", NAMESPACE, "podmonitors"
    )["items"]
    assert [m["metadata"]["name"] for m in pod_monitors] == ["rel-airuntime-runtime"]
    rules = custom.list_namespaced_custom_object(
        "monitoring.coreos.com", "v1", NAMESPACE, "prometheusrules"
    )["items"]
    assert [r["metadata"]["name"] for r in rules] == ["rel-airuntime"]


def test_upgrade_keeps_the_generated_token_and_valkey_password(installed: Installed) -> None:
    tokens, redis, runtime = (
        installed.secret("rel-airuntime-tokens"),
        installed.secret("rel-airuntime-redis"),
        installed.secret("rel-airuntime-runtime-token"),
    )
    assert "token:" in tokens["tokens.yaml"] and len(redis["password"]) == 32
    assert len(runtime["token"]) == 48
    installed.run_helm(
        "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE,
        values={**INSTALLED, "controlPlane": {"replicas": 2}},
    )  # fmt: skip
    assert installed.secret("rel-airuntime-tokens") == tokens
    assert installed.secret("rel-airuntime-redis") == redis
    assert installed.secret("rel-airuntime-runtime-token") == runtime


@pytest.mark.parametrize(("group", "resource", "verb"), OPERATOR_NEEDS,
                         ids=[f"{v} {r}" for _, r, v in OPERATOR_NEEDS])  # fmt: skip
def test_operator_service_account_may(
    installed: Installed, group: str, resource: str, verb: str
) -> None:
    cluster_scoped = resource in ("customresourcedefinitions", "namespaces")
    for namespace in [None] if cluster_scoped else [NAMESPACE, "elsewhere"]:
        assert installed.can("rel-airuntime-operator", verb, resource, group, namespace)


@pytest.mark.parametrize(
    ("account", "verb", "resource", "group", "namespace"),
    [
        ("rel-airuntime-operator", "get", "secrets", "", NAMESPACE),
        ("rel-airuntime-operator", "delete", "pods", "", NAMESPACE),
        ("rel-airuntime-operator", "create", "rolebindings", "rbac.authorization.k8s.io", None),
        ("rel-airuntime-operator", "delete", "runtimepools", "airuntime.io", NAMESPACE),
        ("rel-airuntime-control-plane", "get", "secrets", "", NAMESPACE),
        ("rel-airuntime-control-plane", "create", "scaleoutrequests", "airuntime.io", "elsewhere"),
        ("rel-airuntime-control-plane", "patch", "runtimepools", "airuntime.io", NAMESPACE),
    ],
)
def test_service_account_may_not(
    installed: Installed, account: str, verb: str, resource: str, group: str,
    namespace: str | None,
) -> None:  # fmt: skip
    assert not installed.can(account, verb, resource, group, namespace)


def test_control_plane_service_account_may_create_scale_out_requests(
    installed: Installed,
) -> None:
    for verb in ("create", "get"):
        assert installed.can("rel-airuntime-control-plane", verb, "scaleoutrequests",
                             "airuntime.io")  # fmt: skip


def test_operator_reconciles_pools_as_its_service_account(
    installed: Installed, valkey_url: str, tmp_path: Path
) -> None:
    """``python -m airuntime_operator`` with the chart's env, authenticated as the chart's
    ServiceAccount (peering on, cluster-wide): it creates the peering object, and every
    pool's children, and reports status -- so the ClusterRoles are enough for kopf and
    the operator. A ``403`` in its log fails the test."""
    import os
    import socket
    import sys

    from kubernetes import client

    docs = render_installed(installed)
    (op,) = [c for w, _, c in workloads(docs) if component(w) == "operator"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AIRUNTIME_")},
        **_literal_env(op),
        "AIRUNTIME_REDIS_URL": valkey_url,
        "AIRUNTIME_OPERATOR_LIVENESS": f"http://127.0.0.1:{port}/healthz",
        "AIRUNTIME_HOME": str(tmp_path / "home"),
        "KUBECONFIG": str(installed.service_account_kubeconfig("rel-airuntime-operator")),
    }
    log = tmp_path / "operator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "airuntime.cli", *op["args"]], env=env, cwd=tmp_path,
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        apps = client.AppsV1Api(installed.api)
        custom = client.CustomObjectsApi(installed.api)

        def reconciled() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the operator exited {proc.returncode}:\n{log.read_text()}")
            denied = forbidden_lines(log.read_text())
            assert denied == [], "the operator was denied:\n" + "\n".join(denied[:20])
            names = {d.metadata.name for d in apps.list_namespaced_deployment(NAMESPACE).items}
            if not {"runtime-instance", "tenant-a-runtime"} <= names:
                return False
            pools = custom.list_namespaced_custom_object(
                "airuntime.io", "v1alpha1", NAMESPACE, "runtimepools"
            )["items"]
            return all((p.get("status") or {}).get("desiredReplicas") for p in pools)

        try:
            wait_for(reconciled, timeout=90, what="the operator to reconcile both RuntimePools")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\noperator log:\n{log.read_text()[-5000:]}") from None
        core = client.CoreV1Api(installed.api)
        assert core.read_namespaced_service_account("tenant-a-runtime", NAMESPACE)
        assert custom.get_cluster_custom_object(
            "kopf.dev", "v1", "clusterkopfpeerings", "airuntime"
        )
        runtime = apps.read_namespaced_deployment("tenant-a-runtime", NAMESPACE)
        (container,) = runtime.spec.template.spec.containers
        env = {e.name: e for e in container.env}
        ref = env["AIRUNTIME_RUNTIME_TOKEN"].value_from.secret_key_ref
        assert (ref.name, ref.key) == ("rel-airuntime-runtime-token", "token")
        assert env["AIRUNTIME_PYTHON_HANDLER_MODULES"].value == "mycompany.tools"
        assert env["AIRUNTIME_HTTP_HANDLER_ALLOW"].value in (None, "")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    denied = forbidden_lines(log.read_text())
    assert denied == [], "the operator was denied:\n" + "\n".join(denied[:20])


def forbidden_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if " 403" in line or "Forbidden" in line]


def render_installed(installed: Installed) -> list[Doc]:
    out = installed.run_helm("get", "manifest", RELEASE, "--namespace", NAMESPACE)
    return [d for d in yaml.safe_load_all(out) if d]


def test_mcp_is_served_on_the_control_plane_service_by_a_value(
    render: Callable[[Doc | None], list[Doc]],
) -> None:
    for enabled in (True, False):
        docs = render({"controlPlane": {"mcp": {"enabled": enabled}}})
        deployment = one(docs, "Deployment", "rel-airuntime-control-plane")
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        assert env_of(container)["AIRUNTIME_MCP_ENABLED"]["value"] == str(enabled).lower()
        service = one(docs, "Service", "rel-airuntime-control-plane")
        annotations = service["metadata"].get("annotations") or {}
        assert annotations.get("airuntime.io/mcp-path") == ("/mcp" if enabled else None)
        assert [p["port"] for p in service["spec"]["ports"]] == [8780]  # the API's port
    kept = render({"controlPlane": {"service": {"annotations": {"team": "a"}}}})
    service = one(kept, "Service", "rel-airuntime-control-plane")
    assert service["metadata"]["annotations"] == {"team": "a", "airuntime.io/mcp-path": "/mcp"}
