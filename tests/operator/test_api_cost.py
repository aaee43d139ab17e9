"""What the operator writes to the API server per pool, beyond the pool's children.

A reconcile that succeeds first time costs the pool one status patch and nothing of
kopf's bookkeeping: the handled spec is ``status.observedGeneration``
(:class:`airuntime_operator.persistence.ObservedGenerationDiffBase`), handler progress
is stored only for retries. With ``pool_events`` off, no informational events either.
Against a real API server and Valkey; the diff base's rules also directly on bodies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from kopf.testing import KopfRunner

from airuntime.fleet.registry import Registry
from airuntime_operator.persistence import ObservedGenerationDiffBase, ProgressAnnotations
from tests.k8s_env import KubeTestEnv
from tests.operator.conftest import operator_settings, running_operator
from tests.operator.k8s import Cluster, eventually, pool_spec, unique

FINALIZER = "airuntime.io/finalizer"


@pytest.fixture(scope="module")
def operator(kube_cluster: KubeTestEnv, valkey_url: str) -> Iterator[KopfRunner]:
    settings = operator_settings(kube_cluster, valkey_url, pool_events=False)
    with running_operator(settings) as runner:
        yield runner


def _bookkeeping(pool: dict[str, Any]) -> dict[str, str]:
    annotations: dict[str, str] = pool["metadata"].get("annotations") or {}
    return {k: v for k, v in annotations.items() if k.startswith("airuntime.io/")}


@pytest.mark.usefixtures("operator")
async def test_a_reconciled_pool_carries_only_the_finalizer_and_its_status(
    cluster: Cluster, namespace: str
) -> None:
    prefix = unique("rt")
    cluster.create_pool(namespace, "pool", pool_spec(unique("tenant"), prefix, replicas=1))

    pool = await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="reconcile")
    assert pool["metadata"]["finalizers"] == [FINALIZER]
    assert _bookkeeping(pool) == {}

    # A spec change is a new generation, which the status has not observed: reconciled.
    cluster.patch_pool(namespace, "pool", {"spec": {"replicas": 2}})
    pool = await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="update")
    assert pool["metadata"]["generation"] == 2
    assert pool["status"]["desiredReplicas"] == 2
    deployment = cluster.deployment(namespace, prefix)
    assert deployment is not None and deployment["spec"]["replicas"] == 2
    assert _bookkeeping(pool) == {}


@pytest.mark.usefixtures("operator")
async def test_pool_events_off_posts_no_informational_event(
    cluster: Cluster, namespace: str, registry: Registry
) -> None:
    tenant = unique("tenant")
    cluster.create_pool(namespace, "pool", pool_spec(tenant, unique("rt")))
    await eventually(lambda: cluster.reconciled_pool(namespace, "pool"), what="reconcile")
    cluster.delete_pool(namespace, "pool")
    await eventually(lambda: cluster.pool(namespace, "pool") is None, what="pool deleted")

    assert tenant not in await registry.tenant_ids()  # the cleanup ran
    assert cluster.event_reasons(namespace, "pool") == []


def _body(kind: str, generation: int, status: dict[str, Any] | None = None) -> kopf.Body:
    return kopf.Body(
        {
            "apiVersion": "x/v1",
            "kind": kind,
            "metadata": {"name": "n", "generation": generation, "annotations": {}},
            "spec": {"a": generation},
            "status": status or {},
        }
    )


def _storage() -> ObservedGenerationDiffBase:
    return ObservedGenerationDiffBase(
        observed=["Pool"], annotated=["Request"], prefix="airuntime.io", key="last"
    )


def test_observed_kinds_compare_the_generation_with_the_observed_one() -> None:
    storage = _storage()
    fresh = _body("Pool", 1)
    assert storage.fetch(body=fresh) is None  # never handled: a creation
    assert storage.build(body=fresh) == {"metadata": {"generation": 1}}

    handled = _body("Pool", 3, {"observedGeneration": 3})
    assert storage.fetch(body=handled) == storage.build(body=handled)
    changed = _body("Pool", 4, {"observedGeneration": 3})
    assert storage.fetch(body=changed) != storage.build(body=changed)

    patch = kopf.Patch()
    storage.store(body=changed, patch=patch, essence=storage.build(body=changed))
    assert not patch  # the handler's status patch records it


def test_annotated_kinds_keep_kopfs_annotation_and_other_kinds_have_no_essence() -> None:
    storage = _storage()
    request = _body("Request", 1)
    patch = kopf.Patch()
    storage.store(body=request, patch=patch, essence=storage.build(body=request))
    assert "airuntime.io/last" in patch["metadata"]["annotations"]

    indexed = _body("Deployment", 7)
    assert storage.build(body=indexed) == storage.fetch(body=indexed) == {}


@pytest.mark.parametrize(
    ("storage", "left"),
    [
        (ProgressAnnotations(prefix="airuntime.io"), {}),
        # kopf's own storage leaves its marker: a PATCH of its own after each success.
        (kopf.AnnotationsProgressStorage(prefix="airuntime.io"), {"airuntime.io/kopf-managed"}),
    ],
    ids=["ours", "kopf"],
)
def test_progress_of_a_first_try_success(storage: kopf.ProgressStorage, left: Any) -> None:
    body, patch = _body("Pool", 1), kopf.Patch()
    handler = kopf.HandlerId("reconcile")
    storage.store(key=handler, record={"success": True}, body=body, patch=patch)
    storage.purge(key=handler, body=body, patch=patch)
    assert set(patch.get("metadata", {}).get("annotations", {})) == set(left)
