"""Helpers of the end-to-end tests, and the scenario they share.

* :func:`built_image` builds (or reuses) the container image with
  ``scripts/image-build.sh`` and :func:`podman_run` runs it the way these machines need;
* :func:`apply_manifests` applies every object ``helm template --include-crds``
  rendered (CRDs first, waiting until they are Established) through the dynamic
  client, so custom resources (RuntimePools) go through the API server's validation;
* :class:`LocalContainer` runs one container of a pod template as a local process
  (``tests/operator`` uses it where no node is needed):
  the container's ``command`` (or the image's entrypoint, ``airt``) and ``args``; its
  ``env`` resolved like the kubelet does (literal values, ``secretKeyRef`` and
  ``configMapKeyRef`` read from the API server, ``fieldRef`` from the pod's identity);
  its Secret/ConfigMap volumes written to files and its emptyDirs created under a
  per-pod directory, with every env path below a mount point rewritten to there.

The scenario itself (tenants, chart values, submitting and following the runs, the
placement checks) is at the end, shared by ``tests/e2e/test_cluster_e2e.py`` (a real
node of tests/k8s_node.py) and ``tests/e2e/test_kind_e2e.py``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from airuntime_operator import deployments
from tests.polling import wait_until

Doc = dict[str, Any]

# The image (the Dockerfile's final stage; test_cluster_e2e checks they agree): entrypoint
# `airt`; HOME and AIRUNTIME_HOME under the /tmp emptyDir; servers listen on every
# interface of the pod (the local kubelet overrides that with the loopback "pod IP").
IMAGE_ENTRYPOINT = ("airt",)
IMAGE_ENV = {
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "PIP_NO_CACHE_DIR": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "HOME": "/tmp",
    "AIRUNTIME_HOME": "/tmp/airuntime",
    "AIRUNTIME_API_HOST": "0.0.0.0",
    "AIRUNTIME_HTTP_HOST": "0.0.0.0",
}
POD_IP = "127.0.0.1"
"""Every local "pod" shares the loopback interface: its pod IP."""

# The runtime Deployments the operator creates (airuntime_operator.deployments labels).
RUNTIME_SELECTOR = (
    f"app.kubernetes.io/managed-by={deployments.MANAGED_BY},"
    f"app.kubernetes.io/component={deployments.COMPONENT}"
)

_LOG_TAIL = 4000


def tail(path: Path, limit: int = _LOG_TAIL) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return text if len(text) <= limit else "...\n" + text[-limit:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    predicate: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.2
) -> Any:
    """The shared deadline poll (:func:`tests.polling.wait_until`) with this module's
    ``timeout`` keyword and interval."""
    return wait_until(predicate, within=timeout, what=what, interval=interval)


def executable(name: str) -> str:
    """``airt`` of this interpreter's environment (the venv may not be on PATH)."""
    sibling = Path(sys.executable).parent / name
    if os.access(sibling, os.X_OK):
        return str(sibling)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is neither next to {sys.executable} nor on PATH")
    return found


# -- the built image ---------------------------------------------------------------------------

IMAGE_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "image-build.sh"


@dataclass(frozen=True)
class BuiltImage:
    """What ``scripts/image-build.sh`` printed: the podman tag and the archive a node imports."""

    ref: str
    archive: Path
    size_bytes: int

    @property
    def repository(self) -> str:
        return self.ref.rpartition(":")[0]

    @property
    def tag(self) -> str:
        return self.ref.rpartition(":")[2]


def image_unavailable() -> str | None:
    """Why the image cannot be built or run here, or None."""
    if os.geteuid() != 0 and shutil.which("podman") is None:
        return "podman is not installed and installing it needs root"
    return None


