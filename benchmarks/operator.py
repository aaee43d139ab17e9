"""How fast the operator turns N RuntimePools into N Deployments, and at what API cost.

Run ``python -m benchmarks.operator [--json] [--pools 300]`` from the repository root.

Set-up (not timed): a real etcd + kube-apiserver (:class:`tests.k8s_env.KubeTestEnv`,
binaries from ``scripts/k8s-test-binaries.sh``) with **audit logging** on
(``--audit-policy-file`` / ``--audit-log-path``, level Metadata, only the
ResponseComplete stage), the CRDs of ``crds/``, one embedded Valkey, and the
operator (``airuntime_operator.build_registry`` run by ``kopf.operator`` in a thread,
standalone, cluster-wide, default settings). By default no kube-controller-manager
runs, so Deployments get no ReplicaSets or pods and the numbers are the operator's
alone; ``--controller-manager`` adds it.

What is measured, from the first create request:

* ``create_s``: the benchmark's own client creating the N pools (8 threads);
* ``deployments_s``: until N Deployments of the operator exist (polled with a LIST
  every 0.25 s, so up to that much late);
* ``reconciled_s``: until every pool's ``status.observedGeneration`` is its
  generation (the operator applied children, published tenant settings, wrote the
  status);
* ``requests_per_pool``: API requests made by the operator (user agents ``kopf/*``
  and ``airuntime-operator``), counted in the audit log from the operator's start
  until all pools are reconciled plus ``--settle`` seconds (default 2, to include
  status writes in flight), divided by N. ``by_request`` breaks them down by verb
  and resource; watches still open are not in the log yet and not counted.

Reference: kopf issue #111 ("Operator is slow with many objects") reports about
90 s to handle 300 objects. The whole run takes well under a minute with 300 pools
on a 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import kopf
from kubernetes import client, config

from airuntime.devstack.embedded import EmbeddedServer
from airuntime.k8s.v1alpha1 import API_GROUP, API_VERSION, RUNTIME_POOL
from airuntime_operator import OperatorSettings, build_registry
from tests.k8s_env import KubeTestEnv
from tests.operator.conftest import install_crds

REFERENCE = "kopf issue #111: about 90 s for 300 objects"
NAMESPACE = "bench"
OPERATOR_AGENTS = ("kopf/", "airuntime-operator")
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
"""


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def _operator(settings: OperatorSettings) -> Iterator[None]:
    """The operator in a thread with its own event loop, until the block ends."""
    ready, stop = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(
                kopf.operator(
                    registry=build_registry(settings),
                    clusterwide=True,
                    standalone=True,
                    ready_flag=ready,
                    stop_flag=stop,
                )
            )
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)
            ready.set()

    thread = threading.Thread(target=target, name="operator", daemon=True)
    thread.start()
    ready.wait(60)
    if failure:
        raise RuntimeError("the operator did not start") from failure[0]
    try:
        yield
    finally:
        stop.set()
        thread.join(60)


def _pool_body(index: int) -> dict[str, Any]:
    return {
        "apiVersion": RUNTIME_POOL.api_version,
        "kind": RUNTIME_POOL.kind,
        "metadata": {"name": f"pool-{index:04d}"},
        "spec": {
            "tenantId": f"tenant-{index:04d}",
            "isolationMode": "Dedicated",
            "runtimePrefix": f"rt-{index:04d}",
            "minInstances": 1,
            "maxInstances": 3,
            "redis": {"name": "redis-credentials"},
        },
    }


def _count_requests(audit_log: Path, since: float, until: float) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for line in audit_log.read_text().splitlines():
        entry = json.loads(line)
        agent = str(entry.get("userAgent", ""))
        if not agent.startswith(OPERATOR_AGENTS):
            continue
        stamp = str(entry.get("requestReceivedTimestamp", ""))
        moment = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        if not since - 1 <= moment <= until + 1:
            continue
        ref = entry.get("objectRef") or {}
        resource = ref.get("resource", entry.get("requestURI", "?"))
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        counts[f"{entry.get('verb')} {resource}"] += 1
    return counts


