"""Parsed JSON records by their exact stored text: a record read back unchanged is not
parsed again.

Why this exists: a shared run's record (its pipeline, inputs and context snapshot:
kilobytes of JSON) is read and parsed at every step of its life in the control plane:
the pump's claim, the dispatch transaction, the outcome's transition, the
reconciler's pass. Most of those reads return exactly the text the step before
wrote, and pydantic's parse of it was about a tenth of the control plane's CPU per
dispatched run. A tenant's settings are read by submit, admission, intake and start
of every run and change rarely. The records are frozen models, so one parsed
instance can serve every reader of the same text. The key is the text itself, so any
change, by this process or another, is a different key and is parsed afresh: the cache
can be stale only about text nobody stores any more. It is bounded by count and by size: the newest
``entries`` texts holding at most ``total_bytes`` together, none over ``max_bytes`` (a
larger record is parsed every time, never kept).
"""

from __future__ import annotations

from typing import Generic, TypeVar

from pydantic import BaseModel

__all__ = ["ParsedRecords"]

M = TypeVar("M", bound=BaseModel)


class ParsedRecords(Generic[M]):
    """Records of one frozen model, by the bytes they are stored as."""

    def __init__(
        self,
        model: type[M],
        *,
        entries: int = 4096,
        max_bytes: int = 256 * 1024,
        total_bytes: int = 16 * 1024 * 1024,
    ):
        if not model.model_config.get("frozen"):
            # A reader that changed a shared instance would change every other reader's.
            raise TypeError(f"{model.__name__} is not frozen: its parsed records cannot be shared")
        if min(entries, max_bytes, total_bytes) < 1 or max_bytes > total_bytes:
            raise ValueError(
                f"need 0 < max_bytes <= total_bytes and entries > 0: entries={entries}, "
                f"max_bytes={max_bytes}, total_bytes={total_bytes}"
            )
        self.model = model
        self.entries = entries
        self.max_bytes = max_bytes
        self.total_bytes = total_bytes
        self._by_text: dict[bytes, M] = {}
        self._bytes = 0

    def parse(self, raw: bytes | str) -> M:
        """The record stored as ``raw`` (validated as the model; a ValidationError for
        text that is not one)."""
        text = raw.encode() if isinstance(raw, str) else raw
        if len(text) > self.max_bytes:
            return self.model.model_validate_json(text)
        record = self._by_text.get(text)
        if record is None:
            record = self.model.model_validate_json(text)
            self._keep(text, record)
        return record

    def written(self, text: str, record: M) -> None:
        """``record`` was just stored as ``text`` (its ``model_dump_json()``): the next
        read of it needs no parse."""
        data = text.encode()
        if len(data) <= self.max_bytes:
            self._keep(data, record)

    def __len__(self) -> int:
        return len(self._by_text)

    @property
    def held_bytes(self) -> int:
        """The size of the texts kept."""
        return self._bytes

    def _keep(self, text: bytes, record: M) -> None:
        by_text = self._by_text
        if by_text.pop(text, None) is not None:  # re-inserted below as the newest
            self._bytes -= len(text)
        by_text[text] = record
        self._bytes += len(text)
        while len(by_text) > self.entries or self._bytes > self.total_bytes:
            oldest = next(iter(by_text))
            del by_text[oldest]
            self._bytes -= len(oldest)
