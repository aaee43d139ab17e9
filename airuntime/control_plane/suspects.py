"""Suspect instances: a runtime that heartbeats but cannot be reached stops winning admission.

Why this module exists: the registry only knows that an instance heartbeats. A
runtime whose heartbeat still runs while its intake does not answer (frozen, a
network partition between the control plane and the pod, an inbox nobody reads)
keeps looking like the best candidate, and every dispatch cycle delivers to it,
times out, and puts the run back. After ``failures_before_suspect`` consecutive
delivery failures the instance is *suspect* for a while: admission skips it. The
suspicion lasts ``initial`` and doubles each time the instance is suspected again
soon after (capped at ``maximum``); one successful delivery clears it all.

Redis (keys in :mod:`airuntime.core.keys`): ``air:delivery-failures:<instance>``, a
hash counting consecutive failures and past suspicions (``recordDeliveryFailure-1.lua``,
with a TTL), and ``air:suspect:<instance>``, the mark itself: a hash (failures,
suspicions, last error, since) whose TTL is the suspicion -- admission skips the
instance while it exists. Only failures to *reach* an instance count (unreachable,
timeout, a transport error); an instance that answers and refuses (queue full,
paused, invalid run) is reachable and its capacity descriptor says why.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel, ConfigDict

from airuntime.core import keys
from airuntime.core.redis_client import RedisClient
from airuntime.core.reply_text import reply_text as _s
from airuntime.core.scripts import ScriptLibrary, library
from airuntime.core.slots import ensure_transaction_slot

__all__ = ["FAULT_REASONS", "SuspectMark", "SuspectMarks", "SuspectPolicy"]

FAULT_REASONS: Final = frozenset({"unreachable", "timeout"})
"""DeliveryError reasons that mean the instance could not be reached."""


@dataclass(frozen=True, slots=True)
class SuspectPolicy:
    failures_before_suspect: int = 3
    initial_s: float = 5.0
    maximum_s: float = 300.0


class SuspectMark(BaseModel):
    """What ``/v1/instances`` shows of a suspect instance."""

    model_config = ConfigDict(extra="forbid")

    failures: int
    """Consecutive delivery failures that made it suspect."""
    suspicions: int
    """How often it was suspected lately (each one lasts twice as long, capped)."""
    last_error: str
    since_ms: int
    remaining_ms: int
    """How much longer admission skips it."""


class SuspectMarks:
    """Counts delivery failures, marks and clears suspect instances."""

    def __init__(
        self,
        redis: RedisClient,
        policy: SuspectPolicy | None = None,
        scripts: ScriptLibrary | None = None,
    ) -> None:
        self.redis = redis
        self.policy = policy or SuspectPolicy()
        self.scripts = scripts or library()

    async def failed(self, instance_id: str, error: str) -> SuspectMark | None:
        """Count one failure to reach ``instance_id``; the new mark if it became suspect."""
        p = self.policy
        maximum_ms = int(p.maximum_s * 1000)
        reply: Any = await self.scripts.call(
            self.redis,
            "recordDeliveryFailure",
            [keys.delivery_failures(instance_id)],
            [p.failures_before_suspect, int(p.initial_s * 1000), maximum_ms, maximum_ms],
        )
        failures, suspicions, suspect_for = (int(x) for x in reply)
        if suspect_for <= 0:
            return None
        mark = SuspectMark(
            failures=max(failures, p.failures_before_suspect),
            suspicions=suspicions,
            last_error=error[:500],
            since_ms=int(time.time() * 1000),
            remaining_ms=suspect_for,
        )
        pipe = self.redis.pipeline(transaction=True)
        key = keys.suspect_instance(instance_id)
        pipe.delete(key)
        fields: dict[str | bytes, str | int] = {
            "failures": mark.failures,
            "suspicions": mark.suspicions,
            "last_error": mark.last_error,
            "since_ms": mark.since_ms,
        }
        pipe.hset(key, mapping=fields)  # type: ignore[arg-type]
        pipe.pexpire(key, suspect_for)
        ensure_transaction_slot("suspect mark", pipe)
        await pipe.execute()
        return mark

    async def succeeded(self, instance_id: str) -> None:
        """A delivery got through: forget the failures and any suspicion."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(keys.delivery_failures(instance_id))
        pipe.delete(keys.suspect_instance(instance_id))
        await pipe.execute()

    async def state(self, instance_ids: Iterable[str]) -> tuple[set[str], set[str]]:
        """(suspect instances, instances with a failure record) among ``instance_ids``,
        in one round trip."""
        ids = list(instance_ids)
        if not ids:
            return set(), set()
        pipe = self.redis.pipeline(transaction=False)
        for iid in ids:
            pipe.exists(keys.suspect_instance(iid))
            pipe.exists(keys.delivery_failures(iid))
        flags = await pipe.execute()
        suspect = {iid for iid, f in zip(ids, flags[0::2], strict=True) if f}
        failing = {iid for iid, f in zip(ids, flags[1::2], strict=True) if f}
        return suspect, failing

    async def marks(self, instance_ids: Iterable[str]) -> dict[str, SuspectMark]:
        """The live marks among ``instance_ids`` (for the API and metrics)."""
        ids = list(instance_ids)
        if not ids:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for iid in ids:
            pipe.hgetall(keys.suspect_instance(iid))
            pipe.pttl(keys.suspect_instance(iid))
        replies = await pipe.execute()
        out: dict[str, SuspectMark] = {}
        for iid, raw, ttl in zip(ids, replies[0::2], replies[1::2], strict=True):
            if not raw or int(ttl) <= 0:
                continue
            fields = {_s(k): _s(v) for k, v in raw.items()}
            out[iid] = SuspectMark(
                failures=int(fields.get("failures", 0)),
                suspicions=int(fields.get("suspicions", 0)),
                last_error=fields.get("last_error", ""),
                since_ms=int(fields.get("since_ms", 0)),
                remaining_ms=int(ttl),
            )
        return out
