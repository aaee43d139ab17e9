"""``airt up``: the whole system on one machine, in one command.

Starts (or uses) Redis — by default a private embedded Valkey —, loads the tenant
settings file into the tenant settings store, runs the control plane with its
background pump, scale-out watcher, requeuer and the ``local`` scale-out provider
(which starts ``airt runtime`` processes per tenant prefix on demand), and serves the
HTTP API. It writes a state file (``$AIRUNTIME_HOME/up.json``: Redis URL, API URL,
one development token per tenant) so ``airt submit``/``drain``/``runs`` find it.
Ctrl-C stops everything, runtime processes included.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
from importlib import resources
from pathlib import Path
from typing import Any

import uvicorn
from pydantic import BaseModel, ConfigDict

from airuntime.control_plane.api import begin_closing, close_app, create_app
from airuntime.control_plane.metrics import ControlPlaneMetrics
from airuntime.control_plane.rbac import Authenticator, TokenEntry
from airuntime.control_plane.scale_out import LocalScaler, ScaleOutProvider
from airuntime.control_plane.service import ControlPlane
from airuntime.control_plane.settings import ControlPlaneSettings
from airuntime.core.config_files import load_yaml_model, parse_yaml_model
from airuntime.core.errors import ConfigError
from airuntime.core.listening import listen_socket, serve_on
from airuntime.core.redis_client import RedisClient, connect
from airuntime.core.settings import HOME_ENV, airuntime_home
from airuntime.engine.secret_sealing import SECRETS_KEYS_ENV
from airuntime.fleet.tenancy import TenantSettings
from airuntime.history import open_history_at_start
from airuntime.history.settings import HistorySettings


class TenantsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenants: list[TenantSettings]


def state_file() -> Path:
    return airuntime_home() / "up.json"


def local_secrets_keys() -> None:
    """``airt up`` seals tenant secrets as a deployment does: without
    ``AIRUNTIME_SECRETS_KEYS`` it sets a key kept in ``$AIRUNTIME_HOME/secrets.keys``
    (made once, readable by this user only; kept so a stack on a persistent Redis opens
    what an earlier one sealed) for the control plane and the runtimes it starts."""
    if os.environ.get(SECRETS_KEYS_ENV):
        return
    path = airuntime_home() / "secrets.keys"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(36) + "\n")
    os.environ[SECRETS_KEYS_ENV] = path.read_text().strip()


def default_tenants_text() -> str:
    return resources.files("airuntime.devstack").joinpath("default_tenants.yaml").read_text()


DEFAULT_TENANTS_SOURCE = "airuntime/devstack/default_tenants.yaml"
"""Where ``airt up`` reads its tenants without ``--tenants-file`` (package data)."""


def load_tenants(path: Path | None) -> list[TenantSettings]:
    """Tenant settings from YAML; errors name the file, the entry and the field."""
    if path is not None:
        return load_yaml_model(path, TenantsFile).tenants
    source = DEFAULT_TENANTS_SOURCE
    return parse_yaml_model(default_tenants_text(), TenantsFile, source=source).tenants


async def serve_control_plane(
    redis_url: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8780,
    settings: ControlPlaneSettings | None = None,
    tenants: list[TenantSettings] | None = None,
    tenants_source: str = "the tenants file",
    auth: Authenticator | None = None,
    local_scaler: bool = True,
    scale_out_provider: ScaleOutProvider | None = None,
    state: dict[str, Any] | None = None,
    stop: asyncio.Event | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Run the control plane and its API until ``stop`` is set (or SIGINT/SIGTERM).

    ``tenants`` (read from ``tenants_source``) are published, and published again if
    Redis loses them (:meth:`ControlPlane.seed_tenants`). Without ``auth`` every tenant
    gets a development token (kept in ``state``); with
    ``state`` the stack's state file is written once the API listens, and removed at
    the end. ``sock``: the API's listening socket
    (:func:`~airuntime.core.listening.listen_socket`), else one is
    opened on ``host``:``port`` before anything else starts (a port in use is a
    :class:`ConfigError`, and nothing was started).
    """
    sock = sock or listen_socket(host, port)
    redis = connect(redis_url, client_name="airt-control-plane")
    settings = settings or ControlPlaneSettings()
    history_settings = HistorySettings()
    scaler = scale_out_provider or (
        _local_scaler(redis, redis_url, settings, history_settings) if local_scaler else None
    )
    # One store: the API reads runs from it, the archiver (when enabled) writes them;
    # the runtimes the local scaler starts write large step outputs to it.
    history = await open_history_at_start(history_settings)
    archive_to = history if settings.archiver_enabled else None
    cp = ControlPlane(redis, settings, scale_out_provider=scaler, history=archive_to)
    metrics = ControlPlaneMetrics(cp)
    if tenants:
        await cp.seed_tenants(tenants, tenants_source)
    if auth is None:
        auth = _development_auth(tenants or [], state)
    stop = _stop_on_signals(stop or asyncio.Event())
    app = create_app(cp, auth, metrics, history)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
        # What still runs then (a request under way, an MCP stream) is cut off after 5 s:
        # a stop never waits on a client.
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    await cp.start()
    serving = asyncio.create_task(serve_on(server, sock))
    try:
        api_url = await _listening(server, serving, f"{host}:{port}")
        if state is not None:
            state.update({"redis_url": redis_url, "api_url": api_url, "pid": os.getpid()})
            _write_state(state)
        await stop.wait()
    finally:
        begin_closing(app)  # followed event streams end: the shutdown does not wait on them
        server.should_exit = True
        with contextlib.suppress(Exception):
            await serving
        await close_app(app)
        await cp.stop()
        await history.close()
        if state is not None:
            with contextlib.suppress(FileNotFoundError):
                state_file().unlink()
        await redis.aclose()


