"""The production durable history: PostgreSQL through psycopg 3 and a connection pool.

Why this exists: many control-plane and runtime processes archive and read history at
once, and the history must outlive every pod. psycopg's ``AsyncConnectionPool`` keeps
a few connections per process (``AIRUNTIME_HISTORY_POOL_MIN_SIZE``/``MAX_SIZE``),
checks a connection before lending it (so a server restart costs no failed
operation once the server is back) and reconnects in the background.

Opening never waits for the server: the pool connects in the background, and an
operation that gets no connection within ``AIRUNTIME_HISTORY_TIMEOUT_S`` raises
:class:`HistoryUnavailable` -- an archive that is down never blocks execution. The
schema revision is checked on the first connection: not at head means
:class:`SchemaOutOfDate` (run ``airt history migrate``), unless the store was opened
with ``auto_migrate``, which migrates then (in a thread; Alembic is synchronous).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from airuntime.history import codec, sql
from airuntime.history.dsn import HistoryDsn
from airuntime.history.errors import HistoryError, HistoryUnavailable, SchemaOutOfDate
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

__all__ = ["PostgresHistoryStore"]

Conn = psycopg.AsyncConnection[Any]

_WRITE_ATTEMPTS = 3
"""A write that lost a deadlock or serialization race is retried (rows are locked in
one order, so this is a safety net, not a path)."""


def q(text: str) -> str:
    return sql.for_psycopg(text)


class PostgresHistoryStore(HistoryStore):
    """The history in a PostgreSQL database (see the module docstring)."""

    backend = "postgresql"

    def __init__(
        self,
        dsn: HistoryDsn,
        *,
        min_size: int = 1,
        max_size: int = 10,
        timeout_s: float = 10.0,
        auto_migrate: bool = False,
    ) -> None:
        self._dsn = dsn
        self._timeout_s = timeout_s
        self._auto_migrate = auto_migrate
        self._schema_checked = False
        self._schema_lock = asyncio.Lock()
        self._pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            dsn.conninfo,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout_s,
            open=False,
            check=AsyncConnectionPool.check_connection,
            kwargs={"connect_timeout": max(1, round(timeout_s))},
            name="airt-history",
        )

    @classmethod
    async def open(
        cls,
        dsn: HistoryDsn,
        *,
        min_size: int = 1,
        max_size: int = 10,
        timeout_s: float = 10.0,
        auto_migrate: bool = False,
    ) -> PostgresHistoryStore:
        """Open the pool (connecting in the background; a server that is down now
        makes operations unavailable, not the open)."""
        store = cls(
            dsn,
            min_size=min_size,
            max_size=max_size,
            timeout_s=timeout_s,
            auto_migrate=auto_migrate,
        )
        await store._pool.open(wait=False)
        return store

    # --- connections, errors, schema -----------------------------------------------

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[Conn]:
        try:
            async with self._pool.connection() as conn:
                if not self._schema_checked:
                    await self._check_schema(conn)
                yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError) as error:
            raise HistoryUnavailable(f"history {self._dsn}: {error}") from error
        except psycopg.Error as error:
            raise HistoryError(f"history {self._dsn}: {error}") from error

    async def _check_schema(self, conn: Conn) -> None:
        async with self._schema_lock:
            if self._schema_checked:
                return
            revision = await self._revision(conn)
            if revision != HEAD_REVISION and self._auto_migrate:
                await asyncio.to_thread(upgrade, self._dsn, timeout_s=self._timeout_s)
                revision = await self._revision(conn)
            if revision != HEAD_REVISION:
                raise SchemaOutOfDate(
                    f"history {self._dsn}: schema revision {revision or 'none'}, this "
                    f"release needs {HEAD_REVISION}: run `airt history migrate`"
                )
            self._schema_checked = True

    @staticmethod
    async def _revision(conn: Conn) -> str | None:
        cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", [VERSION_TABLE])
        exists = await cur.fetchone()
        if not exists or not exists[0]:
            await conn.commit()
            return None
        cur = await conn.execute(f"SELECT version_num FROM {VERSION_TABLE}")
        row = await cur.fetchone()
        await conn.commit()
        return None if row is None else str(row[0])

    async def _read(self, text: str, params: dict[str, Any]) -> list[Any]:
        async with self._connection() as conn:
            cur = await conn.execute(q(text), params)
            return list(await cur.fetchall())

    # --- the interface -----------------------------------------------------------

    async def upsert_execution(
        self, record: ExecutionRow, events: Iterable[LedgerEntry] = ()
    ) -> None:
        await self.upsert_executions([(record, events)])

    async def upsert_executions(
        self, items: Sequence[tuple[ExecutionRow, Iterable[LedgerEntry]]]
    ) -> None:
        # Rows are locked in execution-id (then seq) order by every writer, so two
        # archivers re-archiving overlapping batches cannot deadlock each other.
        batch = sorted(
            (
                (record.execution_id, codec.execution_params(record), codec.event_rows(record, ev))
                for record, ev in items
            ),
            key=lambda item: item[0],
        )
        for attempt in range(1, _WRITE_ATTEMPTS + 1):
            try:
                async with self._connection() as conn, conn.transaction():
                    for execution_id, params, rows in batch:
                        cur = await conn.execute(q(sql.UPSERT_EXECUTION), params)
                        if cur.rowcount == 0:
                            raise tenant_conflict("execution", execution_id)
                        if rows:
                            await cur.executemany(q(sql.UPSERT_EVENT), rows)
                return
            except HistoryUnavailable as error:
                retryable = isinstance(
                    error.__cause__,
                    psycopg.errors.DeadlockDetected | psycopg.errors.SerializationFailure,
                )
                if not retryable or attempt == _WRITE_ATTEMPTS:
                    raise

    async def upsert_shared_run(self, record: ArchivedSharedRun) -> None:
        await self.upsert_shared_runs([record])

    async def upsert_shared_runs(self, records: Sequence[ArchivedSharedRun]) -> None:
        batch = sorted(
            ((r.shared_run_id, codec.shared_run_params(r)) for r in records), key=lambda b: b[0]
        )
        if not batch:
            return
        async with self._connection() as conn, conn.transaction():
            for shared_run_id, params in batch:
                cur = await conn.execute(q(sql.UPSERT_SHARED_RUN), params)
                if cur.rowcount == 0:
                    raise tenant_conflict("shared run", shared_run_id)

    async def get_execution(
        self, execution_id: str, tenant_id: str | None
    ) -> ArchivedExecution | None:
        params: dict[str, Any] = {"id": execution_id}
        rows = await self._read(sql.tenant_scoped(sql.GET_EXECUTION, tenant_id, params), params)
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
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute(q(visible_sql), visible)
            if await cur.fetchone() is None:
                return None
            cur = await conn.execute(q(sql.PAGE_EVENTS), page)
            rows = await cur.fetchall()
        return codec.events_page(rows, limit)

    async def get_shared_run(
        self, shared_run_id: str, tenant_id: str | None
    ) -> ArchivedSharedRun | None:
        params: dict[str, Any] = {"id": shared_run_id}
        rows = await self._read(sql.tenant_scoped(sql.GET_SHARED_RUN, tenant_id, params), params)
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
        rows = await self._read(text, params)
        return codec.shared_runs_page(rows, limit, query)

    async def put_payload(self, payload: Payload) -> str:
        params = codec.payload_params(payload)
        async with self._connection() as conn, conn.transaction():
            await conn.execute(q(sql.PUT_PAYLOAD), params)
        return payload.payload_id

    async def get_payload(self, payload_id: str, tenant_id: str | None) -> Payload | None:
        params: dict[str, Any] = {"id": payload_id}
        rows = await self._read(sql.tenant_scoped(sql.GET_PAYLOAD, tenant_id, params), params)
        return codec.payload_from_row(rows[0]) if rows else None

    async def ping(self) -> None:
        await self._read("SELECT 1", {})

    async def close(self) -> None:
        await self._pool.close()
