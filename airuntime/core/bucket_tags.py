"""Hash tags that divide a Redis Cluster's 16384 slots evenly among buckets.

Why this exists: executions and runs are grouped in buckets whose keys share a hash
tag (the slot layout in :mod:`airuntime.core.keys`, which builds the keys). Plain tags
such as ``x:<b>`` hash unevenly (39/39/50 of 128 buckets on three shards), so each
bucket's tag is searched so that its slot falls in the bucket's own equal slot range,
and buckets spread evenly over shards that own equal slot ranges.
"""

from __future__ import annotations

from functools import cache

from redis.crc import key_slot

__all__ = ["bucket_tags"]

_SLOTS = 16384


@cache
def bucket_tags(buckets: int, kind: str) -> tuple[str, ...]:
    """The tag of each of ``buckets`` buckets: ``<kind>:<b>:<n>`` with the smallest
    ``n`` whose hash slot falls in the b-th of ``buckets`` equal slot ranges
    (``kind``: ``x`` executions, ``rb`` runs)."""
    tags: list[str] = []
    for b in range(buckets):
        low, high = b * _SLOTS // buckets, (b + 1) * _SLOTS // buckets
        n = 0
        while not low <= key_slot(f"{kind}:{b}:{n}".encode()) < high:
            n += 1
        tags.append(f"{kind}:{b}:{n}")
    return tuple(tags)
