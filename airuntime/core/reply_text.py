"""A Redis reply value as text.

Why this exists: every client airuntime makes answers bytes (``decode_responses`` is
off: ledger fields, outputs and plans are read as they were written), so each reader
of ids, statuses and hash fields decodes them; one function, instead of a private
copy in each module.
"""

from __future__ import annotations

from typing import Any

__all__ = ["reply_text"]


def reply_text(value: Any) -> str:
    """``value`` decoded (UTF-8) if Redis answered bytes, else ``str(value)``."""
    return value.decode() if isinstance(value, bytes) else str(value)
