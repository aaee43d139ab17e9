"""The side effect of the chaos test's ``python`` steps: rows in a SQLite file.

Every run of a handler appends one row to ``attempts`` (raw: duplicates stay visible)
and inserts one into ``effects`` keyed by the step's idempotency key with ``INSERT OR
IGNORE`` -- the dedupe a real handler would do with ``ctx.idempotency_key``. A run of
the same attempt on another worker (a frozen worker finishing late, a step recovered
after a crash) adds an ``attempts`` row and no ``effects`` row.
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

from airuntime.engine.handlers import StepFailed, current_step

SCHEMA = """
CREATE TABLE IF NOT EXISTS attempts (
    idempotency_key TEXT NOT NULL, execution TEXT NOT NULL, step TEXT NOT NULL,
    attempt INTEGER NOT NULL, n INTEGER NOT NULL, pid INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS effects (
    idempotency_key TEXT PRIMARY KEY, execution TEXT NOT NULL, step TEXT NOT NULL,
    n INTEGER NOT NULL, pid INTEGER NOT NULL);
"""


def connect(path: str) -> sqlite3.Connection:
    """A connection that waits for the writer lock instead of failing (WAL mode)."""
    db = sqlite3.connect(path, timeout=60, isolation_level=None)
    db.execute("PRAGMA busy_timeout = 60000")
    db.execute("PRAGMA journal_mode = WAL")
    return db


def create(path: str) -> None:
    db = connect(path)
    try:
        db.executescript(SCHEMA)
    finally:
        db.close()


def record(db: str, n: int, before_s: float = 0.0, after_s: float = 0.0) -> dict[str, Any]:
    """Sleep ``before_s``, perform the effect, sleep ``after_s`` (a crash in that window
    leaves an effect whose completion was never recorded)."""
    step = current_step()
    if step is None:
        raise StepFailed("tests.chaos.effects:record runs only as a step")
    time.sleep(before_s)
    conn = connect(db)
    try:
        row = (step.idempotency_key, step.execution_id, step.step_id, n, os.getpid())
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO attempts (idempotency_key, execution, step, attempt, n, pid) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (row[0], row[1], row[2], step.attempt, n, row[4]),
        )
        conn.execute(
            "INSERT OR IGNORE INTO effects (idempotency_key, execution, step, n, pid) "
            "VALUES (?, ?, ?, ?, ?)",
            row,
        )
        conn.execute("COMMIT")
    finally:
        conn.close()
    time.sleep(after_s)
    return {"n": n, "step": step.step_id}
