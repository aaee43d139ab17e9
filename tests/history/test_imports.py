"""What the history costs a process that does not use it: nothing heavy at import.

``airt`` registers ``airt history`` in every start, and the SQLite store is the
embedded default; neither may pull in SQLAlchemy/Alembic (the migration engine, loaded
only to migrate) or psycopg (loaded only for a PostgreSQL DSN).
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import airuntime.cli.app, airuntime.cli.history, airuntime.history.sqlite
heavy = ("sqlalchemy", "alembic", "psycopg", "psycopg_pool")
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in heavy})))
"""


def test_airt_and_the_sqlite_store_import_no_migration_engine_or_postgres_driver() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(result.stdout) == []
