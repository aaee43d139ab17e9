"""Parsed records are shared only between readers of the same stored text, stay
bounded, and are refused for a model a reader could change."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError
from redis.asyncio import Redis

from airuntime.control_plane.shared_runs import SharedRun, SharedRunStore, parse_shared_run
from airuntime.core import keys
from airuntime.core.parsed_records import ParsedRecords


class Rec(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    n: int


def test_the_same_text_is_parsed_once_and_a_changed_text_afresh() -> None:
    records = ParsedRecords(Rec)
    first = records.parse(b'{"name":"a","n":1}')
    assert records.parse(b'{"name":"a","n":1}') is first
    assert records.parse('{"name":"a","n":1}') is first, "str and bytes are the same text"
    changed = records.parse(b'{"name":"a","n":2}')
    assert changed == Rec(name="a", n=2) and changed is not first


def test_a_written_record_is_read_back_without_a_parse() -> None:
    records = ParsedRecords(Rec)
    rec = Rec(name="w", n=3)
    records.written(rec.model_dump_json(), rec)
    assert records.parse(rec.model_dump_json().encode()) is rec


def test_text_that_is_not_a_record_is_refused_every_time() -> None:
    records = ParsedRecords(Rec)
    for _ in range(2):
        with pytest.raises(ValidationError):
            records.parse(b'{"name":"a"}')
    assert len(records) == 0


def test_it_keeps_the_newest_entries_and_never_a_large_record() -> None:
    records = ParsedRecords(Rec, entries=3, max_bytes=64, total_bytes=1000)
    texts = [f'{{"name":"r","n":{i}}}'.encode() for i in range(5)]
    parsed = [records.parse(t) for t in texts]
    assert len(records) == 3
    assert records.parse(texts[4]) is parsed[4], "the newest is kept"
    assert records.parse(texts[0]) is not parsed[0], "the oldest was dropped"
    big = ('{"name":"' + "x" * 100 + '","n":1}').encode()
    assert records.parse(big) is not records.parse(big), "a large record is never kept"
    assert len(records) == 3


def test_the_texts_kept_stay_within_their_total_size() -> None:
    records = ParsedRecords(Rec, max_bytes=40, total_bytes=100)
    texts = [f'{{"name":"{"y" * 10}","n":{i}}}'.encode() for i in range(10)]
    assert {len(t) for t in texts} == {27}
    parsed = [records.parse(t) for t in texts]
    assert len(records) == 3 and records.held_bytes == 81, "a fourth would make 108"
    assert records.parse(texts[9]) is parsed[9] and records.parse(texts[6]) is not parsed[6]
    records.written(texts[6].decode(), parsed[6])  # kept again: counted once
    assert len(records) == 3 and records.held_bytes == 81


def test_a_model_readers_could_change_is_refused() -> None:
    class Mutable(BaseModel):
        n: int

    with pytest.raises(TypeError, match="Mutable is not frozen"):
        ParsedRecords(Mutable)


_RAW = (
    '{"shared_run_id":"sr-1","status":"QueuedGlobally","pipeline_id":"p","pipeline":{},'
    '"snapshot":{"tenant_id":"t"},"created_at_ms":1,"updated_at_ms":1}'
)


def test_a_shared_run_cannot_be_changed_in_place() -> None:
    raw = _RAW
    run = parse_shared_run(raw)
    assert parse_shared_run(raw.encode()) is run
    with pytest.raises(ValidationError, match="frozen"):
        run.status = run.status  # type: ignore[misc]
    assert isinstance(run, SharedRun)


async def test_a_record_one_update_wrote_is_read_back_without_a_parse(redis: Redis) -> None:
    store = SharedRunStore(redis)
    srid = store.new_id()
    await store.create(parse_shared_run(_RAW.replace("sr-1", srid)))
    updated = await store.update(srid, reason="checked")
    stored = await redis.get(keys.shared_run(srid))
    assert parse_shared_run(stored) is updated, "the text the update wrote is kept"
    assert updated.reason == "checked"