def built_image(*, timeout: float = 3000) -> BuiltImage:
    """Build (or reuse, by content hash) the image of the repository's Dockerfile."""
    proc = subprocess.run(
        ["bash", str(IMAGE_SCRIPT)], capture_output=True, text=True, timeout=timeout, check=False
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, (
        f"{IMAGE_SCRIPT.name} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    )
    info = json.loads(lines[-1])
    return BuiltImage(info["image"], Path(info["archive"]), int(info["size_bytes"]))


# What a container needs on these machines: runc (crun fails on the hybrid cgroup layout)
# and limits within the sandbox's hard limits (podman's defaults exceed them).
PODMAN_RUN = (
    "podman", "run", "--rm", "--runtime", "runc",
    "--ulimit", "nproc=4096:4096", "--ulimit", "nofile=20000:20000",
)  # fmt: skip

# The chart's container securityContext, as podman flags (the user comes separately).
HARDENED = (
    "--read-only", "--tmpfs", "/tmp:rw,size=256m,mode=1777", "--cap-drop", "ALL",
    "--security-opt", "no-new-privileges",
)  # fmt: skip


def podman_run(
    image: str,
    *args: str,
    entrypoint: str | None = None,
    user: str | None = "10001:10001",
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``podman run`` of ``image`` hardened like the chart's containers, without network."""
    argv = [*PODMAN_RUN, "--network", "none", *HARDENED]
    if user is not None:
        argv += ["--user", user]
    if entrypoint is not None:
        argv += ["--entrypoint", entrypoint]
    argv += [image, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


# -- applying rendered manifests ------------------------------------------------------------


def apply_manifests(api: Any, docs: Iterable[Doc], *, timeout: float = 60.0) -> list[str]:
    """Create every object of ``docs`` on the API server: CRDs first (waiting until they are
    Established), then the rest through the dynamic client. Returns ``Kind/name`` of each."""
    from kubernetes import client
    from kubernetes.dynamic import DynamicClient

    docs = list(docs)
    created: list[str] = []
    ext = client.ApiextensionsV1Api(api)
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    for crd in crds:
        ext.create_custom_resource_definition(crd)
        created.append(f"CustomResourceDefinition/{crd['metadata']['name']}")

    def established() -> bool:
        for crd in crds:
            got = ext.read_custom_resource_definition(crd["metadata"]["name"])
            conditions = (got.status.conditions if got.status else None) or []
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                return False
        return True

    wait_for(established, timeout=timeout, what="the chart's CRDs to be Established")
    dynamic = DynamicClient(api)  # discovery after the CRDs are served
    for doc in docs:
        if doc["kind"] == "CustomResourceDefinition":
            continue
        resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        namespace = doc["metadata"].get("namespace") if resource.namespaced else None
        resource.create(body=doc, namespace=namespace)
        created.append(f"{doc['kind']}/{doc['metadata']['name']}")
    return created


# -- one container as a local process ---------------------------------------------------------


@dataclass(frozen=True)
class PodIdentity:
    """What ``fieldRef``s of a local pod resolve to."""

    name: str
    namespace: str
    service_account: str = "default"
    ip: str = POD_IP

    def field(self, path: str) -> str:
        values = {
            "metadata.name": self.name,
            "metadata.namespace": self.namespace,
            "spec.serviceAccountName": self.service_account,
            "spec.nodeName": "localhost",
            "status.podIP": self.ip,
            "status.hostIP": self.ip,
        }
        if path not in values:
            raise NotImplementedError(f"fieldRef {path} is not supported by the local kubelet")
        return values[path]


def _decoded(data: Mapping[str, str] | None, *, secret: bool) -> dict[str, str]:
    if not data:
        return {}
    if not secret:
        return dict(data)
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


class _Objects:
    """Secrets and ConfigMaps of a namespace, read through the admin client."""

    def __init__(self, api: Any, namespace: str) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.namespace = namespace

    def data(self, kind: str, name: str) -> dict[str, str] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            if kind == "Secret":
                obj = self.core.read_namespaced_secret(name, self.namespace)
                return _decoded(obj.data, secret=True)
            obj = self.core.read_namespaced_config_map(name, self.namespace)
            return _decoded(obj.data, secret=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise


def resolve_env(container: Doc, pod: PodIdentity, objects: _Objects) -> dict[str, str]:
    """The container's ``env`` as the kubelet resolves it (``envFrom`` is not used by the
    chart or the operator and is refused)."""
    if container.get("envFrom"):
        raise NotImplementedError("envFrom is not supported by the local kubelet")
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        name = entry["name"]
        if "value" in entry:
            env[name] = str(entry["value"])
            continue
        source = entry.get("valueFrom") or {}
        if "fieldRef" in source:
            env[name] = pod.field(source["fieldRef"]["fieldPath"])
            continue
        for ref_name, kind in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
            if ref_name in source:
                ref = source[ref_name]
                data = objects.data(kind, ref["name"])
                if data is None or ref["key"] not in data:
                    if ref.get("optional"):
                        break
                    raise LookupError(f"env {name}: {kind} {ref['name']} has no key {ref['key']}")
                env[name] = data[ref["key"]]
                break
        else:
            if not source:
                env[name] = ""
            else:
                raise NotImplementedError(f"env {name}: {source} is not supported")
    return env


def materialize_volumes(
    pod_spec: Doc, container: Doc, root: Path, objects: _Objects
) -> dict[str, Path]:
    """Mount the container's volumes under ``root``: Secret and ConfigMap volumes become
    files, emptyDirs empty directories. Returns mount path -> local directory."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        volume = volumes[mount["name"]]
        local = root / mount["mountPath"].lstrip("/")
        local.mkdir(parents=True, exist_ok=True)
        for key, kind in (("secret", "Secret"), ("configMap", "ConfigMap")):
            if key in volume:
                source = volume[key]
                name = source["secretName"] if key == "secret" else source["name"]
                data = objects.data(kind, name)
                if data is None:
                    raise LookupError(f"volume {mount['name']}: {kind} {name} not found")
                items = source.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    path = local / item["path"]
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(data[item["key"]])
                    path.chmod(0o400)
                break
        else:
            if "emptyDir" not in volume:
                raise NotImplementedError(f"volume {mount['name']}: {volume} is not supported")
        mounts[mount["mountPath"]] = local
    return mounts


def _rewrite_path(value: str, mounts: Mapping[str, Path]) -> str:
    """``value`` with a leading mount path replaced by its local directory."""
    for mount_path in sorted(mounts, key=len, reverse=True):
        if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
            return str(mounts[mount_path]) + value[len(mount_path.rstrip("/")) :]
    return value


def _inherited_env() -> dict[str, str]:
    """This process's environment without anything a container would not have."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRUNTIME_", "KUBECONFIG", "PYTEST_", "COV_"))
    }


class LocalContainer:
    """One container of a pod template running as a local process."""

    def __init__(
        self,
        pod: PodIdentity,
        pod_spec: Doc,
        container: Doc,
        *,
        api: Any,
        root: Path,
        overrides: Mapping[str, str] | None = None,
    ) -> None:
        self.pod = pod
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        objects = _Objects(api, pod.namespace)
        mounts = materialize_volumes(pod_spec, container, root, objects)
        env = {**IMAGE_ENV, **resolve_env(container, pod, objects)}
        env = {k: _rewrite_path(v, mounts) for k, v in env.items()}
        self.env = {**_inherited_env(), **env, **(overrides or {})}
        argv = [*(container.get("command") or IMAGE_ENTRYPOINT), *(container.get("args") or [])]
        if argv[0] == "airt":
            argv[0] = executable("airt")
        self.argv = argv
        self.readiness_path = ((container.get("readinessProbe") or {}).get("httpGet") or {}).get(
            "path"
        )
        self.log_path = root / "container.log"
        self.started_at = time.monotonic()
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                argv,
                env=self.env,
                cwd=root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def name(self) -> str:
        return self.pod.name

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self, limit: int = _LOG_TAIL) -> str:
        return tail(self.log_path, limit)

    def terminate(self) -> None:
        """SIGTERM to the process group (what the kubelet sends first)."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; the whole process group."""
        self.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()

    def endpoint(self) -> str | None:
        """The HTTP endpoint a runtime announced in its ``ready`` event (it listens on a
        free port: several local pods share one network namespace)."""
        for line in self.log(200_000).splitlines():
            if '"event": "ready"' in line:
                try:
                    return str(json.loads(line[line.index("{") :])["endpoint"]) or None
                except (ValueError, KeyError):
                    return None
        return None

    def ready(self) -> bool:
        """The container's readinessProbe (httpGet path) against its announced endpoint."""
        if not self.alive():
            return False
        endpoint = self.endpoint()
        if endpoint is None:
            return False
        if not self.readiness_path:
            return True
        try:
            return httpx.get(endpoint + self.readiness_path, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


def pod_name(deployment: str) -> str:
    alphabet = string.ascii_lowercase + string.digits
    return f"{deployment}-{''.join(secrets.choice(alphabet) for _ in range(5))}"


# -- the scenario (shared with tests/e2e/test_kind_e2e.py) -----------------------------------

REPO_ROOT = Path(__file__).resolve().parents[2]
PIPELINE = REPO_ROOT / "airuntime" / "examples" / "summarize-documents.yaml"

TENANTS: dict[str, tuple[str, str, str]] = {
    "default": ("Shared", "shared", "runtime-instance"),
    "tenant-a": ("Dedicated", "tenant-a", "tenant-a-runtime"),
    "tenant-b": ("Hybrid", "tenant-b", "tenant-b-runtime"),
}
"""tenant -> (isolation mode, RuntimePool name, runtime prefix)."""
MAX_INSTANCES = 2
_FINISHED_SHARED_RUN = ("Succeeded", "Failed", "Cancelled", "Rejected")


def runtime_pools() -> list[Doc]:
    """The chart's ``runtimePools`` values: one pool per tenant mode, starting empty
    (``replicas`` 0, ``minInstances`` 0), so every run needs a scale-out."""
    return [
        {
            "name": pool,
            "spec": {"tenantId": tenant, "runtimePrefix": prefix, "isolationMode": mode,
                     "minInstances": 0, "maxInstances": MAX_INSTANCES, "replicas": 0},
        }
        for tenant, (mode, pool, prefix) in TENANTS.items()
    ]  # fmt: skip


def scenario_values(*, with_pools: bool = True) -> Doc:
    """Chart values of the scenario: API tokens and tenant settings of the three tenants,
    a quick operator, and (``with_pools``) the three RuntimePools. The scale-out provider
    (``kubernetes``) and the submit mode (``QueueFirst``; runs ask for DirectDispatch)
    are the chart's defaults."""
    values: Doc = {
        "auth": {
            "tokens": [
                {"token": f"e2e-{tenant}-token", "user": f"user-{tenant}", "tenant": tenant,
                 "roles": ["operator"]}
                for tenant in TENANTS
            ]
        },
        "controlPlane": {
            "tenants": [
                {"tenant_id": tenant, "isolation_mode": mode, "max_instances": MAX_INSTANCES,
                 "runtime_prefix": prefix}
                for tenant, (mode, _, prefix) in TENANTS.items()
            ],
        },
        "operator": {
            "statusIntervalSeconds": 1,
            "extraEnv": [{"name": "AIRUNTIME_OPERATOR_FULFILMENT_POLL", "value": "0.5"}],
        },
    }  # fmt: skip
    if with_pools:
        values["runtimePools"] = runtime_pools()
    return values


def submit_and_wait(
    api_url: str, tokens: Mapping[str, str], *, deadline_s: float
) -> tuple[dict[str, Doc], dict[str, Doc]]:
    """Submit the pipeline once per tenant (DirectDispatch, as that tenant) and poll
    ``GET /v1/runs/{id}`` until each run finished. Returns (submitted, finished) bodies;
    a run that did not finish in time is missing from the second."""
    import yaml

    pipeline = yaml.safe_load(PIPELINE.read_text())
    submitted: dict[str, Doc] = {}
    finished: dict[str, Doc] = {}

    def client(tenant: str) -> httpx.Client:
        headers = {"authorization": f"Bearer {tokens[tenant]}"}
        return httpx.Client(base_url=api_url, headers=headers, timeout=30)

    for tenant in [t for t in TENANTS if t in tokens]:  # the tenants given a token
        with client(tenant) as http:
            resp = http.post("/v1/runs", json={"pipeline": pipeline, "mode": "DirectDispatch"})
        assert resp.status_code == 202, f"{tenant}: {resp.status_code} {resp.text}"
        submitted[tenant] = resp.json()
    deadline = time.monotonic() + deadline_s
    while len(finished) < len(submitted) and time.monotonic() < deadline:
        for tenant, run in submitted.items():
            if tenant in finished:
                continue
            with client(tenant) as http:
                body = http.get(f"/v1/runs/{run['shared_run_id']}").json()
            # Finished when the shared run ended (the control plane read the outcome).
            if body.get("status") in _FINISHED_SHARED_RUN:
                finished[tenant] = body
        time.sleep(0.2)
    return submitted, finished


def check_placement(submitted: Mapping[str, Doc], finished: Mapping[str, Doc]) -> None:
    """Every run was scaled out for, completed, and ran on its tenant's own instance."""
    for tenant, (mode, _, prefix) in TENANTS.items():
        body = finished[tenant]
        where = f"{tenant} ({mode}): {json.dumps(body, default=str)[:2000]}"
        assert submitted[tenant]["status"] == "ScaleOutRequested", (
            f"{tenant}: no runtime existed, admission must have asked for one: {submitted[tenant]}"
        )
        assert body["status"] == "Succeeded", where
        assert body["run"]["status"] == "completed", where
        assert body["execution"]["completed"] == body["execution"]["total"] == 10, where
        instance = body["assigned_instance_id"]
        assert instance.startswith(f"{prefix}-"), where
        assert body["run"]["instance_id"] == instance, where
        assert body["execution_id"], where
    # Dedicated and Hybrid runs never run on shared capacity.
    for tenant in ("tenant-a", "tenant-b"):
        assert not finished[tenant]["assigned_instance_id"].startswith("runtime-instance")
