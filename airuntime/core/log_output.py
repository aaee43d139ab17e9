"""How airuntime's long-running processes write their log: one line a record, as text
or as JSON, at a level the environment chooses.

Why this exists: the control plane, runtimes and workers logged through whatever the
root logger happened to be. With nothing configured, Python's last-resort handler wrote
WARNING and above as the bare message -- no time, level or logger -- and dropped INFO,
so a supervised loop that failed said so without a time and said nothing when it
recovered; with the MCP endpoint on, the MCP SDK's ``basicConfig`` installed rich's
handler, which lays records out in 80 columns when its output is not a terminal (a
pod's log): one record over five or six lines, each a separate entry for a log
collector. :func:`configure_logs`, called by each long-running entry point before it
starts anything, installs one handler on the root logger (``basicConfig`` later, by a
library, is then a no-op):

* ``AIRUNTIME_LOG_FORMAT=text`` (default): ``2026-12-07T14:15:47.123Z WARNING
  airuntime.core.supervision: message`` -- UTC, milliseconds; a traceback follows on
  its own lines, as Python prints it;
* ``AIRUNTIME_LOG_FORMAT=json``: one JSON object a line (``ts``, ``level``, ``logger``,
  ``message``, and ``exception`` with the traceback's text), for a log collector;
* ``AIRUNTIME_LOG_LEVEL``: ``DEBUG``, ``INFO`` (default), ``WARNING``, ``ERROR`` or
  ``CRITICAL``.

Libraries that log every request at INFO (httpx, the MCP SDK) are held at WARNING
unless the level is DEBUG. A malformed value is refused, naming the variable and the
value, before the process starts.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from enum import StrEnum
from typing import Any, Final, Literal, TextIO, get_args

from pydantic import field_validator

from airuntime.core.settings import EnvSettings

__all__ = ["LEVELS", "LogFormat", "LogLevel", "LogSettings", "configure_logs", "known_level"]

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
LEVELS: Final = get_args(LogLevel)
CHATTY: Final = ("httpx", "httpcore", "mcp", "uvicorn.access", "alembic")
"""Loggers that write a record per request (or per plugin, alembic) at INFO: WARNING
unless the level is DEBUG."""


def known_level(value: Any) -> Any:
    """A level in any case (``info``) as :data:`LogLevel` spells it; anything else as
    given, for the refusal to show."""
    if isinstance(value, str) and value.strip().upper() in LEVELS:
        return value.strip().upper()
    return value


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class LogSettings(EnvSettings):
    """The log of a long-running process (``AIRUNTIME_LOG_*``)."""

    log_level: LogLevel = "INFO"
    """Lowest level written (``AIRUNTIME_LOG_LEVEL``: DEBUG, INFO, WARNING, ERROR,
    CRITICAL, in any case; default INFO)."""
    log_format: LogFormat = LogFormat.TEXT
    """``text`` (one line a record, UTC time, level, logger, message) or ``json`` (one
    object a line) (``AIRUNTIME_LOG_FORMAT``; default text)."""

    _in_any_case = field_validator("log_level", mode="before")(known_level)


def _utc(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    """``<UTC time> <LEVEL> <logger>: <message>``, then the traceback, if any."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_utc(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object a record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": _utc(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logs(
    level: str, log_format: LogFormat, stream: TextIO | None = None
) -> logging.Handler:
    """Make the root logger write ``log_format`` at ``level`` to ``stream`` (default
    stderr), replacing any handler it had; the handler installed."""
    handler = logging.StreamHandler(stream or sys.stderr)
    formatter = JsonFormatter() if log_format is LogFormat.JSON else TextFormatter()
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    quiet = logging.DEBUG if level == "DEBUG" else logging.WARNING
    for name in CHATTY:
        logging.getLogger(name).setLevel(quiet)
    return handler
