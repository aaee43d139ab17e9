"""A real Valkey that a test can kill (-9) and start again at the same address.

``EmbeddedServer`` picks a new port on every start, so clients could never reconnect
after a restart; the outage tests need the address to stay, as a real server's does.
This one keeps its port and an append-only file in ``data_dir`` (``appendfsync
always``), so what was written before ``kill()`` is there after ``start()`` (the
server answers ``LOADING`` while it reads the file back).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from airuntime.devstack.child_process import LOOPBACK, SPAWNER, free_port, make_preexec
from airuntime.devstack.embedded import default_executable

__all__ = ["RestartableValkey"]


class RestartableValkey:
    """``valkey-server`` on a fixed port with AOF persistence; ``kill()``/``start()``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.executable = default_executable()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    async def start(self, timeout_s: float = 20.0) -> None:
        """Start (again) and wait until it answers PING with its data loaded."""
        assert self._proc is None, "already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            self.executable,
            "--port", str(self.port),
            "--bind", LOOPBACK,
            "--protected-mode", "yes",
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--dir", str(self.data_dir),
        ]  # fmt: skip
        log = (self.data_dir / "server.log").open("ab")
        self._proc = SPAWNER.spawn(
            lambda: subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=make_preexec()
            )
        )
        log.close()
        client = Redis.from_url(self.url)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    if await client.ping():
                        return
                except RedisConnectionError:  # not listening yet, or LOADING
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"valkey on port {self.port} did not come up")
                await asyncio.sleep(0.02)
        finally:
            await client.aclose()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the running server (SIGSTOP / SIGCONT: freeze, thaw)."""
        assert self._proc is not None, "not running"
        self._proc.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no goodbye to clients."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def stop(self) -> None:
        """SIGTERM: a clean shutdown (the server flushes its append-only file and exits)."""
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()
            self._proc = None
