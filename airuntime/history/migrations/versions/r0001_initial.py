"""The first durable history schema: executions, their ledger, shared runs, payloads.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    _executions()
    _events()
    _shared_runs()
    _payloads()


def _executions() -> None:
    """One row per archived execution, and its listing indexes."""
    op.create_table(
        "history_executions",
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=True),
        sa.Column("shared_run_id", sa.Text(), nullable=True),
        sa.Column("pipeline_id", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("finished_ms", sa.BigInteger(), nullable=True),
        sa.Column("plan_json", sa.Text(), nullable=False),
        sa.Column("inputs_json", sa.Text(), nullable=False),
        sa.Column("context_json", sa.Text(), nullable=False),
        sa.Column("snapshot_json", sa.Text(), nullable=False),
        sa.Column("step_slots_json", sa.Text(), nullable=True),
        sa.Column("replay_of", sa.Text(), nullable=True),
        sa.Column("archived_at_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("execution_id", name="pk_history_executions"),
    )
    op.create_index(
        "ix_history_executions_tenant_created",
        "history_executions",
        ["tenant_id", "created_ms", "execution_id"],
    )
    op.create_index("ix_history_executions_shared_run", "history_executions", ["shared_run_id"])
    op.create_index("ix_history_executions_run", "history_executions", ["run_id"])
    op.create_index("ix_history_executions_replay_of", "history_executions", ["replay_of"])


def _events() -> None:
    """One row per ledger entry of an execution."""
    op.create_table(
        "history_events",
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("entry_id", sa.Text(), nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("fields_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("execution_id", "seq", name="pk_history_events"),
        sa.ForeignKeyConstraint(
            ["execution_id"],
            ["history_executions.execution_id"],
            name="fk_history_events_execution",
            ondelete="CASCADE",
        ),
    )


def _shared_runs() -> None:
    """One row per archived shared run, and its listing indexes."""
    op.create_table(
        "history_shared_runs",
        sa.Column("shared_run_id", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("pipeline_id", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("finished_ms", sa.BigInteger(), nullable=True),
        sa.Column("run_json", sa.Text(), nullable=False),
        sa.Column("archived_at_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("shared_run_id", name="pk_history_shared_runs"),
    )
    op.create_index(
        "ix_history_shared_runs_created", "history_shared_runs", ["created_ms", "shared_run_id"]
    )
    op.create_index(
        "ix_history_shared_runs_tenant_created",
        "history_shared_runs",
        ["tenant_id", "created_ms", "shared_run_id"],
    )
    op.create_index(
        "ix_history_shared_runs_tenant_status",
        "history_shared_runs",
        ["tenant_id", "status", "created_ms", "shared_run_id"],
    )
    op.create_index(
        "ix_history_shared_runs_tenant_pipeline",
        "history_shared_runs",
        ["tenant_id", "pipeline_id", "created_ms", "shared_run_id"],
    )


def _payloads() -> None:
    """Large step outputs, by content hash."""
    # No foreign key to the execution: a large output is stored when its step
    # completes, long before the execution is archived.
    op.create_table(
        "history_payloads",
        sa.Column("payload_id", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("step_id", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.Text(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("payload_id", name="pk_history_payloads"),
    )
    op.create_index("ix_history_payloads_execution", "history_payloads", ["execution_id"])


def downgrade() -> None:
    op.drop_table("history_payloads")
    op.drop_table("history_shared_runs")
    op.drop_table("history_events")
    op.drop_table("history_executions")
