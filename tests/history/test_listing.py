"""Listing shared runs on both backends: the filters, the newest-first order with the id
breaking ties, and a cursor that neither repeats nor skips a row -- also when rows are
archived between two page requests."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from airuntime.history import ArchivedSharedRun, HistoryStore, InvalidCursor
from tests.history import records

TENANTS = ("tenant-a", "tenant-b", "tenant-c")
STATUSES = ("Succeeded", "Failed", "Cancelled")
PIPELINES = ("summarize-documents", "retries")


def corpus(count: int, seed: int = 7) -> list[ArchivedSharedRun]:
    """Runs spread over tenants, statuses and pipelines, many sharing a created_ms (so
    the id must break ties)."""
    rng = random.Random(seed)
    return [
        records.shared_run(
            f"sr-{n:04d}",
            rng.choice(TENANTS),
            created_ms=1_000 + rng.randrange(count // 3),
            status=rng.choice(STATUSES),
            pipeline_id=rng.choice(PIPELINES),
        )
        for n in range(count)
    ]


def newest_first(runs: list[ArchivedSharedRun]) -> list[str]:
    ordered = sorted(runs, key=lambda r: (r.created_ms, r.shared_run_id), reverse=True)
    return [r.shared_run_id for r in ordered]


async def page_through(
    store: HistoryStore, tenant: str | None, limit: int, **filters: object
) -> list[str]:
    seen: list[str] = []
    cursor = None
    while True:
        page = await store.list_shared_runs(tenant, cursor=cursor, limit=limit, **filters)  # type: ignore[arg-type]
        assert not page.corrupt and len(page.runs) <= limit
        seen.extend(r.shared_run_id for r in page.runs)
        if page.next_cursor is None:
            return seen
        assert page.runs, "a page with a next cursor is never empty"
        cursor = page.next_cursor


Predicate = Callable[[ArchivedSharedRun], bool]

FILTERS: list[tuple[str, dict[str, object], Predicate]] = [
    ("all", {}, lambda r: True),
    ("status", {"statuses": ["Failed"]}, lambda r: r.status == "Failed"),
    (
        "statuses",
        {"statuses": ["Failed", "Cancelled"]},
        lambda r: r.status in ("Failed", "Cancelled"),
    ),
    ("pipeline", {"pipeline_id": "retries"}, lambda r: r.pipeline_id == "retries"),
    (
        "time range",
        {"created_from_ms": 1_010, "created_to_ms": 1_030},
        lambda r: 1_010 <= r.created_ms < 1_030,
    ),
    (
        "everything",
        {"statuses": ["Succeeded"], "pipeline_id": "summarize-documents", "created_from_ms": 1_020},
        lambda r: (
            r.status == "Succeeded"
            and r.pipeline_id == "summarize-documents"
            and r.created_ms >= 1_020
        ),
    ),
]


async def test_every_filter_pages_newest_first_without_duplicates_or_misses(
    store: HistoryStore,
) -> None:
    runs = corpus(150)
    for run in runs:
        await store.upsert_shared_run(run)

    for tenant in (*TENANTS, None):
        for name, filters, keep in FILTERS:
            expected = newest_first(
                [r for r in runs if (tenant is None or r.tenant_id == tenant) and keep(r)]
            )
            for limit in (1, 7, 1000):
                assert await page_through(store, tenant, limit, **filters) == expected, (
                    tenant,
                    name,
                    limit,
                )


async def test_rows_archived_between_pages_never_repeat_or_hide_the_others(
    store: HistoryStore,
) -> None:
    before = corpus(60)
    for run in before:
        await store.upsert_shared_run(run)
    first = await store.list_shared_runs("tenant-a", limit=5)
    assert first.next_cursor is not None
    last = first.runs[-1]

    # Archived now: newer than everything, older than the cursor, and tied with it on
    # created_ms on both sides of its id.
    late = [
        records.shared_run("sr-new", "tenant-a", created_ms=9_999),
        records.shared_run("sr-old", "tenant-a", created_ms=1),
        records.shared_run(last.shared_run_id + "-after", "tenant-a", created_ms=last.created_ms),
        records.shared_run(last.shared_run_id[:-1], "tenant-a", created_ms=last.created_ms),
    ]
    for run in late:
        await store.upsert_shared_run(run)

    seen = [r.shared_run_id for r in first.runs]
    seen += await page_through_from(store, first.next_cursor)
    assert len(seen) == len(set(seen)), "a row was listed twice"
    existing = {r.shared_run_id for r in before if r.tenant_id == "tenant-a"}
    assert existing <= set(seen), "a row that existed before the first page was skipped"
    # What sorts after the cursor is on a later page; what sorts before it is not.
    assert "sr-old" in seen and last.shared_run_id[:-1] in seen
    assert "sr-new" not in seen and last.shared_run_id + "-after" not in seen


async def page_through_from(store: HistoryStore, cursor: str) -> list[str]:
    seen: list[str] = []
    next_cursor: str | None = cursor
    while next_cursor is not None:
        page = await store.list_shared_runs("tenant-a", cursor=next_cursor, limit=5)
        seen.extend(r.shared_run_id for r in page.runs)
        next_cursor = page.next_cursor
    return seen


async def test_a_cursor_is_opaque_and_bound_to_its_filter(store: HistoryStore) -> None:
    for run in corpus(20):
        await store.upsert_shared_run(run)
    page = await store.list_shared_runs(None, statuses=["Succeeded", "Failed"], limit=2)
    assert page.next_cursor is not None

    # The same filter, spelt in another order, accepts it.
    again = await store.list_shared_runs(
        None, statuses=["Failed", "Succeeded"], cursor=page.next_cursor, limit=2
    )
    assert again.runs and again.runs[0] not in page.runs
    with pytest.raises(InvalidCursor, match="another filter"):
        await store.list_shared_runs("tenant-a", cursor=page.next_cursor)
    for garbage in ("", "not a cursor", "W10", page.next_cursor[:-3]):
        with pytest.raises(ValueError, match="cursor"):
            await store.list_shared_runs(None, cursor=garbage)
    for limit in (0, 1001):
        with pytest.raises(ValueError, match="limit"):
            await store.list_shared_runs(None, limit=limit)
