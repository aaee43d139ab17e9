"""A real control plane with its HTTP API on a TCP port, in a thread of the test process,
for the ``airt`` subprocesses of the CLI tests: Valkey, one runtime host, the background
pump, the durable history (the test's DSN), uvicorn. ``call`` runs a coroutine on the
server's loop (to archive a run from the test); ``restart_api`` stops and starts the
HTTP API alone, on the same port."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI
from redis.asyncio import Redis

from airuntime.control_plane.api import begin_closing, create_app
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.fleet.registry import Registry
from airuntime.fleet.tenancy import DEFAULT_ALLOWED_HANDLERS, TenantSettings
from airuntime.history import HistoryStore, open_history_store
from runtime_pod.config import InstanceConfig
from runtime_pod.host import RuntimeHost
from tests.history.conftest import settings
from tests.runs.conftest import authenticator

T = TypeVar("T")


class ServedControlPlane:
    def __init__(
        self, redis_url: str, history_dsn: str, settings: ControlPlaneSettings | None = None
    ) -> None:
        self.redis_url, self.history_dsn = redis_url, history_dsn
        self.cp_settings = settings or ControlPlaneSettings(scale_out_enabled=False)
        self.url = ""
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="served-cp", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.redis: Redis | None = None
        self.history: HistoryStore | None = None
        self._cp: ControlPlane | None = None
        self._app: FastAPI | None = None
        self._server: uvicorn.Server | None = None
        self._serving: asyncio.Task[None] | None = None

    def start(self, timeout_s: float = 60) -> None:
        self._thread.start()
        if not self._ready.wait(timeout_s) or self._error is not None:
            raise RuntimeError(f"the control plane did not start: {self._error!r}")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def call(self, make: Callable[[Redis, HistoryStore], Awaitable[T]]) -> T:
        assert self._loop is not None and self.redis is not None and self.history is not None
        coro: Any = make(self.redis, self.history)
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(60)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to start()
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self.redis = redis = Redis.from_url(self.redis_url)
        await redis.flushall()
        # tenant-a may use ``python`` steps (the nondeterministic handler of the replay test).
        await Registry(redis).put_tenant(
            TenantSettings(
                tenant_id="tenant-a", allowed_handlers=(*DEFAULT_ALLOWED_HANDLERS, "python")
            )
        )
        self.history = await open_history_store(self.history_dsn, settings=settings())
        host = RuntimeHost(redis, InstanceConfig(workers=4, heartbeat_s=0.5), instances=1)
        await host.start()
        cp = ControlPlane(redis, self.cp_settings)
        for inst in host.instances:
            cp.local.add(inst)
        await cp.start()
        self._cp = cp
        await self._serve_api(port=0)
        try:
            self._ready.set()
            await self._stop.wait()
        finally:
            await self._stop_api()
            await cp.stop()
            await host.stop(drain_timeout_s=5)
            await self.history.close()
            await redis.aclose()

    def restart_api(self) -> None:
        """Stop the HTTP API as a stopping control plane does (its followed event
        streams end) and serve a new one on the same port; the control plane, its
        loops and the runtime go on."""
        port = int(self.url.rsplit(":", 1)[1])

        async def restart() -> None:
            await self._stop_api()
            await self._serve_api(port)

        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(restart(), self._loop).result(60)

    async def _serve_api(self, port: int) -> None:
        assert self._cp is not None and self.history is not None
        self._app = app = create_app(self._cp, authenticator(), history=self.history)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"
        )
        self._server = server = uvicorn.Server(config)
        self._serving = serving = asyncio.create_task(server.serve())
        while not server.started:
            if serving.done():
                serving.result()
            await asyncio.sleep(0.01)
        bound = server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{bound}"

    async def _stop_api(self) -> None:
        if self._server is None or self._serving is None or self._app is None:
            return
        begin_closing(self._app)  # as the real server stops: followed streams end
        self._server.should_exit = True
        await self._serving
        self._server = self._serving = self._app = None
