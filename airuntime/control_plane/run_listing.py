"""``GET /v1/runs``: one listing over the shared runs still in Redis and the archived ones.

Why this exists: a finished run leaves Redis when its retention ends, and one that
ended a moment ago may not be archived yet; a caller must see each run exactly once
wherever it is. Both sources are read newest first by ``(created ms, id)``, the hot
ones from the creation index (``air:{air}:sruns[:tenant:<t>]``), the archived ones through
:meth:`HistoryStore.list_shared_runs`; they are merged by that key, a run in both is
shown once (the hot record), and the page ends at a keyset position that the opaque
cursor carries -- so a run moving to the archive between two pages is neither lost nor
repeated.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airuntime.control_plane.run_ledger import BadCursor
from airuntime.control_plane.shared_runs import SharedRun, SharedRunStore
from airuntime.core import keys
from airuntime.core.redis_client import RedisClient
from airuntime.core.reply_text import reply_text as _s
from airuntime.history.store import HistoryStore

__all__ = ["RunFilter", "RunListing", "RunsPage"]

_BATCH = 200


@dataclass(frozen=True, slots=True)
class RunFilter:
    tenant_id: str | None
    statuses: tuple[str, ...] = ()
    pipeline_id: str | None = None
    created_from_ms: int | None = None
    """Inclusive."""
    created_to_ms: int | None = None
    """Exclusive."""

    def fingerprint(self) -> str:
        raw = json.dumps([self.tenant_id, sorted(self.statuses), self.pipeline_id,
                          self.created_from_ms, self.created_to_ms])  # fmt: skip
        return hashlib.sha256(raw.encode()).hexdigest()[:16]

    def admits(self, run: SharedRun) -> bool:
        created = run.created_at_ms
        return (
            (not self.statuses or run.status.value in self.statuses)
            and (self.pipeline_id is None or run.pipeline_id == self.pipeline_id)
            and (self.created_from_ms is None or created >= self.created_from_ms)
            and (self.created_to_ms is None or created < self.created_to_ms)
            and (self.tenant_id is None or run.snapshot.tenant_id == self.tenant_id)
        )


@dataclass(frozen=True, slots=True)
class RunsPage:
    runs: list[SharedRun]
    next_cursor: str | None


Position = tuple[int, str]


def _encode(position: Position, query: RunFilter) -> str:
    raw = json.dumps({"c": position[0], "i": position[1], "f": query.fingerprint()})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode(cursor: str, query: RunFilter) -> Position:
    try:
        data = json.loads(base64.urlsafe_b64decode((cursor + "=" * (-len(cursor) % 4)).encode()))
        created, run_id, fp = data["c"], data["i"], data["f"]
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise BadCursor(f"cursor {cursor!r} is not a run-list cursor") from None
    if fp != query.fingerprint() or not isinstance(created, int) or not isinstance(run_id, str):
        raise BadCursor(f"cursor {cursor!r} was made for another filter")
    return created, run_id


def _before(run: SharedRun, after: Position | None) -> bool:
    return after is None or (run.created_at_ms, run.shared_run_id) < after


class RunListing:
    def __init__(self, redis: RedisClient, history: HistoryStore | None) -> None:
        self.redis = redis
        self.history = history
        self.runs = SharedRunStore(redis)

    async def page(self, query: RunFilter, cursor: str | None, limit: int) -> RunsPage:
        after = _decode(cursor, query) if cursor else None
        hot = await self._hot(query, after, limit + 1)
        archived = await self._archived(query, after, limit + 1)
        merged = {r.shared_run_id: r for r in archived}
        merged.update({r.shared_run_id: r for r in hot})
        ordered = sorted(merged.values(), key=lambda r: (r.created_at_ms, r.shared_run_id))
        ordered.reverse()
        runs = ordered[:limit]
        more = len(ordered) > limit
        last = (runs[-1].created_at_ms, runs[-1].shared_run_id) if runs else None
        return RunsPage(runs, _encode(last, query) if more and last else None)

    async def _hot(self, query: RunFilter, after: Position | None, want: int) -> list[SharedRun]:
        index = (
            keys.shared_runs_by_tenant(query.tenant_id) if query.tenant_id else keys.shared_runs()
        )
        limits = [after[0]] if after is not None else []
        if query.created_to_ms is not None:
            limits.append(query.created_to_ms - 1)
        top: Any = min(limits) if limits else "+inf"
        bottom: Any = "-inf" if query.created_from_ms is None else query.created_from_ms
        found: list[SharedRun] = []
        offset = 0
        while len(found) < want:
            ids = await self.redis.zrevrangebyscore(index, top, bottom, start=offset, num=_BATCH)
            if not ids:
                break
            offset += len(ids)
            batch = await self.runs.get_many([_s(i) for i in ids])
            found += [r for r in batch if _before(r, after) and query.admits(r)]
        return found[:want]

    async def _archived(
        self, query: RunFilter, after: Position | None, want: int
    ) -> list[SharedRun]:
        if self.history is None:
            return []
        to_ms = query.created_to_ms
        if after is not None:
            to_ms = after[0] + 1 if to_ms is None else min(to_ms, after[0] + 1)
        found: list[SharedRun] = []
        cursor: str | None = None
        while len(found) < want:
            page = await self.history.list_shared_runs(
                query.tenant_id,
                statuses=_seq(query.statuses),
                pipeline_id=query.pipeline_id,
                created_from_ms=query.created_from_ms,
                created_to_ms=to_ms,
                cursor=cursor,
                limit=min(1000, max(want, 50)),
            )
            for rec in page.runs:
                run = SharedRun.model_validate(rec.run)
                if _before(run, after):
                    found.append(run)
            cursor = page.next_cursor
            if cursor is None:
                break
        return found[:want]


def _seq(values: tuple[str, ...]) -> Sequence[str]:
    return list(values)
