"""How every ``airt`` listing prints: ``-o table|wide|json|yaml``, ids that never wrap,
and ``--watch`` for a live view.

Why this exists: ``airt instances``, ``airt runs`` and ``airt queue`` show rows of
records whose first column is an id (``tenant-a-runtime-1``, ``sr-<32 hex>``). In an
80-column terminal rich folded such ids over two lines, which breaks reading and
copying them. Here an id column is ``no_wrap``: in ``table`` the row's own id is shown
whole and the other ids it refers to are shortened in the middle
(``sr-9d7a12…0c72816d42``, both ends kept); ``wide`` shows every id in full and the extra
columns, at whatever width that takes (like ``kubectl -o wide``); ``json``
and ``yaml`` print the records as the API (or the registry) gives them, for machines.
``--watch`` redraws the table every ``--interval`` seconds (rich ``Live``) until Ctrl-C
(or ``--updates N`` redraws).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.live import Live
from rich.table import Table

from airuntime.cli.common import invalid, out, print_table

__all__ = [
    "Column",
    "Interval",
    "Output",
    "OutputFormat",
    "Updates",
    "Watch",
    "middle",
    "output_format",
    "print_listing",
    "step_table",
]

ID_WIDTH = 20
"""Longest id a ``table`` shows whole; longer ones are shortened in the middle."""
WIDE_WIDTH = 1000
"""Console width of ``-o wide``: as wide as the rows need."""


class OutputFormat(StrEnum):
    TABLE = "table"
    WIDE = "wide"
    JSON = "json"
    YAML = "yaml"


Output = Annotated[
    OutputFormat | None,
    typer.Option(
        "--output",
        "-o",
        help="table (fits 80 columns; ids never wrapped, ids a row refers to shortened "
        "in the middle), wide (every id whole, more columns), json or yaml.",
    ),
]
Watch = Annotated[
    bool, typer.Option("--watch", "-w", help="Redraw the table every --interval seconds.")
]
Interval = Annotated[
    float, typer.Option("--interval", min=0.1, max=3600, help="Seconds between --watch redraws.")
]
Updates = Annotated[
    int | None,
    typer.Option("--updates", min=1, help="With --watch: stop after this many redraws."),
]


@dataclass(frozen=True)
class Column:
    """One column: its header, how a record shows in it, whether it is an id (never
    wrapped; ``shorten``: middle-shortened in ``table``, for ids that are not the row's
    own) and whether only ``wide`` shows it."""

    header: str
    cell: Callable[[Any], str]
    is_id: bool = False
    shorten: bool = False
    wide_only: bool = False
    no_wrap: bool = False
    """A short word (a status) that must not be folded either."""


def local_time(ms: Any) -> str:
    """A Unix-ms timestamp as local ``YYYY-MM-DD HH:MM:SS`` (``-`` for none)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else "-"


