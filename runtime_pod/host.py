"""A runtime host: one process hosting one or more runtime instances, and its HTTP API.

``airt runtime --instances N`` hosts N child instances (the reference's pooled HTTP
host): each child has its own id ``<prefix>-<n>``, local queue, workers and
capacity descriptor and is a dispatch target; the host's own identity never is (it
is not registered). One instance per process is the default, one per pod on
Kubernetes (where the id is the pod name).

Its HTTP API (probes, metrics, the ``http`` provider's intake, live settings) is in
:mod:`runtime_pod.http_api`; the intake and the settings need the host's runtime token
(a bearer token the control plane holds). A host whose instances take runs over HTTP
refuses to start without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

import uvicorn
from fastapi import FastAPI

from airuntime.core import keys
from airuntime.core.errors import ConfigError
from airuntime.core.listening import listen_socket, serve_on
from airuntime.core.redis_client import RedisClient
from airuntime.engine.handlers import HandlerRegistry
from airuntime.engine.payloads import PayloadOffload
from airuntime.fleet.discovery import resolve_control_plane_id
from airuntime.fleet.instance_settings import RUNTIME_TOKEN_ENV, InstanceConfig
from runtime_pod.http_api import host_router
from runtime_pod.instance import InstanceHooks, RuntimeInstance
from runtime_pod.metrics import RuntimeMetrics
from runtime_pod.settings_store import RuntimeSettings, SettingsStore
from runtime_pod.step_slots import StepSlotController

log = logging.getLogger(__name__)


async def allocate_instance_ids(redis: RedisClient, prefix: str, count: int) -> list[str]:
    """``<prefix>-<n>`` ids, n from a per-prefix counter (never reused)."""
    last = int(await redis.incrby(keys.prefix_sequence(prefix), count))
    return [f"{prefix}-{n}" for n in range(last - count + 1, last + 1)]


class RuntimeHost:
    """Hosts instances, their shared step-slot settings and the HTTP API."""

    def __init__(
        self,
        redis: RedisClient,
        config: InstanceConfig,
        *,
        instances: int = 1,
        instance_ids: list[str] | None = None,
        http_host: str = "127.0.0.1",
        http_port: int | None = None,
        advertise_host: str | None = None,
        wait_for_control_plane_s: float = 0.0,
        settings_store: SettingsStore | None = None,
        handlers: HandlerRegistry | None = None,
        token: str | None = None,
        payloads: PayloadOffload | None = None,
    ) -> None:
        self.payloads = payloads
        """Large outputs to the durable payload store (``airt runtime`` opens the history);
        None: every output stays in Redis."""
        if instances < 1:
            raise ValueError(f"instances must be >= 1, got {instances}")
        if config.provider == "http" and not token:
            raise ConfigError(
                f"a runtime with the http provider needs a runtime token ({RUNTIME_TOKEN_ENV}): "
                "without one its run intake would take runs from anyone who reaches it"
            )
        self.redis = redis
        self.config = config
        self.count = instances
        self.instance_ids = instance_ids
        self.http_host = http_host
        self.http_port = http_port
        self.advertise_host = advertise_host
        self.wait_for_control_plane_s = wait_for_control_plane_s
        self.control_plane_id: str | None = None
        self.settings_store = settings_store
        self.handlers = handlers
        self.token = token or None
        """Bearer token of the intake and settings API; None: both answer 401."""
        self.metrics = RuntimeMetrics()
        self.instances: list[RuntimeInstance] = []
        self._server: uvicorn.Server | None = None
        self._server_task: asyncio.Task[None] | None = None
        self.endpoint = ""

    async def start(self) -> None:
        # The intake's port first: one in use is refused before anything is registered.
        port = self.http_port
        sock = None if port is None else listen_socket(self.http_host, port, "--http-port")
        limit = self.config.max_concurrent_step_tasks
        if self.settings_store is not None:
            limit = self.settings_store.load().max_concurrent_step_tasks  # bad file fails startup
        ids = self.instance_ids
        if ids is None:
            if self.config.instance_id and self.count == 1:
                ids = [self.config.instance_id]
            else:
                ids = await allocate_instance_ids(
                    self.redis, self.config.runtime_prefix, self.count
                )
        # Resolve the control plane's identity once; shutdown reuses it (no rediscovery).
        self.control_plane_id = await resolve_control_plane_id(
            self.redis, wait_s=self.wait_for_control_plane_s
        )
        if sock is not None:
            await self._start_http(sock)
        for iid in ids:
            slots = StepSlotController(limit, on_admit=self._slot_admitted(iid))
            hooks = InstanceHooks(
                on_step=self._step_observed(iid),
                on_run_state=self._run_state(iid),
                on_loop_error=self._loop_error(iid),
            )
            inst = RuntimeInstance(
                self.redis,
                self.config,
                iid,
                endpoint=self.endpoint,
                handlers=self.handlers,
                slots=slots,
                hooks=hooks,
                payloads=self.payloads,
            )
            inst.pool.observer = hooks.on_step
            inst.control_plane_id = self.control_plane_id
            self.instances.append(inst)
            self.metrics.track(inst)
        if self.settings_store is not None:
            self.settings_store.subscribe(self._apply_settings)
        await asyncio.gather(*(i.start() for i in self.instances))

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        await asyncio.gather(*(i.stop(drain_timeout_s=drain_timeout_s) for i in self.instances))
        if self._server is not None:
            self._server.should_exit = True
            if self._server_task is not None:
                with contextlib.suppress(Exception):
                    await self._server_task

    def _apply_settings(self, settings: RuntimeSettings) -> None:
        """Live settings change: raising the limit admits waiters, lowering never pre-empts."""
        for inst in self.instances:
            inst.slots.set_limit(settings.max_concurrent_step_tasks)

    @property
    def ready(self) -> bool:
        """Every instance registered and none of their loops failing."""
        return (
            bool(self.instances)
            and all(i.registered.is_set() for i in self.instances)
            and not self.unhealthy()
        )

    def unhealthy(self) -> dict[str, list[str]]:
        """Instance id -> its failing loops, for the instances that have some."""
        return {i.instance_id: loops for i in self.instances if (loops := i.unhealthy_loops())}

    def instance(self, instance_id: str) -> RuntimeInstance | None:
        return next((i for i in self.instances if i.instance_id == instance_id), None)

    # -- hooks ----------------------------------------------------------------------

    # The per-step hooks keep their labelled children: ``labels()`` takes a lock and
    # builds a key on every call, several times a run.

    def _slot_admitted(self, iid: str) -> Any:
        wait = self.metrics.slot_wait_seconds.labels(iid)

        def hook(execution_id: str, wait_s: float) -> None:
            wait.observe(wait_s)

        return hook

    def _step_observed(self, iid: str) -> Any:
        seconds_of = self.metrics.step_seconds.labels(iid)
        counters: dict[str, Any] = {}

        def hook(execution_id: str, step_id: str, outcome: str, seconds: float) -> None:
            counter = counters.get(outcome)
            if counter is None:
                counter = counters[outcome] = self.metrics.steps.labels(iid, outcome)
            counter.inc()
            seconds_of.observe(seconds)

        return hook

    def _loop_error(self, iid: str) -> Any:
        def hook(loop: str, error: BaseException) -> None:
            self.metrics.loop_errors.labels(iid, loop).inc()

        return hook

    def _run_state(self, iid: str) -> Any:
        counters: dict[str, Any] = {}

        def hook(run_id: str, state: str) -> None:
            counter = counters.get(state)
            if counter is None:
                counter = counters[state] = self.metrics.run_transitions.labels(iid, state)
            counter.inc()

        return hook

    # -- HTTP -------------------------------------------------------------------------

    def app(self) -> FastAPI:
        """The host's HTTP API (:mod:`runtime_pod.http_api`)."""
        app = FastAPI(title="airuntime runtime host", version="v1")
        app.include_router(host_router(self))
        return app

    async def _start_http(self, sock: socket.socket) -> None:
        config = uvicorn.Config(
            self.app(),
            host=self.http_host,
            port=self.http_port or 0,
            log_level="warning",
            lifespan="off",
        )
        self._server = uvicorn.Server(config)
        self._server_task = asyncio.create_task(serve_on(self._server, sock))
        while not self._server.started:
            if self._server_task.done():
                self._server_task.result()
                raise RuntimeError("HTTP server stopped during startup")
            await asyncio.sleep(0.01)
        sock = self._server.servers[0].sockets[0]
        host, port = sock.getsockname()[:2]
        # Advertise an address others can reach (the pod IP on Kubernetes), not 0.0.0.0.
        self.endpoint = f"http://{self.advertise_host or host}:{port}"
