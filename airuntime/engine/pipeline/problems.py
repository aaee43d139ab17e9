"""How a pipeline's problems are reported: where (``steps[3].depends_on``) and what.

Every check of the pipeline package speaks in :class:`Problem`s and raises one
:class:`PipelineError` listing them all, so a user sees every mistake of a file at once,
each line in the same ``<location>: <what is wrong> (value=...)`` form.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from airuntime.core.errors import AirError


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a pipeline: ``loc`` like ``steps[3].depends_on``."""

    loc: str
    message: str

    def __str__(self) -> str:
        return f"{self.loc}: {self.message}" if self.loc else self.message


class PipelineError(AirError, ValueError):
    """The pipeline is invalid; ``problems`` lists every problem found, ``str()`` shows one
    per line (prefixed with ``source``, e.g. the file name, when known)."""

    def __init__(self, problems: Sequence[Problem] | str, *, source: str | None = None) -> None:
        if isinstance(problems, str):
            problems = [Problem("", problems)]
        self.problems: tuple[Problem, ...] = tuple(problems)
        self.source = source
        super().__init__(str(self))

    def __str__(self) -> str:
        prefix = f"{self.source}: " if self.source else ""
        return "\n".join(f"{prefix}{p}" for p in self.problems)


def fmt_value(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def format_loc(parts: Iterable[str | int]) -> str:
    """A pydantic-style location as users read it: ``steps[3].with['a b']``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            out += "(key)"
        elif _IDENT.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out
