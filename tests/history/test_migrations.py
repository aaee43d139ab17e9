"""The schema's versioned migrations (Alembic) on a real SQLite file and a real
PostgreSQL: an empty database upgraded to head matches the metadata the code expects,
migrating is idempotent and safe to run from several processes at once, a PostgreSQL
store refuses an unmigrated database until it is migrated (or auto-migrates when told
to), and ``airt history migrate`` does it from the command line."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine

from airuntime.history import SchemaOutOfDate, open_history_store
from airuntime.history.dsn import Backend, parse_dsn
from airuntime.history.migrate import current_revision, head_revision, upgrade
from airuntime.history.schema import HEAD_REVISION, VERSION_TABLE, metadata
from tests.history import records
from tests.history.conftest import settings
from tests.postgres import PostgresServer


@pytest.fixture
def empty_dsn(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database nothing was ever migrated into."""
    if backend == Backend.SQLITE:
        yield f"sqlite:///{tmp_path / 'sub' / 'history.db'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    name = f"empty_{uuid.uuid4().hex[:12]}"
    yield server.create_database(name)
    server.drop_database(name)


def test_the_head_revision_constant_is_alembics_head() -> None:
    assert head_revision() == HEAD_REVISION


def test_an_empty_database_upgraded_to_head_matches_the_metadata(empty_dsn: str) -> None:
    dsn = parse_dsn(empty_dsn)
    first = upgrade(dsn)
    assert (first.before, first.after) == (None, HEAD_REVISION)

    engine = create_engine(dsn.sqlalchemy_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"version_table": VERSION_TABLE, "compare_type": True}
            )
            assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()

    again = upgrade(dsn)
    assert (again.before, again.after) == (HEAD_REVISION, HEAD_REVISION)
    assert current_revision(dsn) == HEAD_REVISION


def test_migrators_racing_on_one_database_migrate_it_once(empty_dsn: str) -> None:
    dsn = parse_dsn(empty_dsn)
    racers = 4
    barrier = threading.Barrier(racers)
    results, errors = [], []

    def migrate() -> None:
        barrier.wait()
        try:
            results.append(upgrade(dsn))
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=migrate) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert sorted((r.before or "", r.after) for r in results) == [
        ("", HEAD_REVISION),
        *[(HEAD_REVISION, HEAD_REVISION)] * (racers - 1),
    ]


async def test_a_sqlite_store_migrates_the_file_it_opens(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'new' / 'history.db'}"
    async with await open_history_store(dsn, settings=settings()) as store:
        await store.upsert_execution(records.execution(), records.events())
        assert await store.get_execution("e-1", "tenant-a") is not None
    assert current_revision(parse_dsn(dsn)) == HEAD_REVISION


async def test_a_postgres_store_refuses_an_unmigrated_database_until_migrated(
    postgres: PostgresServer,
) -> None:
    name = f"unmigrated_{uuid.uuid4().hex[:12]}"
    dsn = postgres.create_database(name)
    try:
        store = await open_history_store(dsn, settings=settings())
        try:
            with pytest.raises(SchemaOutOfDate, match="airt history migrate"):
                await store.ping()
            upgrade(parse_dsn(dsn))
            await store.ping()
        finally:
            await store.close()
    finally:
        postgres.drop_database(name)


async def test_a_postgres_store_told_to_auto_migrate_does(postgres: PostgresServer) -> None:
    name = f"auto_{uuid.uuid4().hex[:12]}"
    dsn = postgres.create_database(name)
    try:
        opened = await open_history_store(dsn, settings=settings(history_auto_migrate=True))
        async with opened as store:
            await store.upsert_execution(records.execution(), records.events())
            assert await store.get_execution("e-1", None) is not None
        assert current_revision(parse_dsn(dsn)) == HEAD_REVISION
    finally:
        postgres.drop_database(name)


def airt(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AIRUNTIME_")}
    return subprocess.run(
        [sys.executable, "-m", "airuntime.cli", *args],
        env={**clean, "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_airt_history_migrate(empty_dsn: str) -> None:
    first = airt("history", "migrate", "--dsn", empty_dsn)
    assert first.returncode == 0, first.stderr
    assert f"migrated from an empty database to {HEAD_REVISION}" in first.stdout
    again = airt("history", "migrate", AIRUNTIME_HISTORY_DSN=empty_dsn)
    assert again.returncode == 0, again.stderr
    assert f"at revision {HEAD_REVISION} (nothing to do)" in again.stdout


def test_airt_history_migrate_defaults_to_the_file_under_airuntime_home(tmp_path: Path) -> None:
    result = airt("history", "migrate", AIRUNTIME_HOME=str(tmp_path / "home"))
    assert result.returncode == 0, result.stderr
    assert current_revision(parse_dsn(f"sqlite:///{tmp_path / 'home' / 'history.db'}")) == (
        HEAD_REVISION
    )


def test_airt_history_migrate_refuses_or_fails_without_a_traceback() -> None:
    bad = airt("history", "migrate", "--dsn", "mysql://u:pw@host/db")
    assert bad.returncode == 2 and "expected sqlite:///<path> or postgresql://" in bad.stderr
    assert "pw@" not in bad.stderr
    down = airt("history", "migrate", "--dsn", "postgresql://u:pw@127.0.0.1:1/db", "--timeout", "1")
    assert down.returncode == 1 and "Connection refused" in down.stderr, down.stderr
    assert "pw@" not in down.stderr
    bad_timeout = airt("history", "migrate", AIRUNTIME_HISTORY_TIMEOUT_S="soon")
    assert bad_timeout.returncode == 2 and "AIRUNTIME_HISTORY_TIMEOUT_S" in bad_timeout.stderr
    for result in (bad, down, bad_timeout):
        assert "Traceback" not in result.stdout + result.stderr
