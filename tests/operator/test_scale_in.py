"""Scale-in: runtime pods idle for the pool's ``idleScaleInDelaySeconds`` are removed --
exactly those (``pod-deletion-cost``), never a busy one, never below ``minInstances``."""

from __future__ import annotations

import pytest

from airuntime_operator.pools import DELETION_COST_ANNOTATION
from tests.operator.k8s import Cluster, eventually, pool_spec, unique
from tests.operator.runtimes import RuntimeLauncher, RuntimeSpec

pytestmark = pytest.mark.usefixtures("operator")


async def test_idle_pod_is_removed_and_busy_pod_kept(
    cluster: Cluster, namespace: str, runtimes: RuntimeLauncher
) -> None:
    tenant, prefix = unique("tenant"), unique("rt")
    cluster.create_pool(
        namespace, "pool",
        pool_spec(tenant, prefix, minInstances=1, maxInstances=3, replicas=3,
                  idleScaleInDelaySeconds=1),
    )  # fmt: skip
    selector = f"app.kubernetes.io/name=airuntime-runtime,airuntime.io/prefix={prefix}"

    def pod_names() -> set[str]:
        return {p["metadata"]["name"] for p in cluster.pods(namespace, selector)}

    await eventually(lambda: len(pod_names()) == 3, what="three pods (kube-controller-manager)")
    idle, busy, second_busy = sorted(pod_names())
    # Each pod registers itself under its pod name (AIRUNTIME_INSTANCE_ID).
    await runtimes.start(RuntimeSpec(idle, tenant, prefix))
    await runtimes.start(RuntimeSpec(busy, tenant, prefix, busy=True))
    await runtimes.start(RuntimeSpec(second_busy, tenant, prefix, busy=True))

    await eventually(
        lambda: (cluster.pool(namespace, "pool") or {}).get("spec", {}).get("replicas") == 2,
        what="the pool scaled in to 2",
    )
    await eventually(
        lambda: pod_names() == {busy, second_busy}, what="the ReplicaSet deleted the idle pod"
    )
    # The idle pod went because of its deletion cost (the busy ones carry none), not by
    # the ReplicaSet's own ranking of three otherwise equal pending pods.
    for pod in cluster.pods(namespace, selector):
        assert DELETION_COST_ANNOTATION not in (pod["metadata"].get("annotations") or {})
    await eventually(
        lambda: "ScaledIn" in cluster.event_reasons(namespace, "pool"), what="a ScaledIn event"
    )
