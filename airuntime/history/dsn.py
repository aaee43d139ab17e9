"""Which database a history DSN names, and how each tool must be given it.

Why this exists: one setting (``AIRUNTIME_HISTORY_DSN``) names the durable store, and
three consumers read it differently -- stdlib ``sqlite3`` wants a file path, psycopg a
libpq URI, SQLAlchemy (the migration engine) a URL naming its driver. Parsing happens
once, here, and a DSN that names neither backend is refused with the value (password
masked) before anything is opened.

Forms: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` (SQLAlchemy's
convention: the path follows the third slash, so ``sqlite:///$AIRUNTIME_HOME/history.db``
is absolute), and ``postgresql://`` or ``postgres://`` URIs as libpq reads them
(``?host=/socket/dir`` for a unix socket).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from airuntime.core.errors import ConfigError

__all__ = ["Backend", "HistoryDsn", "parse_dsn", "redact"]

_SQLITE = "sqlite:///"
_POSTGRES = ("postgresql://", "postgres://")


class Backend(StrEnum):
    SQLITE = "sqlite"
    POSTGRESQL = "postgresql"


def redact(dsn: str) -> str:
    """The DSN with any password replaced by ``***`` (for messages and logs)."""
    masked = re.sub(r"(://[^:/@?]*:)[^@/?]*@", r"\1***@", dsn)
    return re.sub(r"(password=)[^&\s]*", r"\1***", masked)


@dataclass(frozen=True, slots=True)
class HistoryDsn:
    """A parsed DSN: the backend, and what each consumer is given."""

    backend: Backend
    dsn: str

    @property
    def sqlite_path(self) -> Path:
        if self.backend is not Backend.SQLITE:
            raise ValueError(f"{redact(self.dsn)} is not a SQLite DSN")
        return Path(self.dsn[len(_SQLITE) :])

    @property
    def conninfo(self) -> str:
        """What psycopg connects with (the PostgreSQL URI as given)."""
        return self.dsn

    @property
    def sqlalchemy_url(self) -> str:
        """The URL of the migration engine: the same database through the same driver
        (``postgresql+psycopg``; sqlite3 for SQLite)."""
        if self.backend is Backend.SQLITE:
            return f"sqlite:///{self.sqlite_path}"
        rest = self.dsn.split("://", 1)[1]
        return f"postgresql+psycopg://{rest}"

    def __str__(self) -> str:
        return redact(self.dsn)


def parse_dsn(dsn: str) -> HistoryDsn:
    """Parse a history DSN; ConfigError (naming the value) when it is not one."""
    value = dsn.strip()
    if value.startswith(_SQLITE):
        path = value[len(_SQLITE) :]
        if not path or path == ":memory:" or "?" in path:
            raise ConfigError(
                f"history DSN {value!r}: a SQLite DSN names a file "
                "(sqlite:///relative.db or sqlite:////absolute/path.db), without options"
            )
        return HistoryDsn(Backend.SQLITE, value)
    if value.startswith(_POSTGRES):
        return HistoryDsn(Backend.POSTGRESQL, value)
    raise ConfigError(
        f"history DSN {redact(value)!r}: expected sqlite:///<path> or postgresql://..."
    )
