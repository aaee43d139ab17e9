"""Apply the durable history's schema migrations (Alembic) to a database.

Why this exists: the schema changes with releases, and every database behind a store
-- a user's SQLite file, a production PostgreSQL -- must reach the same head through
the same versioned steps. ``airt history migrate`` calls :func:`upgrade`; a SQLite
store calls it when it opens a file that is not at head; a PostgreSQL store does when
``AIRUNTIME_HISTORY_AUTO_MIGRATE`` is set.

Migrating is safe to run from several processes at once (``airt up`` opens one file
from several): the whole upgrade, including reading the current revision, runs in one
transaction that first takes the database's write lock -- ``BEGIN IMMEDIATE`` on
SQLite, a transaction-scoped advisory lock on PostgreSQL -- so a second migrator
waits, then finds the database at head and does nothing. DDL is transactional on
both, so a failed migration leaves the previous revision intact.

Synchronous (Alembic and SQLAlchemy are): async callers run it in a thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from airuntime.history.dsn import Backend, HistoryDsn
from airuntime.history.errors import HistoryError, HistoryUnavailable
from airuntime.history.names import VERSION_TABLE

__all__ = ["MigrationResult", "current_revision", "head_revision", "upgrade"]

SCRIPT_LOCATION: Final = "airuntime.history:migrations"
_ADVISORY_LOCK_KEY: Final = 0x41495254_48495354  # "AIRTHIST": one key for every migrator


@dataclass(frozen=True, slots=True)
class MigrationResult:
    before: str | None
    """The revision found (None: an empty database)."""
    after: str
    """The revision reached (the head)."""


def _config(connection: Any = None) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision of the shipped migrations."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config()).get_current_head()
    if head is None:
        raise HistoryError("the history migrations have no head revision")
    return head


def _engine(dsn: HistoryDsn, timeout_s: float) -> Any:
    from sqlalchemy import create_engine, event
    from sqlalchemy.pool import NullPool

    if dsn.backend is Backend.POSTGRESQL:
        return create_engine(
            dsn.sqlalchemy_url,
            poolclass=NullPool,
            connect_args={"connect_timeout": max(1, round(timeout_s))},
        )
    dsn.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(dsn.sqlalchemy_url, poolclass=NullPool)

    # pysqlite opens transactions on its own terms (not before DDL); take them over so
    # the whole upgrade is one transaction that holds the write lock from its start.
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        dbapi_connection.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


@contextmanager
def _locked_transaction(dsn: HistoryDsn, timeout_s: float) -> Iterator[Any]:
    """A connection in a transaction that holds the migration lock; errors translated."""
    from alembic.util import CommandError
    from sqlalchemy import exc, text

    engine = _engine(dsn, timeout_s)
    try:
        with engine.begin() as connection:
            if dsn.backend is Backend.POSTGRESQL:
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _ADVISORY_LOCK_KEY}
                )
            yield connection
    except exc.OperationalError as error:
        raise HistoryUnavailable(f"history {dsn}: {error.orig or error}") from error
    except exc.SQLAlchemyError as error:
        raise HistoryError(f"history {dsn}: {error}") from error
    except CommandError as error:
        raise HistoryError(f"history {dsn}: migration failed: {error}") from error
    finally:
        engine.dispose()


def _revision_of(connection: Any) -> str | None:
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    revision: str | None = context.get_current_revision()
    return revision


def current_revision(dsn: HistoryDsn, *, timeout_s: float = 30.0) -> str | None:
    """The database's revision (None: never migrated)."""
    with _locked_transaction(dsn, timeout_s) as connection:
        return _revision_of(connection)


def upgrade(dsn: HistoryDsn, *, timeout_s: float = 30.0) -> MigrationResult:
    """Bring the database to head (a no-op at head); HistoryUnavailable when it
    cannot be reached, HistoryError when a migration fails (nothing is applied)."""
    from alembic import command

    with _locked_transaction(dsn, timeout_s) as connection:
        before = _revision_of(connection)
        command.upgrade(_config(connection), "head")
        after = _revision_of(connection)
    if after is None:
        raise HistoryError(f"history {dsn}: no revision recorded after the upgrade")
    return MigrationResult(before, after)
