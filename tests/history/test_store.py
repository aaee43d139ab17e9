"""The durable store's contract, on a real SQLite file and a real PostgreSQL: idempotent
upserts (twice, after a partial archive, after a failed transaction, concurrently),
tenant isolation of every read, ledger pagination, payloads, corrupt rows."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from airuntime.history import (
    CorruptRecord,
    EncodedEvent,
    EncodedExecution,
    HistoryError,
    HistoryStore,
    HistoryUnavailable,
    Payload,
    PayloadRef,
    open_history_store,
)
from airuntime.history.dsn import Backend
from tests.history import records
from tests.history.conftest import RawSql, settings


async def test_the_same_archive_twice_is_one_row_set(store: HistoryStore, raw: RawSql) -> None:
    record, ledger = records.execution(), records.events(count=7)
    await store.upsert_execution(record, ledger)
    first = await store.get_execution(record.execution_id, "tenant-a")
    await store.upsert_execution(record, ledger)

    again = await store.get_execution(record.execution_id, "tenant-a")
    assert again == first
    assert again is not None and records.without_archived_at(again) == record
    assert raw("SELECT count(*) FROM history_executions") == [(1,)]
    assert raw("SELECT count(*) FROM history_events") == [(7,)]
    page = await store.events(record.execution_id, "tenant-a", limit=100)
    assert page is not None and page.events == ledger and page.next_after_seq is None


async def test_a_re_archive_completes_a_partial_one_and_keeps_the_first_archive_time(
    store: HistoryStore,
) -> None:
    ledger = records.events(count=10)
    partial = records.execution(status="Running", finished_ms=None)
    await store.upsert_execution(partial, ledger[:4])
    first = await store.get_execution("e-1", "tenant-a")

    final = records.execution()
    await store.upsert_execution(final, ledger)

    stored = await store.get_execution("e-1", "tenant-a")
    assert stored is not None and records.without_archived_at(stored) == final
    assert first is not None and stored.archived_at_ms == first.archived_at_ms
    page = await store.events("e-1", "tenant-a", limit=100)
    assert page is not None and page.events == ledger


async def test_an_archive_written_in_part_around_the_store_is_completed(
    store: HistoryStore, raw: RawSql
) -> None:
    """What a writer that died between its statements would leave: the execution row
    with garbage-free but stale columns and the first two ledger entries."""
    ledger = records.events(count=6)
    raw(
        "INSERT INTO history_executions (execution_id, tenant_id, pipeline_id, status, "
        "created_ms, plan_json, inputs_json, context_json, snapshot_json, archived_at_ms) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        "e-1", "tenant-a", "summarize-documents", "Running", 1, "{}", "{}", "{}", "{}", 5,
    )  # fmt: skip
    for event in ledger[:2]:
        raw(
            "INSERT INTO history_events (execution_id, seq, entry_id, type, fields_json) "
            "VALUES (?, ?, ?, ?, ?)",
            event.execution_id, event.seq, event.entry_id, event.type, "{}",
        )  # fmt: skip

    record = records.execution()
    await store.upsert_execution(record, ledger)

    stored = await store.get_execution("e-1", "tenant-a")
    assert stored is not None and records.without_archived_at(stored) == record
    page = await store.events("e-1", "tenant-a", limit=100)
    assert page is not None and page.events == ledger


def _reject_event_3(raw: RawSql, backend: str) -> None:
    if backend == Backend.SQLITE:
        raw(
            "CREATE TRIGGER reject_event_3 BEFORE INSERT ON history_events "
            "WHEN NEW.seq = 3 BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
        )
        return
    raw(
        "CREATE FUNCTION reject_event_3() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.seq = 3 THEN RAISE EXCEPTION 'injected failure'; END IF; RETURN NEW; END $$"
    )
    raw(
        "CREATE TRIGGER reject_event_3 BEFORE INSERT ON history_events "
        "FOR EACH ROW EXECUTE FUNCTION reject_event_3()"
    )


async def test_an_upsert_is_one_transaction(store: HistoryStore, raw: RawSql, backend: str) -> None:
    """The database refuses the fourth ledger entry: nothing of the archive is kept,
    and the same call succeeds once the database accepts it."""
    _reject_event_3(raw, backend)
    record, ledger = records.execution(), records.events(count=6)
    with pytest.raises(HistoryError, match="injected failure") as info:
        await store.upsert_execution(record, ledger)
    assert not isinstance(info.value, HistoryUnavailable)
    assert await store.get_execution("e-1", None) is None
    assert raw("SELECT count(*) FROM history_events") == [(0,)]

    raw("DROP TRIGGER reject_event_3" + ("" if backend == Backend.SQLITE else " ON history_events"))
    await store.upsert_execution(record, ledger)
    page = await store.events("e-1", "tenant-a", limit=100)
    assert page is not None and page.events == ledger


async def test_a_write_never_moves_a_row_to_another_tenant(store: HistoryStore) -> None:
    await store.upsert_execution(records.execution(tenant_id="tenant-a"), records.events(count=2))
    await store.upsert_shared_run(records.shared_run("sr-1", "tenant-a"))

    with pytest.raises(HistoryError, match="another tenant"):
        await store.upsert_execution(records.execution(tenant_id="tenant-b"), records.events())
    with pytest.raises(HistoryError, match="another tenant"):
        await store.upsert_shared_run(records.shared_run("sr-1", "tenant-b"))

    kept = await store.get_execution("e-1", None)
    assert kept is not None and kept.tenant_id == "tenant-a"
    page = await store.events("e-1", None)
    assert page is not None and len(page.events) == 2
    run = await store.get_shared_run("sr-1", None)
    assert run is not None and run.tenant_id == "tenant-a"


async def test_no_read_returns_another_tenants_row(store: HistoryStore) -> None:
    await store.upsert_execution(records.execution("e-a", "tenant-a"), records.events("e-a"))
    await store.upsert_shared_run(records.shared_run("sr-a", "tenant-a"))
    payload = Payload.of("tenant-a", "e-a", "split", b"secret" * 100)
    await store.put_payload(payload)

    for tenant in ("tenant-b", "tenant-a-", ""):
        assert await store.get_execution("e-a", tenant) is None
        assert await store.events("e-a", tenant) is None
        assert await store.get_shared_run("sr-a", tenant) is None
        assert await store.get_payload(payload.payload_id, tenant) is None
        assert (await store.list_shared_runs(tenant)).runs == []

    # The owner and an admin/internal read (None) see them.
    for tenant in ("tenant-a", None):
        assert await store.get_execution("e-a", tenant) is not None
        assert await store.events("e-a", tenant) is not None
        assert await store.get_shared_run("sr-a", tenant) is not None
        assert await store.get_payload(payload.payload_id, tenant) == payload
        assert [r.shared_run_id for r in (await store.list_shared_runs(tenant)).runs] == ["sr-a"]


async def test_the_ledger_is_read_in_pages(store: HistoryStore) -> None:
    ledger = records.events(count=25)
    await store.upsert_execution(records.execution(), ledger)

    seen, after, pages = [], None, 0
    while True:
        page = await store.events("e-1", "tenant-a", after_seq=after, limit=10)
        assert page is not None and not page.corrupt
        seen.extend(page.events)
        pages += 1
        if page.next_after_seq is None:
            break
        after = page.next_after_seq
    assert pages == 3 and seen == ledger

    exact = await store.events("e-1", "tenant-a", limit=25)
    assert exact is not None and len(exact.events) == 25 and exact.next_after_seq is None
    past = await store.events("e-1", "tenant-a", after_seq=24)
    assert past is not None and past.events == [] and past.next_after_seq is None
    with pytest.raises(ValueError, match="limit"):
        await store.events("e-1", "tenant-a", limit=0)
    assert await store.events("no-such-execution", None) is None


async def test_payloads_round_trip_idempotently(store: HistoryStore, raw: RawSql) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value
    payload = Payload.of("tenant-a", "e-1", "summarize", data)
    assert await store.put_payload(payload) == payload.payload_id
    assert await store.put_payload(payload) == payload.payload_id
    assert raw("SELECT count(*) FROM history_payloads") == [(1,)]

    stored = await store.get_payload(payload.payload_id, "tenant-a")
    assert stored == payload and stored.ref() == PayloadRef.from_json(payload.ref().to_json())
    assert await store.get_payload("p-" + "0" * 64, "tenant-a") is None

    # The same bytes of another step (or tenant) are another payload.
    other = Payload.of("tenant-a", "e-1", "translate", data)
    assert other.payload_id != payload.payload_id
    await store.put_payload(other)
    assert raw("SELECT count(*) FROM history_payloads") == [(2,)]

    forged = replace(payload, data=b"other bytes", size=11)
    with pytest.raises(ValueError, match="sha256"):
        await store.put_payload(forged)


async def test_corrupt_rows_are_reported_with_table_and_key(
    store: HistoryStore, raw: RawSql
) -> None:
    await store.upsert_execution(records.execution(), records.events(count=3))
    for n in range(3):
        await store.upsert_shared_run(records.shared_run(f"sr-{n}", created_ms=1000 + n))
    payload = Payload.of("tenant-a", "e-1", "split", b"x" * 1000)
    await store.put_payload(payload)

    raw("UPDATE history_executions SET plan_json = ? WHERE execution_id = ?", "{not json", "e-1")
    raw("UPDATE history_shared_runs SET run_json = ? WHERE shared_run_id = ?", "[1, 2]", "sr-1")
    raw("UPDATE history_events SET fields_json = ? WHERE seq = ?", '{"a": 1', 1)
    raw(
        "UPDATE history_payloads SET data = ? WHERE payload_id = ?", b"y" * 1000, payload.payload_id
    )

    with pytest.raises(CorruptRecord, match=r"history_executions \(key e-1\): plan_json") as info:
        await store.get_execution("e-1", "tenant-a")
    assert (info.value.table, info.value.key) == ("history_executions", "e-1")
    with pytest.raises(CorruptRecord, match=r"history_shared_runs \(key sr-1\)"):
        await store.get_shared_run("sr-1", "tenant-a")
    with pytest.raises(CorruptRecord, match=r"history_payloads .*sha256"):
        await store.get_payload(payload.payload_id, "tenant-a")

    # Lists go on: the readable rows, and the unreadable ones reported.
    page = await store.list_shared_runs("tenant-a", limit=2)
    assert [r.shared_run_id for r in page.runs] == ["sr-2"]
    assert len(page.corrupt) == 1 and "history_shared_runs (key sr-1)" in page.corrupt[0]
    assert page.next_cursor is not None
    rest = await store.list_shared_runs("tenant-a", cursor=page.next_cursor, limit=2)
    assert [r.shared_run_id for r in rest.runs] == ["sr-0"] and rest.next_cursor is None
    ledger = await store.events("e-1", "tenant-a")
    assert ledger is not None and [e.seq for e in ledger.events] == [0, 2]
    assert ledger.corrupt == [
        "corrupt row in history_events (key e-1/1): fields_json is not JSON "
        "(Expecting ',' delimiter: line 1 column 8 (char 7))"
    ]


async def test_concurrent_archives_of_one_execution_end_as_one_row_set(
    history_dsn: str, raw: RawSql
) -> None:
    """Eight archivers (each its own store: its own connection or pool) write the same
    execution at once, each with an overlapping part of the ledger."""
    writers = 8
    ledger = records.events(count=40)
    record = records.execution()
    stores = [await open_history_store(history_dsn, settings=settings()) for _ in range(writers)]
    barrier = asyncio.Barrier(writers)

    async def archive(n: int, store: HistoryStore) -> None:
        await barrier.wait()
        await store.upsert_execution(record, ledger[n * 4 : n * 4 + 12])

    try:
        await asyncio.gather(*(archive(n, s) for n, s in enumerate(stores)))
        stored = await stores[0].get_execution("e-1", "tenant-a")
        page = await stores[0].events("e-1", "tenant-a", limit=100)
    finally:
        for store in stores:
            await store.close()
    assert stored is not None and records.without_archived_at(stored) == record
    assert page is not None and page.events == ledger
    assert raw("SELECT count(*) FROM history_executions") == [(1,)]


async def test_encoded_rows_are_stored_as_they_are(store: HistoryStore, raw: RawSql) -> None:
    """The archiver hands over the JSON texts Redis held (:class:`EncodedExecution`,
    :class:`EncodedEvent`); the store writes those texts, and what it reads back equals
    the decoded record and ledger."""
    expected, ledger_values = records.execution(), records.events(count=3)
    plan_text = '{"id": "summarize-documents", "steps": [{"id": "split"}, {"id": "join"}]}'
    spaced = '{ "status" : "Succeeded", "steps" : {"split": {"output": [1, 2.5, null]}} }'
    encoded = EncodedExecution(
        execution_id="e-1",
        tenant_id="tenant-a",
        pipeline_id=expected.pipeline_id,
        status=expected.status,
        created_ms=expected.created_ms,
        finished_ms=expected.finished_ms,
        plan_json=plan_text,
        inputs_json='{"doc": "h\\u00e9llo \\u2713", "n": 3}',
        context_json='{"tenant_id":"tenant-a","user":"u1","namespaces":["a","b"]}',
        snapshot_json=spaced,
        step_slots_json=json.dumps(expected.step_slots),
        run_id=expected.run_id,
        shared_run_id=expected.shared_run_id,
    )
    ledger = [
        EncodedEvent("e-1", e.seq, e.entry_id, e.type, json.dumps(e.fields, indent=1))
        for e in ledger_values
    ]
    await store.upsert_execution(encoded, ledger)

    assert raw("SELECT plan_json, snapshot_json FROM history_executions") == [(plan_text, spaced)]
    stored_fields = raw("SELECT fields_json FROM history_events ORDER BY seq")
    assert [row[0] for row in stored_fields] == [e.fields_json for e in ledger]
    stored = await store.get_execution("e-1", "tenant-a")
    assert stored is not None and records.without_archived_at(stored) == expected
    assert encoded.decoded() == expected
    page = await store.events("e-1", "tenant-a", limit=10)
    assert page is not None and page.events == ledger_values
    assert [e.decoded() for e in ledger] == ledger_values

    await store.upsert_execution(expected, ledger_values)  # a decoded record: re-encoded
    [(plan_json,)] = raw("SELECT plan_json FROM history_executions")
    assert plan_json != plan_text and json.loads(plan_json) == expected.plan
