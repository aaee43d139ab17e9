"""Fixtures of the durable history tests: every store test runs on both backends.

* ``postgres`` (session): a private PostgreSQL cluster (:mod:`tests.postgres`);
  skipped, with the reason, where PostgreSQL is not installed.
* ``history_dsn`` (function, parametrized ``sqlite`` / ``postgresql``): a fresh,
  migrated database -- a SQLite file in the test's tmp dir, or a PostgreSQL database
  copied from a template migrated once per session (dropped afterwards).
* ``store``: the store opened on it; ``raw``: a plain driver connection to the same
  database, for what a test must write around the store (garbage, partial writes).
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio

from airuntime.history import HistorySettings, HistoryStore, open_history_store
from airuntime.history.dsn import Backend, parse_dsn
from airuntime.history.migrate import upgrade
from tests.postgres import POSTGRES_MISSING, PostgresServer, postgres_bin_dir, running_postgres

TEMPLATE = "airt_history_template"

RawSql = Callable[..., list[Any]]


def settings(**overrides: Any) -> HistorySettings:
    """Explicit settings (the environment of the test run does not leak in)."""
    values: dict[str, Any] = {
        "history_dsn": None,
        "payload_threshold_bytes": 65536,
        "history_pool_min_size": 1,
        "history_pool_max_size": 10,
        "history_timeout_s": 5.0,
        "history_auto_migrate": False,
    }
    values.update(overrides)
    return HistorySettings(**values)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    if postgres_bin_dir() is None:
        pytest.skip(POSTGRES_MISSING)
    with running_postgres() as server:
        yield server


@pytest.fixture(scope="session")
def pg_template(postgres: PostgresServer) -> str:
    upgrade(parse_dsn(postgres.create_database(TEMPLATE)))
    return TEMPLATE


@pytest.fixture(params=[Backend.SQLITE.value, Backend.POSTGRESQL.value])
def backend(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture
def history_dsn(
    backend: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if backend == Backend.SQLITE:
        yield f"sqlite:///{tmp_path_factory.mktemp('history') / 'history.db'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    template: str = request.getfixturevalue("pg_template")
    name = f"t_{uuid.uuid4().hex[:12]}"
    dsn = server.create_database(name, template=template)
    yield dsn
    server.drop_database(name)


@pytest_asyncio.fixture
async def store(history_dsn: str) -> AsyncIterator[HistoryStore]:
    opened = await open_history_store(history_dsn, settings=settings())
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def raw(history_dsn: str) -> RawSql:
    """``raw(sql, *params)``: run one statement (``?`` placeholders) on the database
    directly, committed; returns the rows it produced."""
    parsed = parse_dsn(history_dsn)

    def run(statement: str, *params: Any) -> list[Any]:
        if parsed.backend is Backend.SQLITE:
            with contextlib.closing(sqlite3.connect(parsed.sqlite_path)) as db, db:
                cursor = db.execute(statement, params)
                return cursor.fetchall() if cursor.description else []
        with psycopg.connect(parsed.conninfo, autocommit=True) as conn:
            cur = conn.execute(statement.replace("?", "%s"), params)
            return cur.fetchall() if cur.description else []

    return run
