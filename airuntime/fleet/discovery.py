"""Control-plane discovery: the logical control-plane id, published for runtime hosts.

The control plane publishes ``{control_plane_id, host, heartbeat_at_ms}`` at
``air:control-plane`` with a TTL and refreshes it. A runtime-only host resolves it
once at startup (:func:`resolve_control_plane_id`, optionally waiting for it) and
stamps it on the descriptors of the instances it registers; at shutdown it reuses
the identity it already resolved — it never rediscovers, because the discovery
record (or Redis itself) may already be gone by then.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass

from airuntime.core import keys
from airuntime.core.redis_client import RedisClient

DISCOVERY_TTL_MS = 10_000


@dataclass(frozen=True, slots=True)
class ControlPlaneRecord:
    control_plane_id: str
    host: str
    heartbeat_at_ms: int


async def publish_control_plane(
    redis: RedisClient, control_plane_id: str, ttl_ms: int = DISCOVERY_TTL_MS
) -> None:
    doc = {
        "control_plane_id": control_plane_id,
        "host": socket.gethostname(),
        "heartbeat_at_ms": int(time.time() * 1000),
    }
    await redis.set(keys.control_plane(), json.dumps(doc), px=ttl_ms)


async def read_control_plane(redis: RedisClient) -> ControlPlaneRecord | None:
    raw = await redis.get(keys.control_plane())
    if raw is None:
        return None
    doc = json.loads(raw)
    return ControlPlaneRecord(
        str(doc["control_plane_id"]), str(doc.get("host", "")), int(doc.get("heartbeat_at_ms", 0))
    )


async def resolve_control_plane_id(
    redis: RedisClient, *, wait_s: float = 0.0, poll_s: float = 0.1
) -> str | None:
    """The published control-plane id; waits up to ``wait_s`` for one to appear."""
    deadline = time.monotonic() + wait_s
    while True:
        record = await read_control_plane(redis)
        if record is not None:
            return record.control_plane_id
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(poll_s)
