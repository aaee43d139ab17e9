"""The run page's Gantt chart: bar geometry from the API's trace, computed server-side.

Why this exists: the trace (``GET /v1/runs/{id}/trace``) gives each step's attempts with
claim and end times; a person wants them as bars on one time axis. Each attempt is one
bar (a retried step shows its attempts side by side), steps ordered by first claim,
at most ``MAX_ROWS`` of them (the API has the rest). Times are relative to the
execution's creation; an attempt still running ends at ``now_ms``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["Bar", "Chart", "Row", "gantt_rows"]

MAX_ROWS: Final = 300
WIDTH: Final = 760
"""Width of the time axis, px."""
LABEL_W: Final = 180
ROW_H: Final = 18


@dataclass(frozen=True)
class Bar:
    x: float
    w: float
    status: str
    title: str


@dataclass
class Row:
    step: str
    y: int
    bars: list[Bar] = field(default_factory=list)


@dataclass
class Chart:
    rows: list[Row]
    span_ms: int
    hidden: int
    """Steps with a claim that are not drawn (beyond MAX_ROWS)."""
    never_ran: int
    ticks: list[tuple[float, str]]

    @property
    def height(self) -> int:
        return 24 + len(self.rows) * ROW_H

    @property
    def width(self) -> int:
        return LABEL_W + WIDTH + 10


def _attempt_status(step_status: str | None, attempt: dict[str, Any], last: bool) -> str:
    if attempt.get("ended_at_ms") is None:
        return "running"
    if last and step_status:
        return step_status
    return "failed" if attempt.get("outcome") not in ("completed", None) else "completed"


def gantt_rows(trace: dict[str, Any], now_ms: int) -> Chart:
    """The chart of a trace (``TraceBody`` as JSON)."""
    origin = int(trace.get("created_at_ms") or 0)
    steps = [s for s in trace.get("steps") or () if s.get("attempts")]
    never_ran = len(trace.get("steps") or ()) - len(steps)
    steps.sort(key=lambda s: (s["attempts"][0].get("claimed_at_ms") or 0, s["step"]))
    shown = steps[:MAX_ROWS]
    end = max(
        [trace.get("finished_at_ms") or 0]
        + [a.get("ended_at_ms") or now_ms for s in shown for a in s["attempts"]]
    )
    span = max(1, end - origin)
    scale = WIDTH / span
    rows = []
    for i, step in enumerate(shown):
        row = Row(step["step"], 24 + i * ROW_H)
        attempts = step["attempts"]
        for n, a in enumerate(attempts):
            start = (a.get("claimed_at_ms") or origin) - origin
            stop = (a.get("ended_at_ms") or now_ms) - origin
            status = _attempt_status(step.get("status"), a, n == len(attempts) - 1)
            title = (
                f"{step['step']} attempt {a.get('attempt')}: {status}, "
                f"{max(0, stop - start)} ms on {a.get('worker') or '?'}"
            )
            row.bars.append(
                Bar(LABEL_W + start * scale, max(2.0, (stop - start) * scale), status, title)
            )
        rows.append(row)
    ticks = [(LABEL_W + WIDTH * k / 4, f"{span * k / 4 / 1000:.2f} s") for k in range(5)]
    return Chart(rows, span, len(steps) - len(shown), never_ran, ticks)
