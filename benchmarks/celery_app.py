"""Celery peer for :mod:`benchmarks.dag_throughput`: one app with one no-op task.

The broker and result backend come from ``AIRUNTIME_BENCH_CELERY_BROKER`` and
``AIRUNTIME_BENCH_CELERY_BACKEND`` (defaults: DBs 1 and 2 of a local Redis), so the
benchmark can point the worker subprocess at the same server airuntime uses.
Everything else is Celery's default except what keeps the benchmark quiet.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

BROKER_ENV = "AIRUNTIME_BENCH_CELERY_BROKER"
BACKEND_ENV = "AIRUNTIME_BENCH_CELERY_BACKEND"

app = Celery(
    "airuntime_bench",
    broker=os.environ.get(BROKER_ENV, "redis://127.0.0.1:6379/1"),
    backend=os.environ.get(BACKEND_ENV, "redis://127.0.0.1:6379/2"),
)
app.conf.update(
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    result_expires=3600,
)


@app.task(name="bench.noop")  # type: ignore[untyped-decorator]
def noop(*args: Any, **kwargs: Any) -> None:
    """Do nothing (the chord callback gets the header's results as an argument)."""
    return None
