"""Open the durable history a DSN names: SQLite or PostgreSQL behind one interface.

Why this exists: callers (the archiver, the resolver, ``airt history``) hold a
:class:`~airuntime.history.store.HistoryStore` and never choose an implementation; the
DSN does (``AIRUNTIME_HISTORY_DSN``; with none, the SQLite file under
``AIRUNTIME_HOME``).
"""

from __future__ import annotations

from airuntime.core.errors import ConfigError
from airuntime.core.settings import HOME_ENV
from airuntime.history.dsn import Backend, parse_dsn
from airuntime.history.errors import HistoryError
from airuntime.history.settings import HistorySettings
from airuntime.history.store import HistoryStore

__all__ = ["open_history_at_start", "open_history_store"]


async def open_history_store(
    dsn: str | None = None, *, settings: HistorySettings | None = None
) -> HistoryStore:
    """Open the store ``dsn`` names (default: ``settings``' DSN, read from the
    environment when not given). A SQLite file is created and migrated when needed; a
    PostgreSQL pool connects in the background (see each implementation).

    ConfigError for a DSN that names no backend; HistoryUnavailable when a SQLite file
    cannot be opened.
    """
    settings = settings or HistorySettings()
    parsed = parse_dsn(dsn or settings.dsn())
    if parsed.backend is Backend.SQLITE:
        from airuntime.history.sqlite import SqliteHistoryStore

        return await SqliteHistoryStore.open(parsed, timeout_s=settings.history_timeout_s)
    from airuntime.history.postgres import PostgresHistoryStore

    return await PostgresHistoryStore.open(
        parsed,
        min_size=settings.history_pool_min_size,
        max_size=settings.history_pool_max_size,
        timeout_s=settings.history_timeout_s,
        auto_migrate=settings.history_auto_migrate,
    )


async def open_history_at_start(settings: HistorySettings | None = None) -> HistoryStore:
    """:func:`open_history_store` for a process that is starting (a control plane, a
    runtime, ``airt mcp``): a store that cannot be opened at all -- a SQLite file in a
    directory that cannot exist, a file that is not a database -- is a
    :class:`ConfigError` naming the setting, so the process refuses to start (exit 2,
    one line) instead of ending in a traceback. A PostgreSQL server that is down does
    not stop a start: its pool connects in the background."""
    settings = settings or HistorySettings()
    try:
        return await open_history_store(settings=settings)
    except HistoryError as error:
        where = HistorySettings.env_var("history_dsn")
        if not settings.history_dsn:
            where += f", or {HOME_ENV} for the default file"
        raise ConfigError(f"{error} (set {where})") from None
