"""The durable history's tables, as SQLAlchemy metadata: the schema at head.

Why this exists: the schema is versioned by Alembic migrations
(``airuntime/history/migrations/versions``), which are frozen in time; this module is
what the code expects *now*. A test upgrades an empty SQLite file and an empty
PostgreSQL database to head and compares both with this metadata, so a migration that
forgets a column or an index fails there. The stores query with raw SQL through
sqlite3/psycopg and never import this module (SQLAlchemy is the migration engine
only; the names they share live in :mod:`airuntime.history.names`).

The schema is the same on both backends: text ids, ``BIGINT`` epoch milliseconds,
JSON as ``TEXT`` (the archive is evidence, never queried inside; the same bytes on
both backends; a row that does not parse is reported as corrupt), payload bytes as
``BLOB``/``BYTEA``. The list indexes serve ``(created_ms, shared_run_id)`` descending
per tenant and per tenant with a status or pipeline filter.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    ForeignKeyConstraint,
    Index,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
)

from airuntime.history.names import (
    EVENTS,
    EXECUTIONS,
    HEAD_REVISION,
    PAYLOADS,
    SHARED_RUNS,
    VERSION_TABLE,
)

__all__ = [
    "EVENTS",
    "EXECUTIONS",
    "HEAD_REVISION",
    "PAYLOADS",
    "SHARED_RUNS",
    "VERSION_TABLE",
    "metadata",
]

metadata = MetaData()

executions = Table(
    EXECUTIONS,
    metadata,
    Column("execution_id", Text, nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("run_id", Text, nullable=True),
    Column("shared_run_id", Text, nullable=True),
    Column("pipeline_id", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("finished_ms", BigInteger, nullable=True),
    Column("plan_json", Text, nullable=False),
    Column("inputs_json", Text, nullable=False),
    Column("context_json", Text, nullable=False),
    Column("snapshot_json", Text, nullable=False),
    Column("step_slots_json", Text, nullable=True),
    Column("replay_of", Text, nullable=True),
    Column("archived_at_ms", BigInteger, nullable=False),
    PrimaryKeyConstraint("execution_id", name="pk_history_executions"),
    Index("ix_history_executions_tenant_created", "tenant_id", "created_ms", "execution_id"),
    Index("ix_history_executions_shared_run", "shared_run_id"),
    Index("ix_history_executions_run", "run_id"),
    Index("ix_history_executions_replay_of", "replay_of"),
)

events = Table(
    EVENTS,
    metadata,
    Column("execution_id", Text, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("entry_id", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column("fields_json", Text, nullable=False),
    PrimaryKeyConstraint("execution_id", "seq", name="pk_history_events"),
    ForeignKeyConstraint(
        ["execution_id"],
        [f"{EXECUTIONS}.execution_id"],
        name="fk_history_events_execution",
        ondelete="CASCADE",
    ),
)

shared_runs = Table(
    SHARED_RUNS,
    metadata,
    Column("shared_run_id", Text, nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("pipeline_id", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("finished_ms", BigInteger, nullable=True),
    Column("run_json", Text, nullable=False),
    Column("archived_at_ms", BigInteger, nullable=False),
    PrimaryKeyConstraint("shared_run_id", name="pk_history_shared_runs"),
    Index("ix_history_shared_runs_created", "created_ms", "shared_run_id"),
    Index("ix_history_shared_runs_tenant_created", "tenant_id", "created_ms", "shared_run_id"),
    Index(
        "ix_history_shared_runs_tenant_status",
        "tenant_id",
        "status",
        "created_ms",
        "shared_run_id",
    ),
    Index(
        "ix_history_shared_runs_tenant_pipeline",
        "tenant_id",
        "pipeline_id",
        "created_ms",
        "shared_run_id",
    ),
)

payloads = Table(
    PAYLOADS,
    metadata,
    Column("payload_id", Text, nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("execution_id", Text, nullable=False),
    Column("step_id", Text, nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("sha256", Text, nullable=False),
    Column("data", LargeBinary, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    PrimaryKeyConstraint("payload_id", name="pk_history_payloads"),
    Index("ix_history_payloads_execution", "execution_id"),
)
