"""The dispatch benchmark's runtimes in their own process, as they are deployed.

Why this module exists: by default :mod:`benchmarks.dispatch` runs the control plane,
the three runtime instances and the submitters in one Python process, so one core
does all of their work, while its Celery peer runs a worker process beside the
submitting one. ``--runtime-process`` starts the instances the way a pod does instead:
one ``airt runtime --instances 3 --provider redis`` process on the same server, which
the control plane reaches through the instances' Redis inboxes (batch deliveries:
:class:`airuntime.fleet.providers.RedisProvider`). Its start (interpreter, imports,
registration) happens before the scenario's clock starts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from redis.asyncio import Redis

from airuntime.fleet.registry import Registry

__all__ = ["RuntimeProcess"]

AIRT = str(Path(sys.executable).parent / "airt")


class RuntimeProcess:
    """``instances`` runtime instances in one ``airt runtime`` child process."""

    instances: tuple[()] = ()
    """None in this process (the in-process host's list, which the driver hands to
    the control plane's local provider)."""

    def __init__(self, redis: Redis, url: str, *, instances: int, slots: int, queue: int):
        self.redis = redis
        self.url = url
        self.count = instances
        self.args = [
            AIRT,
            "runtime",
            "--instances",
            str(instances),
            "--provider",
            "redis",
            "--workers",
            str(slots),
            "--max-concurrent-runs",
            str(slots),
            "--max-local-workers-per-execution",
            "1",
            "--queue-capacity",
            str(queue),
            "--heartbeat-s",
            "1",
        ]
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        """Start the child and return once all its instances are registered."""
        # Assistance stays on, as deployed (`airt runtime` has no setting for it; the
        # in-process host of the default set-up turns it off): with one-step runs it
        # finds little to join (Python CPU a run within the noise, two alternated pairs).
        env = {**os.environ, "AIRUNTIME_REDIS_URL": self.url}
        self.proc = await asyncio.create_subprocess_exec(
            *self.args, env=env, stdout=asyncio.subprocess.DEVNULL
        )
        registry = Registry(self.redis)
        async with asyncio.timeout(60):
            while len(await registry.list_all()) < self.count:
                if self.proc.returncode is not None:
                    raise RuntimeError(f"airt runtime exited with {self.proc.returncode}")
                await asyncio.sleep(0.05)

    async def stop(self, drain_timeout_s: float = 5) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), drain_timeout_s + 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
