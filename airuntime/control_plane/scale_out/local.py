"""The ``local`` scale-out provider: ``airt runtime`` processes on this machine.

:class:`LocalScaler` starts processes named ``<prefix>-<n>``, counting per runtime
prefix (never globally) and never beyond the tenant's ``max_instances``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from pathlib import Path

from redis.asyncio import Redis

from airuntime.control_plane.scale_out.requests import ScaleOutRejected, ScaleOutRequest
from airuntime.fleet.registry import Registry
from airuntime.fleet.tenancy import IsolationMode, TenantSettings

log = logging.getLogger(__name__)


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
        if tenant.isolation_mode is not IsolationMode.SHARED:
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
