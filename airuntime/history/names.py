"""The names the stores and the migrations agree on, without SQLAlchemy.

Why this exists: the stores query with raw SQL and must not pay for importing
SQLAlchemy (the migration engine) at every ``airt`` start; they need only the table
names and the revision the code expects. :mod:`airuntime.history.schema` builds the
tables from the same names.
"""

from __future__ import annotations

from typing import Final

__all__ = ["EVENTS", "EXECUTIONS", "HEAD_REVISION", "PAYLOADS", "SHARED_RUNS", "VERSION_TABLE"]

HEAD_REVISION: Final = "0001"
"""The newest migration's revision (a test keeps it equal to Alembic's head). The
stores compare the database's revision with it without loading Alembic."""

VERSION_TABLE: Final = "airuntime_history_version"
"""Alembic's version table, named so it cannot meet another application's."""

EXECUTIONS: Final = "history_executions"
EVENTS: Final = "history_events"
SHARED_RUNS: Final = "history_shared_runs"
PAYLOADS: Final = "history_payloads"
