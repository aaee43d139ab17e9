"""Plain JSON values inside a pipeline (``inputs``, each step's ``with``): checked for
type, depth and size before anything encodes them, then normalised by a JSON round trip.

The checks stop as soon as a value is known to be too large, so even a YAML alias bomb
costs bounded work.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from airuntime.engine.pipeline.problems import fmt_value
from airuntime.engine.pipeline.spec import MAX_VALUE_DEPTH


class BadValue(Exception):
    """A value that is not plain JSON, too deep, or over its size cap (``too_big``)."""

    def __init__(self, loc: tuple[str | int, ...], message: str, *, too_big: bool = False) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message
        self.too_big = too_big


def check_json_value(value: Any, cap: int) -> None:
    """Check that ``value`` is plain JSON data no deeper than MAX_VALUE_DEPTH, and stop as
    soon as a lower bound of its encoded size exceeds ``cap`` bytes, so the work is bounded
    even for YAML alias bombs.  Raises :class:`BadValue`."""
    size = 0
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), value)]
    while stack:
        loc, item = stack.pop()
        if len(loc) > MAX_VALUE_DEPTH:
            raise BadValue(loc, f"nested deeper than {MAX_VALUE_DEPTH} levels")
        if isinstance(item, str):
            size += len(item) + 2
        elif item is None or isinstance(item, bool | int):
            size += 1
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise BadValue(loc, f"not JSON-serialisable: {item!r} is not a finite number")
            size += 1
        elif isinstance(item, Mapping):
            size += 2
            for key, child in item.items():
                if not isinstance(key, str):
                    raise BadValue(loc, f"keys must be strings (key={fmt_value(key)})")
                size += len(key) + 4
                stack.append(((*loc, key), child))
        elif isinstance(item, list | tuple):
            size += 2 + len(item)
            stack.extend(((*loc, i), child) for i, child in enumerate(item))
        else:
            raise BadValue(
                loc, f"not JSON-serialisable: {type(item).__name__} (value={fmt_value(item)})"
            )
        if size > cap:
            raise BadValue((), f"at least {size} bytes", too_big=True)


def normalize_json(value: Any, cap: int) -> tuple[Any, int]:
    """A JSON round trip of ``value`` (deep copy; lists instead of tuples) and its encoded
    size in bytes.  Raises :class:`BadValue`."""
    check_json_value(value, cap)
    try:
        encoded = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError, RecursionError) as exc:
        raise BadValue((), f"not JSON-serialisable: {exc}") from None
    size = len(encoded.encode("utf-8"))
    if size > cap:
        raise BadValue((), f"{size} bytes", too_big=True)
    return json.loads(encoded), size
