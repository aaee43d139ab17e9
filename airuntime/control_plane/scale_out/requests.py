"""Scale-out requests: what admission asks for when no visible instance can take a run.

When admission answers RequestScaleOut, the dispatcher persists a
:class:`ScaleOutRequest` carrying the tenant settings of that moment; a
:class:`ScaleOutProvider` (local processes, or ScaleOutRequest resources for the
operator) creates the capacity and the request records the outcome.

A request that failed (the provider refused it, or crashed) is not filed again at
the next dispatch cycle: it records its ``attempts``, its ``last_error`` and when the
next attempt may be made (:class:`ScaleOutBackoff`: exponential, capped), and until
then the prefix's runs wait in the shared queue (:meth:`ScaleOutStore.backing_off`).
The next request for the prefix carries the attempt count on; a fulfilled one resets it.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from airuntime.control_plane.json_records import update_record
from airuntime.core import keys
from airuntime.core.errors import AirError
from airuntime.core.redis_client import RedisClient
from airuntime.core.slots import ensure_transaction_slot
from airuntime.fleet.tenancy import TenantSettings
from airuntime.k8s.v1alpha1 import ScaleOutPhase as ScaleOutPhase  # the contract's, re-exported


class ScaleOutRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str
    tenant_id: str
    runtime_prefix: str
    shared_run_id: str
    requested_instances: int = 1
    tenant_settings: TenantSettings
    phase: ScaleOutPhase = ScaleOutPhase.PENDING
    provider: str = ""
    fulfilled_instance_id: str | None = None
    reason: str | None = None
    requested_at_ms: int
    observed_at_ms: int | None = None
    fulfilled_at_ms: int | None = None
    requeued: bool = False
    attempts: int = 1
    """This request is the n-th consecutive attempt to scale the prefix out."""
    last_error: str | None = None
    """Why the attempt failed (the provider's refusal, or its crash)."""
    next_attempt_at_ms: int | None = None
    """A failed attempt: no new request for the prefix before this time."""


class ScaleOutRejected(AirError):
    """The provider will not create capacity (e.g. the tenant is at max_instances)."""


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class ScaleOutBackoff:
    """Delay after the n-th failed attempt: ``initial_s * 2**(n-1)``, at most ``maximum_s``."""

    initial_s: float = 5.0
    maximum_s: float = 300.0

    def delay_ms(self, attempts: int) -> int:
        return int(min(self.maximum_s, self.initial_s * 2 ** min(max(attempts, 1) - 1, 30)) * 1000)


class ScaleOutStore:
    def __init__(self, redis: RedisClient, backoff: ScaleOutBackoff | None = None) -> None:
        self.redis = redis
        self.backoff = backoff or ScaleOutBackoff()

    async def create(
        self, tenant: TenantSettings, shared_run_id: str, *, attempts: int = 1
    ) -> ScaleOutRequest:
        req = ScaleOutRequest(
            request_id=f"so-{uuid.uuid4().hex[:16]}",
            tenant_id=tenant.tenant_id,
            runtime_prefix=tenant.runtime_prefix,
            shared_run_id=shared_run_id,
            tenant_settings=tenant,
            requested_at_ms=now_ms(),
            attempts=attempts,
        )
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(keys.scale_out_request(req.request_id), req.model_dump_json())
        pipe.zadd(keys.scale_out_requests(), {req.request_id: req.requested_at_ms})
        ensure_transaction_slot("ScaleOutRequests.create", pipe)
        await pipe.execute()
        return req

    async def outstanding(self, runtime_prefix: str) -> ScaleOutRequest | None:
        """A Pending or Observed request for ``runtime_prefix``, if one is in flight."""
        for req in await self.list(limit=200):
            if req.runtime_prefix == runtime_prefix and req.phase in (
                ScaleOutPhase.PENDING,
                ScaleOutPhase.OBSERVED,
            ):
                return req
        return None

    async def latest(self, runtime_prefix: str) -> ScaleOutRequest | None:
        """The most recent request for ``runtime_prefix`` (None: none kept)."""
        for req in await self.list(limit=200):
            if req.runtime_prefix == runtime_prefix:
                return req
        return None

    @staticmethod
    def backing_off(latest: ScaleOutRequest | None, now: int | None = None) -> bool:
        """Whether ``latest`` failed and its next attempt is not due yet."""
        return (
            latest is not None
            and latest.phase is ScaleOutPhase.REJECTED
            and (latest.next_attempt_at_ms or 0) > (now_ms() if now is None else now)
        )

    @staticmethod
    def next_attempts(latest: ScaleOutRequest | None) -> int:
        """The attempt count of the next request for the prefix."""
        if latest is None or latest.phase is not ScaleOutPhase.REJECTED:
            return 1
        return latest.attempts + 1

    async def failed(self, request_id: str, error: str) -> ScaleOutRequest | None:
        """Record a failed attempt: Rejected, with the error and the next attempt's time."""

        def apply(req: ScaleOutRequest) -> ScaleOutRequest | None:
            if req.phase is ScaleOutPhase.FULFILLED:
                return None
            now = now_ms()
            return req.model_copy(
                update={
                    "phase": ScaleOutPhase.REJECTED,
                    "reason": error,
                    "last_error": error,
                    "next_attempt_at_ms": now + self.backoff.delay_ms(req.attempts),
                }
            )

        updated = await update_record(
            self.redis, keys.scale_out_request(request_id), ScaleOutRequest, apply
        )
        return None if updated is None else updated[1]

    async def get(self, request_id: str) -> ScaleOutRequest | None:
        raw = await self.redis.get(keys.scale_out_request(request_id))
        return ScaleOutRequest.model_validate_json(raw) if raw else None

    async def transition(
        self,
        request_id: str,
        expect: set[ScaleOutPhase] | None,
        *,
        unless_requeued: bool = False,
        **changes: Any,
    ) -> ScaleOutRequest | None:
        """Compare-and-set: apply ``changes`` only if the phase is in ``expect`` (and,
        with ``unless_requeued``, the run was not requeued yet)."""

        def apply(req: ScaleOutRequest) -> ScaleOutRequest | None:
            if expect is not None and req.phase not in expect:
                return None
            if unless_requeued and req.requeued:
                return None
            return req.model_copy(update=changes)

        key = keys.scale_out_request(request_id)
        updated = await update_record(self.redis, key, ScaleOutRequest, apply)
        return None if updated is None else updated[1]

    async def requested_before(
        self, cutoff_ms: int, start: int, count: int
    ) -> list[ScaleOutRequest]:
        """A page of the requests filed at or before ``cutoff_ms``, oldest first (records
        already gone are dropped from the index on the way)."""
        raw_ids: list[Any] = await self.redis.zrangebyscore(
            keys.scale_out_requests(), "-inf", cutoff_ms, start=start, num=count
        )
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in raw_ids]
        if not ids:
            return []
        raws = await self.redis.mget([keys.scale_out_request(i) for i in ids])
        gone = [i for i, r in zip(ids, raws, strict=True) if not r]
        if gone:
            await self.redis.zrem(keys.scale_out_requests(), *gone)
        return [ScaleOutRequest.model_validate_json(r) for r in raws if r]

    async def delete(self, request_ids: list[str]) -> None:
        """Remove records and their index entries."""
        if not request_ids:
            return
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(*[keys.scale_out_request(i) for i in request_ids])
        pipe.zrem(keys.scale_out_requests(), *request_ids)
        await pipe.execute()

    async def list(self, limit: int = 500) -> list[ScaleOutRequest]:
        ids: list[Any] = await self.redis.zrevrange(keys.scale_out_requests(), 0, limit - 1)
        if not ids:
            return []
        raws = await self.redis.mget(
            [keys.scale_out_request(i.decode() if isinstance(i, bytes) else i) for i in ids]
        )
        return [ScaleOutRequest.model_validate_json(r) for r in raws if r]


class ScaleOutProvider(Protocol):
    name: str

    async def fulfil(self, request: ScaleOutRequest) -> str:
        """Create capacity for the request's tenant; return the new ready instance id."""
        ...

    async def close(self) -> None: ...
