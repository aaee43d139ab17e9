"""What can go wrong with the durable history, as the three answers a caller acts on.

Why this exists: the archiver, the resolver and the API must decide what to do without
knowing which database is behind the store. Each backend translates its driver's
exceptions (sqlite3, psycopg, psycopg_pool) once, here-shaped, so a caller catches:

* :class:`HistoryUnavailable` -- the store cannot be reached or is busy/locked right
  now. Retryable: the outbox keeps the run, the resolver answers from Redis alone.
  An archive that is down never blocks execution.
* :class:`CorruptRecord` -- a stored row cannot be read back (unparseable JSON, a
  payload whose bytes do not match its hash). Reported with the table and the key,
  never a crash of the caller.
* :class:`HistoryError` -- anything else the database refused (a constraint, a
  schema the code does not know). Not retryable as such.

:class:`InvalidCursor` is a caller's mistake (a list cursor that this store did not
produce), a ``ValueError`` so an API answers 400.
"""

from __future__ import annotations

from airuntime.core.errors import AirError

__all__ = [
    "CorruptRecord",
    "HistoryError",
    "HistoryUnavailable",
    "InvalidCursor",
    "SchemaOutOfDate",
]


class HistoryError(AirError):
    """The durable history refused an operation (not retryable as such)."""


class HistoryUnavailable(HistoryError):
    """The durable history cannot be reached (or is locked) now; retry later."""


class SchemaOutOfDate(HistoryUnavailable):
    """The database's schema is not the one this release needs: run
    ``airt history migrate`` (retryable: another process may be migrating it)."""


class CorruptRecord(HistoryError):
    """A stored row cannot be read back; ``table`` and ``key`` name it."""

    def __init__(self, table: str, key: str, reason: str) -> None:
        super().__init__(f"corrupt row in {table} (key {key}): {reason}")
        self.table = table
        self.key = key
        self.reason = reason


class InvalidCursor(HistoryError, ValueError):
    """A list cursor that this store did not produce (or from another filter)."""