def _local_scaler(
    redis: RedisClient, redis_url: str, settings: ControlPlaneSettings, history: HistorySettings
) -> LocalScaler:
    """The local scaler: its runtimes get the runtime token and the history's DSN (large
    step outputs go where this control plane reads them)."""
    token = settings.runtime_token.get_secret_value() if settings.runtime_token else None
    return LocalScaler(redis, redis_url, runtime_token=token, history_dsn=history.dsn())


def _development_auth(tenants: list[TenantSettings], state: dict[str, Any] | None) -> Authenticator:
    """One fresh operator token per tenant (recorded in ``state`` for the clients)."""
    tokens = {t.tenant_id: f"dev-{t.tenant_id}-{secrets.token_hex(8)}" for t in tenants}
    if state is not None:
        state["tokens"] = tokens
    return Authenticator(
        [
            TokenEntry(token=tok, user=f"dev-{tid}", tenant=tid, roles=["operator"])
            for tid, tok in tokens.items()
        ]
    )


def _stop_on_signals(stop: asyncio.Event) -> asyncio.Event:
    """``stop``, also set by SIGINT/SIGTERM where this loop can handle signals."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop


async def _listening(server: uvicorn.Server, serving: asyncio.Task[None], address: str) -> str:
    """The API's URL once the server listens (the bound port when 0 was asked)."""
    while not server.started:
        if serving.done():
            serving.result()
            raise ConfigError(f"the API server could not start on {address}")
        await asyncio.sleep(0.01)
    bound_host, bound_port = server.servers[0].sockets[0].getsockname()[:2]
    return f"http://{bound_host}:{bound_port}"


def _write_state(state: dict[str, Any]) -> None:
    """The state file, replaced atomically and readable by this user only (it holds tokens)."""
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.chmod(0o600)
    tmp.replace(path)


def running_stack() -> dict[str, Any] | None:
    """The state of an ``airt up`` still running in this home (its process alive), or
    None: no state file, an unreadable one, or one left by a process that is gone."""
    try:
        loaded = json.loads(state_file().read_text())
    except (OSError, ValueError):
        return None
    data: dict[str, Any] = loaded if isinstance(loaded, dict) else {}
    pid = data.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return data  # alive, another user's
    return data


def read_state() -> dict[str, Any]:
    path = state_file()
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"no local stack is running ({path} not found): start one with `airt up`"
        ) from None
    except OSError as exc:  # a home that is a file, a state file that is a directory...
        raise ConfigError(
            f"cannot read the local stack's state {path}: {exc.strerror} "
            f"(check {HOME_ENV}={airuntime_home()})"
        ) from None
    except ValueError:
        raise ConfigError(
            f"the local stack's state {path} is not JSON: stop `airt up` and start it again"
        ) from None
    return data
