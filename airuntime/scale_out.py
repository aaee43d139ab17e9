"""Scale-out: requests for capacity, the providers that create it, and the requeue.

When admission answers RequestScaleOut, the dispatcher persists a
:class:`ScaleOutRequest` carrying the tenant settings of that moment. A
:class:`ScaleOutWatcher` hands Pending requests to a :class:`ScaleOutProvider`
(``local`` here: :class:`LocalScaler` starts ``airt runtime`` processes named
``<prefix>-<n>``, counting per runtime prefix and never beyond the tenant's
``max_instances``; the ``kubernetes`` provider creates ScaleOutRequest resources for
the operator). Fulfilment marks the request Fulfilled with the new instance id; the
:class:`FulfilledRunRequeuer` then puts the shared run back into the shared queue
and the pump dispatches it — the watcher never dispatches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
import uuid
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict
from redis.asyncio import Redis
from redis.exceptions import WatchError

from airuntime import keys
from airuntime.errors import AirError
from airuntime.registry import Registry
from airuntime.shared_runs import SharedQueue, SharedRunStatus, SharedRunStore
from airuntime.tenancy import TenantSettings

log = logging.getLogger(__name__)


class ScaleOutPhase(StrEnum):
    PENDING = "Pending"
    OBSERVED = "Observed"
    FULFILLED = "Fulfilled"
    REJECTED = "Rejected"


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


def _now() -> int:
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
            requested_at_ms=_now(),
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
        key = keys.scale_out_request(request_id)
        while True:
            async with self.redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    if raw is None:
                        return None
                    req = ScaleOutRequest.model_validate_json(raw)
                    if expect is not None and req.phase not in expect:
                        return None
                    if unless_requeued and req.requeued:
                        return None
                    new = req.model_copy(update=changes)
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.set(key, new.model_dump_json())
                    await pipe.execute()
                    return new
                except WatchError:
                    continue

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


class LocalScaler:
    """Starts ``airt runtime`` processes on this machine, per runtime prefix."""

    name = "local"

    def __init__(
        self,
        redis: Redis,
        redis_url: str,
        *,
        ready_timeout_s: float = 60.0,
        heartbeat_s: float = 1.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.redis = redis
        self.redis_url = redis_url
        self.registry = Registry(redis)
        self.ready_timeout_s = ready_timeout_s
        self.heartbeat_s = heartbeat_s
        self.extra_args = extra_args
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self._lock = asyncio.Lock()

    def started_for(self, prefix: str) -> list[str]:
        return [
            iid
            for iid, p in self.processes.items()
            if iid.startswith(f"{prefix}-") and p.returncode is None
        ]

    async def fulfil(self, request: ScaleOutRequest) -> str:
        tenant = request.tenant_settings
        async with self._lock:
            live = {
                d.instance_id for d in await self.registry.list_by_prefix(tenant.runtime_prefix)
            }
            mine = set(self.started_for(tenant.runtime_prefix))
            count = len(live | mine)
            if count >= tenant.max_instances:
                raise ScaleOutRejected(
                    f"tenant {tenant.tenant_id} already has {count} of max {tenant.max_instances} "
                    f"{tenant.runtime_prefix} instances"
                )
            n = 1
            while f"{tenant.runtime_prefix}-{n}" in live | mine:
                n += 1
            instance_id = f"{tenant.runtime_prefix}-{n}"
            await self._spawn(instance_id, tenant)
        return await self._wait_ready(instance_id)

    async def _spawn(self, instance_id: str, tenant: TenantSettings) -> None:
        args = [
            sys.executable,
            "-m",
            "airuntime.cli",
            "runtime",
            "--prefix",
            tenant.runtime_prefix,
            "--instance-id",
            instance_id,
            "--isolation-mode",
            tenant.isolation_mode.value,
            "--workers",
            str(tenant.workers_per_instance),
            "--max-concurrent-runs",
            str(tenant.max_concurrent_runs),
            "--queue-capacity",
            str(tenant.queue_capacity),
            "--max-local-workers-per-execution",
            str(min(tenant.max_local_workers_per_execution, tenant.workers_per_instance)),
            "--max-concurrent-step-tasks",
            str(tenant.max_concurrent_step_tasks),
            "--heartbeat-s",
            str(self.heartbeat_s),
            *self.extra_args,
        ]
        if tenant.isolation_mode.value != "Shared":
            args += ["--tenant", tenant.tenant_id]
            if tenant.tenant_group_id:
                args += ["--tenant-group", tenant.tenant_group_id]
        args += [
            "--allow-shared-fallback"
            if tenant.allow_shared_fallback
            else "--no-allow-shared-fallback"
        ]
        env = {**os.environ, "AIRUNTIME_REDIS_URL": self.redis_url, "COLUMNS": "100000"}
        env.pop("AIRUNTIME_INSTANCE_ID", None)
        log_dir = Path(os.environ.get("AIRUNTIME_HOME") or Path.home() / ".airuntime") / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        with (log_dir / f"{instance_id}.log").open("ab") as log_file:
            proc = await asyncio.create_subprocess_exec(
                *args,
                env=env,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes[instance_id] = proc
        log.info("local scaler started %s (pid %s)", instance_id, proc.pid)

    async def _wait_ready(self, instance_id: str) -> str:
        deadline = time.monotonic() + self.ready_timeout_s
        proc = self.processes[instance_id]
        while time.monotonic() < deadline:
            desc = await self.registry.get(instance_id)
            if desc is not None and desc.capacity.can_accept_run:
                return instance_id
            if proc.returncode is not None:
                raise ScaleOutRejected(
                    f"runtime process {instance_id} exited with {proc.returncode}"
                )
            await asyncio.sleep(0.05)
        raise ScaleOutRejected(
            f"runtime {instance_id} did not become ready in {self.ready_timeout_s} s"
        )

    async def close(self) -> None:
        for proc in self.processes.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        for proc in self.processes.values():
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()


class ScaleOutWatcher:
    """Hands Pending requests to the provider and records the outcome."""

    def __init__(
        self, store: ScaleOutStore, provider: ScaleOutProvider, poll_s: float = 0.1
    ) -> None:
        self.store = store
        self.provider = provider
        self.poll_s = poll_s
        self._inflight: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        while True:
            await self.observe_once()
            await asyncio.sleep(self.poll_s)

    async def observe_once(self) -> int:
        started = 0
        for req in await self.store.list():
            if req.phase is not ScaleOutPhase.PENDING or req.request_id in self._inflight:
                continue
            observed = await self.store.transition(
                req.request_id,
                {ScaleOutPhase.PENDING},
                phase=ScaleOutPhase.OBSERVED,
                observed_at_ms=_now(),
                provider=self.provider.name,
            )
            if observed is None:
                continue  # another watcher took it
            self._inflight.add(req.request_id)
            task = asyncio.create_task(self._fulfil(observed))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            started += 1
        return started

    async def _fulfil(self, req: ScaleOutRequest) -> None:
        try:
            instance_id = await self.provider.fulfil(req)
        except ScaleOutRejected as exc:
            await self.store.transition(
                req.request_id, None, phase=ScaleOutPhase.REJECTED, reason=str(exc)
            )
        except Exception as exc:
            log.exception("scale-out %s failed", req.request_id)
            await self.store.transition(
                req.request_id, None, phase=ScaleOutPhase.REJECTED, reason=repr(exc)
            )
        else:
            await self.store.transition(
                req.request_id,
                None,
                phase=ScaleOutPhase.FULFILLED,
                fulfilled_instance_id=instance_id,
                fulfilled_at_ms=_now(),
            )
        finally:
            self._inflight.discard(req.request_id)

    async def wait_idle(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


class FulfilledRunRequeuer:
    """Puts shared runs of finished scale-out requests back into the shared queue."""

    def __init__(
        self, store: ScaleOutStore, runs: SharedRunStore, queue: SharedQueue, poll_s: float = 0.1
    ) -> None:
        self.store = store
        self.runs = runs
        self.queue = queue
        self.poll_s = poll_s

    async def run(self) -> None:
        while True:
            await self.requeue_once()
            await asyncio.sleep(self.poll_s)

    async def requeue_once(self) -> int:
        n = 0
        for req in await self.store.list():
            if req.requeued or req.phase not in (ScaleOutPhase.FULFILLED, ScaleOutPhase.REJECTED):
                continue
            marked = await self.store.transition(
                req.request_id,
                {ScaleOutPhase.FULFILLED, ScaleOutPhase.REJECTED},
                unless_requeued=True,
                requeued=True,
            )
            if marked is None:
                continue  # another requeuer took it
            run = await self.runs.get(req.shared_run_id)
            if run is None or run.status is not SharedRunStatus.SCALE_OUT_REQUESTED:
                continue
            # Rejected scale-out still requeues: existing capacity (or shared fallback)
            # may take the run later; admission decides again at dispatch time.
            await self.runs.update(req.shared_run_id, status=SharedRunStatus.QUEUED_GLOBALLY)
            await self.queue.enqueue(req.shared_run_id, run.snapshot.tenant_id, requeue=True)
            n += 1
        return n
