"""The Celery peer of :mod:`benchmarks.dag_throughput`: a chord 1 -> n -> 1 of no-op tasks
on the same Redis/Valkey, timed from sending the workflow to the callback's result.

Why a module of its own: it owns a Celery worker subprocess and its settings
(:mod:`benchmarks.celery_app`), which nothing else of the throughput benchmark needs.
"""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from benchmarks.redis_probe import ServerSample, celery_url

__all__ = ["CELERY_CONCURRENCY", "ChordRun", "run_celery"]

REPO_ROOT = Path(__file__).resolve().parent.parent
CELERY_CONCURRENCY = 2
RUN_TIMEOUT_S = 180.0
CELERY_BROKER_ENV = "AIRUNTIME_BENCH_CELERY_BROKER"  # read by benchmarks/celery_app.py
CELERY_BACKEND_ENV = "AIRUNTIME_BENCH_CELERY_BACKEND"

ChordRun = tuple[float, ServerSample, ServerSample]
"""Duration (s), and the server samples before and after."""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def celery_worker(url: str, name: str = "bench") -> Iterator[Any]:
    """A ``celery worker --pool prefork --concurrency 2`` subprocess on databases 1
    (broker) and 2 (results) of ``url``'s server, up and answering pings; yields the app.
    Stopped (and the result consumer with it) on the way out."""
    broker, backend = celery_url(url, 1), celery_url(url, 2)
    os.environ[CELERY_BROKER_ENV] = broker
    os.environ[CELERY_BACKEND_ENV] = backend
    from benchmarks.celery_app import app

    app.conf.update(broker_url=broker, result_backend=backend)
    # ``python -m`` in the repository root makes ``benchmarks`` importable, as for this
    # module. Not PYTHONPATH: that is searched before the standard library while the
    # interpreter starts, and the repository's ``operator/`` would shadow ``operator``.
    cmd = [
        sys.executable, "-m", "celery", "-A", "benchmarks.celery_app", "worker",
        "--pool", "prefork", "--concurrency", str(CELERY_CONCURRENCY), "--loglevel", "WARNING",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--hostname", f"{name}-{os.getpid()}@%h",
    ]  # fmt: skip
    try:
        with tempfile.TemporaryFile(mode="w+") as worker_log:
            proc = subprocess.Popen(
                cmd,
                env=dict(os.environ),
                cwd=REPO_ROOT,
                stdout=worker_log,
                stderr=subprocess.STDOUT,
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
                _stop(proc)
    finally:
        # AsyncResult.__del__ unsubscribes from the result backend: let it run while
        # the server is still up (at interpreter exit it would retry a dead server).
        gc.collect()
        with contextlib.suppress(Exception):
            app.backend.result_consumer.stop()
        app.close()


def run_celery(url: str, n: int) -> ChordRun:
    """Chord of ``n`` no-op tasks run by :func:`celery_worker` on ``url``'s server."""
    client = redis.Redis.from_url(url)
    try:
        with celery_worker(url):
            return _time_chord(client, n)
    finally:
        client.close()


def _time_chord(client: redis.Redis, n: int) -> ChordRun:
    from celery import chain as celery_chain
    from celery import chord

    from benchmarks.celery_app import noop

    noop.delay().get(timeout=30)  # warm-up: pool children and the result consumer are ready
    workflow = celery_chain(noop.si(), chord([noop.si() for _ in range(n)], noop.si()))
    before = ServerSample.take(client)
    t0 = time.perf_counter()
    workflow.apply_async().get(timeout=RUN_TIMEOUT_S)
    duration = time.perf_counter() - t0
    after = ServerSample.take(client)
    return duration, before, after
