"""A history that cannot be used now answers HistoryUnavailable (retryable), never
hangs and never crashes with another error.

PostgreSQL that goes away: every operation answers within the timeout, opening a store
does not wait for the server, and the same store works again once the server is back
-- with what was written before still there. SQLite: a file locked by another writer
past the timeout, a path that cannot be a file, a file that is not a database."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from airuntime.history import HistoryStore, HistoryUnavailable, Payload, open_history_store
from airuntime.history.dsn import Backend, parse_dsn
from airuntime.history.migrate import upgrade
from tests.history import records
from tests.history.conftest import settings
from tests.postgres import POSTGRES_MISSING, PostgresServer, postgres_bin_dir, running_postgres


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server of this test's own: it is stopped and started again."""
    if postgres_bin_dir() is None:
        pytest.skip(POSTGRES_MISSING)
    with running_postgres() as server:
        yield server


def operations(store: HistoryStore) -> dict[str, Callable[[], Awaitable[object]]]:
    payload = Payload.of("tenant-a", "e-2", "s", b"z" * 100)
    return {
        "ping": store.ping,
        "upsert_execution": lambda: store.upsert_execution(
            records.execution("e-2"), records.events("e-2")
        ),
        "upsert_shared_run": lambda: store.upsert_shared_run(records.shared_run("sr-2")),
        "get_execution": lambda: store.get_execution("e-1", "tenant-a"),
        "events": lambda: store.events("e-1", "tenant-a"),
        "get_shared_run": lambda: store.get_shared_run("sr-1", "tenant-a"),
        "list_shared_runs": lambda: store.list_shared_runs("tenant-a"),
        "put_payload": lambda: store.put_payload(payload),
        "get_payload": lambda: store.get_payload(payload.payload_id, "tenant-a"),
    }


async def back_within(store: HistoryStore, seconds: float) -> None:
    """Wait (bounded) until the pool has reconnected to the restarted server."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            await store.ping()
            return
        except HistoryUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_a_stopped_server_is_unavailable_and_a_restarted_one_serves_again(
    own_postgres: PostgresServer,
) -> None:
    dsn = own_postgres.create_database("history")
    upgrade(parse_dsn(dsn))
    store = await open_history_store(dsn, settings=settings(history_timeout_s=1.0))
    try:
        await store.upsert_execution(records.execution("e-1"), records.events("e-1"))
        await store.upsert_shared_run(records.shared_run("sr-1"))

        own_postgres.stop()
        for name, operation in operations(store).items():
            with pytest.raises(HistoryUnavailable) as info:
                await operation()
            assert "history postgresql://" in str(info.value), name

        own_postgres.start()
        await back_within(store, 60)
        for operation in operations(store).values():
            await operation()  # each works again
        assert await store.get_execution("e-1", "tenant-a") is not None
        assert await store.get_execution("e-2", "tenant-a") is not None
    finally:
        await store.close()


async def test_a_store_opens_while_its_server_is_down(own_postgres: PostgresServer) -> None:
    dsn = own_postgres.create_database("history")
    upgrade(parse_dsn(dsn))
    own_postgres.stop()
    store = await open_history_store(dsn, settings=settings(history_timeout_s=1.0))
    try:
        with pytest.raises(HistoryUnavailable):
            await store.get_execution("e-1", None)
        own_postgres.start()
        await back_within(store, 60)
        await store.upsert_execution(records.execution(), records.events())
        assert await store.get_execution("e-1", None) is not None
    finally:
        await store.close()


async def test_a_sqlite_file_locked_by_another_writer_is_unavailable_not_stuck(
    tmp_path: Path,
) -> None:
    path = tmp_path / "locked.db"
    store = await open_history_store(f"sqlite:///{path}", settings=settings(history_timeout_s=0.2))
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        with pytest.raises(HistoryUnavailable, match="locked"):
            await store.upsert_execution(records.execution(), records.events())
        other.execute("ROLLBACK")
        await store.upsert_execution(records.execution(), records.events())
        assert await store.get_execution("e-1", "tenant-a") is not None
    finally:
        other.close()
        await store.close()


async def test_a_sqlite_path_that_cannot_be_a_file_is_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where a directory should be")
    dsn = f"sqlite:///{blocker / 'history.db'}"
    assert parse_dsn(dsn).backend is Backend.SQLITE
    with pytest.raises(HistoryUnavailable, match="not-a-dir"):
        await open_history_store(dsn, settings=settings())


async def test_a_file_that_is_not_a_database_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    path.write_bytes(b"this is not a SQLite database, it is a text file" * 100)
    with pytest.raises(HistoryUnavailable, match="not a database"):
        await open_history_store(f"sqlite:///{path}", settings=settings())
