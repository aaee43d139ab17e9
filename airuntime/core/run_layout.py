"""Which run index bucket layout a client's deployment uses, and the guard against
switching it with data in place.

Why this exists: on a Redis Cluster the runtime run index is split into buckets by
RunId (the slot layout in :mod:`airuntime.core.keys`) so that accepting, starting and
finishing runs spreads over the shards instead of loading the control slot's shard.
The bucket count follows from the client -- 1 on a standalone server (today's key
names, no migration), :data:`~airuntime.core.keys.CLUSTER_RUN_BUCKETS` on a cluster --
and is recorded once in ``air:run-layout``, like the execution layout
(:mod:`airuntime.core.execution_layout`), so a switch with runs in place fails loudly.
"""

from __future__ import annotations

import uuid

from airuntime.core import keys
from airuntime.core.execution_layout import check_recorded
from airuntime.core.redis_client import RedisClient, is_cluster

__all__ = ["check_run_layout", "new_run_id", "run_buckets_for"]


def run_buckets_for(client: RedisClient) -> int:
    """1 on a standalone server, the cluster run bucket count on a cluster."""
    return keys.CLUSTER_RUN_BUCKETS if is_cluster(client) else 1


async def check_run_layout(client: RedisClient) -> int:
    """Record the run bucket count unless one is recorded; raise
    :class:`~airuntime.core.execution_layout.LayoutMismatch` when another one is."""
    return await check_recorded(client, keys.run_layout(), run_buckets_for(client), "runs")


def new_run_id(shared_run_id: str, buckets: int) -> str:
    """A fresh RunId (``run-`` + 32 hex, the format everywhere) in the bucket of
    ``shared_run_id``, so the run's record and its SharedRunId mapping share a slot and
    acceptance stays one atomic script. Drawn again until it lands there (``buckets``
    draws on average, a few microseconds)."""
    want = keys.run_bucket_of(shared_run_id, buckets).index
    while True:
        run_id = f"run-{uuid.uuid4().hex}"
        if keys.run_bucket_of(run_id, buckets).index == want:
            return run_id
