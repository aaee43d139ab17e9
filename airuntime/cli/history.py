"""``airt history``: the durable history's maintenance, starting with its schema.

Why this exists: a PostgreSQL history is migrated by an explicit step (a release's
pre-upgrade job, or an operator by hand) rather than by whichever process happens to
start first; ``airt history migrate`` is that step. It applies the migrations shipped
in the package (a no-op at head) to the database ``--dsn`` or
``AIRUNTIME_HISTORY_DSN`` names (default: the SQLite file under ``AIRUNTIME_HOME``,
which stores also migrate on open).

Exit codes: 0 migrated (or already at head), 1 the database could not be reached or a
migration failed (nothing applied), 2 an invalid DSN.
"""

from __future__ import annotations

from typing import Annotated

import typer

from airuntime.cli.common import (
    EXIT_FAILED,
    console,
    error_line,
    invalid,
    out,
    setting_option,
    settings_from_options,
)
from airuntime.core.errors import ConfigError
from airuntime.history.dsn import parse_dsn
from airuntime.history.errors import HistoryError
from airuntime.history.migrate import upgrade
from airuntime.history.settings import HistorySettings

history_app = typer.Typer(
    help="The durable history of runs: schema migrations.", no_args_is_help=True
)


@history_app.command("migrate")
def migrate(
    ctx: typer.Context,
    history_dsn: Annotated[
        str | None, setting_option(HistorySettings, "history_dsn", "--dsn")
    ] = None,
    history_timeout_s: Annotated[
        float | None,
        setting_option(
            HistorySettings,
            "history_timeout_s",
            "--timeout",
            text="Seconds to wait for the database (and its migration lock).",
        ),
    ] = None,
) -> None:
    """Bring the history database's schema to this release's head (a no-op at head)."""
    settings = settings_from_options(HistorySettings, ctx)
    try:
        dsn = parse_dsn(settings.dsn())
    except ConfigError as error:
        raise invalid(str(error)) from None
    try:
        result = upgrade(dsn, timeout_s=settings.history_timeout_s)
    except HistoryError as error:
        console.print(error_line(str(error)), highlight=False)
        raise typer.Exit(EXIT_FAILED) from None
    if result.before == result.after:
        out.print(
            f"history {dsn}: at revision {result.after} (nothing to do)",
            highlight=False,
        )
    else:
        before = result.before or "an empty database"
        out.print(
            f"history {dsn}: migrated from {before} to {result.after}",
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    app.add_typer(history_app, name="history")
