"""Records to row parameters and rows back to records, with corruption reported.

Why this exists: both backends store the same columns, so the translation is written
once. Writing never fails on content the records allow (JSON is encoded here, before a
transaction starts). Reading never trusts a row: JSON that does not parse, a value of
the wrong type, a payload whose bytes do not match its hash -- each becomes a
:class:`CorruptRecord` naming the table and the key, which single-row reads raise and
multi-row reads report beside the rows they could read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

from airuntime.history.errors import CorruptRecord
from airuntime.history.listing import Position, SharedRunFilter, encode_cursor
from airuntime.history.names import EVENTS, EXECUTIONS, PAYLOADS, SHARED_RUNS
from airuntime.history.records import (
    ArchivedEvent,
    ArchivedExecution,
    ArchivedSharedRun,
    EncodedEvent,
    EncodedExecution,
    EventPage,
    ExecutionRow,
    JsonObject,
    LedgerEntry,
    Payload,
    SharedRunPage,
)

__all__ = [
    "event_from_row",
    "event_params",
    "events_page",
    "execution_from_row",
    "execution_params",
    "now_ms",
    "payload_from_row",
    "payload_params",
    "prepare_events",
    "shared_run_from_row",
    "shared_run_params",
    "shared_runs_page",
]

Row = Sequence[Any]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""One encoder for every column (``json.dumps`` with options builds one per call)."""


def _dump(value: Any) -> str:
    return _ENCODER.encode(value)


def _object(table: str, key: str, column: str, text: Any, *, optional: bool = False) -> Any:
    if text is None and optional:
        return None
    if not isinstance(text, str):
        raise CorruptRecord(table, key, f"{column} is {type(text).__name__}, not JSON text")
    try:
        value = json.loads(text)
    except ValueError as error:
        raise CorruptRecord(table, key, f"{column} is not JSON ({error})") from None
    if not isinstance(value, dict):
        raise CorruptRecord(table, key, f"{column} is a JSON {type(value).__name__}, not an object")
    return value


def _build(table: str, key: str, build: Any, *args: Any) -> Any:
    """Construct a record, turning a value its checks refuse into a CorruptRecord."""
    try:
        return build(*args)
    except (TypeError, ValueError) as error:
        raise CorruptRecord(table, key, str(error)) from None


EXECUTION_COLUMNS = (
    "execution_id",
    "tenant_id",
    "run_id",
    "shared_run_id",
    "pipeline_id",
    "status",
    "created_ms",
    "finished_ms",
    "plan_json",
    "inputs_json",
    "context_json",
    "snapshot_json",
    "step_slots_json",
    "replay_of",
    "archived_at_ms",
)


def execution_params(record: ExecutionRow) -> dict[str, Any]:
    if isinstance(record, EncodedExecution):
        return {**record._asdict(), "replay_of": None, "archived_at_ms": now_ms()}
    return {
        "execution_id": record.execution_id,
        "tenant_id": record.tenant_id,
        "run_id": record.run_id,
        "shared_run_id": record.shared_run_id,
        "pipeline_id": record.pipeline_id,
        "status": record.status,
        "created_ms": record.created_ms,
        "finished_ms": record.finished_ms,
        "plan_json": _dump(record.plan),
        "inputs_json": _dump(record.inputs),
        "context_json": _dump(record.context),
        "snapshot_json": _dump(record.snapshot),
        "step_slots_json": None if record.step_slots is None else _dump(record.step_slots),
        "replay_of": record.replay_of,
        "archived_at_ms": record.archived_at_ms or now_ms(),
    }


def execution_from_row(row: Row) -> ArchivedExecution:
    values = dict(zip(EXECUTION_COLUMNS, row, strict=True))
    key = str(values["execution_id"])

    def obj(column: str, optional: bool = False) -> Any:
        return _object(EXECUTIONS, key, column, values[column], optional=optional)

    record: ArchivedExecution = _build(
        EXECUTIONS,
        key,
        lambda: ArchivedExecution(
            execution_id=values["execution_id"],
            tenant_id=values["tenant_id"],
            run_id=values["run_id"],
            shared_run_id=values["shared_run_id"],
            pipeline_id=values["pipeline_id"],
            status=values["status"],
            created_ms=values["created_ms"],
            finished_ms=values["finished_ms"],
            plan=obj("plan_json"),
            inputs=obj("inputs_json"),
            context=obj("context_json"),
            snapshot=obj("snapshot_json"),
            step_slots=obj("step_slots_json", optional=True),
            replay_of=values["replay_of"],
            archived_at_ms=values["archived_at_ms"],
        ),
    )
    return record


def prepare_events(record: ExecutionRow, events: Iterable[LedgerEntry]) -> list[LedgerEntry]:
    """The events to write, one per seq (the last given wins), in seq order -- the
    order every writer locks rows in, so concurrent re-archives cannot deadlock."""
    by_seq: dict[int, LedgerEntry] = {}
    for event in events:
        if event.execution_id != record.execution_id:
            raise ValueError(
                f"event {event.seq} belongs to execution {event.execution_id}, "
                f"not {record.execution_id}"
            )
        by_seq[event.seq] = event
    return [by_seq[seq] for seq in sorted(by_seq)]


EVENT_COLUMNS = ("execution_id", "seq", "entry_id", "type", "fields_json")