def middle(text: str, width: int = ID_WIDTH) -> str:
    """``text`` shortened to ``width`` characters by an ellipsis in the middle."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    tail = width - 1 - head
    return f"{text[:head]}…{text[-tail:]}"


def output_format(output: OutputFormat | None, as_json: bool) -> OutputFormat:
    """The format chosen by ``-o`` (or the older ``--json``)."""
    if as_json and output not in (None, OutputFormat.JSON):
        raise invalid(f"--json and -o {output} contradict each other")
    return OutputFormat.JSON if as_json else (output or OutputFormat.TABLE)


def table(
    title: str,
    columns: Sequence[Column],
    records: Sequence[Any],
    wide: bool,
    caption: str | None = None,
) -> Table:
    shown = [c for c in columns if wide or not c.wide_only]
    t = Table(title=title, caption=caption)
    for c in shown:
        if c.is_id or c.no_wrap:
            t.add_column(c.header, no_wrap=True, overflow="ellipsis", min_width=len(c.header))
        else:
            t.add_column(c.header, overflow="fold", min_width=len(c.header))
    for record in records:
        cells = [c.cell(record) for c in shown]
        if not wide:
            cells = [middle(v) if c.shorten else v for c, v in zip(shown, cells, strict=True)]
        t.add_row(*cells)
    return t


def print_listing(
    fetch: Callable[[], tuple[Any, Sequence[Any]]],
    *,
    title: str,
    columns: Sequence[Column],
    fmt: OutputFormat,
    watch: bool = False,
    interval: float = 2.0,
    updates: int | None = None,
    caption: str | None = None,
) -> None:
    """Print what ``fetch`` returns -- (the document for json/yaml, the records for a
    table) -- once, or redrawn every ``interval`` seconds with ``watch``."""
    wide = fmt is OutputFormat.WIDE
    console = Console(width=WIDE_WIDTH, markup=False, soft_wrap=True) if wide else out
    if not watch:
        document, records = fetch()
        if fmt is OutputFormat.JSON:
            out.print_json(json.dumps(document))
        elif fmt is OutputFormat.YAML:
            out.print(yaml.safe_dump(document, sort_keys=False), highlight=False, end="")
        else:
            print_table(table(title, columns, records, wide, caption), console)
        return
    if fmt in (OutputFormat.JSON, OutputFormat.YAML):
        raise invalid(f"--watch shows a table: use -o table or -o wide, not -o {fmt}")
    drawn = 0
    with Live(console=console, auto_refresh=False) as live:
        try:
            while True:
                _, records = fetch()
                stamp = time.strftime("%H:%M:%S")
                drawing = table(f"{title} ({stamp})", columns, records, wide, caption)
                live.update(drawing, refresh=True)
                drawn += 1
                if updates is not None and drawn >= updates:
                    return
                time.sleep(interval)
        except KeyboardInterrupt:
            return


def _step_duration(record: dict[str, Any]) -> str:
    if record.get("claimed_at_ms") and record.get("finished_at_ms"):
        return f"{(record['finished_at_ms'] - record['claimed_at_ms']) / 1000:.3f}s"
    return ""


_MODEL_REPLY = frozenset({"text", "provider", "model", "finish_reason", "usage"})


def _is_model_reply(output: Any) -> bool:
    """The output of a ``model`` step (its keys exactly, ``json`` optional)."""
    return (
        isinstance(output, dict)
        and isinstance(output.get("text"), str)
        and set(output) - {"json"} == _MODEL_REPLY
    )


def _step_shown(record: dict[str, Any], width: int = 60) -> str:
    """A step's error when it did not complete and has one, else its output (a model
    step's: the reply's text); JSON, cut to ``width`` characters (``--json`` has it
    whole)."""
    error = record.get("error")
    shown = error if error and record.get("status") != "completed" else record.get("output")
    if shown is None:
        return "-"
    if _is_model_reply(shown):
        shown = shown["text"]  # what the model said; the rest is in --json
    text = shown if isinstance(shown, str) else json.dumps(shown)
    return text if len(text) <= width else text[: width - 3] + "..."


STEP_COLUMNS = (
    Column("step", lambda s: s[0], is_id=True),
    Column("status", lambda s: s[1]["status"], no_wrap=True),
    Column("attempts", lambda s: str(s[1].get("attempts", 1)), no_wrap=True),
    Column("instance", lambda s: s[1].get("instance_id") or "-", is_id=True, shorten=True),
    Column("took", lambda s: _step_duration(s[1]), no_wrap=True),
    Column("output / error", lambda s: _step_shown(s[1])),
)
"""A run's steps, one a row: ``(step id, record)`` pairs as an execution snapshot holds
them."""


def step_table(title: str, steps: Sequence[tuple[str, dict[str, Any]]]) -> Table:
    """The steps of one execution (``airt run``, ``submit --wait``, ``runs show``): ids
    never folded, the output cut to a short cell. The instance column only when the
    steps ran on more than one instance (a recovery moved some): otherwise the run's
    line names it, and the 80 columns go to the step ids and outputs."""
    instances = {record.get("instance_id") for _, record in steps if record.get("instance_id")}
    columns = [c for c in STEP_COLUMNS if len(instances) > 1 or c.header != "instance"]
    return table(title, columns, steps, wide=False)
