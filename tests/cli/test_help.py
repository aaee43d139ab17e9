"""``airt --help`` and every command's help read as prose at any terminal width: a
docstring's source line breaks are not printed (rich help keeps them as they are, so
a summary wrapped at 88 columns in the source broke mid-sentence in a terminal of 80),
while paragraphs and a laid-out list stay as written."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import typer

from airuntime.cli.app import _reflowed, assembled


def _commands(group: Any, path: str = "airt") -> Iterator[tuple[str, Any]]:
    """Every command under ``group`` (typer's own click), with its command line."""
    yield path, group
    for name, sub in getattr(group, "commands", {}).items():
        yield from _commands(sub, f"{path} {name}")


def test_no_help_paragraph_keeps_a_source_line_break() -> None:
    root = typer.main.get_command(assembled())
    seen = 0
    for path, command in _commands(root):
        for paragraph in (command.help or "").split("\n\n"):
            laid_out = any(
                line[:1].isspace() or line.startswith("- ") for line in paragraph.splitlines()
            )
            assert laid_out or "\n" not in paragraph, (path, paragraph)
        seen += 1
    assert seen > 20  # every group and command was walked, plugins' too
    assert "runtime settings" in {p.removeprefix("airt ") for p, _ in _commands(root)}


def test_reflowing_keeps_paragraphs_and_laid_out_lists() -> None:
    doc = """First line of a summary
    wrapped here.

    Second paragraph,
    also wrapped.

    Options:
      - one
      - two
    """
    assert _reflowed(doc) == (
        "First line of a summary wrapped here.\n\nSecond paragraph, also wrapped."
        "\n\nOptions:\n  - one\n  - two"
    )


def test_the_command_list_at_80_columns_breaks_only_where_the_next_word_does_not_fit() -> None:
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb"}
    code = "import sys; from airuntime.cli.app import main; sys.argv[0] = 'airt'; main()"
    shown = subprocess.run(
        [sys.executable, "-c", code, "--help"], env=env, capture_output=True, text=True, check=True
    ).stdout
    lines = shown.splitlines()
    start = next(i for i, line in enumerate(lines) if "─ Commands ─" in line)
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("╰"))
    panel = lines[start + 1 : end]
    assert all(len(row) == 80 and row.startswith("│ ") for row in panel), shown
    assert len(panel) > 15, shown
    text_at = panel[0].index(panel[0].split()[2])  # the summaries' column
    width = len(panel[0]) - 2 - text_at  # up to the panel's right edge
    for row, after in itertools.pairwise(panel):
        summary, continuation = row[text_at:-1].rstrip(), after[text_at:-1].strip()
        if after[2:text_at].strip() or not continuation:
            continue  # the next row starts another command
        # A continued summary: its first word would not have fit on this row.
        assert len(summary) + 1 + len(continuation.split()[0]) > width, (row, after)
