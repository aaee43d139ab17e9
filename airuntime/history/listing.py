"""How shared runs are listed: the filter, the order, and the opaque cursor.

Why this exists: ``GET /v1/runs`` pages through archived runs with a cursor, and both
backends must page the same way. The order is ``(created_ms, shared_run_id)``
descending -- newest first, the id breaking ties -- which an ascending index on the
same columns serves backwards on SQLite and PostgreSQL alike. A cursor is the position
of the last row of a page (keyset pagination, never an offset): a row inserted between
two page requests can never shift the rest, so pages have no duplicates, and every
row that existed when the first page was read is on exactly one page.

The cursor is opaque to callers (base64url of a small JSON list) and bound to the
filter it was made for: reusing it with another filter is an :class:`InvalidCursor`,
not a silently wrong page.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from typing import Final

from airuntime.history.errors import InvalidCursor

__all__ = ["MAX_PAGE", "Position", "SharedRunFilter", "decode_cursor", "encode_cursor"]

MAX_PAGE: Final = 1000
_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class SharedRunFilter:
    """Which shared runs a list returns. ``tenant_id`` None is an admin/internal read
    (every tenant); ``created_from_ms`` is inclusive, ``created_to_ms`` exclusive."""

    tenant_id: str | None
    statuses: tuple[str, ...] = ()
    pipeline_id: str | None = None
    created_from_ms: int | None = None
    created_to_ms: int | None = None

    def fingerprint(self) -> str:
        raw = json.dumps(
            [
                self.tenant_id,
                sorted(set(self.statuses)),
                self.pipeline_id,
                self.created_from_ms,
                self.created_to_ms,
            ]
        )
        return hashlib.sha256(raw.encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class Position:
    """The last row of a page: the next page starts strictly after it."""

    created_ms: int
    shared_run_id: str


def encode_cursor(position: Position, query: SharedRunFilter) -> str:
    raw = json.dumps(
        [_VERSION, query.fingerprint(), position.created_ms, position.shared_run_id],
        separators=(",", ":"),
    )
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, query: SharedRunFilter) -> Position:
    """The position a cursor stands for; InvalidCursor when it is not one of ours or
    was made for another filter."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        value = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise InvalidCursor(f"cursor {cursor[:40]!r} is not a list cursor") from None
    if (
        not isinstance(value, list)
        or len(value) != 4
        or value[0] != _VERSION
        or not isinstance(value[2], int)
        or not isinstance(value[3], str)
    ):
        raise InvalidCursor(f"cursor {cursor[:40]!r} is not a list cursor")
    if value[1] != query.fingerprint():
        raise InvalidCursor("the cursor was made for another filter; start again without it")
    return Position(value[2], value[3])
