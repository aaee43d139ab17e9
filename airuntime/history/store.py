"""The durable history's interface: what the archiver writes and the resolver reads.

Why this exists: a run's hot state lives in Redis until its retention TTL; the
archiver copies it here once finalized, and the resolver reads here what Redis no
longer has. Both depend on this interface only; :func:`airuntime.history.open_history_store`
picks the implementation from the DSN (SQLite for the embedded default, PostgreSQL in
production), and the two behave the same (the tests run every case on both).

The contract every implementation holds:

* **Idempotent writes.** ``upsert_execution`` writes the execution and its events in
  one transaction, by primary key (the execution id; ``(execution id, seq)`` for
  events): writing the same data twice leaves one row set, and a re-archive after a
  failure completes what is missing. A write never moves a row to another tenant.
  ``put_payload`` is idempotent by the payload's content address.
* **Tenant isolation.** Every read takes the caller's tenant id, or ``None`` for an
  admin/internal read, and never returns another tenant's row: an invisible row reads
  as absent.
* **Errors.** :class:`HistoryUnavailable` when the database cannot be reached
  (retryable; an archive that is down never blocks execution), :class:`CorruptRecord`
  naming the table and key of a row that cannot be read (multi-row reads report such
  rows beside the good ones instead), :class:`HistoryError` for anything else.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from types import TracebackType

from airuntime.history.errors import HistoryError
from airuntime.history.listing import MAX_PAGE
from airuntime.history.records import (
    ArchivedExecution,
    ArchivedSharedRun,
    EventPage,
    ExecutionRow,
    LedgerEntry,
    Payload,
    SharedRunPage,
)

__all__ = ["HistoryStore", "check_limit", "tenant_conflict"]


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit {limit}: expected 1..{MAX_PAGE}")
    return limit


def tenant_conflict(kind: str, key: str) -> HistoryError:
    return HistoryError(f"{kind} {key} is archived for another tenant; not overwritten")


class HistoryStore(ABC):
    """The durable store of finished runs (async; safe to share across tasks)."""

    backend: str
    """``sqlite`` or ``postgresql``."""

    @abstractmethod
    async def upsert_execution(
        self, record: ExecutionRow, events: Iterable[LedgerEntry] = ()
    ) -> None:
        """Archive an execution and (some or all of) its ledger, in one transaction."""

    async def upsert_executions(
        self, items: Sequence[tuple[ExecutionRow, Iterable[LedgerEntry]]]
    ) -> None:
        """Archive several executions with their ledgers, in one transaction (all or
        none). The implementations override this default, which writes one by one."""
        for record, events in items:
            await self.upsert_execution(record, events)

    @abstractmethod
    async def upsert_shared_run(self, record: ArchivedSharedRun) -> None:
        """Archive a shared run (idempotent by its id)."""

    async def upsert_shared_runs(self, records: Sequence[ArchivedSharedRun]) -> None:
        """Archive several shared runs in one transaction (all or none). The
        implementations override this default, which writes one by one."""
        for record in records:
            await self.upsert_shared_run(record)

    @abstractmethod
    async def get_execution(
        self, execution_id: str, tenant_id: str | None
    ) -> ArchivedExecution | None:
        """The archived execution, or None (absent, or another tenant's)."""

    @abstractmethod
    async def events(
        self,
        execution_id: str,
        tenant_id: str | None,
        *,
        after_seq: int | None = None,
        limit: int = 100,
    ) -> EventPage | None:
        """The ledger from ``after_seq`` (exclusive; None: the start) in seq order, at
        most ``limit`` entries; None when the execution is absent or not visible."""

    @abstractmethod
    async def get_shared_run(
        self, shared_run_id: str, tenant_id: str | None
    ) -> ArchivedSharedRun | None:
        """The archived shared run, or None (absent, or another tenant's)."""

    @abstractmethod
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
        """Shared runs newest first (``created_ms``, then id, descending), filtered;
        ``cursor`` is the previous page's ``next_cursor`` (same filter)."""

    @abstractmethod
    async def put_payload(self, payload: Payload) -> str:
        """Store a payload (idempotent by its id); returns the id."""

    @abstractmethod
    async def get_payload(self, payload_id: str, tenant_id: str | None) -> Payload | None:
        """The payload with its bytes checked, or None (absent, or another tenant's)."""

    @abstractmethod
    async def ping(self) -> None:
        """Return when the database answers; HistoryUnavailable otherwise."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections and threads (idempotent)."""

    async def __aenter__(self) -> HistoryStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
