"""The SQL both backends run, written once with ``:name`` parameters.

Why this exists: SQLite and PostgreSQL share everything the store needs -- ``INSERT
... ON CONFLICT ... DO UPDATE``, row-value comparison for keyset pagination, ``LIMIT``
-- so the statements are one text; sqlite3 binds ``:name`` natively and
:func:`for_psycopg` rewrites them to ``%(name)s``. No statement contains a literal
``%`` or ``:`` that the rewrite could mistake.

Upserts are idempotent by the primary key, and refuse to move a row to another
tenant: the ``DO UPDATE ... WHERE`` guard leaves another tenant's row untouched and
the statement reports no row changed, which the store turns into an error.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from airuntime.history.codec import (
    EVENT_COLUMNS,
    EXECUTION_COLUMNS,
    PAYLOAD_COLUMNS,
    SHARED_RUN_COLUMNS,
)
from airuntime.history.listing import Position, SharedRunFilter
from airuntime.history.names import EVENTS, EXECUTIONS, PAYLOADS, SHARED_RUNS

__all__ = [
    "EXECUTION_VISIBLE",
    "GET_EXECUTION",
    "GET_PAYLOAD",
    "GET_SHARED_RUN",
    "PAGE_EVENTS",
    "PUT_PAYLOAD",
    "UPSERT_EVENT",
    "UPSERT_EXECUTION",
    "UPSERT_SHARED_RUN",
    "for_psycopg",
    "list_shared_runs",
    "tenant_scoped",
]


def _upsert(table: str, columns: tuple[str, ...], key: tuple[str, ...], keep: set[str]) -> str:
    names = ", ".join(columns)
    values = ", ".join(f":{c}" for c in columns)
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in {*key, *keep})
    sql = (
        f"INSERT INTO {table} ({names}) VALUES ({values}) "
        f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"
    )
    if "tenant_id" in columns:
        sql += f" WHERE {table}.tenant_id = excluded.tenant_id"
    return sql


UPSERT_EXECUTION = _upsert(
    EXECUTIONS, EXECUTION_COLUMNS, ("execution_id",), keep={"tenant_id", "archived_at_ms"}
)
UPSERT_EVENT = _upsert(EVENTS, EVENT_COLUMNS, ("execution_id", "seq"), keep=set())
UPSERT_SHARED_RUN = _upsert(
    SHARED_RUNS, SHARED_RUN_COLUMNS, ("shared_run_id",), keep={"tenant_id", "archived_at_ms"}
)
PUT_PAYLOAD = (
    f"INSERT INTO {PAYLOADS} ({', '.join(PAYLOAD_COLUMNS)}, created_ms) "
    f"VALUES ({', '.join(f':{c}' for c in PAYLOAD_COLUMNS)}, :created_ms) "
    "ON CONFLICT (payload_id) DO NOTHING"
)


def tenant_scoped(sql: str, tenant_id: str | None, params: dict[str, Any]) -> str:
    """``sql`` (whose WHERE clause is open) restricted to the caller's tenant; an
    admin/internal read (``None``) sees every tenant."""
    if tenant_id is None:
        return sql
    params["tenant_id"] = tenant_id
    return f"{sql} AND tenant_id = :tenant_id"


GET_EXECUTION = f"SELECT {', '.join(EXECUTION_COLUMNS)} FROM {EXECUTIONS} WHERE execution_id = :id"
EXECUTION_VISIBLE = f"SELECT 1 FROM {EXECUTIONS} WHERE execution_id = :id"
PAGE_EVENTS = (
    f"SELECT {', '.join(EVENT_COLUMNS)} FROM {EVENTS} "
    "WHERE execution_id = :id AND seq > :after ORDER BY seq LIMIT :limit"
)
GET_SHARED_RUN = (
    f"SELECT {', '.join(SHARED_RUN_COLUMNS)} FROM {SHARED_RUNS} WHERE shared_run_id = :id"
)
GET_PAYLOAD = f"SELECT {', '.join(PAYLOAD_COLUMNS)} FROM {PAYLOADS} WHERE payload_id = :id"


def list_shared_runs(
    query: SharedRunFilter, after: Position | None, limit: int
) -> tuple[str, dict[str, Any]]:
    """One page of shared runs, newest first (``created_ms``, then id, descending),
    strictly after ``after``; ``limit`` rows at most."""
    where: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    if query.tenant_id is not None:
        where.append("tenant_id = :tenant_id")
        params["tenant_id"] = query.tenant_id
    if query.statuses:
        names = []
        for i, status in enumerate(sorted(set(query.statuses))):
            params[f"status_{i}"] = status
            names.append(f":status_{i}")
        where.append(f"status IN ({', '.join(names)})")
    if query.pipeline_id is not None:
        where.append("pipeline_id = :pipeline_id")
        params["pipeline_id"] = query.pipeline_id
    if query.created_from_ms is not None:
        where.append("created_ms >= :created_from")
        params["created_from"] = query.created_from_ms
    if query.created_to_ms is not None:
        where.append("created_ms < :created_to")
        params["created_to"] = query.created_to_ms
    if after is not None:
        where.append("(created_ms, shared_run_id) < (:after_ms, :after_id)")
        params["after_ms"] = after.created_ms
        params["after_id"] = after.shared_run_id
    sql = f"SELECT {', '.join(SHARED_RUN_COLUMNS)} FROM {SHARED_RUNS}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY created_ms DESC, shared_run_id DESC LIMIT :limit"
    return sql, params


@cache
def for_psycopg(sql: str) -> str:
    """``:name`` parameters as psycopg's ``%(name)s``."""
    return re.sub(r"(?<![:\w]):([A-Za-z_]\w*)", r"%(\1)s", sql)