def event_params(event: LedgerEntry) -> dict[str, Any]:
    text = event.fields_json if isinstance(event, EncodedEvent) else _dump(event.fields)
    return {
        "execution_id": event.execution_id,
        "seq": event.seq,
        "entry_id": event.entry_id,
        "type": event.type,
        "fields_json": text,
    }


def event_rows(record: ExecutionRow, events: Iterable[LedgerEntry]) -> list[dict[str, Any]]:
    """The parameter rows of an execution's events, one per seq in seq order."""
    return [event_params(e) for e in prepare_events(record, events)]


def event_from_row(row: Row) -> ArchivedEvent:
    values = dict(zip(EVENT_COLUMNS, row, strict=True))
    key = f"{values['execution_id']}/{values['seq']}"
    fields = _object(EVENTS, key, "fields_json", values["fields_json"])
    event: ArchivedEvent = _build(
        EVENTS,
        key,
        lambda: ArchivedEvent(
            execution_id=values["execution_id"],
            seq=values["seq"],
            entry_id=values["entry_id"],
            type=values["type"],
            fields=fields,
        ),
    )
    return event


def events_page(rows: Sequence[Row], limit: int) -> EventPage:
    """A page from up to ``limit + 1`` event rows (one more tells whether more exist);
    rows that cannot be read are reported, not raised."""
    events: list[ArchivedEvent] = []
    corrupt: list[str] = []
    for row in rows[:limit]:
        try:
            events.append(event_from_row(row))
        except CorruptRecord as error:
            corrupt.append(str(error))
    more = len(rows) > limit
    return EventPage(events, int(rows[limit - 1][1]) if more else None, corrupt)


SHARED_RUN_COLUMNS = (
    "shared_run_id",
    "tenant_id",
    "pipeline_id",
    "status",
    "created_ms",
    "finished_ms",
    "run_json",
    "archived_at_ms",
)


def shared_run_params(record: ArchivedSharedRun) -> dict[str, Any]:
    return {
        "shared_run_id": record.shared_run_id,
        "tenant_id": record.tenant_id,
        "pipeline_id": record.pipeline_id,
        "status": record.status,
        "created_ms": record.created_ms,
        "finished_ms": record.finished_ms,
        "run_json": _dump(record.run),
        "archived_at_ms": record.archived_at_ms or now_ms(),
    }


def shared_run_from_row(row: Row) -> ArchivedSharedRun:
    values = dict(zip(SHARED_RUN_COLUMNS, row, strict=True))
    key = str(values["shared_run_id"])
    run: JsonObject = _object(SHARED_RUNS, key, "run_json", values["run_json"])
    record: ArchivedSharedRun = _build(
        SHARED_RUNS,
        key,
        lambda: ArchivedSharedRun(
            shared_run_id=values["shared_run_id"],
            tenant_id=values["tenant_id"],
            pipeline_id=values["pipeline_id"],
            status=values["status"],
            created_ms=values["created_ms"],
            finished_ms=values["finished_ms"],
            run=run,
            archived_at_ms=values["archived_at_ms"],
        ),
    )
    return record


def shared_runs_page(rows: Sequence[Row], limit: int, query: SharedRunFilter) -> SharedRunPage:
    """A page from up to ``limit + 1`` shared-run rows; rows that cannot be read are
    reported, not raised (the cursor still moves past them)."""
    runs: list[ArchivedSharedRun] = []
    corrupt: list[str] = []
    for row in rows[:limit]:
        try:
            runs.append(shared_run_from_row(row))
        except CorruptRecord as error:
            corrupt.append(str(error))
    cursor = None
    if len(rows) > limit:
        last = dict(zip(SHARED_RUN_COLUMNS, rows[limit - 1], strict=True))
        cursor = encode_cursor(Position(last["created_ms"], last["shared_run_id"]), query)
    return SharedRunPage(runs, cursor, corrupt)


PAYLOAD_COLUMNS = (
    "payload_id",
    "tenant_id",
    "execution_id",
    "step_id",
    "size_bytes",
    "sha256",
    "data",
)


def payload_params(payload: Payload) -> dict[str, Any]:
    problem = payload.problem()
    if problem is not None:
        raise ValueError(f"payload {payload.payload_id}: {problem}")
    return {
        "payload_id": payload.payload_id,
        "tenant_id": payload.tenant_id,
        "execution_id": payload.execution_id,
        "step_id": payload.step_id,
        "size_bytes": payload.size,
        "sha256": payload.sha256,
        "data": payload.data,
        "created_ms": now_ms(),
    }


def payload_from_row(row: Row) -> Payload:
    values = dict(zip(PAYLOAD_COLUMNS, row, strict=True))
    key = str(values["payload_id"])
    data = values["data"]
    if isinstance(data, memoryview):
        data = data.tobytes()
    if not isinstance(data, bytes):
        raise CorruptRecord(PAYLOADS, key, f"data is {type(data).__name__}, not bytes")
    payload: Payload = _build(
        PAYLOADS,
        key,
        lambda: Payload(
            payload_id=values["payload_id"],
            tenant_id=values["tenant_id"],
            execution_id=values["execution_id"],
            step_id=values["step_id"],
            size=values["size_bytes"],
            sha256=values["sha256"],
            data=data,
        ),
    )
    problem = payload.problem()
    if problem is not None:
        raise CorruptRecord(PAYLOADS, key, problem)
    return payload
