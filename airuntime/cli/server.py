"""``airt control-plane``: the control plane as a long-running server.

Its settings are
:class:`~airuntime.control_plane.settings.ControlPlaneServerSettings`: read from
``AIRUNTIME_*`` variables (how the chart configures the control plane's pod), each
overridden by the option of the same name when it is given.
"""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from airuntime.cli.common import (
    collector_threshold_or_exit,
    configure_logs_or_exit,
    handler_policy_or_exit,
    invalid,
    setting_option,
    settings_from_options,
    tune_collector_or_exit,
)
from airuntime.control_plane.rbac import Authenticator
from airuntime.control_plane.settings import (
    ControlPlaneServerSettings,
    ScaleOutProviderKind,
    SubmitMode,
)
from airuntime.core.errors import ConfigError
from airuntime.core.settings import REDIS_URL_ENV
from airuntime.fleet.tenancy import TenantSettings

if TYPE_CHECKING:
    from airuntime.control_plane.scale_out import ScaleOutProvider


_setting = partial(setting_option, ControlPlaneServerSettings)
"""The option of a ControlPlaneServerSettings field."""


def control_plane(
    ctx: typer.Context,
    api_host: Annotated[str | None, _setting("api_host", "--host")] = None,
    api_port: Annotated[int | None, _setting("api_port", "--port")] = None,
    tokens_file: Annotated[Path | None, _setting("tokens_file")] = None,
    tenants_file: Annotated[Path | None, _setting("tenants_file")] = None,
    submit_mode: Annotated[SubmitMode | None, _setting("submit_mode")] = None,
    pump_enabled: Annotated[
        bool | None, _setting("pump_enabled", "--pump/--no-pump", text="Allow manual drain.")
    ] = None,
    background_pump: Annotated[bool | None, _setting("background_pump")] = None,
    scale_out_enabled: Annotated[
        bool | None, _setting("scale_out_enabled", "--scale-out/--no-scale-out")
    ] = None,
    scale_out_provider: Annotated[
        ScaleOutProviderKind | None, _setting("scale_out_provider")
    ] = None,
    namespace: Annotated[
        str | None, _setting("namespace", text="Namespace of ScaleOutRequests.")
    ] = None,
    mcp_enabled: Annotated[
        bool | None, _setting("mcp_enabled", "--mcp/--no-mcp", text="Serve MCP at /mcp.")
    ] = None,
    redis_url: Annotated[str | None, _setting("redis_url", "--redis-url")] = None,
) -> None:
    """Run the control plane (API, pump, admission, scale-out) on a shared Redis."""
    from airuntime.core.listening import listen_socket
    from airuntime.devstack.local_stack import serve_control_plane

    settings = settings_from_options(ControlPlaneServerSettings, ctx)
    if not settings.redis_url:
        raise invalid(
            f"airt control-plane needs a shared Redis: set {REDIS_URL_ENV} (or use `airt up`)"
        )
    collector = collector_threshold_or_exit()
    configure_logs_or_exit()
    handler_policy_or_exit()
    auth, tenants = _access(settings)
    try:
        sock = listen_socket(settings.api_host, settings.api_port)
    except ConfigError as exc:
        raise invalid(str(exc)) from None
    tune_collector_or_exit(collector)
    try:
        asyncio.run(
            serve_control_plane(
                settings.redis_url,
                host=settings.api_host,
                port=settings.api_port,
                sock=sock,
                settings=settings.control_plane_settings(),
                tenants=tenants,
                tenants_source=str(settings.tenants_file),
                auth=auth,
                local_scaler=settings.scale_out_provider is ScaleOutProviderKind.LOCAL,
                scale_out_provider=_kubernetes_provider(settings),
            )
        )
    except ConfigError as exc:
        raise invalid(str(exc)) from None


def _access(
    settings: ControlPlaneServerSettings,
) -> tuple[Authenticator, list[TenantSettings] | None]:
    """The API's tokens (required) and the tenants to publish, read from their files."""
    from airuntime.devstack.local_stack import load_tenants

    try:
        auth = Authenticator.from_file(settings.tokens_file) if settings.tokens_file else None
        tenants = load_tenants(settings.tenants_file) if settings.tenants_file else None
    except ConfigError as exc:
        raise invalid(str(exc)) from None
    if auth is None:
        tokens = ControlPlaneServerSettings.env_var("tokens_file")
        raise invalid(f"--tokens-file (or {tokens}) is required: the API needs bearer tokens")
    return auth, tenants


def _kubernetes_provider(settings: ControlPlaneServerSettings) -> ScaleOutProvider | None:
    """ScaleOutRequest resources in ``namespace``, fulfilled by the operator; None
    unless scale-out is enabled with the ``kubernetes`` provider."""
    if not (
        settings.scale_out_enabled
        and settings.scale_out_provider is ScaleOutProviderKind.KUBERNETES
    ):
        return None
    try:
        from airuntime.control_plane.scale_out.kubernetes import KubernetesScaleOutProvider

        return KubernetesScaleOutProvider(settings.namespace)
    except ImportError as exc:
        raise invalid(
            f"--scale-out-provider kubernetes needs the kubernetes client "
            f"(pip install 'airuntime[kubernetes]'): {exc}"
        ) from None


def register(app: typer.Typer) -> None:
    app.command("control-plane")(control_plane)
