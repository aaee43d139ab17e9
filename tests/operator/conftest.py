"""Fixtures of the operator tests: a real API server with the CRDs, and a real operator.

* ``kube_cluster`` (session): etcd + kube-apiserver + kube-controller-manager from
  :class:`tests.k8s_env.KubeTestEnv`, with every CRD of ``crds/`` installed and
  Established. Skipped (with the reason) when the binaries cannot be had.
* ``k8s`` (session): a ``kubernetes`` ``ApiClient`` on it (admin token).
* ``namespace`` (function): a fresh namespace, deleted afterwards.
* :func:`running_operator`: the kopf operator of ``airuntime_operator`` run in-process
  with ``kopf.testing.KopfRunner`` (``--standalone`` unless peering is wanted),
  against that API server and a real Redis (``valkey_url``).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from kopf.testing import KopfRunner
from kubernetes import client, config
from redis.asyncio import Redis

from airuntime.fleet.registry import Registry
from airuntime_operator import OperatorSettings, build_registry
from tests.k8s_env import REPO_ROOT, KubeBinariesUnavailable, KubeTestEnv
from tests.operator.k8s import Cluster
from tests.operator.runtimes import PublishedRuntimes, RuntimeLauncher
from tests.polling import wait_until

CRD_DIR = REPO_ROOT / "crds"

# A cold cache builds kube-apiserver from source: far longer than the default timeout.
pytestmark = pytest.mark.timeout(3600)


def install_crds(api: client.ApiClient) -> list[str]:
    """Create every CRD of ``crds/`` and wait until the API server serves them."""
    ext = client.ApiextensionsV1Api(api)
    names: list[str] = []
    for path in sorted(CRD_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                ext.create_custom_resource_definition(doc)
                names.append(doc["metadata"]["name"])

    def established() -> bool:
        for name in names:
            crd = ext.read_custom_resource_definition(name)
            conditions = (crd.status.conditions if crd.status else None) or []
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                return False
        return True

    wait_until(established, within=60, what=f"CRDs {names} established")
    return names


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[KubeTestEnv]:
    env = KubeTestEnv(with_controller_manager=True)
    try:
        env.bin_dir  # noqa: B018 - resolves (and if needed builds) the binaries
    except KubeBinariesUnavailable as exc:
        pytest.skip(f"Kubernetes test binaries unavailable: {exc}")
    with env:
        api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(env.kubeconfig_path)
        )
        try:
            install_crds(api)
        finally:
            api.close()  # type: ignore[no-untyped-call]
        yield env


@pytest.fixture(scope="session")
def k8s(kube_cluster: KubeTestEnv) -> Iterator[client.ApiClient]:
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kube_cluster.kubeconfig_path)
    )
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def namespace(k8s: client.ApiClient) -> Iterator[str]:
    core = client.CoreV1Api(k8s)
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_namespace(name)


def operator_settings(kube: KubeTestEnv, redis_url: str, **overrides: Any) -> OperatorSettings:
    """Operator settings for tests: short intervals, this cluster, this Redis."""
    base: dict[str, Any] = {
        "redis_url": redis_url,
        "kubeconfig": str(kube.kubeconfig_path),
        "standalone": True,
        "runtime_image": "example.invalid/airuntime:test",
        "status_interval_seconds": 0.5,
        "fulfilment_poll_seconds": 0.3,
        "registry_cache_seconds": 0.1,
        "gc_interval_seconds": 0.5,
    }
    return OperatorSettings(**{**base, **overrides})


@contextmanager
def running_operator(
    settings: OperatorSettings, *, extra_args: tuple[str, ...] = ()
) -> Iterator[KopfRunner]:
    """The operator, running in a thread of this process until the block ends.

    Its log (kopf's ``--verbose`` output) is written to ``$AIRUNTIME_OPERATOR_TEST_LOG``
    (default: ``<tmp>/airuntime-operator-test.log``) when it stops.
    """
    scope = (
        ["--all-namespaces"]
        if settings.clusterwide
        else [f"--namespace={n}" for n in settings.namespaces]
    )
    args = ["run", *scope, "--verbose", *extra_args]
    if settings.standalone:
        args.append("--standalone")
    else:
        args.append(f"--peering={settings.peering_name}")
    if settings.priority is not None:
        args.append(f"--priority={settings.priority}")
    runner = KopfRunner(args, registry=build_registry(settings), timeout=60)
    try:
        with runner:
            yield runner
    finally:
        if runner.future.done() and runner.future.exception() is None:
            log = Path(
                os.environ.get("AIRUNTIME_OPERATOR_TEST_LOG", "")
                or Path(tempfile.gettempdir()) / "airuntime-operator-test.log"
            )
            log.write_text(runner.output)
    # KopfRunner re-raises the operator's own crash on exit; a clean stop exits 0.
    assert runner.exit_code == 0, runner.output[-5000:]


@pytest.fixture(scope="module")
def operator(kube_cluster: KubeTestEnv, valkey_url: str) -> Iterator[KopfRunner]:
    """One operator (whole cluster, standalone) for the tests of a module."""
    with running_operator(operator_settings(kube_cluster, valkey_url)) as runner:
        yield runner


@pytest_asyncio.fixture
async def valkey(valkey_url: str) -> AsyncIterator[Redis]:
    """A client of the Redis the operator uses (no FLUSHALL: the operator shares it)."""
    redis = Redis.from_url(valkey_url)
    try:
        yield redis
    finally:
        await redis.aclose()


@pytest.fixture
def registry(valkey: Redis) -> Registry:
    return Registry(valkey)


@pytest.fixture
def runtimes(valkey: Redis) -> RuntimeLauncher:
    """How tests bring runtime instances up (see tests/operator/runtimes.py)."""
    return PublishedRuntimes(valkey)


@pytest.fixture
def cluster(k8s: client.ApiClient) -> Cluster:
    return Cluster(k8s)
