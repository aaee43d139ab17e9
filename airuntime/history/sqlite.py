"""The embedded durable history: one SQLite file, through the standard library.

Why this exists: ``airt up`` and ``airt demo`` must keep history with nothing to set
up, so the default store is a file under ``AIRUNTIME_HOME``. sqlite3 is blocking, so
each store owns one dedicated thread and one connection made on it; every operation
runs there (in submission order) and the event loop only awaits it. Several stores --
several processes of ``airt up`` -- may share a file: WAL mode lets readers run beside
the one writer, writes take the lock at their start (``BEGIN IMMEDIATE``) and wait for
it up to the timeout, after which the store counts as unavailable (retryable).

Opening a file that is not at the schema head migrates it first (Alembic, under the
same write lock, so concurrent openers migrate once). ``synchronous=FULL``: a write
that returned is on disk, because the archiver acknowledges its outbox after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from airuntime.history import codec, sql
from airuntime.history.dsn import HistoryDsn
from airuntime.history.errors import HistoryError, HistoryUnavailable
from airuntime.history.listing import SharedRunFilter, decode_cursor
from airuntime.history.migrate import upgrade
from airuntime.history.names import HEAD_REVISION, VERSION_TABLE
from airuntime.history.records import (
    ArchivedExecution,
    ArchivedSharedRun,
    EventPage,
    ExecutionRow,
    LedgerEntry,
    Payload,
    SharedRunPage,
)
from airuntime.history.store import HistoryStore, check_limit, tenant_conflict

__all__ = ["SqliteHistoryStore"]

T = TypeVar("T")


class SqliteHistoryStore(HistoryStore):
    """The history in one SQLite file (see the module docstring)."""

    backend = "sqlite"

    def __init__(self, dsn: HistoryDsn, *, timeout_s: float = 10.0) -> None:
        self._dsn = dsn
        self._timeout_s = timeout_s
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="airt-history-sqlite")
        self._connection: sqlite3.Connection | None = None  # used on self._thread only
        self._closed = False

    @classmethod
    async def open(cls, dsn: HistoryDsn, *, timeout_s: float = 10.0) -> SqliteHistoryStore:
        """Open (creating and migrating the file when needed)."""
        store = cls(dsn, timeout_s=timeout_s)
        try:
            await store._run(store._open)
        except BaseException:
            await store.close()
            raise
        return store

    # --- the thread's side -------------------------------------------------------

    def _open(self) -> None:
        path = self._dsn.sqlite_path
        path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(path, timeout=self._timeout_s, isolation_level=None)
        try:
            connection.execute(f"PRAGMA busy_timeout = {int(self._timeout_s * 1000)}")
            connection.execute("PRAGMA journal_mode = WAL")
            connection.execute("PRAGMA synchronous = FULL")
            connection.execute("PRAGMA foreign_keys = ON")
            if self._revision(connection) != HEAD_REVISION:
                upgrade(self._dsn, timeout_s=self._timeout_s)
        except BaseException:
            connection.close()
            raise
        self._connection = connection

    @staticmethod
    def _revision(connection: sqlite3.Connection) -> str | None:
        try:
            row = connection.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchone()
        except sqlite3.OperationalError as error:
            if "no such table" in str(error):
                return None
            raise
        return None if row is None else str(row[0])

    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            raise HistoryError(f"history {self._dsn}: the store is closed")
        return self._connection

    def _guarded(self, work: Callable[[], T]) -> T:
        """Run ``work`` on the thread; the driver's errors become the store's."""
        try:
            return work()
        except sqlite3.OperationalError as error:  # locked, busy, cannot open, I/O
            raise HistoryUnavailable(f"history {self._dsn}: {error}") from error
        except sqlite3.DatabaseError as error:
            if type(error) is sqlite3.DatabaseError:  # "file is not a database", ...
                raise HistoryUnavailable(f"history {self._dsn}: {error}") from error
            raise HistoryError(f"history {self._dsn}: {error}") from error
        except OSError as error:
            raise HistoryUnavailable(f"history {self._dsn}: {error}") from error

    def _write(self, statements: Callable[[sqlite3.Connection], None]) -> None:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            statements(db)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                # a broken connection cannot roll back; the original error says why
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            raise

    def _read(self, query: str, params: dict[str, Any]) -> list[Any]:
        return list(self._db().execute(query, params).fetchall())

    def _read_snapshot(self, queries: Callable[[sqlite3.Connection], T]) -> T:
        """Several reads seeing one snapshot of the file."""
        db = self._db()
        db.execute("BEGIN")
        try:
            return queries(db)
        finally:
            db.execute("COMMIT")

    async def _run(self, work: Callable[[], T]) -> T:
        if self._closed:
            raise HistoryError(f"history {self._dsn}: the store is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, partial(self._guarded, work))

    # --- the interface -----------------------------------------------------------

    async def upsert_execution(
        self, record: ExecutionRow, events: Iterable[LedgerEntry] = ()
    ) -> None:
        params = codec.execution_params(record)
        rows = codec.event_rows(record, events)

        def statements(db: sqlite3.Connection) -> None:
            if db.execute(sql.UPSERT_EXECUTION, params).rowcount == 0:
                raise tenant_conflict("execution", record.execution_id)
            db.executemany(sql.UPSERT_EVENT, rows)

        await self._run(partial(self._write, statements))

    async def upsert_executions(
        self, items: Sequence[tuple[ExecutionRow, Iterable[LedgerEntry]]]
    ) -> None:
        batch = [
            (record, codec.execution_params(record), codec.event_rows(record, events))
            for record, events in items
        ]

        def statements(db: sqlite3.Connection) -> None:
            for record, params, rows in batch:
                if db.execute(sql.UPSERT_EXECUTION, params).rowcount == 0:
                    raise tenant_conflict("execution", record.execution_id)
                db.executemany(sql.UPSERT_EVENT, rows)

        await self._run(partial(self._write, statements))

    async def upsert_shared_run(self, record: ArchivedSharedRun) -> None:
        await self.upsert_shared_runs([record])

    async def upsert_shared_runs(self, records: Sequence[ArchivedSharedRun]) -> None:
        batch = [(r.shared_run_id, codec.shared_run_params(r)) for r in records]
        if not batch:
            return

        def statements(db: sqlite3.Connection) -> None:
            for shared_run_id, params in batch:
                if db.execute(sql.UPSERT_SHARED_RUN, params).rowcount == 0:
                    raise tenant_conflict("shared run", shared_run_id)

        await self._run(partial(self._write, statements))

    async def get_execution(
        self, execution_id: str, tenant_id: str | None
    ) -> ArchivedExecution | None:
        params: dict[str, Any] = {"id": execution_id}
        query = sql.tenant_scoped(sql.GET_EXECUTION, tenant_id, params)
        rows = await self._run(partial(self._read, query, params))
        return codec.execution_from_row(rows[0]) if rows else None

    async def events(
        self,
        execution_id: str,
        tenant_id: str | None,
        *,
        after_seq: int | None = None,
        limit: int = 100,
    ) -> EventPage | None:
        check_limit(limit)
        visible: dict[str, Any] = {"id": execution_id}
        visible_sql = sql.tenant_scoped(sql.EXECUTION_VISIBLE, tenant_id, visible)
        page = {"id": execution_id, "after": -1 if after_seq is None else after_seq}
        page["limit"] = limit + 1

        def queries(db: sqlite3.Connection) -> list[Any] | None:
            if db.execute(visible_sql, visible).fetchone() is None:
                return None
            return list(db.execute(sql.PAGE_EVENTS, page).fetchall())

        rows = await self._run(partial(self._read_snapshot, queries))
        return None if rows is None else codec.events_page(rows, limit)

    async def get_shared_run(
        self, shared_run_id: str, tenant_id: str | None
    ) -> ArchivedSharedRun | None:
        params: dict[str, Any] = {"id": shared_run_id}
        query = sql.tenant_scoped(sql.GET_SHARED_RUN, tenant_id, params)
        rows = await self._run(partial(self._read, query, params))
        return codec.shared_run_from_row(rows[0]) if rows else None

    async def list_shared_runs(
        self,
        tenant_id: str | None,
        *,
        statuses: Sequence[str] = (),
        pipeline_id: str | None = None,
        created_from_ms: int | None = None,
        created_to_ms: int | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> SharedRunPage:
        check_limit(limit)
        query = SharedRunFilter(
            tenant_id, tuple(statuses), pipeline_id, created_from_ms, created_to_ms
        )
        after = None if cursor is None else decode_cursor(cursor, query)
        text, params = sql.list_shared_runs(query, after, limit + 1)
        rows = await self._run(partial(self._read, text, params))
        return codec.shared_runs_page(rows, limit, query)

    async def put_payload(self, payload: Payload) -> str:
        params = codec.payload_params(payload)

        def statements(db: sqlite3.Connection) -> None:
            db.execute(sql.PUT_PAYLOAD, params)

        await self._run(partial(self._write, statements))
        return payload.payload_id

    async def get_payload(self, payload_id: str, tenant_id: str | None) -> Payload | None:
        params: dict[str, Any] = {"id": payload_id}
        query = sql.tenant_scoped(sql.GET_PAYLOAD, tenant_id, params)
        rows = await self._run(partial(self._read, query, params))
        return codec.payload_from_row(rows[0]) if rows else None

    async def ping(self) -> None:
        await self._run(partial(self._read, "SELECT 1", {}))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._close_connection)
        self._thread.shutdown(wait=False)

    def _close_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
