"""``airt runtime``: start a runtime host, and change its settings live.

Registered into ``airt`` through the ``airuntime.commands`` entry point (``airuntime``
does not import this package). Every option defaults to an ``AIRUNTIME_*``
environment variable, which is how the operator's pod template configures a pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from pathlib import Path
from typing import Annotated

import httpx
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from airuntime.core.redis_client import connect
from airuntime.devstack.embedded import ENV_VAR
from airuntime.fleet.registry import Registry
from airuntime.fleet.tenancy import IsolationMode
from runtime_pod.config import InstanceConfig
from runtime_pod.host import RuntimeHost
from runtime_pod.settings_store import SettingsError, SettingsStore, default_settings_path

console = Console(stderr=True)
runtime_app = typer.Typer(
    help="Runtime instances: run them, change their settings.", no_args_is_help=False
)
settings_app = typer.Typer(help="Live runtime settings (persisted in the settings file).")
runtime_app.add_typer(settings_app, name="settings")


def _invalid(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


@runtime_app.callback(invoke_without_command=True)
def runtime(
    ctx: typer.Context,
    tenant: Annotated[str | None, typer.Option("--tenant", envvar="AIRUNTIME_TENANT_ID")] = None,
    tenant_group: Annotated[
        str | None, typer.Option("--tenant-group", envvar="AIRUNTIME_TENANT_GROUP_ID")
    ] = None,
    isolation_mode: Annotated[
        IsolationMode, typer.Option("--isolation-mode", envvar="AIRUNTIME_ISOLATION_MODE")
    ] = IsolationMode.SHARED,
    prefer_dedicated: Annotated[bool, typer.Option(envvar="AIRUNTIME_PREFER_DEDICATED")] = False,
    allow_shared_fallback: Annotated[
        bool, typer.Option(envvar="AIRUNTIME_ALLOW_SHARED_FALLBACK")
    ] = True,
    prefix: Annotated[
        str, typer.Option("--prefix", envvar="AIRUNTIME_RUNTIME_PREFIX")
    ] = "runtime-instance",
    instance_id: Annotated[
        str | None, typer.Option("--instance-id", envvar="AIRUNTIME_INSTANCE_ID")
    ] = None,
    instances: Annotated[
        int, typer.Option("--instances", help="Child instances in this process.")
    ] = 1,
    workers: Annotated[int, typer.Option("--workers", envvar="AIRUNTIME_WORKERS")] = 10,
    max_concurrent_runs: Annotated[int, typer.Option(envvar="AIRUNTIME_MAX_CONCURRENT_RUNS")] = 3,
    queue_capacity: Annotated[int, typer.Option(envvar="AIRUNTIME_QUEUE_CAPACITY")] = 100,
    max_local_workers_per_execution: Annotated[
        int, typer.Option(envvar="AIRUNTIME_MAX_LOCAL_WORKERS_PER_EXECUTION")
    ] = 4,
    max_concurrent_step_tasks: Annotated[
        int, typer.Option(envvar="AIRUNTIME_MAX_CONCURRENT_STEP_TASKS")
    ] = 0,
    provider: Annotated[str, typer.Option(envvar="AIRUNTIME_PROVIDER")] = "redis",
    http_host: Annotated[str, typer.Option(envvar="AIRUNTIME_HTTP_HOST")] = "127.0.0.1",
    http_port: Annotated[
        int, typer.Option(envvar="AIRUNTIME_HTTP_PORT", help="0 = any free port")
    ] = 0,
    advertise_host: Annotated[
        str | None,
        typer.Option(envvar="AIRUNTIME_ADVERTISE_HOST", help="Address published in the registry."),
    ] = None,
    heartbeat_s: Annotated[float, typer.Option(envvar="AIRUNTIME_HEARTBEAT_S")] = 2.0,
    wait_for_control_plane_s: Annotated[
        float,
        typer.Option(
            envvar="AIRUNTIME_WAIT_FOR_CONTROL_PLANE_S",
            help="Wait this long for the control plane's discovery record at startup.",
        ),
    ] = 0.0,
    lease_ms: Annotated[int, typer.Option(envvar="AIRUNTIME_LEASE_MS")] = 15_000,
    settings_file: Annotated[Path | None, typer.Option(envvar="AIRUNTIME_SETTINGS_FILE")] = None,
    redis_url: Annotated[str | None, typer.Option("--redis-url", envvar=ENV_VAR)] = None,
) -> None:
    """Start a runtime host on the shared Redis and run until SIGTERM/Ctrl-C."""
    if ctx.invoked_subcommand is not None:
        return
    if not redis_url:
        raise _invalid(
            f"airt runtime needs the shared Redis of the control plane: set {ENV_VAR} "
            "(an instance alone on a private server could never receive a run)"
        )
    try:
        config = InstanceConfig(
            tenant_id=tenant or None,
            tenant_group_id=tenant_group or None,
            isolation_mode=isolation_mode,
            prefer_dedicated=prefer_dedicated,
            allow_shared_fallback=allow_shared_fallback,
            runtime_prefix=prefix,
            instance_id=instance_id or None,
            workers=workers,
            max_concurrent_runs=max_concurrent_runs,
            queue_capacity=queue_capacity,
            max_local_workers_per_execution=max_local_workers_per_execution,
            max_concurrent_step_tasks=max_concurrent_step_tasks,
            provider=provider,
            heartbeat_s=heartbeat_s,
            lease_ms=lease_ms,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "settings"
        raise _invalid(f"{field}: {err['msg']} (value={err.get('input')!r})") from None
    if instances < 1:
        raise _invalid(f"--instances: must be >= 1, got {instances}")
    store = SettingsStore(settings_file or default_settings_path())
    try:
        store.load()
    except SettingsError as exc:
        raise _invalid(str(exc)) from None
    asyncio.run(
        _serve(
            redis_url,
            config,
            instances,
            http_host,
            http_port,
            store,
            advertise_host,
            wait_for_control_plane_s,
        )
    )


async def _serve(
    url: str,
    config: InstanceConfig,
    instances: int,
    http_host: str,
    http_port: int,
    store: SettingsStore,
    advertise_host: str | None = None,
    wait_for_control_plane_s: float = 0.0,
) -> None:
    redis = connect(url, client_name="airt-runtime")
    host = RuntimeHost(
        redis,
        config,
        instances=instances,
        http_host=http_host,
        http_port=http_port,
        settings_store=store,
        advertise_host=advertise_host or None,
        wait_for_control_plane_s=wait_for_control_plane_s,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await host.start()
        console.print(
            json.dumps(
                {
                    "event": "ready",
                    "instances": [i.instance_id for i in host.instances],
                    "endpoint": host.endpoint,
                }
            ),
            highlight=False,
            soft_wrap=True,
        )
        await stop.wait()
    finally:
        await host.stop()
        await redis.aclose()


# ignore_unknown_options: a negative VALUE ("-1") is an argument to validate and
# refuse with the setting's rule, not an unknown option.
@settings_app.command("set", context_settings={"ignore_unknown_options": True})
def settings_set(
    key: Annotated[str, typer.Argument(help="Setting name, e.g. max_concurrent_step_tasks.")],
    value: Annotated[str, typer.Argument(help="New value.")],
    endpoint: Annotated[
        str | None, typer.Option(help="HTTP endpoint of a running host (applies live).")
    ] = None,
    instance: Annotated[
        str | None, typer.Option(help="Running instance id (endpoint looked up).")
    ] = None,
    settings_file: Annotated[Path | None, typer.Option(envvar="AIRUNTIME_SETTINGS_FILE")] = None,
    redis_url: Annotated[str | None, typer.Option("--redis-url", envvar=ENV_VAR)] = None,
) -> None:
    """Change a runtime setting: live through a host's settings API, or in the file."""
    if instance and not endpoint:
        if not redis_url:
            raise _invalid(f"--instance needs {ENV_VAR} to find the instance's endpoint")
        endpoint = asyncio.run(_endpoint_of(redis_url, instance))
    if endpoint:
        try:
            resp = httpx.put(
                f"{endpoint.rstrip('/')}/v1/settings/{key}", json={"value": value}, timeout=10
            )
        except httpx.HTTPError as exc:
            raise _invalid(f"cannot reach {endpoint}: {exc}") from None
        if resp.status_code != 200:
            raise _invalid(resp.json().get("detail", resp.text))
        typer.echo(json.dumps(resp.json()))
        return
    store = SettingsStore(settings_file or default_settings_path())
    try:
        settings = store.set(key, value)
    except SettingsError as exc:
        raise _invalid(str(exc)) from None
    typer.echo(json.dumps(settings.model_dump()))


async def _endpoint_of(url: str, instance_id: str) -> str:
    redis = connect(url)
    try:
        desc = await Registry(redis).get(instance_id)
    finally:
        await redis.aclose()
    if desc is None or not desc.endpoint:
        raise _invalid(
            f"runtime instance {instance_id!r} is not registered or has no HTTP endpoint"
        )
    return desc.endpoint


@settings_app.command("show")
def settings_show(
    settings_file: Annotated[Path | None, typer.Option(envvar="AIRUNTIME_SETTINGS_FILE")] = None,
) -> None:
    """Print the persisted settings."""
    store = SettingsStore(settings_file or default_settings_path())
    with contextlib.suppress(SettingsError):
        typer.echo(json.dumps(store.load().model_dump()))
        return
    raise _invalid(f"{store.path}: invalid settings file")


def register(app: typer.Typer) -> None:
    """Entry point of the ``airuntime.commands`` group."""
    app.add_typer(runtime_app, name="runtime")
