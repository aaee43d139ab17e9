"""Alembic's entry point for the durable history: run the migrations on the
connection :mod:`airuntime.history.migrate` opened (inside its transaction and lock).

Only online migrations on a given connection are supported: the migrate module owns
how a database is reached (the DSN, SQLite's write lock, PostgreSQL's advisory lock),
so Alembic's own command line is not the way in (``airt history migrate`` is).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from airuntime.history.names import VERSION_TABLE
from airuntime.history.schema import metadata


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, Connection):
        raise RuntimeError(
            "the history migrations run through `airt history migrate` "
            "(airuntime.history.migrate), which passes a connection"
        )
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
