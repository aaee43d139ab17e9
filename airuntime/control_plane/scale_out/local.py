"""The ``local`` scale-out provider: ``airt runtime`` processes on this machine.

:class:`LocalScaler` starts processes named ``<prefix>-<n>``, counting per runtime
prefix (never globally) and never beyond the tenant's ``max_instances``. A child gets
its settings as ``AIRUNTIME_*`` variables named by the runtime's own settings model
(:class:`~airuntime.fleet.instance_settings.InstanceSettings`), exactly as the operator
writes a pod's: the tenant's ownership and isolation, its capacity (workers, run
slots, queue capacity, workers per execution, step slots), the shared Redis, and the
runtime token the control plane presents to the runtime's intake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time

from airuntime.control_plane.scale_out.requests import ScaleOutRejected, ScaleOutRequest
from airuntime.core.redis_client import RedisClient
from airuntime.core.settings import airuntime_home, env_name
from airuntime.fleet.instance_settings import InstanceSettings
from airuntime.fleet.registry import Registry
from airuntime.fleet.tenancy import IsolationMode, TenantSettings

RUNTIME_TOKEN_ENV = env_name("runtime_token")
"""The runtime token's variable (the runtime's ``runtime_token`` setting)."""

HISTORY_DSN_ENV = env_name("history_dsn")
"""The durable history's variable (``HistorySettings.history_dsn``)."""


def runtime_environment(
    instance_id: str, tenant: TenantSettings, *, redis_url: str, heartbeat_s: float
) -> dict[str, str]:
    """The ``AIRUNTIME_*`` variables of a runtime started for ``tenant``."""
    owned = tenant.isolation_mode is not IsolationMode.SHARED
    values: dict[str, object] = {
        "redis_url": redis_url,
        "instance_id": instance_id,
        "runtime_prefix": tenant.runtime_prefix,
        "isolation_mode": tenant.isolation_mode.value,
        # A Shared runtime belongs to nobody; a dedicated or hybrid one to its tenant.
        "tenant_id": tenant.tenant_id if owned else "",
        "tenant_group_id": (tenant.tenant_group_id or "") if owned else "",
        "prefer_dedicated": tenant.prefer_dedicated,
        "allow_shared_fallback": tenant.allow_shared_fallback,
        "workers": tenant.workers_per_instance,
        "max_concurrent_runs": tenant.max_concurrent_runs,
        "queue_capacity": tenant.queue_capacity,
        "max_local_workers_per_execution": min(
            tenant.max_local_workers_per_execution, tenant.workers_per_instance
        ),
        "max_concurrent_step_tasks": tenant.max_concurrent_step_tasks,
        "heartbeat_s": heartbeat_s,
    }
    return {
        InstanceSettings.env_var(field): (
            ("true" if value else "false") if isinstance(value, bool) else str(value)
        )
        for field, value in values.items()
    }


log = logging.getLogger(__name__)


class LocalScaler:
    """Starts ``airt runtime`` processes on this machine, per runtime prefix."""

    name = "local"

    def __init__(
        self,
        redis: RedisClient,
        redis_url: str,
        *,
        ready_timeout_s: float = 60.0,
        heartbeat_s: float = 1.0,
        extra_args: tuple[str, ...] = (),
        runtime_token: str | None = None,
        history_dsn: str | None = None,
    ) -> None:
        """``history_dsn``: the control plane's durable history, passed to every runtime
        as ``AIRUNTIME_HISTORY_DSN`` so step outputs over the payload threshold go where
        the control plane reads them (on one machine a SQLite file can be shared)."""
        self.redis = redis
        self.redis_url = redis_url
        self.registry = Registry(redis)
        self.ready_timeout_s = ready_timeout_s
        self.heartbeat_s = heartbeat_s
        self.extra_args = extra_args
        self.runtime_token = runtime_token
        self.history_dsn = history_dsn
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
        args = [sys.executable, "-m", "airuntime.cli", "runtime", *self.extra_args]
        env = {
            **os.environ,
            **runtime_environment(
                instance_id, tenant, redis_url=self.redis_url, heartbeat_s=self.heartbeat_s
            ),
            "COLUMNS": "100000",
        }
        if self.runtime_token:
            env[RUNTIME_TOKEN_ENV] = self.runtime_token
        if self.history_dsn:
            env[HISTORY_DSN_ENV] = self.history_dsn
        log_dir = airuntime_home() / "logs"
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
