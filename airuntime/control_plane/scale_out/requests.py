"""Scale-out requests: what admission asks for when no visible instance can take a run.

When admission answers RequestScaleOut, the dispatcher persists a
:class:`ScaleOutRequest` carrying the tenant settings of that moment; a
:class:`ScaleOutProvider` (local processes, or ScaleOutRequest resources for the
operator) creates the capacity and the request records the outcome.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict
from redis.asyncio import Redis

from airuntime.control_plane.json_records import update_record
from airuntime.core import keys
from airuntime.core.errors import AirError
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


class ScaleOutRejected(AirError):
    """The provider will not create capacity (e.g. the tenant is at max_instances)."""


def now_ms() -> int:
    return int(time.time() * 1000)


class ScaleOutStore:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def create(self, tenant: TenantSettings, shared_run_id: str) -> ScaleOutRequest:
        req = ScaleOutRequest(
            request_id=f"so-{uuid.uuid4().hex[:16]}",
            tenant_id=tenant.tenant_id,
            runtime_prefix=tenant.runtime_prefix,
            shared_run_id=shared_run_id,
            tenant_settings=tenant,
            requested_at_ms=now_ms(),
        )
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(keys.scale_out_request(req.request_id), req.model_dump_json())
        pipe.zadd(keys.scale_out_requests(), {req.request_id: req.requested_at_ms})
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
