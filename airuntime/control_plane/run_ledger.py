"""An execution's ledger, paged the same way from its Redis stream and from the archive.

Why this exists: ``GET /v1/runs/{id}/events``, its Server-Sent Events stream, the
trace and the report all read the ledger. The archive numbers stream entries in order
(``seq`` 0..n) and keeps their entry ids, so a position ``(seq, entry id)`` means the
same entry in both places: a page continues in the stream with ``XRANGE (<entry id>``
and in the archive with ``after_seq``, and a cursor handed out while the run was hot
still works after retention moved it to the archive.

The cursor is opaque to callers (URL-safe base64 of JSON) and bound to its execution:
another run's cursor, or a forged one, is refused with :class:`BadCursor`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

from airuntime.core.execution_layout import execution_keys_for
from airuntime.core.redis_client import RedisClient
from airuntime.core.reply_text import reply_text as _s
from airuntime.history.listing import MAX_PAGE
from airuntime.history.store import HistoryStore

__all__ = ["MAX_LIMIT", "BadCursor", "LedgerEntry", "LedgerPage", "LedgerReader"]

MAX_LIMIT: Final = MAX_PAGE - 1
"""The largest page a caller may ask for (one more entry is read to know if more follow)."""


class BadCursor(ValueError):
    """A cursor that is not one this module made for this execution."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    seq: int
    entry_id: str
    type: str
    fields: dict[str, str]
    """The entry's fields without ``type``."""

    @property
    def at_ms(self) -> int:
        """When the entry was written (Redis time: the stream id's milliseconds)."""
        return int(self.entry_id.split("-", 1)[0])

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "id": self.entry_id, "type": self.type, "fields": self.fields}


@dataclass(frozen=True, slots=True)
class LedgerPage:
    entries: list[LedgerEntry]
    next_cursor: str | None
    """Where the next page starts; None when this page reached the end (so far)."""
    last: tuple[int, str] | None
    """The position of the page's last entry (or the position it started after)."""


def encode_cursor(execution_id: str, seq: int, entry_id: str) -> str:
    raw = json.dumps({"x": execution_id, "s": seq, "e": entry_id}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(execution_id: str, cursor: str) -> tuple[int, str]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        seq, entry_id, owner = data["s"], data["e"], data["x"]
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise BadCursor(f"cursor {cursor!r} is not a ledger cursor") from None
    if owner != execution_id or not isinstance(seq, int) or seq < 0:
        raise BadCursor(f"cursor {cursor!r} does not belong to this run's ledger")
    if not isinstance(entry_id, str) or not _is_stream_id(entry_id):
        raise BadCursor(f"cursor {cursor!r} does not name a ledger entry")
    return seq, entry_id


def _is_stream_id(value: str) -> bool:
    ms, sep, n = value.partition("-")
    return bool(sep) and ms.isdigit() and n.isdigit()


class LedgerReader:
    """Pages of one execution's ledger: hot while its stream exists, else archived."""

    def __init__(self, redis: RedisClient, history: HistoryStore | None) -> None:
        self.redis = redis
        self.history = history

    async def page(
        self,
        execution_id: str,
        tenant_id: str,
        after: tuple[int, str] | None,
        limit: int,
    ) -> LedgerPage:
        """Up to ``limit`` entries after ``after`` (None: from the start)."""
        entries = await self._read(execution_id, tenant_id, after, limit + 1)
        more = len(entries) > limit
        entries = entries[:limit]
        last = (entries[-1].seq, entries[-1].entry_id) if entries else after
        cursor = None
        if more and last is not None:
            cursor = encode_cursor(execution_id, *last)
        return LedgerPage(entries, cursor, last)

    async def all(self, execution_id: str, tenant_id: str) -> list[LedgerEntry]:
        return [e async for e in self.iterate(execution_id, tenant_id)]

    async def iterate(self, execution_id: str, tenant_id: str) -> AsyncIterator[LedgerEntry]:
        after: tuple[int, str] | None = None
        while True:
            page = await self.page(execution_id, tenant_id, after, MAX_LIMIT)
            for entry in page.entries:
                yield entry
            if page.next_cursor is None:
                return
            after = page.last

    async def _read(
        self, execution_id: str, tenant_id: str, after: tuple[int, str] | None, count: int
    ) -> list[LedgerEntry]:
        stream = execution_keys_for(self.redis, execution_id).events
        if await self.redis.exists(stream):
            start = f"({after[1]}" if after else "-"
            raw: Any = await self.redis.xrange(stream, min=start, count=count)
            first = after[0] + 1 if after else 0
            out = []
            for i, (entry_id, fields) in enumerate(raw):
                f = {_s(k): _s(v) for k, v in fields.items()}
                out.append(LedgerEntry(first + i, _s(entry_id), f.pop("type", ""), f))
            if out or await self.redis.exists(stream):
                return out
        if self.history is None:
            return []
        page = await self.history.events(
            execution_id, tenant_id, after_seq=after[0] if after else None, limit=count
        )
        if page is None:
            return []
        return [
            LedgerEntry(
                e.seq, e.entry_id, e.type, {k: v for k, v in e.fields.items() if k != "type"}
            )
            for e in page.events
        ]