def run(pools: int, *, controller_manager: bool, settle: float) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="airuntime-bench-operator-"))
    policy, audit_log = workdir / "audit-policy.yaml", workdir / "audit.log"
    policy.write_text(AUDIT_POLICY)
    env = KubeTestEnv(
        with_controller_manager=controller_manager,
        extra_apiserver_args=[
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit_log}",
            "--audit-log-format=json",
            "--audit-log-maxsize=0",
        ],
    )
    with env, EmbeddedServer() as redis_server:
        api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(env.kubeconfig_path)
        )
        install_crds(api)
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        custom = client.CustomObjectsApi(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        settings = OperatorSettings(
            redis_url=redis_server.url, kubeconfig=str(env.kubeconfig_path), standalone=True
        )
        _log(f"API server up in {env.startup_seconds:.1f}s; starting the operator")
        operator_started = time.time()
        with _operator(settings):
            started = time.monotonic()

            def create(index: int) -> None:
                custom.create_namespaced_custom_object(
                    API_GROUP, API_VERSION, NAMESPACE, RUNTIME_POOL.plural, _pool_body(index)
                )

            with ThreadPoolExecutor(8) as executor:
                list(executor.map(create, range(pools)))
            create_s = time.monotonic() - started
            _log(f"created {pools} pools in {create_s:.1f}s")

            deployments_s = reconciled_s = None
            while reconciled_s is None:
                if deployments_s is None:
                    found = apps.list_namespaced_deployment(
                        NAMESPACE, label_selector="app.kubernetes.io/managed-by=airuntime-operator"
                    )
                    if len(found.items) >= pools:
                        deployments_s = time.monotonic() - started
                        _log(f"{pools} Deployments after {deployments_s:.1f}s")
                if deployments_s is not None:
                    answer = custom.list_namespaced_custom_object(
                        API_GROUP, API_VERSION, NAMESPACE, RUNTIME_POOL.plural
                    )
                    assert isinstance(answer, dict)
                    listed: list[dict[str, Any]] = answer["items"]
                    done = sum(
                        1
                        for p in listed
                        if p.get("status", {}).get("observedGeneration")
                        == p["metadata"]["generation"]
                    )
                    if done >= pools:
                        reconciled_s = time.monotonic() - started
                        _log(f"{pools} pools reconciled after {reconciled_s:.1f}s")
                if time.monotonic() - started > 600:
                    raise TimeoutError("the operator did not reconcile every pool in 10 minutes")
                time.sleep(0.25)
            time.sleep(settle)
            counted_until = time.time()
        api.close()  # type: ignore[no-untyped-call]
    counts = _count_requests(audit_log, operator_started, counted_until)
    total = sum(counts.values())
    return {
        "pools": pools,
        "controller_manager": controller_manager,
        "create_s": round(create_s, 2),
        "deployments_s": round(deployments_s or 0.0, 2),
        "reconciled_s": round(reconciled_s, 2),
        "pools_per_s": round(pools / reconciled_s, 1),
        "operator_requests": total,
        "requests_per_pool": round(total / pools, 2),
        "by_request": dict(counts.most_common()),
        "reference": REFERENCE,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.operator", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--pools", type=int, default=300, help="RuntimePools to create")
    parser.add_argument(
        "--controller-manager",
        action="store_true",
        help="also run kube-controller-manager (ReplicaSets and pods for every Deployment)",
    )
    parser.add_argument(
        "--settle", type=float, default=2.0, help="seconds counted after the last reconcile"
    )
    args = parser.parse_args(argv)
    result = run(args.pools, controller_manager=args.controller_manager, settle=args.settle)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{result['pools']} RuntimePools -> Deployments in {result['deployments_s']}s, "
            f"all reconciled in {result['reconciled_s']}s ({result['pools_per_s']} pools/s); "
            f"{result['requests_per_pool']} operator API requests per pool "
            f"({result['operator_requests']} total)"
        )
        for request, count in result["by_request"].items():
            print(f"  {count:6d}  {request}")
        print(f"reference: {REFERENCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
