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

import threading
import time
from typing import Any

from benchmarks.celery_peer import celery_worker

TIMEOUT_S = 300.0


def celery_jobs_per_s(url: str, jobs: int, submitters: int) -> float:
    """Submit ``jobs`` no-op jobs from ``submitters`` threads, await every result."""
    from benchmarks.celery_app import noop

    with celery_worker(url, "dispatch-bench"):
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
