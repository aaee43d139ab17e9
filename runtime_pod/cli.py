"""``airt runtime``: start a runtime host, and change its settings live.

Registered into ``airt`` through the ``airuntime.commands`` entry point (``airuntime``
does not import this package). The host's settings are
:class:`~airuntime.fleet.instance_settings.InstanceSettings`: read from ``AIRUNTIME_*``
variables (how the operator's pod template configures a pod), each overridden by the
option of the same name when it is given. The runtime token
(``AIRUNTIME_RUNTIME_TOKEN``) has no option: a secret on a command line is visible to
every process of the machine. Once read, every credential-bearing variable is removed
from the process (:mod:`runtime_pod.environment`) before any step can run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from airuntime.cli.common import (
    configure_logs_or_exit,
    console,
    handler_policy_or_exit,
    invalid,
    secrets_keys_or_exit,
    setting_option,
    settings_from_options,
    tune_collector_or_exit,
)
from airuntime.core.errors import ConfigError
from airuntime.core.redis_client import connect
from airuntime.core.settings import REDIS_URL_ENV
from airuntime.fleet.instance_settings import RUNTIME_TOKEN_ENV, InstanceSettings
from airuntime.fleet.registry import Registry
from airuntime.fleet.tenancy import IsolationMode
from airuntime.history import HistorySettings, HistoryStore, open_history_at_start
from airuntime.history.payloads import payload_offload
from runtime_pod.environment import scrub_secrets
from runtime_pod.host import RuntimeHost
from runtime_pod.settings_store import SettingsError, SettingsStore, default_settings_path

runtime_app = typer.Typer(
    help="Runtime instances: run them, change their settings.", no_args_is_help=False
)
settings_app = typer.Typer(help="Live runtime settings (persisted in the settings file).")
runtime_app.add_typer(settings_app, name="settings")


_setting = partial(setting_option, InstanceSettings)
"""The option of a InstanceSettings field."""


_SETTINGS_FILE_ENV = InstanceSettings.env_var("settings_file")
_RedisUrl = Annotated[str | None, typer.Option("--redis-url", envvar=REDIS_URL_ENV)]
_SettingsFile = Annotated[Path | None, typer.Option(envvar=_SETTINGS_FILE_ENV)]
_Endpoint = Annotated[
    str | None, typer.Option(help="HTTP endpoint of a running host (applies live).")
]
_Instance = Annotated[str | None, typer.Option(help="Running instance id (endpoint looked up).")]
_Token = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar=RUNTIME_TOKEN_ENV,
        show_default=False,
        help=f"The host's runtime token (better: env {RUNTIME_TOKEN_ENV}).",
    ),
]


@runtime_app.callback(invoke_without_command=True)
def runtime(
    ctx: typer.Context,
    tenant_id: Annotated[str | None, _setting("tenant_id", "--tenant")] = None,
    tenant_group_id: Annotated[str | None, _setting("tenant_group_id", "--tenant-group")] = None,
    isolation_mode: Annotated[
        IsolationMode | None, _setting("isolation_mode", "--isolation-mode")
    ] = None,
    prefer_dedicated: Annotated[bool | None, _setting("prefer_dedicated")] = None,
    allow_shared_fallback: Annotated[bool | None, _setting("allow_shared_fallback")] = None,
    runtime_prefix: Annotated[str | None, _setting("runtime_prefix", "--prefix")] = None,
    instance_id: Annotated[str | None, _setting("instance_id", "--instance-id")] = None,
    instances: Annotated[
        int, typer.Option("--instances", help="Child instances in this process.")
    ] = 1,
    workers: Annotated[int | None, _setting("workers", "--workers")] = None,
    max_concurrent_runs: Annotated[int | None, _setting("max_concurrent_runs")] = None,
    queue_capacity: Annotated[int | None, _setting("queue_capacity")] = None,
    max_local_workers_per_execution: Annotated[
        int | None, _setting("max_local_workers_per_execution")
    ] = None,
    max_concurrent_step_tasks: Annotated[int | None, _setting("max_concurrent_step_tasks")] = None,
    provider: Annotated[str | None, _setting("provider")] = None,
    http_host: Annotated[str | None, _setting("http_host")] = None,
    http_port: Annotated[int | None, _setting("http_port")] = None,
    advertise_host: Annotated[str | None, _setting("advertise_host")] = None,
    heartbeat_s: Annotated[float | None, _setting("heartbeat_s")] = None,
    wait_for_control_plane_s: Annotated[float | None, _setting("wait_for_control_plane_s")] = None,
    lease_ms: Annotated[int | None, _setting("lease_ms")] = None,
    run_retention_s: Annotated[int | None, _setting("run_retention_s")] = None,
    settings_file: Annotated[Path | None, _setting("settings_file")] = None,
    redis_url: Annotated[str | None, _setting("redis_url", "--redis-url")] = None,
) -> None:
    """Start a runtime host on the shared Redis and run until SIGTERM/Ctrl-C."""
    if ctx.invoked_subcommand is not None:
        return
    settings = settings_from_options(InstanceSettings, ctx)
    if not settings.redis_url:
        raise invalid(
            f"airt runtime needs the shared Redis of the control plane: set {REDIS_URL_ENV} "
            "(an instance alone on a private server could never receive a run)"
        )
    if instances < 1:
        raise invalid(f"--instances: must be >= 1, got {instances}")
    if settings.provider == "http" and settings.runtime_token is None:
        raise invalid(
            f"the http provider needs a runtime token: set {RUNTIME_TOKEN_ENV} (the control "
            "plane sends it); without one the run intake would take runs from anyone"
        )
    store = _loaded_store(settings.settings_file)
    secrets_keys_or_exit()  # kept for the pools: the variable goes with the scrub below
    scrub_secrets()  # read above; no handler of this process may find them
    configure_logs_or_exit()
    handler_policy_or_exit()
    tune_collector_or_exit()
    try:
        asyncio.run(_serve(settings.redis_url, settings, instances, store))
    except ConfigError as exc:  # the intake's port in use, above all
        raise invalid(str(exc)) from None


def _loaded_store(path: Path | None) -> SettingsStore:
    """The live settings file, read once now: an invalid one stops startup (exit 2)."""
    store = SettingsStore(path or default_settings_path())
    try:
        store.load()
    except SettingsError as exc:
        raise invalid(str(exc)) from None
    return store


async def _serve(
    url: str, settings: InstanceSettings, instances: int, store: SettingsStore
) -> None:
    redis = connect(url, client_name="airt-runtime")
    history = await _payload_history()
    host = RuntimeHost(
        redis,
        settings.instance_config(),
        instances=instances,
        http_host=settings.http_host,
        http_port=settings.http_port,
        settings_store=store,
        advertise_host=settings.advertise_host,
        wait_for_control_plane_s=settings.wait_for_control_plane_s,
        token=settings.runtime_token.get_secret_value() if settings.runtime_token else None,
        payloads=payload_offload(history) if history is not None else None,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await host.start()
        ready = {
            "event": "ready",
            "instances": [i.instance_id for i in host.instances],
            "endpoint": host.endpoint,
        }
        console.print(json.dumps(ready), highlight=False, soft_wrap=True)
        await stop.wait()
    finally:
        await host.stop()
        await redis.aclose()
        if history is not None:
            await history.close()


async def _payload_history() -> HistoryStore | None:
    """The durable store large step outputs go to: only with AIRUNTIME_HISTORY_DSN set
    (a runtime pod's home is not where the history lives); otherwise outputs stay in
    Redis."""
    settings = HistorySettings()
    if not settings.history_dsn or settings.payload_threshold_bytes <= 0:
        return None
    return await open_history_at_start(settings)


# ignore_unknown_options: a negative VALUE ("-1") is an argument to validate and
# refuse with the setting's rule, not an unknown option.
@settings_app.command("set", context_settings={"ignore_unknown_options": True})
def settings_set(
    key: Annotated[str, typer.Argument(help="Setting name, e.g. max_concurrent_step_tasks.")],
    value: Annotated[str, typer.Argument(help="New value.")],
    endpoint: _Endpoint = None,
    instance: _Instance = None,
    token: _Token = None,
    settings_file: _SettingsFile = None,
    redis_url: _RedisUrl = None,
) -> None:
    """Change a runtime setting: live through a host's settings API, or in the file."""
    endpoint = _resolve_endpoint(endpoint, instance, redis_url)
    if endpoint:
        typer.echo(json.dumps(_live("PUT", endpoint, token, key=key, json={"value": value})))
        return
    store = SettingsStore(settings_file or default_settings_path())
    try:
        settings = store.set(key, value)
    except SettingsError as exc:
        raise invalid(str(exc)) from None
    typer.echo(json.dumps(settings.model_dump()))


def _resolve_endpoint(endpoint: str | None, instance: str | None, redis_url: str | None) -> str:
    """``--endpoint``, or the endpoint ``--instance`` registered; '' for neither."""
    if instance and not endpoint:
        if not redis_url:
            raise invalid(f"--instance needs {REDIS_URL_ENV} to find the instance's endpoint")
        endpoint = asyncio.run(_endpoint_of(redis_url, instance))
    return endpoint or ""


def _live(method: str, endpoint: str, token: str | None, *, key: str = "", json: Any = None) -> Any:
    """Call a running host's settings API with its runtime token; a refusal becomes
    exit 2 with its reason."""
    if not token:
        raise invalid(
            f"the settings API of a running host needs its token: set {RUNTIME_TOKEN_ENV}"
        )
    url = f"{endpoint.rstrip('/')}/v1/settings" + (f"/{key}" if key else "")
    try:
        resp = httpx.request(
            method, url, json=json, timeout=10, headers={"authorization": f"Bearer {token}"}
        )
    except httpx.HTTPError as exc:
        raise invalid(f"cannot reach {endpoint}: {exc}") from None
    if resp.status_code != 200:
        try:
            detail = resp.json().get("detail", resp.text)
        except ValueError:
            detail = resp.text
        raise invalid(f"{endpoint} answered {resp.status_code}: {detail}")
    return resp.json()


async def _endpoint_of(url: str, instance_id: str) -> str:
    redis = connect(url)
    try:
        desc = await Registry(redis).get(instance_id)
    finally:
        await redis.aclose()
    if desc is None or not desc.endpoint:
        raise invalid(f"runtime instance {instance_id!r} is not registered or has no HTTP endpoint")
    return desc.endpoint


@settings_app.command("show")
def settings_show(
    endpoint: _Endpoint = None,
    instance: _Instance = None,
    token: _Token = None,
    settings_file: _SettingsFile = None,
    redis_url: _RedisUrl = None,
) -> None:
    """Print the settings: live from a running host, or the persisted ones."""
    endpoint = _resolve_endpoint(endpoint, instance, redis_url)
    if endpoint:
        typer.echo(json.dumps(_live("GET", endpoint, token)))
        return
    store = SettingsStore(settings_file or default_settings_path())
    with contextlib.suppress(SettingsError):
        typer.echo(json.dumps(store.load().model_dump()))
        return
    raise invalid(f"{store.path}: invalid settings file")


def register(app: typer.Typer) -> None:
    """Entry point of the ``airuntime.commands`` group."""
    app.add_typer(runtime_app, name="runtime")
