"""The Celery peer of :mod:`benchmarks.dispatch`: N independent no-op jobs, each awaited.

Why this module exists: the dispatch targets are ratios to Celery measured in the same
run on the same server, so the peer runs against the benchmark's own Valkey (broker in
database 1, results in database 2). One ``celery worker --pool prefork --concurrency 2``
subprocess (gossip, mingle and heartbeats off) runs ``bench.noop`` of
:mod:`benchmarks.celery_app`; ``submitters`` threads submit their share of the jobs
(``apply_async``) and every result is awaited (``AsyncResult.get``). ``jobs_per_s`` =
jobs / (last result received - first submit), after one warm-up job.
"""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.dag_throughput import CELERY_BACKEND_ENV, CELERY_BROKER_ENV, with_db

REPO_ROOT = Path(__file__).resolve().parent.parent
CONCURRENCY = 2
TIMEOUT_S = 300.0


@contextlib.contextmanager
def celery_worker(url: str) -> Iterator[Any]:
    """A Celery worker subprocess on ``url`` (broker DB 1, results DB 2); yields the app."""
    broker, backend = with_db(url, 1), with_db(url, 2)
    os.environ[CELERY_BROKER_ENV] = broker
    os.environ[CELERY_BACKEND_ENV] = backend
    from benchmarks.celery_app import app

    app.conf.update(broker_url=broker, result_backend=backend)
    cmd = [
        sys.executable, "-m", "celery", "-A", "benchmarks.celery_app", "worker",
        "--pool", "prefork", "--concurrency", str(CONCURRENCY), "--loglevel", "WARNING",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--hostname", f"dispatch-bench-{os.getpid()}@%h",
    ]  # fmt: skip
    with tempfile.TemporaryFile(mode="w+") as worker_log:
        proc = subprocess.Popen(
            cmd, env=dict(os.environ), cwd=REPO_ROOT, stdout=worker_log, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 60
            while not app.control.ping(timeout=0.5):
                if proc.poll() is not None or time.monotonic() > deadline:
                    worker_log.seek(0)
                    raise RuntimeError(
                        f"celery worker did not come up: {worker_log.read()[-2000:]}"
                    )
            yield app
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            gc.collect()  # AsyncResult.__del__ unsubscribes while the server is still up
            with contextlib.suppress(Exception):
                app.backend.result_consumer.stop()


def celery_jobs_per_s(url: str, jobs: int, submitters: int) -> float:
    """Submit ``jobs`` no-op jobs from ``submitters`` threads, await every result."""
    from benchmarks.celery_app import noop

    with celery_worker(url):
        noop.delay().get(timeout=30)  # warm-up: pool children and result consumer ready
        results: list[Any] = []
        lock = threading.Lock()
        shares = [
            jobs // submitters + (1 if i < jobs % submitters else 0) for i in range(submitters)
        ]

        def submit(n: int) -> None:
            mine = [noop.apply_async() for _ in range(n)]
            with lock:
                results.extend(mine)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=submit, args=(n,)) for n in shares]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in results:
            r.get(timeout=TIMEOUT_S)
        duration = time.perf_counter() - t0
        results.clear()
    return round(jobs / duration, 1)
