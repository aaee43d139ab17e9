"""The durable history of runs: what outlives Redis's retention TTL.

Why this exists: everything about a run lives in Redis only until its retention TTL.
This package keeps it for good -- the execution (plan, inputs, context, terminal
snapshot, step-slot evidence), its ledger, the shared run, and large step outputs --
in SQLite (the embedded default, a file under ``AIRUNTIME_HOME``) or PostgreSQL
(production), behind one async interface. It is a layer of its own, beside ``k8s``:
below the control plane (which archives and resolves through it) and above the fleet.

* :mod:`.records` -- what is archived; :mod:`.store` -- the interface and its contract;
  :mod:`.errors` -- unavailable (retryable), corrupt row, other.
* :mod:`.sqlite`, :mod:`.postgres` -- the two implementations; :func:`open_history_store`
  picks one from the DSN (:mod:`.dsn`, :mod:`.settings`).
* :mod:`.schema`, :mod:`.migrate`, ``migrations/`` -- the schema and its versioned
  Alembic migrations (``airt history migrate``); :mod:`.names` -- the table names and
  the head revision, for the stores (which never import SQLAlchemy).
* :mod:`.codec`, :mod:`.sql`, :mod:`.listing` -- what both implementations share.
"""

from airuntime.history.errors import (
    CorruptRecord,
    HistoryError,
    HistoryUnavailable,
    InvalidCursor,
    SchemaOutOfDate,
)
from airuntime.history.factory import open_history_at_start, open_history_store
from airuntime.history.records import (
    ArchivedEvent,
    ArchivedExecution,
    ArchivedSharedRun,
    EncodedEvent,
    EncodedExecution,
    EventPage,
    ExecutionRow,
    LedgerEntry,
    Payload,
    PayloadRef,
    SharedRunPage,
)
from airuntime.history.settings import HistorySettings
from airuntime.history.store import HistoryStore

__all__ = [
    "ArchivedEvent",
    "ArchivedExecution",
    "ArchivedSharedRun",
    "CorruptRecord",
    "EncodedEvent",
    "EncodedExecution",
    "EventPage",
    "ExecutionRow",
    "HistoryError",
    "HistorySettings",
    "HistoryStore",
    "HistoryUnavailable",
    "InvalidCursor",
    "LedgerEntry",
    "Payload",
    "PayloadRef",
    "SchemaOutOfDate",
    "SharedRunPage",
    "open_history_at_start",
    "open_history_store",
]
