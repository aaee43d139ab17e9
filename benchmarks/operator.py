"""How fast the operator turns N RuntimePools into N Deployments, and at what API cost.

Run ``python -m benchmarks.operator [--json] [--pools 300 ...] [--quick]`` from the
repository root.

Set-up (not timed): a real etcd + kube-apiserver (:class:`tests.k8s_env.KubeTestEnv`,
binaries from ``scripts/k8s-test-binaries.sh``) with **audit logging** on
(``--audit-policy-file`` / ``--audit-log-path``, level Metadata, only the
ResponseComplete stage), the CRDs of ``crds/``, one embedded Valkey, and the
operator as deployed: ``python -m airuntime_operator`` in a process of its own
(standalone, cluster-wide, default settings), started and ready (its liveness probe
answers) before the first pool is created. By default no kube-controller-manager
runs, so Deployments get no ReplicaSets or pods and the numbers are the operator's
alone; ``--controller-manager`` adds it.

What is measured, from the first create request (one fresh cluster per size):

* ``create_s``: the benchmark's own client creating the N pools (8 threads);
* ``deployments_s``: until N Deployments of the operator exist;
* ``reconciled_s``: until every pool's ``status.observedGeneration`` is its
  generation (the operator applied children, published tenant settings, wrote the
  status). Both are seen by a watch; the Python client's watch sometimes holds back
  its last events, so a LIST every 2 s settles it (then up to 2 s late);
* ``cpu_ms_per_pool``: CPU time of the operator, kube-apiserver and etcd processes
  over the same span, per pool; ``pools_per_operator_cpu_s`` is the rate the operator
  would sustain on one core of its own (on a shared machine the wall-clock rate says
  more about the neighbours than about the operator);
* ``requests_per_pool``: API requests made by the operator (user agents ``kopf/*``
  and ``airuntime-operator``), counted by verb and resource in the audit log from the
  operator's start until all pools are reconciled plus ``--settle`` seconds (default
  2, to include status writes and events in flight), divided by N. ``by_request``
  breaks them down; watches still open are not in the log yet and not counted.
  ``startup_requests`` are the ones an operator makes once, whatever N (API discovery,
  the initial LIST and WATCH of each kind it serves);
  ``per_pool_requests_after_startup`` is (total - startup) / N, the cost of one more pool.

``--quick`` (CI): 60 pools, and exit status 1 when a ratio falls below half its
target -- more than 10 requests per pool (target 5) or fewer than 15 pools per
operator CPU-second (target 30) -- a regression guard that does not depend on how
busy the machine is (the wall-clock pools/s is reported, not judged).

Reference: kopf issue #111 ("Operator is slow with many objects") reports about
90 s to handle 300 objects.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from airuntime.devstack.embedded import EmbeddedServer
from airuntime.k8s.v1alpha1 import API_GROUP, API_VERSION, RUNTIME_POOL
from tests.k8s_env import KubeTestEnv
from tests.operator.conftest import install_crds

REFERENCE = "kopf issue #111: about 90 s for 300 objects"
NAMESPACE = "bench"
OPERATOR_AGENTS = ("kopf/", "airuntime-operator")
QUICK_POOLS = 60
TARGET_REQUESTS_PER_POOL = 5.0
TARGET_POOLS_PER_S = 30.0
"""Targets (issue #13); ``--quick`` fails below half of them (requests: above twice)."""
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
"""
_MANAGED = "app.kubernetes.io/managed-by=airuntime-operator"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a running process (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def _operator(
    env: KubeTestEnv, redis_url: str, workdir: Path, extra: dict[str, str]
) -> Iterator[int]:
    """``python -m airuntime_operator`` in its own process, ready, until the block ends."""
    port = _free_port()
    environ = {
        **os.environ,
        "AIRUNTIME_REDIS_URL": redis_url,
        "KUBECONFIG": str(env.kubeconfig_path),
        "AIRUNTIME_OPERATOR_STANDALONE": "1",
        "AIRUNTIME_OPERATOR_LIVENESS": f"http://127.0.0.1:{port}/healthz",
        **extra,
    }
    log = (workdir / "operator.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "airuntime_operator"], env=environ, stdout=log, stderr=log
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the operator exited ({proc.returncode}); see {log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"the operator was not ready in 120 s; see {log.name}"
                    ) from None
                time.sleep(0.2)
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


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


class _Watcher:
    """Sets ``done`` once ``count`` objects of a resource meet ``test`` (a watch)."""

    def __init__(self, api: client.ApiClient, gvp: tuple[str, str, str], count: int,
                 test: Any, label_selector: str | None = None) -> None:  # fmt: skip
        self.done = threading.Event()
        self.at: float | None = None
        self.error: BaseException | None = None
        self._custom, self._gvp, self._count = client.CustomObjectsApi(api), gvp, count
        self._test, self._selector = test, label_selector
        self._watch = watch.Watch()  # type: ignore[no-untyped-call]
        threading.Thread(target=self._run, daemon=True).start()

    def check(self) -> None:
        """Count with a LIST; ``done`` (now) if enough objects meet the test."""
        answer = self._custom.list_namespaced_custom_object(
            *self._gvp[:2], NAMESPACE, self._gvp[2], label_selector=self._selector or ""
        )
        if sum(1 for obj in answer["items"] if self._test(obj)) >= self._count:
            self._finish()

    def _finish(self) -> None:
        if not self.done.is_set():
            self.at = time.monotonic()
            self.done.set()
        self._watch.stop()  # type: ignore[no-untyped-call]

    def _run(self) -> None:
        try:
            self._follow()
        except BaseException as exc:  # reported by the waiting thread
            self.error = exc
            self.done.set()

    def _follow(self) -> None:
        met: set[str] = set()
        kwargs: dict[str, Any] = {"timeout_seconds": 900}
        if self._selector:
            kwargs["label_selector"] = self._selector
        stream = self._watch.stream(
            self._custom.list_namespaced_custom_object, *self._gvp[:2], NAMESPACE, self._gvp[2],
            **kwargs,
        )  # fmt: skip
        for event in stream:
            obj = event["object"]
            if event["type"] in ("ADDED", "MODIFIED") and self._test(obj):
                met.add(obj["metadata"]["name"])
            if len(met) >= self._count:
                self._finish()


def _reconciled(pool: dict[str, Any]) -> bool:
    observed = (pool.get("status") or {}).get("observedGeneration")
    return bool(observed == pool["metadata"]["generation"])


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


def _create_and_wait(api: client.ApiClient, pools: int) -> dict[str, float]:
    """Create the pools; the seconds until they are created, deployed, reconciled."""
    custom = client.CustomObjectsApi(api)
    deployed = _Watcher(api, ("apps", "v1", "deployments"), pools, lambda _: True, _MANAGED)
    reconciled = _Watcher(api, (API_GROUP, API_VERSION, RUNTIME_POOL.plural), pools, _reconciled)
    time.sleep(0.5)  # both watches established (their initial lists are empty)
    started = time.monotonic()

    def create(index: int) -> None:
        custom.create_namespaced_custom_object(
            API_GROUP, API_VERSION, NAMESPACE, RUNTIME_POOL.plural, _pool_body(index)
        )

    with ThreadPoolExecutor(8) as executor:
        list(executor.map(create, range(pools)))
    create_s = time.monotonic() - started
    _log(f"created {pools} pools in {create_s:.1f}s")
    for watcher, what in ((deployed, "Deployments"), (reconciled, "pools reconciled")):
        deadline = time.monotonic() + 600
        while not watcher.done.wait(2):
            watcher.check()  # the watch may hold back its last events: a LIST settles it
            if time.monotonic() > deadline:
                raise TimeoutError(f"not all {pools} {what} within 10 minutes")
        if watcher.error is not None:
            raise RuntimeError(f"watching the {what} failed") from watcher.error
        _log(f"{pools} {what} after {(watcher.at or 0) - started:.1f}s")
    return {
        "create_s": create_s,
        "deployments_s": (deployed.at or 0) - started,
        "reconciled_s": (reconciled.at or 0) - started,
    }


def run(
    pools: int, *, controller_manager: bool, settle: float, operator_env: dict[str, str]
) -> dict[str, Any]:
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
        client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE))
        )
        _log(f"API server up in {env.startup_seconds:.1f}s; starting the operator")
        operator_started = time.time()
        with _operator(env, redis_server.url, workdir, operator_env) as operator_pid:
            pids = {**env.pids(), "operator": operator_pid}
            cpu_before = {name: _cpu_seconds(pid) for name, pid in pids.items()}
            timings = _create_and_wait(api, pools)
            time.sleep(settle)
            counted_until = time.time()
            cpu = {name: _cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
        api.close()  # type: ignore[no-untyped-call]
    counts = _count_requests(audit_log, operator_started, counted_until)
    total = sum(counts.values())
    startup = sum(n for request, n in counts.items() if request.startswith(_ONCE))
    return {
        "pools": pools,
        "controller_manager": controller_manager,
        "operator_env": operator_env,
        **{key: round(value, 2) for key, value in timings.items()},
        "pools_per_s": round(pools / timings["reconciled_s"], 1),
        "cpu_ms_per_pool": {name: round(1000 * s / pools, 1) for name, s in cpu.items()},
        "pools_per_operator_cpu_s": round(pools / max(cpu["operator"], 1e-3), 1),
        "operator_requests": total,
        "requests_per_pool": round(total / pools, 2),
        "startup_requests": startup,
        "per_pool_requests_after_startup": round((total - startup) / pools, 2),
        "by_request": dict(counts.most_common()),
        "reference": REFERENCE,
    }


_ONCE = ("get /api", "list ", "watch ")
"""Requests made once per operator start (discovery, the initial LIST and WATCH)."""


def regressions(result: dict[str, Any]) -> list[str]:
    """What of ``result`` falls below half its target (``--quick`` fails on it)."""
    found = []
    if result["requests_per_pool"] > 2 * TARGET_REQUESTS_PER_POOL:
        found.append(
            f"{result['requests_per_pool']} API requests per pool "
            f"> {2 * TARGET_REQUESTS_PER_POOL:g} (twice the target)"
        )
    if result["pools_per_operator_cpu_s"] < TARGET_POOLS_PER_S / 2:
        found.append(
            f"{result['pools_per_operator_cpu_s']} pools per operator CPU-second "
            f"< {TARGET_POOLS_PER_S / 2:g} (half the target)"
        )
    return found


def _print(result: dict[str, Any]) -> None:
    print(
        f"{result['pools']} RuntimePools -> Deployments in {result['deployments_s']}s, "
        f"all reconciled in {result['reconciled_s']}s ({result['pools_per_s']} pools/s); "
        f"{result['requests_per_pool']} operator API requests per pool "
        f"({result['operator_requests']} total; {result['per_pool_requests_after_startup']} "
        f"per pool after the {result['startup_requests']} made once at start)"
    )
    cpu = ", ".join(f"{name} {ms} ms" for name, ms in result["cpu_ms_per_pool"].items())
    print(
        f"  CPU per pool: {cpu}; {result['pools_per_operator_cpu_s']} pools per operator CPU-second"
    )
    for request, count in result["by_request"].items():
        print(f"  {count:6d}  {request}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.operator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--json", action="store_true", help="print JSON (a list when several sizes)"
    )
    parser.add_argument(
        "--pools", type=int, nargs="+", default=[300],
        help="RuntimePools to create; several sizes run one after the other, each on a "
        "fresh cluster (e.g. --pools 100 300 1000)",
    )  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true",
        help=f"CI guard: {QUICK_POOLS} pools; exit 1 below half of a target",
    )  # fmt: skip
    parser.add_argument(
        "--controller-manager",
        action="store_true",
        help="also run kube-controller-manager (ReplicaSets and pods for every Deployment)",
    )
    parser.add_argument(
        "--operator-env", action="append", default=[], metavar="NAME=VALUE",
        help="an operator setting other than the default, e.g. "
        "AIRUNTIME_OPERATOR_POOL_EVENTS=0 (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--settle", type=float, default=2.0, help="seconds counted after the last reconcile"
    )
    args = parser.parse_args(argv)
    sizes = [QUICK_POOLS] if args.quick else args.pools
    for item in args.operator_env:
        if not item.partition("=")[0] or "=" not in item:
            parser.error(f"--operator-env {item!r}: expected NAME=VALUE")
    operator_env = dict(item.partition("=")[::2] for item in args.operator_env)
    results = [
        run(n, controller_manager=args.controller_manager, settle=args.settle,
            operator_env=operator_env)
        for n in sizes
    ]  # fmt: skip
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
    else:
        for result in results:
            _print(result)
        print(f"reference: {REFERENCE}")
    failures = [f for result in results for f in regressions(result)] if args.quick else []
    for failure in failures:
        print(f"REGRESSION: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
