"""Where a workload's Redis time goes: every command's and script call's server time,
summed by script name.

Why this exists: ``INFO commandstats`` puts every script call under one ``evalsha``
line, so it cannot say which of a run's dozen scripts costs what. The server's
``SLOWLOG`` can: with ``slowlog-log-slower-than 0`` it records every command with its
duration in microseconds and its arguments, and an ``EVALSHA``'s first argument names
the script (its SHA1, which :func:`airuntime.core.scripts.library` maps back to a
name). Recording costs the server some time of its own, so the workload's throughput
while recording is not a figure to report; the times are.

    with CommandTimes(client, capacity=200_000) as times:
        ...  # the workload
    rows = times.per(runs)

``capacity`` must hold every command of the workload (the server keeps the newest
``slowlog-max-len`` entries): :attr:`CommandTimes.complete` says whether it did. The
server's two settings are put back as they were, and its log emptied, on exit.

The server logs the commands a script runs as well as the script call (with the
caller's address, so the log cannot tell them from commands a client sent): a script's
row includes the time of the commands it ran, and a plain command's row counts both
kinds. Sum the script rows, or the plain rows, never both.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import redis

from airuntime.core.scripts import library
from benchmarks.redis_probe import text

__all__ = ["CommandTime", "CommandTimes"]

_MARKER_TEXT = "command-times-start"
_MARKER = f"ECHO {_MARKER_TEXT}"
"""How the marker the block starts with reads in the server's log."""


@dataclass(frozen=True)
class CommandTime:
    """One script's (``EVALSHA <name>``) or plain command's share of a workload."""

    name: str
    calls_per_unit: float
    us_per_unit: float
    us_per_call: float


class CommandTimes:
    """Every command the server runs while the block runs, with its duration."""

    def __init__(self, client: redis.Redis, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, not {capacity}")
        self.client = client
        self.capacity = capacity
        self._saved: dict[str, str] = {}
        self.entries: list[dict[str, Any]] = []
        self.complete = False
        """True when the log held every command of the block (none was pushed out)."""

    def __enter__(self) -> CommandTimes:
        for name in ("slowlog-log-slower-than", "slowlog-max-len"):
            self._saved[name] = text(self.client.config_get(name)[name])
        # The marker proves, at the end, that nothing the block did was pushed out of
        # the log: it is still there only if the log never overflowed. (+2: the marker,
        # and the CONFIG SET below, which the server may log too.)
        self.client.config_set("slowlog-max-len", self.capacity + 2)
        self.client.slowlog_reset()
        self.client.config_set("slowlog-log-slower-than", 0)
        self.client.echo(_MARKER_TEXT)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.client.config_set(
                "slowlog-log-slower-than", self._saved["slowlog-log-slower-than"]
            )
            if exc_type is None:
                entries = self.client.slowlog_get(self.capacity + 2)
                marker = [i for i, e in enumerate(entries) if text(e["command"]) == _MARKER]
                self.complete = bool(marker)
                # Newest first: what the block ran comes before the marker (and the
                # settings changed around it are left out).
                kept = entries[: marker[0]] if marker else entries
                self.entries = [e for e in kept if not text(e["command"]).startswith("CONFIG")]
        finally:
            self.client.slowlog_reset()
            self.client.config_set("slowlog-max-len", self._saved["slowlog-max-len"])

    def per(self, units: int) -> list[CommandTime]:
        """The block's server time per unit (a run, a step), largest share first:
        ``EVALSHA <script>`` per script, other commands by name."""
        if units < 1:
            raise ValueError(f"units must be >= 1, not {units}")
        names = {s.sha: s.name for s in library().scripts.values()}
        us: Counter[str] = Counter()
        calls: Counter[str] = Counter()
        for entry in self.entries:
            argv = text(entry["command"]).split()
            name = argv[0].upper() if argv else "?"
            if name in ("EVALSHA", "EVAL_RO", "EVALSHA_RO") and len(argv) > 1:
                name = f"EVALSHA {names.get(argv[1], argv[1][:12])}"
            us[name] += int(entry["duration"])
            calls[name] += 1
        return [
            CommandTime(
                name,
                round(calls[name] / units, 2),
                round(total / units, 1),
                round(total / calls[name], 1),
            )
            for name, total in us.most_common()
        ]
