"""``airt secrets list | set | delete``: a tenant's secrets through the control plane's API.

Why this exists: an ``http`` step sends a tenant's credential as ``${secrets.NAME}``
(:mod:`airuntime.engine.secret_refs`) only once someone stored it; this is the terminal's
way to. A value is read from standard input (``printf %s "$TOKEN" | airt secrets set
NAME``) or typed at a hidden prompt, never taken from the command line, where the
shell's history and every local user's ``ps`` would see it; nothing prints a value back.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from airuntime.cli.client import _Api, _Token, api_call, tenant_target
from airuntime.cli.common import RedisUrl, invalid, out
from airuntime.cli.listing import Column, Output, local_time, output_format, print_listing
from airuntime.core.settings import REDIS_URL_ENV

secrets_app = typer.Typer(
    help="A tenant's secrets (values http steps send as ${secrets.NAME}): list, set, delete.",
    no_args_is_help=True,
)

_Tenant = Annotated[
    str | None,
    typer.Option(
        help="Whose secrets: this tenant (and, on the local stack, its token). Default: "
        "the local stack's 'default'; required with --api/--token."
    ),
]
_Name = Annotated[str, typer.Argument(help="The secret's name (letters, digits, _).")]


SECRET_COLUMNS = (
    Column("name", lambda s: s["name"], is_id=True),
    Column("set at", lambda s: local_time(s["updated_at_ms"]), no_wrap=True),
    Column("set by", lambda s: s["updated_by"]),
    Column("sealed", lambda s: s.get("sealed_with") or "no", no_wrap=True),
)


@secrets_app.command("list")
def list_secrets(
    tenant: _Tenant = None, output: Output = None, api: _Api = None, token: _Token = None
) -> None:
    """The tenant's secrets by name, when and by whom each was set (never a value)."""
    fmt = output_format(output, False)
    base, tok, who = tenant_target(api, token, tenant)

    def fetch() -> tuple[Any, list[Any]]:
        body = api_call("GET", f"{base}/v1/tenants/{who}/secrets", tok, timeout=30)
        return body, body

    print_listing(fetch, title=f"secrets of {who}", columns=SECRET_COLUMNS, fmt=fmt)


def _read_value(name: str) -> str:
    """The value from standard input (one trailing newline dropped), or typed twice at a
    hidden prompt when standard input is a terminal."""
    if sys.stdin.isatty():
        value: str = typer.prompt(
            f"value of {name}", hide_input=True, confirmation_prompt=True, err=True
        )
        return value
    value = sys.stdin.read()
    if value.endswith("\r\n"):
        return value[:-2]
    return value[:-1] if value.endswith("\n") else value


@secrets_app.command("set")
def set_secret(name: _Name, tenant: _Tenant = None, api: _Api = None, token: _Token = None) -> None:
    """Set a secret (created or replaced); the value comes from standard input, or a
    hidden prompt: `printf %s "$TOKEN" | airt secrets set API_TOKEN`."""
    base, tok, who = tenant_target(api, token, tenant)
    value = _read_value(name)
    body = api_call(
        "PUT", f"{base}/v1/tenants/{who}/secrets/{name}", tok, timeout=30, json={"value": value}
    )
    out.print(f"secret {body['name']} of {who} set", highlight=False)


@secrets_app.command("delete")
def delete_secret(
    name: _Name, tenant: _Tenant = None, api: _Api = None, token: _Token = None
) -> None:
    """Forget a secret: steps that name it fail from then on, naming it."""
    base, tok, who = tenant_target(api, token, tenant)
    api_call(
        "DELETE", f"{base}/v1/tenants/{who}/secrets/{name}", tok, timeout=30, expect_body=False
    )
    out.print(f"secret {name} of {who} deleted", highlight=False)


@secrets_app.command("reseal")
def reseal(redis_url: RedisUrl = None) -> None:
    """Seal every tenant's stored secrets under the first key of AIRUNTIME_SECRETS_KEYS
    (values stored as written too): after putting a new key first, before dropping the
    old one. Run by the platform's operators against the shared Redis; a value set
    meanwhile is left as its setter sealed it; one no listed key opens is named, and
    the exit status is 1."""
    import asyncio

    from airuntime.core.errors import ConfigError
    from airuntime.core.redis_client import connect
    from airuntime.engine.secret_sealing import SECRETS_KEYS_ENV, configured_sealer
    from airuntime.engine.tenant_secrets import ResealReport, TenantSecrets

    if not redis_url:
        raise invalid(
            f"--redis-url: airt secrets reseal works on the shared Redis: set {REDIS_URL_ENV}"
        )
    try:
        sealer = configured_sealer()
    except ConfigError as exc:
        raise invalid(str(exc)) from None
    if sealer is None:
        raise invalid(f"{SECRETS_KEYS_ENV}: not set; reseal seals under its first key")

    async def run() -> ResealReport:
        client = connect(redis_url)
        try:
            return await TenantSecrets(client, sealer=sealer).reseal()
        finally:
            await client.aclose()

    report = asyncio.run(run())
    out.print(
        f"sealed under key {sealer.fingerprint}: {report.sealed} resealed, {report.current} "
        f"already, {report.changed} set meanwhile (left as set)",
        highlight=False,
    )
    if report.unreadable:
        out.print(
            f"{len(report.unreadable)} no listed key opens (left as they are): "
            + ", ".join(report.unreadable),
            highlight=False,
        )
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(secrets_app, name="secrets")
