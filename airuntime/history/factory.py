"""Open the durable history a DSN names: SQLite or PostgreSQL behind one interface.

Why this exists: callers (the archiver, the resolver, ``airt history``) hold a
:class:`~airuntime.history.store.HistoryStore` and never choose an implementation; the
DSN does (``AIRUNTIME_HISTORY_DSN``; with none, the SQLite file under
``AIRUNTIME_HOME``).
"""

from __future__ import annotations

from airuntime.history.dsn import Backend, parse_dsn
from airuntime.history.settings import HistorySettings
from airuntime.history.store import HistoryStore

__all__ = ["open_history_store"]


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
