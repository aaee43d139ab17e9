"""One wording for a rejected value: where it was, what is wrong, which value it was.

Why this exists: settings from options and environment variables, tenant and token
files and run requests are all validated by pydantic models, and their callers report
the first problem to a person. The same three parts in the same order make those
messages predictable (and testable) wherever they come from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

__all__ = ["format_validation_error"]


def _dotted(loc: str) -> str:
    return loc or "value"


def format_validation_error(
    exc: ValidationError,
    *,
    where: Callable[[str], str] = _dotted,
    with_value: bool = True,
    redact: Callable[[tuple[Any, ...], Any], Any] | None = None,
) -> str:
    """``<where>: <what is wrong> (value=<value>)`` for the first error of ``exc``.

    ``where`` turns the error's dotted location (``""`` for a rule on the whole model)
    into what the reader knows it by, e.g. the option or variable that supplied the
    field. The value is left out with ``with_value=False`` (a token must not be
    echoed) and for a rule on the whole model, whose input is every value at once (a
    Redis URL with its password among them); its message names the fields.
    ``redact(loc, value)`` returns what may be shown of the value (secrets hidden).
    """
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    text = f"{where(loc)}: {str(err['msg']).removeprefix('Value error, ')}"
    if with_value and loc:
        value = err.get("input")
        if redact is not None:
            value = redact(tuple(err["loc"]), value)
        text += f" (value={value!r})"
    return text
